"""Reply fuzz (issue 42): no Redis reply can crash a backend or the worker.

A proxy stands between PostgreSQL and a real Redis: it passes every command
on and every reply back, except the ones a rule arms, which it replaces by a
malformed reply: a wrong type, short and long arrays, nils, nested arrays,
huge and negative integers, the shape another operation answers with, a
frame cut short (then the connection closes).  Every SQL function that talks
to Redis, in every layout, gets each shape for each reply it reads, the
n-th command after it is armed for n up to the number of commands it sends
(counted on a normal run first); the worker gets them for its renewals, the
releases it settles for a backend, its keyspace subscriptions and their
notifications; a waiter gets them as pushes on its subscriber connection.

Each call ends with a result or an ERROR whose SQLSTATE is not an internal
error (class XX), within a bound; the session still works, a bystander
session and its open transaction survive (a crashed backend or worker makes
the postmaster restart them all), the worker processes are the same, and the
server log shows no crash.  src/connection.c (rl_reply_fits) is the one
check every reader makes before it reads a reply.
"""
import collections
import socket
import threading
import time

import psycopg2
import pytest

import testbed
from renewals import watchdog_pids
from test_hostile import array, bulk, integer
from testbed import TIME_SCALE as S

COMMAND_TIMEOUT_MS = 400
BOUND_S = 10 * S
NIL = b"$-1\r\n"
TRUNCATED = b"*3\r\n:1\r\n$5\r\nab"      # then the connection closes

SHAPES = {
    "integer": integer(1),
    "zero": integer(0),
    "negative": integer(-1),
    "huge-integer": integer(9223372036854775807),
    "min-integer": integer(-9223372036854775808),
    "status": b"+OK\r\n",
    "bulk": bulk("hash"),
    "nil": NIL,
    "nil-array": b"*-1\r\n",
    "empty-array": b"*0\r\n",
    "short-array": array(integer(1)),
    "long-array": array(*[integer(i) for i in (1, 2, 3, 4, 5)]),
    "grant-shape": array(integer(1), integer(7)),
    "wrongtype-shape": array(integer(-1), bulk("zset")),
    "three-integers": array(integer(1), integer(-1), integer(9223372036854775807)),
    "inspect-shape": array(bulk("string"), integer(5000), bulk("x")),
    "nils": array(NIL, NIL, NIL),
    "nested": array(array(integer(1), array(NIL)), array(array(bulk("x"))), array()),
    "huge-elements": array(integer(9223372036854775807), integer(-9223372036854775808),
                           bulk("9" * 40)),
    "message-shape": array(bulk("message"), integer(3), NIL),
    "truncated": TRUNCATED,
}
HANDSHAKE = {b"CLIENT", b"AUTH", b"SELECT", b"COMMAND", b"PING", b"HELLO"}
PUSH_PREFIXES = (b"*3\r\n$7\r\nmessage\r\n", b"*3\r\n$8\r\nsmessage\r\n")


# ----------------------------------------------------------------------
# The proxy
# ----------------------------------------------------------------------
def frame_end(buf, pos=0):
    """Offset just past the RESP2 frame at pos, or None while incomplete."""
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        return None
    kind, n = buf[pos:pos + 1], buf[pos + 1:nl]
    if kind in (b"+", b"-", b":"):
        return nl + 2
    n = int(n)
    if kind == b"$":
        end = nl + 2 + n + 2 if n >= 0 else nl + 2
        return end if len(buf) >= end else None
    p = nl + 2
    for _ in range(max(n, 0)):
        p = frame_end(buf, p)
        if p is None:
            return None
    return p


def is_worker(name):
    """Is this connection name (CLIENT SETNAME) a worker's?"""
    return b":worker" in name


class Rule:
    """Replace the reply of the nth command (counted from arming, handshake
    commands not counted) that a connection of `who` sends ("backend",
    "worker" or "any"), of the names in cmds if given; nth None only counts."""

    def __init__(self, shape=None, nth=1, who="backend", cmds=None):
        self.shape, self.nth, self.who, self.cmds = shape, nth, who, cmds
        self.seen = 0
        self.hits = 0
        self.argv = []

    def takes(self, name, argv):
        if is_worker(name) != (self.who == "worker") and self.who != "any":
            return False
        if argv[0].upper() not in (self.cmds or ()) and (
                self.cmds is not None or argv[0].upper() in HANDSHAKE):
            return False
        self.seen += 1
        self.argv.append(argv)
        if self.nth is not None and self.seen == self.nth:
            self.hits += 1
            return True
        return False


class Conn:
    def __init__(self, client, upstream):
        self.client, self.upstream = client, upstream
        self.name = b""
        self.owed = collections.deque()     # per reply expected: its replacement or None
        self.send_lock = threading.Lock()
        self.subscribed = False


class FuzzProxy:
    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.port = testbed.free_port()
        self.lock = threading.Lock()
        self.rules = []
        self.conns = set()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port))
        self.listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return "redis://127.0.0.1:%d/0" % self.port

    def arm(self, *rules):
        with self.lock:
            self.rules = list(rules)
        return rules

    def disarm(self):
        with self.lock:
            self.rules = []

    def inject(self, who, data):
        """Write data to every subscribed connection of who, between frames."""
        with self.lock:
            conns = [c for c in self.conns if c.subscribed and is_worker(c.name) == (who == "worker")]
        for c in conns:
            self._send(c, data)
        return len(conns)

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = Conn(client, upstream)
            with self.lock:
                self.conns.add(c)
            threading.Thread(target=self._commands, args=(c,), daemon=True).start()
            threading.Thread(target=self._replies, args=(c,), daemon=True).start()

    def _close(self, c):
        with self.lock:
            self.conns.discard(c)
        for s in (c.client, c.upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _send(self, c, data):
        with c.send_lock:
            try:
                c.client.sendall(data)
            except OSError:
                return
            if data.endswith(TRUNCATED):
                self._close(c)

    def _commands(self, c):
        buf = b""
        try:
            while True:
                data = c.client.recv(65536)
                if not data:
                    break
                buf += data
                while buf:
                    end = frame_end(buf)
                    if end is None:
                        break
                    frame, buf = buf[:end], buf[end:]
                    self._command(c, frame)
                    c.upstream.sendall(frame)
        except (OSError, ValueError):
            pass
        self._close(c)

    def _command(self, c, frame):
        argv, rest = [], frame[frame.find(b"\r\n") + 2:]
        while rest:
            nl = rest.find(b"\r\n")
            n = int(rest[1:nl])
            argv.append(rest[nl + 2:nl + 2 + n])
            rest = rest[nl + 2 + n + 2:]
        name = argv[0].upper()
        if name == b"CLIENT" and len(argv) > 2 and argv[1].upper() == b"SETNAME":
            c.name = argv[2]
        replacement = None
        with self.lock:
            for r in self.rules:
                if r.takes(c.name, argv) and replacement is None:
                    replacement = r.shape
        replies = len(argv) - 1 if name in (b"SUBSCRIBE", b"SSUBSCRIBE", b"UNSUBSCRIBE",
                                            b"SUNSUBSCRIBE") else 1
        if name in (b"SUBSCRIBE", b"SSUBSCRIBE"):
            c.subscribed = True
        c.owed.append(replacement)
        for _ in range(replies - 1):
            c.owed.append(None)

    def _replies(self, c):
        buf = b""
        try:
            while True:
                data = c.upstream.recv(65536)
                if not data:
                    break
                buf += data
                while buf:
                    end = frame_end(buf)
                    if end is None:
                        break
                    frame, buf = buf[:end], buf[end:]
                    replacement = None
                    if not (c.subscribed and frame.startswith(PUSH_PREFIXES)) and c.owed:
                        replacement = c.owed.popleft()
                    self._send(c, frame if replacement is None else replacement)
        except (OSError, ValueError):
            pass
        self._close(c)

    def stop(self):
        self.listener.close()
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            self._close(c)


# ----------------------------------------------------------------------
# Fixtures and checks
# ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def redis_srv():
    r = testbed.Redis(args=["--notify-keyspace-events", "Kgx"]).start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def proxy(redis_srv):
    p = FuzzProxy(redis_srv.port)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def pg(proxy):
    p = testbed.Postgres(conf={
        "redis_lock.url": proxy.url,
        "redis_lock.command_timeout": "%dms" % COMMAND_TIMEOUT_MS,
        "redis_lock.connect_timeout": "2s",
        "redis_lock.wait_timeout": "300ms",
    }).init().start().with_extension()
    yield p
    p.cleanup()


class World:
    """The server, the proxy, Redis, a bystander in an open transaction."""

    def __init__(self, pg, proxy, redis_srv):
        self.pg, self.proxy, self.rc = pg, proxy, redis_srv.client()
        self.log_start = len(pg.log_text())
        self.workers = sorted(watchdog_pids(pg.postmaster_pid()))
        self.bystander = pg.connect()
        self.bystander.autocommit = False
        self.bystander_pid = one(self.bystander, "SELECT pg_backend_pid()")

    def session(self, settings=()):
        conn = self.pg.connect()
        for s in settings:
            one(conn, s)
        return conn

    def reset(self):
        self.proxy.disarm()
        self.rc.flushall()

    def assert_alive(self, what):
        log = self.pg.log_text()[self.log_start:]
        for mark in ("terminated by signal", "TRAP:", "PANIC:"):
            assert mark not in log, "%s: %s" % (what, log[-3000:])
        assert one(self.bystander, "SELECT pg_backend_pid()") == self.bystander_pid, what
        assert sorted(watchdog_pids(self.pg.postmaster_pid())) == self.workers, what

    def close(self):
        self.proxy.disarm()
        self.bystander.close()


@pytest.fixture
def world(pg, proxy, redis_srv):
    w = World(pg, proxy, redis_srv)
    yield w
    w.close()


def one(conn, q):
    with conn.cursor() as cur:
        cur.execute(q)
        if cur.description is None:
            return None
        row = cur.fetchone()
        return row[0] if row else None


def run(conn, q):
    """(result, SQLSTATE or None, seconds) of q; a lost connection raises."""
    t0 = time.monotonic()
    try:
        return one(conn, q), None, time.monotonic() - t0
    except psycopg2.OperationalError as e:
        if e.pgcode is None:
            raise AssertionError("the backend died: %s" % e)
        return None, e.pgcode, time.monotonic() - t0
    except psycopg2.Error as e:
        return None, e.pgcode, time.monotonic() - t0


def assert_clear(case, result, code, seconds):
    assert seconds < BOUND_S, "%s took %.1fs" % (case, seconds)
    assert code is None or (len(code) == 5 and code[:2] != "XX"), \
        "%s ended in %s" % (case, code)


# ----------------------------------------------------------------------
# Every SQL function that talks to Redis
# ----------------------------------------------------------------------
RISSON = "SET redis_lock.protocol = 'redisson'"
FAIR = "SET redis_lock.protocol = 'redisson_fair'"
SEM_NPM = "SET redis_lock.semaphore_protocol = 'redis_semaphore'"
VERIFY = "SET redis_lock.verify_on_commit = on"
GRANT = "SELECT redis_lock_acquire('f', ttl => '60s')"
# name: (settings, setup run before arming, the call whose replies are fuzzed)
FUNCTIONS = {
    "acquire": ((), (), "SELECT redis_lock_acquire('f', ttl => '60s')"),
    "try_acquire": ((), (), "SELECT redis_lock_try_acquire('f', ttl => '60s')"),
    "acquire_busy": ((), ("busy",), "SELECT redis_lock_acquire('f', ttl => '60s', wait => '1s')"),
    "acquire_many": ((), (), "SELECT redis_lock_acquire_many('{f,g}', ttl => '60s')"),
    "release": ((), (GRANT,), "SELECT redis_lock_release('f')"),
    "release_all": ((), (GRANT,), "SELECT redis_lock_release_all()"),
    "release_many": ((), ("SELECT redis_lock_acquire_many('{f,g}', ttl => '60s')",),
                     "SELECT redis_lock_release_many('{f,g}')"),
    "extend": ((), (GRANT,), "SELECT redis_lock_extend('f', '30s')"),
    "status": ((), (GRANT,), "SELECT (redis_lock_status('f')).locked"),
    "status_free": ((), (), "SELECT (redis_lock_status('f')).locked"),
    "force_release": ((), (GRANT,), "SELECT redis_lock_force_release('f')"),
    "with_lock": ((), (), "SELECT redis_lock_with_lock('f', 'SELECT 1')"),
    "xact_commit": ((VERIFY,), ("BEGIN", "SELECT redis_lock_acquire('f', ttl => '60s', xact => true)"),
                    "COMMIT"),
    "redisson_acquire": ((RISSON,), (), "SELECT redis_lock_acquire('f', ttl => '60s')"),
    "redisson_release": ((RISSON,), (GRANT,), "SELECT redis_lock_release('f')"),
    "redisson_extend": ((RISSON,), (GRANT,), "SELECT redis_lock_extend('f', '30s')"),
    "redisson_status": ((RISSON,), (GRANT,), "SELECT (redis_lock_status('f')).locked"),
    "fair_acquire_busy": ((FAIR,), ("busy-hash",),
                          "SELECT redis_lock_acquire('f', ttl => '60s', wait => '1s')"),
    "fair_release": ((FAIR,), (GRANT,), "SELECT redis_lock_release('f')"),
    "read_acquire": ((), (), "SELECT redis_lock_acquire_read('f', ttl => '60s')"),
    "read_release": ((), ("SELECT redis_lock_acquire_read('f', ttl => '60s')",),
                     "SELECT redis_lock_release_read('f')"),
    "write_acquire": ((), (), "SELECT redis_lock_acquire_write('f', ttl => '60s')"),
    "write_release": ((), ("SELECT redis_lock_acquire_write('f', ttl => '60s')",),
                      "SELECT redis_lock_release_write('f')"),
    "sem_init": ((), (), "SELECT redis_semaphore_init('s', 3)"),
    "sem_acquire": ((), ("SELECT redis_semaphore_init('s', 3)",),
                    "SELECT redis_semaphore_acquire('s', 2, ttl => '60s')"),
    "sem_try_acquire": ((), ("SELECT redis_semaphore_init('s', 3)",),
                        "SELECT redis_semaphore_try_acquire('s', 2, ttl => '60s')"),
    "sem_release": ((), ("SELECT redis_semaphore_init('s', 3)",
                         "SELECT redis_semaphore_acquire('s', 2, ttl => '60s')"),
                    "SELECT redis_semaphore_release('s')"),
    "sem_extend": ((), ("SELECT redis_semaphore_init('s', 3)",
                        "SELECT redis_semaphore_acquire('s', 2, ttl => '60s')"),
                   "SELECT redis_semaphore_extend('s', '30s')"),
    "sem_status": ((), ("SELECT redis_semaphore_init('s', 3)",),
                   "SELECT (redis_semaphore_status('s')).taken"),
    "npm_acquire": ((SEM_NPM,), (), "SELECT redis_semaphore_acquire('s', 2, ttl => '60s', "
                    "max_permits => 3)"),
    "npm_release": ((SEM_NPM,), ("SELECT redis_semaphore_acquire('s', 2, ttl => '60s', "
                                 "max_permits => 3)",),
                    "SELECT redis_semaphore_release('s')"),
    "npm_extend": ((SEM_NPM,), ("SELECT redis_semaphore_acquire('s', 2, ttl => '60s', "
                                "max_permits => 3)",),
                   "SELECT redis_semaphore_extend('s', '30s')"),
    "npm_status": ((SEM_NPM,), (), "SELECT (redis_semaphore_status('s', 3)).taken"),
}
MAX_NTH = 4


def prepare(world, conn, steps):
    for s in steps:
        if s == "busy":         # another client's lock, gone within the wait
            world.rc.set("f", "someone-else", px=int(150 * S))
        elif s == "busy-hash":
            world.rc.hset("f", "someone-else:1", 1)
            world.rc.pexpire("f", int(150 * S))
        else:
            one(conn, s)


def commands_of(world, settings, steps, call):
    """How many commands (not the handshake's) call sends, on a normal run."""
    world.reset()
    conn = world.session(settings)
    try:
        prepare(world, conn, steps)
        counter, = world.proxy.arm(Rule(nth=None))
        result, code, seconds = run(conn, call)
        world.proxy.disarm()
        assert code is None, "%s failed on a normal run: %s" % (call, code)
        return counter.seen
    finally:
        conn.close()


@pytest.mark.parametrize("fn", list(FUNCTIONS))
def test_every_reply_of_a_sql_function(world, fn):
    settings, steps, call = FUNCTIONS[fn]
    n = commands_of(world, settings, steps, call)
    assert n >= 1, "%s sent nothing to Redis" % fn
    for nth in range(1, min(n, MAX_NTH) + 1):
        for shape, data in SHAPES.items():
            case = "%s, reply %d: %s" % (fn, nth, shape)
            world.reset()
            conn = world.session(settings)
            try:
                prepare(world, conn, steps)
                rule, = world.proxy.arm(Rule(data, nth))
                result, code, seconds = run(conn, call)
                world.proxy.disarm()
                assert_clear(case, result, code, seconds)
                if rule.hits == 0:      # a shape that ended the call early
                    continue
                if code is not None and conn.get_transaction_status() != 0:
                    conn.rollback()
                assert one(conn, "SELECT 1") == 1, case
            finally:
                conn.close()
            world.assert_alive(case)


@pytest.mark.parametrize("cmd", [b"CLIENT", b"COMMAND"])
def test_every_reply_of_a_handshake(world, cmd):
    """A new connection's CLIENT SETNAME, or its COMMAND INFO (asked by the
    script-free forms), gets each shape."""
    for shape, data in SHAPES.items():
        case = "%s: %s" % (cmd.decode(), shape)
        world.reset()
        conn = world.session(("SET redis_lock.scripting = off",) if cmd == b"COMMAND" else ())
        try:
            rule, = world.proxy.arm(Rule(data, 1, cmds={cmd}))
            assert_clear(case, *run(conn, "SELECT redis_lock_try_acquire('h', ttl => '60s')"))
            world.proxy.disarm()
            assert rule.hits == 1, case
            assert one(conn, "SELECT 1") == 1, case
        finally:
            conn.close()
        world.assert_alive(case)


# ----------------------------------------------------------------------
# The worker
# ----------------------------------------------------------------------
LEASE = ("SET redis_lock.lease_time = '900ms'",)


def worker_renews(world, conn, name):
    """Take lock name (renewed by the worker) and wait for its renewal."""
    counter, = world.proxy.arm(Rule(nth=None, who="worker", cmds={b"EVALSHA", b"EVAL"}))
    assert one(conn, "SELECT redis_lock_acquire('%s')" % name) > 0
    testbed.wait_until(lambda: any(name.encode() in a for a in list(counter.argv)),
                       10, 0.01, what="the worker to renew " + name)
    world.proxy.disarm()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_renewal_reply(world, shape):
    """The worker's renewal of a lock gets the shape; it goes on renewing."""
    world.reset()
    conn = world.session(LEASE)
    try:
        rule, = world.proxy.arm(Rule(SHAPES[shape], 1, who="worker"))
        assert one(conn, "SELECT redis_lock_acquire('w')") > 0
        testbed.wait_until(lambda: rule.hits > 0, 10, 0.01, what="a renewal")
        world.proxy.disarm()
        run(conn, "SELECT redis_lock_release_all()")
        worker_renews(world, conn, "after")
    finally:
        conn.close()
    world.assert_alive(shape)


def test_keyspace_notifications(world):
    """The worker's subscriber connection gets each shape as a push, then
    a real notification: the lock it watches is deleted, and its renewal
    finds that at once (the worker carries on)."""
    world.reset()
    conn = world.session(("SET redis_lock.lease_time = '3s'",))
    try:
        for i, (shape, data) in enumerate(SHAPES.items()):
            name = "k%d" % i
            assert one(conn, "SELECT redis_lock_acquire('%s')" % name) > 0
            testbed.wait_until(lambda: world.proxy.inject("worker", b"") > 0, 15, 0.05,
                               what="a worker's subscriber connection")
            assert world.proxy.inject("worker", data) > 0
            world.rc.delete(name)
            run(conn, "SELECT redis_lock_release_all()")
            world.assert_alive(shape)
        worker_renews(world, conn, "after")
    finally:
        conn.close()
    world.assert_alive("keyspace notifications")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_push_to_a_waiter(world, shape):
    """A backend waiting for a busy lock gets the shape as a push on its
    subscriber connection; its wait ends as a wait does."""
    world.reset()
    conn = world.session()
    try:
        world.rc.set("f", "someone-else", px=int(60000 * S))
        pid = one(conn, "SELECT pg_backend_pid()")
        result = {}

        def wait():
            result["r"] = run(conn, "SELECT redis_lock_acquire('f', wait => '3s', ttl => '60s')")

        t = threading.Thread(target=wait)
        t.start()
        testbed.wait_until(lambda: any(c.subscribed and c.name == b"redis_lock:%d:sub" % pid
                                       for c in list(world.proxy.conns)),
                           10, 0.01, what="the waiter to subscribe")
        assert world.proxy.inject("backend", SHAPES[shape]) > 0
        world.rc.delete("f")
        t.join(BOUND_S)
        assert not t.is_alive(), "the waiter did not return"
        assert_clear(shape, *result["r"])
        assert one(conn, "SELECT 1") == 1
    finally:
        conn.close()
    world.assert_alive(shape)
