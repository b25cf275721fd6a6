"""Security, issue 32 item 7: a hostile or spoofed Redis cannot blow up a
backend's or the watchdog worker's memory.

A fake Redis (test_hostile.FakeRedis, which answers like a real one until a
kind of command is armed) answers one command with a reply larger than any
reply redis_lock gets from a real server, sent as fast as the socket takes
it and then nothing more:

- a bulk string announced at 777 MB whose bytes keep coming (the bytes a
  reply not yet whole waits with in hiredis' buffer);
- wide arrays of empty arrays, 4 million values in 16 MB (each value a
  hiredis object of ~72 bytes);
- an array of 1 MB bulk strings, 100 MB (bytes already made into values).

Each must fail the operation promptly (long before command_timeout) with
08P01 and a message saying the reply was too large, the process's peak
memory (VmHWM) must grow by less than 64 MB, the connection must be closed
(the fake sees its write fail), the session must go on working, and what
the session believes must be what it would be after a lost reply: an
acquire whose grant was cut off is not held, and the grant it may have made
is deleted by the watchdog (a doubt).  The same for the watchdog worker's
renewals.  A reply made to stay just under both limits costs a bounded
amount too.  And a legitimately large reply (CLUSTER SLOTS of a Cluster
whose slots lie in 8192 ranges over masters with three replicas each)
still works.

The SQL runs as a role with LOGIN only, but for the Cluster case
(redis_lock.cluster is a superuser's setting).
"""
import time

import psycopg2
import pytest

import testbed
from renewals import watchdog_pids
from test_hostile import FakeRedis, array, bulk, integer
from testbed import TIME_SCALE as S

COMMAND_TIMEOUT_MS = 10000
# the fake sends this much at most, then nothing; an unbounded reader would
# hold it all until command_timeout
SEND_LIMIT = 256 * 1024 * 1024
# a refused reply must end the call long before command_timeout
PROMPT_S = 4.0 * S
HWM_GROWTH_LIMIT_KB = 64 * 1024
ROLE = "rl_plain"


# ----------------------------------------------------------------------
# What the fake sends
# ----------------------------------------------------------------------
def huge_bulk():
    """A bulk string announced at 777 MB, its bytes 1 MB at a time."""
    yield b"$777000000\r\n"
    chunk = b"x" * (1024 * 1024)
    while True:
        yield chunk


def wide_arrays():
    """400 arrays of 10 000 empty arrays each: 4 000 401 values in 16 MB."""
    yield b"*400\r\n"
    inner = b"*10000\r\n" + b"*0\r\n" * 10000
    for _ in range(400):
        yield inner


def many_strings():
    """100 bulk strings of 1 MB each in one array."""
    yield b"*100\r\n"
    one = b"$1048576\r\n" + b"y" * 1048576 + b"\r\n"
    for _ in range(100):
        yield one


SHAPES = {"huge-bulk": huge_bulk, "wide-arrays": wide_arrays, "many-strings": many_strings}


class Stream:
    """Armed reply: the chunks of gen, sent until the client stops taking
    them (cut: it closed the connection) or SEND_LIMIT is reached."""

    mode = "stream"

    def __init__(self, gen):
        self.gen = gen
        self.hits = 0
        self.sent = 0
        self.cut = False


class StreamingRedis(FakeRedis):
    """FakeRedis with one more way to answer an armed command: Stream."""

    def _handle(self, c, argv):
        kind = self._kind(argv)
        with self.lock:
            armed = self.armed.get(kind)
        if not isinstance(armed, Stream):
            return super()._handle(c, argv)
        with self.lock:
            self.commands.append((kind, argv))
            armed.hits += 1
            self._normal(kind, argv)    # what the server did: a grant, say
        try:
            for chunk in armed.gen():
                if armed.sent >= SEND_LIMIT:
                    break
                c.sendall(chunk)
                armed.sent += len(chunk)
        except OSError:
            armed.cut = True
            raise
        # (a reply cut short stays so: the next command gets its own reply)
        return True


# ----------------------------------------------------------------------
# Fixtures and helpers
# ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def fake():
    f = StreamingRedis()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def pg(fake):
    p = testbed.Postgres(conf={
        "redis_lock.url": fake.url,
        "redis_lock.command_timeout": "%dms" % COMMAND_TIMEOUT_MS,
        "redis_lock.connect_timeout": "2s",
        "redis_lock.wait_timeout": "300ms",
    }).init().start().with_extension()
    c = p.connect()
    c.cursor().execute("CREATE ROLE %s LOGIN" % ROLE)
    c.close()
    yield p
    p.cleanup()


def one(conn, q, args=None):
    with conn.cursor() as cur:
        cur.execute(q, args)
        if cur.description is None:
            return None
        row = cur.fetchone()
        return row[0] if row else None


def status_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s for pid %d" % (field, pid))


def held(conn):
    return one(conn, "SELECT coalesce(array_agg(lock_name ORDER BY lock_name), '{}') "
               "FROM redis_lock_held()")


def assert_alive(pg, log_start):
    log = pg.log_text()[log_start:]
    assert "terminated by signal" not in log, log[-3000:]
    assert "was terminated" not in log, log[-3000:]


def assert_too_large(err):
    assert err is not None, "the call succeeded"
    msg = err.diag.message_primary or ""
    assert err.pgcode == "08P01" and "sent a reply that is too large" in msg, \
        "%s: %s" % (err.pgcode, (err.pgerror or "").strip())


# ----------------------------------------------------------------------
# A backend
# ----------------------------------------------------------------------
@pytest.mark.parametrize("fn", ["acquire", "release"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_huge_reply_fails_the_call_promptly_with_bounded_memory(pg, fake, shape, fn):
    fake.reset()
    log_start = len(pg.log_text())
    conn = pg.connect(user=ROLE)
    try:
        pid = one(conn, "SELECT pg_backend_pid()")
        # connected, scripts loaded: what is measured is the reply alone
        assert one(conn, "SELECT redis_lock_try_acquire('warm', ttl => '5s')") is True
        assert one(conn, "SELECT redis_lock_release('warm')") is True
        if fn == "release":
            assert one(conn, "SELECT redis_lock_acquire('hl', ttl => '60s')") > 0
        hwm_before = status_kb(pid, "VmHWM")
        armed = Stream(SHAPES[shape])
        fake.arm(fn, armed)
        sql = ("SELECT redis_lock_acquire('hl', ttl => '60s')" if fn == "acquire"
               else "SELECT redis_lock_release('hl')")
        t0 = time.monotonic()
        err = None
        try:
            one(conn, sql)
        except psycopg2.Error as e:
            err = e
        elapsed = time.monotonic() - t0
        hwm_after = status_kb(pid, "VmHWM")
        print("\n%s/%s: %.2fs, VmHWM %d -> %d kB, %d bytes sent, %s"
              % (shape, fn, elapsed, hwm_before, hwm_after, armed.sent,
                 (err.pgerror or "").strip().replace("\n", " | ") if err else "no error"))

        assert armed.hits >= 1     # (the worker's release of the doubt may follow)
        assert_too_large(err)
        assert elapsed < PROMPT_S, "%.2fs" % elapsed
        assert hwm_after - hwm_before < HWM_GROWTH_LIMIT_KB, \
            "VmHWM grew by %d kB" % (hwm_after - hwm_before)
        # the backend closed the connection rather than reading on
        testbed.wait_until(lambda: armed.cut, 5, what="the fake to see its reply cut off")
        fake.disarm()
        assert armed.sent < SEND_LIMIT

        # what the session believes: not held; the grant (or the release's
        # outcome) is a doubt the watchdog settles with a compare-and-delete
        assert held(conn) == []
        testbed.wait_until(lambda: b"hl" not in fake.keys, 10,
                           what="the doubt to be settled (key deleted)")
        # and the session, on a fresh connection, works as before
        assert one(conn, "SELECT redis_lock_try_acquire('after', ttl => '5s')") is True
        assert one(conn, "SELECT redis_lock_release('after')") is True
        assert held(conn) == []
        assert_alive(pg, log_start)
    finally:
        fake.disarm()
        conn.close()


def just_under_the_limits():
    """260 000 bulk strings of 56 bytes: under both limits (263 168 values,
    16 809 984 bytes at the default max_locks), the most values and bytes of
    hiredis objects a reply can make before it is refused."""
    yield b"*260000\r\n"
    thousand = (b"$56\r\n" + b"z" * 56 + b"\r\n") * 1000
    for _ in range(260):
        yield thousand


def test_a_reply_just_under_the_limits_costs_a_bounded_amount(pg, fake):
    """Read whole and copied, then refused as no answer to the command: the
    peak is bounded by the limits (about 75 MB here; doc/reference.md)."""
    fake.reset()
    conn = pg.connect(user=ROLE)
    try:
        pid = one(conn, "SELECT pg_backend_pid()")
        assert one(conn, "SELECT redis_lock_try_acquire('warm', ttl => '5s')") is True
        assert one(conn, "SELECT redis_lock_release('warm')") is True
        hwm_before = status_kb(pid, "VmHWM")
        fake.arm("acquire", Stream(just_under_the_limits))
        with pytest.raises(psycopg2.Error) as e:
            one(conn, "SELECT redis_lock_acquire('hl', ttl => '60s')")
        fake.disarm()
        hwm_after = status_kb(pid, "VmHWM")
        print("\njust under the limits: VmHWM %d -> %d kB, %s"
              % (hwm_before, hwm_after, (e.value.pgerror or "").strip().replace("\n", " | ")))
        assert e.value.pgcode == "08P01"
        # about 73 MB measured; the rest is room for the larger chunks of an
        # assert-enabled server (MEMORY_CONTEXT_CHECKING)
        assert hwm_after - hwm_before < 110 * 1024, "VmHWM grew by %d kB" % (hwm_after - hwm_before)
        assert held(conn) == []
        assert one(conn, "SELECT redis_lock_try_acquire('after', ttl => '5s')") is True
        assert one(conn, "SELECT redis_lock_release('after')") is True
    finally:
        fake.disarm()
        conn.close()


# ----------------------------------------------------------------------
# The watchdog worker
# ----------------------------------------------------------------------
def test_a_huge_reply_to_a_renewal_leaves_the_watchdog_bounded_and_working(pg, fake):
    """The workers read replies with the same code: a renewal answered with
    a bulk string that never ends costs them a bounded amount of memory,
    the renewal fails (it is retried, by the slow-lane worker too), the
    workers stay up, and once the server answers normally the lock is
    renewed again and not lost."""
    fake.reset()
    log_start = len(pg.log_text())
    conn = pg.connect(user=ROLE)
    try:
        # a lease the worker renews (every lease_time / 3)
        one(conn, "SET redis_lock.lease_time = '6s'")
        assert one(conn, "SELECT redis_lock_acquire('wd')") > 0
        workers = sorted(watchdog_pids(pg.postmaster_pid()))
        assert len(workers) == 2, workers
        # the worker has renewed once (its connection and scripts are up)
        testbed.wait_until(lambda: any(k == "extend" for k, _ in fake.commands), 10,
                           what="a first renewal")
        hwm_before = {w: status_kb(w, "VmHWM") for w in workers}
        armed = Stream(huge_bulk)
        fake.arm("extend", armed)
        testbed.wait_until(lambda: armed.hits > 0, 10, what="the next renewal")
        # cut off, or all of it taken (and held until command_timeout)
        testbed.wait_until(lambda: armed.cut or armed.sent >= SEND_LIMIT, PROMPT_S / S,
                           what="the worker to cut the reply off or take all of it")
        hwm_after = {w: status_kb(w, "VmHWM") for w in workers}
        print("\nwatchdog: VmHWM %r -> %r kB, %d hostile replies, %d bytes sent, cut: %s"
              % (hwm_before, hwm_after, armed.hits, armed.sent, armed.cut))
        assert armed.cut and armed.sent < SEND_LIMIT
        for w in workers:
            # (earlier tests' doubts may have raised a worker's peak already)
            assert hwm_after[w] - hwm_before[w] < HWM_GROWTH_LIMIT_KB and \
                hwm_after[w] < 2 * HWM_GROWTH_LIMIT_KB, (w, hwm_before, hwm_after)
        testbed.wait_until(lambda: "sent a reply that is too large" in pg.log_text()[log_start:],
                           5, what="the worker's LOG line")
        fake.disarm()
        with fake.lock:
            seen = len(fake.commands)

        # renewed again, by the same workers, the lock never lost
        def renewed_again():
            with fake.lock:
                return any(k == "extend" for k, _ in fake.commands[seen:])
        testbed.wait_until(renewed_again, 10, what="a renewal after the hostile one")
        assert sorted(watchdog_pids(pg.postmaster_pid())) == workers
        assert one(conn, "SELECT lost FROM redis_lock_held() WHERE lock_name = 'wd'") is False
        assert one(conn, "SELECT redis_lock_release('wd')") is True
        assert_alive(pg, log_start)
    finally:
        fake.disarm()
        conn.close()


# ----------------------------------------------------------------------
# What is not refused
# ----------------------------------------------------------------------
def scattered_slots(port):
    """CLUSTER SLOTS of a Cluster whose 16384 slots lie in 8192 ranges of two,
    each served by a master (the fake) and three replicas, every node with
    its id and a host name (Redis 7's form): 253 953 values, about 4.5 MB.
    The largest reply redis_lock is documented to accept."""
    def node(p, i):
        return array(bulk("127.0.0.1"), integer(p), bulk("%040x" % i),
                     array(bulk("hostname"), bulk("node-%05d.redis.example.internal" % i)))
    parts = [b"*8192\r\n"]
    for s in range(8192):
        parts.append(array(integer(2 * s), integer(2 * s + 1), node(port, 0),
                           node(20000 + s % 1000, 1), node(21000 + s % 1000, 2),
                           node(22000 + s % 1000, 3)))
    return b"".join(parts)


def test_the_largest_legitimate_reply_still_works(pg, fake):
    fake.reset()
    reply = scattered_slots(fake.port)
    assert len(reply) < 16 * 1024 * 1024
    conn = pg.connect()     # a superuser: redis_lock.cluster is one's to set
    try:
        fake.arm("slots", Stream(lambda: iter([reply])))
        one(conn, "SET redis_lock.cluster = on")
        assert one(conn, "SELECT redis_lock_acquire('c', ttl => '5s')") > 0
        fake.disarm()
        assert held(conn) == ["c"]
        assert one(conn, "SELECT redis_lock_release('c')") is True
    finally:
        fake.disarm()
        conn.close()
