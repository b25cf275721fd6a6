"""A Redis behind an emulated network link, for network-fault tests.

The kernel here has network namespaces and TUN but no sch_netem (and no
loadable modules), so the link is emulated in user space:

    host namespace                         namespace rlnf-<pid>-<n>
    10.231.77.1  tun "rlh<pid>" <-- wire process --> tun "rln<pid>"  10.231.77.2
                                                     redis-server :6379

The wire process reads every IP packet from one TUN device and writes it to
the other one, after a delay, or drops it (random loss, or everything: a
silent partition).  `link_down()` takes the host end down instead: the route
disappears and the kernel answers "no route to host" at once.  A guard route
`unreachable 10.231.77.0/30` in the host namespace makes sure no packet for
these addresses ever follows the default route off the machine.

Everything is removed by close(): redis-server, the wire process (its TUN
devices vanish with it), the namespace and the guard route.  Both processes
also die with the Python process that started them (PR_SET_PDEATHSIG), and a
namespace left by a dead test run is deleted the next time.

Needs: iproute2 (ip), /dev/net/tun, root.
"""
import ctypes
import fcntl
import json
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque

HOST_ADDR = "10.231.77.1"
NS_ADDR = "10.231.77.2"
SUBNET = "10.231.77.0/30"
REDIS_PORT = 6379

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _ip(*args, check=True, ns=None):
    cmd = ["ip"] + (["netns", "exec", ns, "ip"] if ns else []) + list(args)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), r.stdout.strip()))
    return r


def unavailable():
    """Why this machine cannot run the emulated link, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, TUN devices)"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun"
    name = "rlnf-probe-%d" % os.getpid()
    r = _ip("netns", "add", name, check=False)
    if r.returncode != 0:
        return "cannot create a network namespace: " + r.stdout.strip()
    _ip("netns", "del", name, check=False)
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        return "cannot open /dev/net/tun: %s" % e
    return None


def _remove_stale():
    """Namespaces left by test runs whose process is gone."""
    r = _ip("netns", "list", check=False)
    for line in r.stdout.splitlines():
        m = re.match(r"(rlnf-(\d+)-\d+)\b", line)
        if m and not os.path.exists("/proc/%s" % m.group(2)):
            _ip("netns", "del", m.group(1), check=False)


class Link:
    """Namespace + emulated link + redis-server inside; see the module doc."""

    _count = 0

    def __init__(self, seed=None):
        Link._count += 1
        pid = os.getpid()
        self.ns = "rlnf-%d-%d" % (pid, Link._count)
        self.host_dev = "rlh%d" % pid
        self.ns_dev = "rln%d" % pid
        self.dir = tempfile.mkdtemp(prefix="rl-netns-")
        os.chmod(self.dir, 0o755)
        self.sock = os.path.join(self.dir, "redis.sock")
        self.seed = seed if seed is not None else int(time.time())
        self.wire = None
        self.redis = None
        self.made_ns = False
        self.made_route = False

    # -- setup / teardown ------------------------------------------------
    def start(self):
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self):
        _remove_stale()
        # guard first: from now on these addresses never leave the machine
        _ip("route", "replace", "unreachable", SUBNET, "metric", "4000")
        self.made_route = True
        _ip("netns", "add", self.ns)
        self.made_ns = True
        self.wire = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "_wire", self.host_dev, self.ns_dev,
             str(self.seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            preexec_fn=_die_with_parent)
        if self.wire.stdout.readline().strip() != "ready":
            raise RuntimeError("wire process did not start")
        _ip("link", "set", self.ns_dev, "netns", self.ns)
        _ip("addr", "add", HOST_ADDR, "peer", NS_ADDR, "dev", self.host_dev)
        _ip("link", "set", self.host_dev, "up")
        _ip("link", "set", "lo", "up", ns=self.ns)
        _ip("addr", "add", NS_ADDR, "peer", HOST_ADDR, "dev", self.ns_dev, ns=self.ns)
        _ip("link", "set", self.ns_dev, "up", ns=self.ns)
        self.redis = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, shutil.which("redis-server") or "redis-server",
             "--bind", NS_ADDR, "--port", str(REDIS_PORT), "--unixsocket", self.sock,
             "--unixsocketperm", "777", "--protected-mode", "no", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--daemonize", "no",
             "--logfile", os.path.join(self.dir, "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 10
        while True:
            if self.redis.poll() is not None:
                raise RuntimeError("redis-server in %s exited" % self.ns)
            try:
                if self.client(socket_timeout=0.5).ping():
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("redis-server in %s did not come up" % self.ns)
            time.sleep(0.02)
        # and over the link itself
        import redis as redis_py
        redis_py.Redis(host=NS_ADDR, port=REDIS_PORT, socket_timeout=2,
                       socket_connect_timeout=2).ping()

    def close(self):
        """Remove everything start() made; safe to call more than once."""
        for p in (self.redis, self.wire):
            if p is None or p.poll() is not None:
                continue
            if p is self.wire:
                try:
                    p.stdin.close()      # the wire exits on EOF
                except OSError:
                    pass
            else:
                p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self.wire is not None and self.wire.stdout is not None:
            self.wire.stdout.close()
        self.redis = self.wire = None
        if self.made_ns:
            _ip("netns", "del", self.ns, check=False)
            self.made_ns = False
        if self.made_route:
            _ip("route", "del", "unreachable", SUBNET, "metric", "4000", check=False)
            self.made_route = False
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- what tests use ----------------------------------------------------
    @property
    def url(self):
        return "redis://%s:%d/0" % (NS_ADDR, REDIS_PORT)

    @property
    def addr(self):
        return "%s:%d" % (NS_ADDR, REDIS_PORT)

    def client(self, **kw):
        """redis-py over the unix socket: out of band, never through the link."""
        import redis as redis_py
        kw.setdefault("socket_timeout", 5)
        return redis_py.Redis(unix_socket_path=self.sock, **kw)

    def set(self, delay=0.0, loss=0.0, loss_back=None, blackhole=False):
        """Every packet waits `delay` seconds in each direction; loss is the
        probability that one is dropped (host->redis; redis->host uses
        loss_back, default the same); blackhole drops everything."""
        cmd = {"delay": delay, "loss": loss,
               "loss_back": loss if loss_back is None else loss_back,
               "blackhole": blackhole}
        self.wire.stdin.write(json.dumps(cmd) + "\n")
        self.wire.stdin.flush()
        if self.wire.stdout.readline().strip() != "ok":
            raise RuntimeError("wire process did not apply %r" % cmd)

    def heal(self):
        self.set()
        self.link_up()

    def partition(self):
        self.set(blackhole=True)

    def link_down(self):
        _ip("link", "set", self.host_dev, "down")

    def link_up(self):
        _ip("link", "set", self.host_dev, "up")


# -- the wire process ------------------------------------------------------
def _tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    return fd


def _wire_main(host_dev, ns_dev, seed):
    _die_with_parent()
    rnd = random.Random(seed)
    a, b = _tun(host_dev), _tun(ns_dev)
    ctl = sys.stdin.fileno()
    state = {"delay": 0.0, "loss": 0.0, "loss_back": 0.0, "blackhole": False}
    # per direction: fd to write to, queue of (due, packet)
    queues = {a: (b, deque(), "loss"), b: (a, deque(), "loss_back")}
    buf = b""
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        for src, (dst, q, _) in queues.items():
            while q and q[0][0] <= now:
                _, pkt = q.popleft()
                try:
                    os.write(dst, pkt)
                except OSError:
                    pass        # that end is down: the packet is lost
        due = [q[0][0] for _, q, _ in queues.values() if q]
        timeout = max(0.0, min(due) - now) if due else 1.0
        readable, _, _ = select.select([a, b, ctl], [], [], timeout)
        for fd in readable:
            if fd == ctl:
                data = os.read(ctl, 4096)
                if not data:
                    return          # parent closed the pipe: done
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    state.update(json.loads(line))
                    print("ok", flush=True)
                continue
            _, q, loss_key = queues[fd]
            for _ in range(64):
                try:
                    pkt = os.read(fd, 65536)
                except (BlockingIOError, OSError):
                    break
                if state["blackhole"] or rnd.random() < state[loss_key]:
                    continue
                q.append((time.monotonic() + state["delay"], pkt))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "_wire":
        _wire_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit("internal helper of t/test_netfaults.py")
