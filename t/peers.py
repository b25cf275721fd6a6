"""Foreign lock clients for the interop tests.

* RedlockPeer: the real npm `redlock` 4.2.0 (with ioredis) in a node process.
* RedlockUniversalPeer: the real npm `redlock-universal` 0.8.5 (with ioredis).
* SemaphorePeer: the real npm `redis-semaphore` 5.8.0 (Semaphore,
  MultiSemaphore; with ioredis).
* JavaPeer: the real Redisson (RLock, RFencedLock; latest 3.x and 4.x) and a
  hand-written Jedis SET NX PX lock, in a JVM (t/interop/java, versions
  pinned in its pom.xml), built by scripts/install-deps (or here when missing).
* SpringPeer: the real Spring Integration RedisLockRegistry (Spring Data
  Redis over Lettuce) in a JVM (t/interop/spring, versions pinned in its
  pom.xml), built by scripts/install-deps (or here when missing).
* RedsyncPeer: the real Go redsync v4 with go-redis v9
  (t/interop/go, versions pinned in go.mod), built once into
  t/interop/go/bin by scripts/install-deps (or here when missing).
"""
import json
import os
import select
import shutil
import subprocess
import threading
import time


INTEROP_DIR = os.path.join(os.path.dirname(__file__), "interop")


class RedlockPeer:
    SCRIPT = "redlock_peer.js"

    def __init__(self, ports):
        self.proc = subprocess.Popen(
            ["node", self.SCRIPT, ",".join(str(p) for p in ports)],
            cwd=INTEROP_DIR, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, bufsize=1)

    def send(self, **cmd):
        """Write one command without waiting for its answer (see receive)."""
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout=15):
        """The next answer, as a dict, and the time.monotonic() it was read."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError("peer did not answer within %ss" % timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("peer died: " + self.proc.stderr.read())
        return json.loads(line), time.monotonic()

    def call(self, timeout=15, **cmd):
        self.send(**cmd)
        return self.receive(timeout)[0]

    def close(self):
        try:
            self.call(op="quit", timeout=5)
        except Exception:  # noqa: BLE001
            pass
        self.proc.kill()
        self.proc.wait(5)


class RedlockUniversalPeer(RedlockPeer):
    """The real npm redlock-universal 0.8.5 (with ioredis) in a node
    process; one Redis (its createLock), same commands as RedlockPeer."""
    SCRIPT = "redlock_universal_peer.js"


class SemaphorePeer(RedlockPeer):
    """The real npm redis-semaphore 5.8.0 (with ioredis) in a node process,
    one Redis; commands in t/interop/semaphore_peer.js.  The peer handles one
    command at a time: a waiting acquire holds up the next command, so a
    test wanting a holder and a waiter on the Node side starts two peers."""
    SCRIPT = "semaphore_peer.js"

    def __init__(self, port):
        super().__init__([port])

    def acquire(self, key, limit, timeout=30, **opts):
        """tryAcquire; the answer (acquired, identifier).  Raises on an
        error answer."""
        r = self.call(timeout=timeout, op="acquire", key=key, limit=limit, **opts)
        if not r["ok"]:
            raise RuntimeError(r["error"])
        return r

    def op(self, op, name, timeout=15):
        r = self.call(timeout=timeout, op=op, name=name)
        if not r["ok"]:
            raise RuntimeError(r["error"])
        return r


GO_DIR = os.path.join(INTEROP_DIR, "go")
REDSYNC_BIN = os.path.join(GO_DIR, "bin", "redsyncpeer")


def build_redsync_peer():
    if not os.path.exists(REDSYNC_BIN):
        go = shutil.which("go") or "/usr/local/go/bin/go"
        subprocess.run([go, "build", "-o", REDSYNC_BIN, "."], cwd=GO_DIR, check=True,
                       timeout=600)
    return REDSYNC_BIN


class RedsyncPeer(RedlockPeer):
    """Same line protocol as RedlockPeer: lock {key, ttl, tries,
    retryDelay}, unlock, extend, quit."""

    def __init__(self, ports):  # noqa: super().__init__ starts node
        self.proc = subprocess.Popen(
            [build_redsync_peer(), ",".join(str(p) for p in ports)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1)


JAVA_DIR = os.path.join(INTEROP_DIR, "java")
REDISSON_LINES = ("3", "4")


JAVA_SOURCE = os.path.join(JAVA_DIR, "src", "main", "java", "peer", "Peer.java")


def build_java_peer(line):
    """The peer's build for one Redisson line, (re)built when missing or
    older than its source."""
    out = os.path.join(JAVA_DIR, "target", "redisson-" + line)
    built = os.path.join(out, "classes", "peer", "Peer.class")
    if not os.path.exists(built) or os.path.getmtime(built) < os.path.getmtime(JAVA_SOURCE):
        cmd = ["mvn", "-B", "-q", "package"] + (["-P", "redisson3"] if line == "3" else [])
        subprocess.run(cmd, cwd=JAVA_DIR, check=True, timeout=900)
    return out


def java_library_version(line, artifact):
    """The version of artifact (redisson, jedis) the peer of line runs."""
    lib = os.path.join(build_java_peer(line), "lib")
    jar, = [j for j in os.listdir(lib)
            if j.startswith(artifact + "-") and j[len(artifact) + 1].isdigit()]
    return jar[len(artifact) + 1:-len(".jar")]


class JavaError(Exception):
    pass


class JavaPeer:
    """A JVM with one RedissonClient (single server or cluster) and a
    JedisPool.  Every op runs on a named peer thread (Redisson's locks
    belong to threads); send() returns at once, result() waits for the
    answer: (value, epoch seconds at which the op finished in the JVM)."""

    def __init__(self, ports, line="4", mode="single", watchdog_ms=30000, truststore=None):
        """mode: single, cluster (ports: seed nodes) or replicated (ports:
        the master, then its replicas).  truststore: a PKCS#12 file of
        trusted CAs (password "changeit"): Redisson then speaks rediss://."""
        self.line = line
        out = build_java_peer(line)
        cp = os.path.join(out, "classes") + ":" + os.path.join(out, "lib", "*")
        jvm = (["-Djavax.net.ssl.trustStore=" + truststore,
                "-Djavax.net.ssl.trustStorePassword=changeit",
                "-Djavax.net.ssl.trustStoreType=PKCS12"] if truststore else [])
        self._start(["java"] + jvm + ["-cp", cp, "peer.Peer", mode,
                                      ",".join(str(p) for p in ports), str(watchdog_ms)]
                    + (["rediss"] if truststore else []))

    def _start(self, argv):
        """Run the JVM and read its answers on a thread of their own."""
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1)
        self.next_id = 0
        self.answers = {}
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            rid, status, value, micros = line.rstrip("\n").split("\t")
            with self.cond:
                self.answers[rid] = (status == "ok", value, int(micros) / 1e6)
                self.cond.notify_all()
        with self.cond:
            self.answers[None] = "eof"
            self.cond.notify_all()

    def send(self, thread, op, *args):
        self.next_id += 1
        rid = str(self.next_id)
        self.proc.stdin.write("\t".join([rid, thread, op] + [str(a) for a in args]) + "\n")
        self.proc.stdin.flush()
        return rid

    def done(self, rid):
        with self.cond:
            return rid in self.answers

    def result(self, rid, timeout=30):
        with self.cond:
            if not self.cond.wait_for(lambda: rid in self.answers or None in self.answers,
                                      timeout):
                raise TimeoutError("java peer did not answer request %s" % rid)
            if rid not in self.answers:
                raise RuntimeError("java peer died: " + self.proc.stderr.read())
            ok, value, at = self.answers.pop(rid)
        if not ok:
            raise JavaError(value)
        return {"true": True, "false": False}.get(value, value), at

    def call(self, thread, op, *args, timeout=30):
        return self.result(self.send(thread, op, *args), timeout)[0]

    def close(self):
        try:
            self.send("main", "quit")
            self.proc.wait(10)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait(5)


SPRING_DIR = os.path.join(INTEROP_DIR, "spring")
SPRING_SOURCE = os.path.join(SPRING_DIR, "src", "main", "java", "peer", "SpringPeer.java")


def build_spring_peer():
    """The Spring peer's build, (re)built when missing or older than its
    source or its pom.xml."""
    out = os.path.join(SPRING_DIR, "target")
    built = os.path.join(out, "classes", "peer", "SpringPeer.class")
    newest = max(os.path.getmtime(SPRING_SOURCE),
                 os.path.getmtime(os.path.join(SPRING_DIR, "pom.xml")))
    if not os.path.exists(built) or os.path.getmtime(built) < newest:
        subprocess.run(["mvn", "-B", "-q", "package"], cwd=SPRING_DIR, check=True, timeout=900)
    return out


def spring_library_version(artifact):
    """The version of artifact (spring-integration-redis, lettuce-core, ...)
    the Spring peer runs."""
    lib = os.path.join(build_spring_peer(), "lib")
    jar, = [j for j in os.listdir(lib)
            if j.startswith(artifact + "-") and j[len(artifact) + 1].isdigit()]
    return jar[len(artifact) + 1:-len(".jar")]


class SpringPeer(JavaPeer):
    """A JVM with one LettuceConnectionFactory and any number of Spring
    RedisLockRegistry instances, made by the registry op; same line
    protocol and threads as JavaPeer (t/interop/spring/.../SpringPeer.java
    lists the ops)."""

    def __init__(self, port):  # noqa: super().__init__ starts Redisson's peer
        out = build_spring_peer()
        cp = os.path.join(out, "classes") + ":" + os.path.join(out, "lib", "*")
        self._start(["java", "-cp", cp, "peer.SpringPeer", str(port)])


def redisson_name(prefix, key):
    """Redisson's naming rule: braces unless the name already has a '{'."""
    return "%s:%s" % (prefix, key) if "{" in key else "%s:{%s}" % (prefix, key)
