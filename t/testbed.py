"""Throwaway Redis and PostgreSQL servers on 127.0.0.1 for redis_lock tests.

Every server a test needs is started here and stopped here, bounded in time.
PostgreSQL refuses to run as root, so when we are root it runs as the
unprivileged user RLTEST_USER (created by .ci/run / scripts/install-deps).

Library use (pytest fixtures in conftest.py) or command line:

    python3 t/testbed.py up DIR      # Redis + preloaded PostgreSQL; writes DIR/env
    python3 t/testbed.py down DIR
"""
import atexit
import contextlib
import datetime
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psycopg2
import redis

PGBIN = os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin")
RLTEST_USER = os.environ.get("RLTEST_USER", "rltest")
# stretch time limits when the servers run slowed down (scripts/memcheck)
TIME_SCALE = float(os.environ.get("RL_TIME_SCALE", "1"))
# A waiter back within this of the release was woken by the release (its
# message, a keyspace event, or a poll of a foreign holder at most 100 ms
# apart): the alternatives are a SQL waiter's 1 s poll of a holder that
# publishes, and the holder's TTL.  The latency itself is a measured figure
# (checks.report_latency), not asserted tightly: on a loaded 2-core machine a
# 20 ms wake-up takes up to a few hundred.
WAKE_BOUND = 0.5 * TIME_SCALE
# the server binary (also run as Sentinel): RL_REDIS_SERVER names another one,
# e.g. Valkey or Redis 8 from scripts/get-server
REDIS_SERVER = (os.environ.get("RL_REDIS_SERVER") or shutil.which("redis-server")
                or "/usr/bin/redis-server")


# Everything started here is stopped when the interpreter exits, also when a
# fixture failed half-way through its setup and never reached its teardown.
_started = []


def _stop_everything():
    for srv in reversed(_started):
        try:
            srv.cleanup() if isinstance(srv, Postgres) else srv.stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


atexit.register(_stop_everything)


def _port_is_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# Under pytest-xdist (scripts/run-tests with RL_PYTEST_WORKERS) the workers
# start servers at the same time.  A port the OS picked is free when picked
# but taken only when the server listens, seconds later for PostgreSQL (after
# initdb); meanwhile another worker's pick, or any connection's source port,
# may take it.  So each worker takes its ports from its own block below the
# kernel's ephemeral range (which the OS's picks and source ports use, and a
# serial run's servers too), its cluster bus ports 10000 above, from a random
# start so that two runs on one machine seldom walk the same ports.
_WORKER_BLOCK = 1200
_WORKER_BASE = 10000


def _worker_ports():
    """(first, last + 1) of this xdist worker's block, or of the block
    RL_PORT_BLOCK names (a lane of scripts/matrix, which runs beside the
    main suites' workers), or None."""
    wid = os.environ.get("PYTEST_XDIST_WORKER", "")
    if wid.startswith("gw"):
        n = int(wid[2:])
    elif os.environ.get("RL_PORT_BLOCK", "").isdigit():
        n = int(os.environ["RL_PORT_BLOCK"])
    else:
        return None
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    first = _WORKER_BASE + n * _WORKER_BLOCK
    if first + _WORKER_BLOCK + 10000 > ephemeral_low:
        return None             # too many workers for the space: let the OS pick
    return first, first + _WORKER_BLOCK


_next_port = [None]


def free_port(bus=False):
    """A TCP port nobody listens on right now (and, with bus, port + 10000
    too); from this worker's block under xdist, else the OS picks it."""
    block = _worker_ports()
    if block is None:
        for _ in range(1000):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                p = s.getsockname()[1]
            if not bus or (p <= 55535 and _port_is_free(p + 10000)):
                return p
        raise RuntimeError("no free port pair for a cluster node")
    first, end = block
    if _next_port[0] is None:
        import random
        _next_port[0] = random.randrange(first, end)
    for _ in range(end - first):
        p = _next_port[0]
        _next_port[0] = first + (p + 1 - first) % (end - first)
        if _port_is_free(p) and (not bus or _port_is_free(p + 10000)):
            return p
    raise RuntimeError("no free port left in %d-%d" % block)


def free_cluster_port():
    """A free port whose cluster bus port (port + 10000) is free too."""
    return free_port(bus=True)


def wait_until(pred, timeout=10.0, interval=0.01, what="condition"):
    """Poll pred() until true; raise after timeout.  Returns pred's value."""
    deadline = time.monotonic() + timeout * TIME_SCALE
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError("timed out waiting for " + what)
        time.sleep(interval)


# scripts/assert-check: a server's log goes away with its directory, so when
# RL_TRAP_LOG names a file, cleanup first appends to it the log lines that
# report a failed Assert() or a server process killed by SIGABRT/SIGSEGV.
_TRAP_MARKERS = ("TRAP:", "PANIC:", "terminated by signal 6", "terminated by signal 11")


def save_traps(logfile):
    dest = os.environ.get("RL_TRAP_LOG")
    if not dest:
        return
    try:
        with open(logfile, errors="replace") as f:
            hits = [line for line in f if any(m in line for m in _TRAP_MARKERS)]
    except OSError:
        return
    if hits:
        with open(dest, "a") as out:
            out.write("== %s\n" % logfile)
            out.writelines(hits)


def _as_pg_user(cmd):
    if os.geteuid() == 0:
        return ["runuser", "-u", RLTEST_USER, "--"] + cmd
    return cmd


class Redis:
    """One redis-server process (no persistence unless asked); server: the
    binary, REDIS_SERVER unless given (e.g. from scripts/get-server)."""

    def __init__(self, port=None, args=(), workdir=None, password=None, server=None):
        self.port = port or free_port()
        self.dir = workdir or tempfile.mkdtemp(prefix="rl-redis-")
        self.args = list(args)
        self.password = password
        self.server = server or REDIS_SERVER
        self.proc = None

    def start(self, timeout=10):
        cmd = [self.server, "--port", str(self.port), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--dir", self.dir,
               "--daemonize", "no", "--logfile", os.path.join(self.dir, "redis.log")]
        if self.password:
            cmd += ["--requirepass", self.password]
        cmd += self.args
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if self not in _started:
            _started.append(self)

        def up():
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited: see " + self.dir + "/redis.log")
            try:
                return self.client(socket_timeout=0.5).ping()
            except redis.exceptions.AuthenticationError:
                return True
            except redis.exceptions.ResponseError as e:
                return "NOAUTH" in str(e)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                return False
        wait_until(up, timeout, what="redis-server on port %d" % self.port)
        return self

    def client(self, **kw):
        kw.setdefault("socket_timeout", 5)
        if self.password and "password" not in kw:
            kw["password"] = self.password
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    @property
    def url(self):
        return "redis://127.0.0.1:%d/0" % self.port

    def pause(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self, timeout=10):
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)

    def restart(self):
        self.stop()
        return self.start()

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)


class Sentinel(Redis):
    """A redis-sentinel watching one master (its config file is rewritten
    by Sentinel itself, so it lives in the instance's own directory)."""

    def __init__(self, master_port, name="mymaster", quorum=2, down_after_ms=1000,
                 server=None):
        super().__init__(server=server)
        self.conf = os.path.join(self.dir, "sentinel.conf")
        with open(self.conf, "w") as f:
            f.write("port %d\nbind 127.0.0.1\ndir %s\n"
                    "sentinel monitor %s 127.0.0.1 %d %d\n"
                    "sentinel down-after-milliseconds %s %d\n"
                    "sentinel failover-timeout %s 4000\n"
                    "sentinel parallel-syncs %s 1\n"
                    % (self.port, self.dir, name, master_port, quorum,
                       name, down_after_ms, name, name))

    def start(self, timeout=10):
        self.proc = subprocess.Popen(
            [self.server, self.conf, "--sentinel", "--logfile",
             os.path.join(self.dir, "sentinel.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if self not in _started:
            _started.append(self)
        wait_until(lambda: self._ping(), timeout, what="sentinel on %d" % self.port)
        return self

    def _ping(self):
        try:
            return self.client(socket_timeout=0.5).ping()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return False


def create_cluster(nodes, timeout=30):
    """Join started cluster-enabled Redis instances into one cluster, masters
    only (over TLS when they are TLSRedis nodes)."""
    tls = ["--tls", "--cacert", nodes[0].pki.ca] if isinstance(nodes[0], TLSRedis) else []
    cmd = ["redis-cli"] + tls + ["--cluster", "create"] + [
        "127.0.0.1:%d" % n.port for n in nodes] + ["--cluster-replicas", "0", "--cluster-yes"]
    subprocess.run(cmd, check=True, timeout=timeout, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)

    def ok():
        for n in nodes:
            info = n.client().execute_command("CLUSTER", "INFO")
            if isinstance(info, bytes):
                info = info.decode()
            if "cluster_state:ok" not in info:
                return False
        return True
    wait_until(ok, timeout, 0.1, what="cluster_state:ok")


def _cluster_args(r):
    return ["--cluster-enabled", "yes", "--cluster-config-file",
            os.path.join(r.dir, "nodes.conf"), "--cluster-node-timeout", "3000"]


def cluster_node(**kw):
    kw.setdefault("port", free_cluster_port())
    r = Redis(**kw)
    r.args += _cluster_args(r)
    return r


@contextlib.contextmanager
def server_env(*assignments):
    """PostgreSQL servers started within get NAME=VALUE assignments in
    their environment (RL_SERVER_ENV, which Postgres.start passes on), on
    top of any already asked for."""
    old = os.environ.get("RL_SERVER_ENV")
    os.environ["RL_SERVER_ENV"] = " ".join(([old] if old else []) + list(assignments))
    try:
        yield
    finally:
        if old is None:
            del os.environ["RL_SERVER_ENV"]
        else:
            os.environ["RL_SERVER_ENV"] = old


class Postgres:
    """One PostgreSQL instance in a fresh data directory."""

    def __init__(self, port=None, preload=True, conf=None):
        self.port = port or free_port()
        self.preload = preload
        self.conf = dict(conf or {})
        self.base = tempfile.mkdtemp(prefix="rl-pg-")
        self.data = os.path.join(self.base, "data")
        self.log = os.path.join(self.base, "postgres.log")
        if os.geteuid() == 0:
            pw = pwd.getpwnam(RLTEST_USER)
            os.chown(self.base, pw.pw_uid, pw.pw_gid)

    def _run(self, cmd, timeout=120, check=True, server=False):
        env = None
        if server and os.environ.get("RL_SERVER_ENV"):
            # extra environment for the server processes only (scripts/asan-check)
            env = dict(os.environ)
            for item in os.environ["RL_SERVER_ENV"].split():
                k, v = item.split("=", 1)
                env[k] = v
        return subprocess.run(_as_pg_user(cmd), check=check, timeout=timeout, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def init(self):
        self._run([PGBIN + "/initdb", "-D", self.data, "-U", "postgres",
                   "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"])
        lines = ["listen_addresses = '127.0.0.1'",
                 "port = %d" % self.port,
                 "unix_socket_directories = '%s'" % self.base,
                 "fsync = off",
                 "max_connections = 60",
                 "log_line_prefix = '%m [%p] '",
                 "restart_after_crash = on"]
        if self.preload:
            lines.append("shared_preload_libraries = 'redis_lock'")
        for k, v in self.conf.items():
            lines.append("%s = '%s'" % (k, v))
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write("\n".join(lines) + "\n")
        return self

    def set_conf(self, **kw):
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            for k, v in kw.items():
                f.write("%s = '%s'\n" % (k.replace("__", "."), v))

    def _ctl(self, *args):
        """pg_ctl with our server binary (RL_POSTGRES_BIN: e.g. under valgrind)."""
        cmd = [PGBIN + "/pg_ctl", "-D", self.data, "-l", self.log, "-w",
               "-t", str(int(60 * TIME_SCALE))]
        if os.environ.get("RL_POSTGRES_BIN"):
            cmd += ["-p", os.environ["RL_POSTGRES_BIN"]]
        return self._run(cmd + list(args), server=True, timeout=120 * TIME_SCALE)

    def start(self):
        if self not in _started:
            _started.append(self)
        self._ctl("start")
        return self

    def stop(self, mode="fast"):
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            self._run([PGBIN + "/pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop"],
                      check=False)

    def restart(self):
        self._ctl("-m", "fast", "restart")

    def reload(self):
        self._run([PGBIN + "/pg_ctl", "-D", self.data, "reload"])

    def with_extension(self):
        """CREATE EXTENSION redis_lock in the postgres database; returns self."""
        c = self.connect()
        try:
            c.cursor().execute("CREATE EXTENSION redis_lock")
        finally:
            c.close()
        return self

    def connect(self, dbname="postgres", autocommit=True, user="postgres", **kw):
        c = psycopg2.connect(host="127.0.0.1", port=self.port, dbname=dbname, user=user,
                             connect_timeout=int(10 * TIME_SCALE), **kw)
        c.autocommit = autocommit
        return c

    def postmaster_pid(self):
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            return int(f.readline())

    def log_text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def ready_count(self):
        """How often the server said it was ready: its start, each restart
        after a crashed backend."""
        return self.log_text().count("database system is ready to accept connections")

    def wait_reinitialized(self, ready_before, timeout=30):
        """After a backend was killed: wait until the postmaster has
        reinitialized.  A connection made before it noticed the crash would
        be ended by that restart (CI13, 2026-11-28)."""
        wait_until(lambda: self.ready_count() > ready_before, timeout,
                   what="PostgreSQL reinitialized after a crash")

    def cleanup(self):
        self.stop("immediate")
        save_traps(self.log)
        if os.environ.get("RL_KEEP_LOGS"):
            shutil.copy(self.log, os.path.join(os.environ["RL_KEEP_LOGS"], os.path.basename(self.base) + ".log"))
        shutil.rmtree(self.base, ignore_errors=True)


def slot_owner(nodes, key):
    """The Cluster node (of nodes) serving key's hash slot, and the slot."""
    c = nodes[0].client()
    slot = c.execute_command("CLUSTER", "KEYSLOT", key)
    for start, end, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
        if start <= slot <= end:
            return next(n for n in nodes if n.port == master[1]), slot
    raise AssertionError("no node serves slot %d" % slot)


class PgBouncer:
    """A PgBouncer (Debian's) on 127.0.0.1 in front of pg: database
    "postgres" in transaction pooling, "postgres_session" (the same
    database) in session pooling with server_reset_query = DISCARD ALL.
    Every user in users may log in without a password."""

    def __init__(self, pg, users=("postgres",), pool_size=1):
        self.pg = pg
        self.port = free_port()
        self.base = tempfile.mkdtemp(prefix="rl-bouncer-")
        self.log = os.path.join(self.base, "pgbouncer.log")
        ini = os.path.join(self.base, "pgbouncer.ini")
        with open(os.path.join(self.base, "users.txt"), "w") as f:
            f.writelines('"%s" ""\n' % u for u in users)
        with open(ini, "w") as f:
            f.write("[databases]\n"
                    "postgres = host=127.0.0.1 port=%d dbname=postgres\n"
                    "postgres_session = host=127.0.0.1 port=%d dbname=postgres pool_mode=session\n"
                    "[pgbouncer]\n"
                    "listen_addr = 127.0.0.1\n"
                    "listen_port = %d\n"
                    "unix_socket_dir =\n"
                    "auth_type = trust\n"
                    "auth_file = %s/users.txt\n"
                    "pool_mode = transaction\n"
                    "default_pool_size = %d\n"
                    "server_reset_query = DISCARD ALL\n"
                    "ignore_startup_parameters = extra_float_digits\n"
                    "logfile = %s\n"
                    % (pg.port, pg.port, self.port, self.base, pool_size, self.log))
        if os.geteuid() == 0:
            pw = pwd.getpwnam(RLTEST_USER)
            for path in (self.base, ini, os.path.join(self.base, "users.txt")):
                os.chown(path, pw.pw_uid, pw.pw_gid)
        self.proc = subprocess.Popen(_as_pg_user(["/usr/sbin/pgbouncer", ini]),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up():
            if self.proc.poll() is not None:
                raise RuntimeError("pgbouncer exited; see " + self.log)
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return True
            except OSError:
                return False
        wait_until(up, 10, what="pgbouncer to listen")

    def connect(self, dbname="postgres", user="postgres"):
        c = psycopg2.connect(host="127.0.0.1", port=self.port, dbname=dbname, user=user,
                             connect_timeout=int(10 * TIME_SCALE))
        c.autocommit = True
        return c

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        shutil.rmtree(self.base, ignore_errors=True)


class DelayProxy:
    """TCP proxy on 127.0.0.1 adding a fixed delay to every chunk, each way.

    Used to make round trips expensive, so a test can tell one pipelined
    round trip from many sequential ones by elapsed time alone.  While
    `held` is true, what Redis sends is kept back (past its delay) until it
    is false again: a reply that must not arrive before the test has done
    something stays in flight however slow the machine.  reset_clients()
    resets every client connection at once (RST), dropping what Redis sent
    that the proxy still holds: a reply lost after its command ran.
    undelivered_replies(name) counts the reply chunks the proxy has read
    but not passed on, for the connections named `name` (CLIENT SETNAME):
    a test that kills Redis after a command ran waits for it to be >= 1,
    or the reply may not have been written yet and dies with the server.
    slow_replies = (suffix, seconds) adds seconds to the replies of the
    connections whose name ends with suffix, once they have named
    themselves; names_seen(suffix) counts such connections so far.
    record, when a list, gets one (way, tag, came, went) per chunk passed
    on: way "c" from the client, "s" from Redis; tag the connection's dict
    (its "name", and "flight": its chunks read and not passed on yet);
    time.monotonic() when it came in and when it went out
    (t/test_round_trips.py counts round trips from it)."""

    def __init__(self, target_port, delay_s):
        import asyncio
        self.asyncio = asyncio
        self.target_port = target_port
        self.delay = delay_s
        self.held = False
        self.chunks_in = 0          # chunks read from clients, for tests to poll
        self.last_chunk_at = None   # time.monotonic() when the last one came in
        # deliver what a client sent even after it reset the connection (a
        # command still on the network when its sender gave up on it)
        self.deliver_after_reset = False
        self.slow_replies = None
        self.named = []             # every connection's name, in order
        self.record = None
        # [client writer, server writer, reset?, {"name", "undelivered"}]
        self.conns = []
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    async def _pipe(self, reader, writer, replies=False, conn=None):
        # a delay line: each chunk goes out `delay` after it came in, however
        # many follow it (sleeping per chunk in turn would add the delay once
        # per chunk, so a reply split in two would cost two round trips)
        loop = self.asyncio.get_running_loop()
        queue = self.asyncio.Queue()

        async def deliver():
            while True:
                due, came, data = await queue.get()
                if data is None:
                    return
                wait = due - loop.time()
                if wait > 0:
                    await self.asyncio.sleep(wait)
                while replies and self.held and not (conn is not None and conn[2]):
                    await self.asyncio.sleep(0.002)
                if conn is not None and conn[2]:
                    return          # reset: what was held is dropped
                # the time before the write: the peer may act on the chunk
                # before this thread runs again
                went = time.monotonic()
                writer.write(data)
                if replies and conn is not None:
                    conn[3]["undelivered"] -= 1
                if self.record is not None and conn is not None:
                    self.record.append(("s" if replies else "c", conn[3], came, went))
                if conn is not None:
                    conn[3]["flight"] -= 1
                await writer.drain()
        sender = loop.create_task(deliver())
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                came = time.monotonic()
                if conn is not None:
                    conn[3]["flight"] += 1
                if not replies:
                    self.chunks_in += 1
                    self.last_chunk_at = time.monotonic()
                    if conn is not None and conn[3]["name"] is None:
                        m = re.search(rb"SETNAME\r\n\$\d+\r\n([^\r]*)", data)
                        conn[3]["name"] = m.group(1).decode() if m else ""
                        self.named.append(conn[3]["name"])
                elif conn is not None:
                    conn[3]["undelivered"] += 1
                delay = self.delay
                slow = self.slow_replies
                if (replies and slow is not None and conn is not None and
                        (conn[3]["name"] or "").endswith(slow[0])):
                    delay += slow[1]
                queue.put_nowait((loop.time() + delay, came, data))
            queue.put_nowait((0, 0, None))
            await sender
        except (ConnectionError, OSError):
            if self.deliver_after_reset and not replies:
                queue.put_nowait((0, 0, None))
                try:
                    await sender
                except (ConnectionError, OSError):
                    pass
        finally:
            sender.cancel()
            writer.close()

    async def _handle(self, creader, cwriter):
        try:
            sreader, swriter = await self.asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cwriter.close()
            return
        conn = [cwriter, swriter, False, {"name": None, "undelivered": 0, "flight": 0}]
        self.conns.append(conn)
        try:
            await self.asyncio.gather(self._pipe(creader, swriter, conn=conn),
                                      self._pipe(sreader, cwriter, replies=True, conn=conn))
        finally:
            self.conns.remove(conn)

    def names_seen(self, suffix):
        return sum(1 for n in list(self.named) if n.endswith(suffix))

    def undelivered_replies(self, name):
        return sum(c[3]["undelivered"] for c in list(self.conns) if c[3]["name"] == name)

    def reset_clients(self):
        """Reset every client connection now, with an RST: replies the
        proxy holds or delays are never delivered.  Returns how many."""
        import struct
        done = threading.Event()
        count = []

        def reset():
            for conn in list(self.conns):
                if conn[2]:
                    continue
                conn[2] = True
                sock = conn[0].get_extra_info("socket")
                try:
                    if sock is not None:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                        struct.pack("ii", 1, 0))
                except OSError:
                    pass        # its client closed it already
                conn[0].transport.abort()
                conn[1].close()
                count.append(conn)
            done.set()
        self.loop.call_soon_threadsafe(reset)
        done.wait(10)
        return len(count)

    def _run(self):
        self.asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            self.asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()
        server.close()
        # let the pipes of open connections finish before the loop goes away
        pending = self.asyncio.all_tasks(self.loop)
        for t in pending:
            t.cancel()
        self.loop.run_until_complete(self.asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    def start(self):
        self.thread.start()
        self.ready.wait(10)
        return self

    @property
    def url(self):
        return "redis://127.0.0.1:%d/0" % self.port

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def sql_one(conn, query, args=None):
    with conn.cursor() as cur:
        cur.execute(query, args)
        row = cur.fetchone()
        return row[0] if row and len(row) == 1 else row


def _cli(argv):
    if len(argv) != 3 or argv[1] not in ("up", "down"):
        sys.exit("usage: testbed.py up|down DIR")
    d = argv[2]
    os.makedirs(d, exist_ok=True)
    envfile = os.path.join(d, "env")
    if argv[1] == "up":
        r = Redis(workdir=d).start()
        pg = Postgres(conf={"redis_lock.url": r.url}).init().start()
        with open(envfile, "w") as f:
            f.write("RL_REDIS_PORT=%d\nRL_REDIS_PID=%d\nPGHOST=127.0.0.1\nPGPORT=%d\n"
                    "PGUSER=postgres\nRL_PG_DATA=%s\nRL_PG_BASE=%s\n"
                    % (r.port, r.proc.pid, pg.port, pg.data, pg.base))
        print(open(envfile).read(), end="")
        _started.clear()        # they outlive this command: "down" stops them
    else:
        env = dict(line.strip().split("=", 1) for line in open(envfile) if "=" in line)
        subprocess.run(_as_pg_user([PGBIN + "/pg_ctl", "-D", env["RL_PG_DATA"], "-m",
                                    "immediate", "-w", "stop"]), check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            os.kill(int(env["RL_REDIS_PID"]), signal.SIGTERM)
        except ProcessLookupError:
            pass
        save_traps(os.path.join(env["RL_PG_BASE"], "postgres.log"))
        shutil.rmtree(env["RL_PG_BASE"], ignore_errors=True)


if __name__ == "__main__":
    _cli(sys.argv)


# ---------------------------------------------------------------- TLS

class PKI:
    """A throw-away CA and certificates (python3-cryptography) in a folder
    the PostgreSQL server can read: ca.pem, and for each make() NAME.pem and
    NAME.key (mode 0600, owned by the server's user)."""

    def __init__(self, name="rl-test-ca"):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
        self._x509, self._hashes, self._ec, self._oid = x509, hashes, ec, NameOID
        self.dir = tempfile.mkdtemp(prefix="rl-pki-")
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.ca_cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                        .public_key(self.ca_key.public_key())
                        .serial_number(x509.random_serial_number())
                        .not_valid_before(now - datetime.timedelta(days=1))
                        .not_valid_after(now + datetime.timedelta(days=30))
                        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                        .sign(self.ca_key, hashes.SHA256()))
        self.ca = self._write("ca.pem", self._pem(self.ca_cert))
        if os.geteuid() == 0:
            pw = pwd.getpwnam(RLTEST_USER)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)

    def _pem(self, obj):
        from cryptography.hazmat.primitives import serialization
        if hasattr(obj, "private_bytes"):
            return obj.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.TraditionalOpenSSL,
                                     serialization.NoEncryption())
        return obj.public_bytes(serialization.Encoding.PEM)

    def _write(self, name, data, mode=0o644):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, mode)
        if os.geteuid() == 0:
            pw = pwd.getpwnam(RLTEST_USER)
            os.chown(path, pw.pw_uid, pw.pw_gid)
        return path

    def make(self, name, dns=("localhost",), ips=("127.0.0.1",), expired=False, client=False):
        """Certificate NAME signed by this CA; returns (cert path, key path)."""
        import ipaddress
        x509, NameOID = self._x509, self._oid
        key = self._ec.generate_private_key(self._ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        start, end = ((now - datetime.timedelta(days=10), now - datetime.timedelta(days=1))
                      if expired else (now - datetime.timedelta(days=1),
                                       now + datetime.timedelta(days=30)))
        alt = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i))
                                                 for i in ips]
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
             .issuer_name(self.ca_cert.subject).public_key(key.public_key())
             .serial_number(x509.random_serial_number())
             .not_valid_before(start).not_valid_after(end))
        if alt and not client:
            b = b.add_extension(x509.SubjectAlternativeName(alt), False)
        cert = b.sign(self.ca_key, self._hashes.SHA256())
        return (self._write(name + ".pem", self._pem(cert)),
                self._write(name + ".key", self._pem(key), 0o600))

    def truststore(self):
        """The CA as a PKCS#12 trust store for a JVM (password "changeit")."""
        path = os.path.join(self.dir, "truststore.p12")
        if not os.path.exists(path):
            subprocess.run(["keytool", "-importcert", "-noprompt", "-alias", "ca",
                            "-file", self.ca, "-keystore", path, "-storetype", "PKCS12",
                            "-storepass", "changeit"], check=True, timeout=60,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return path

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class TLSSentinel(Sentinel):
    """A redis-sentinel that speaks only TLS, to clients and to the master."""

    def __init__(self, pki, master_port, **kw):
        super().__init__(master_port, **kw)
        cert, key = pki.make("sentinel-%d" % self.port)
        self.pki = pki
        with open(self.conf, "a") as f:
            f.write("port 0\ntls-port %d\ntls-cert-file %s\ntls-key-file %s\n"
                    "tls-ca-cert-file %s\ntls-auth-clients no\ntls-replication yes\n"
                    % (self.port, cert, key, pki.ca))

    def client(self, **kw):
        kw.setdefault("socket_timeout", 5)
        return redis.Redis(host="127.0.0.1", port=self.port, ssl=True,
                           ssl_ca_certs=self.pki.ca, **kw)

    @property
    def url(self):
        return "rediss://127.0.0.1:%d" % self.port


class TLSRedis(Redis):
    """A redis-server that speaks only TLS (no plain port)."""

    def __init__(self, pki, cert, key, auth_clients="no", client_verifies=True, **kw):
        """client_verifies=False: client() does not check the server's
        certificate (for a server whose certificate is meant to fail)."""
        super().__init__(**kw)
        self.pki = pki
        self.client_verifies = client_verifies
        self.args += ["--tls-port", str(self.port), "--tls-cert-file", cert,
                      "--tls-key-file", key, "--tls-ca-cert-file", pki.ca,
                      "--tls-auth-clients", auth_clients]
        self.client_cert = pki.make("redis-py-client", client=True) \
            if auth_clients != "no" else None

    def start(self, timeout=10):
        # the plain port is off: --port 0 comes after start()'s --port
        self.args += ["--port", "0"]
        return super().start(timeout)

    def client(self, **kw):
        kw.setdefault("socket_timeout", 5)
        if self.client_cert:
            kw.setdefault("ssl_certfile", self.client_cert[0])
            kw.setdefault("ssl_keyfile", self.client_cert[1])
        if not self.client_verifies:
            kw.setdefault("ssl_cert_reqs", "none")
        return redis.Redis(host="127.0.0.1", port=self.port, ssl=True,
                           ssl_ca_certs=self.pki.ca, **kw)

    @property
    def url(self):
        return "rediss://127.0.0.1:%d/0" % self.port


def tls_cluster_node(pki, **kw):
    """A cluster-enabled redis-server that speaks only TLS: to clients, on
    the cluster bus and for replication (no plain port at all).  Its
    certificate, from pki, names 127.0.0.1, the address CLUSTER SLOTS gives."""
    kw.setdefault("port", free_cluster_port())
    r = TLSRedis(pki, *pki.make("cluster-%d" % kw["port"]), **kw)
    r.args += _cluster_args(r) + ["--tls-cluster", "yes", "--tls-replication", "yes"]
    return r
