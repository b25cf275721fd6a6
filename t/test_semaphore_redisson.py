"""SQL sessions and the real Redisson share semaphores (issue 36), with
redis_lock.semaphore_protocol = 'redisson' (the default), both Redisson
lines (the latest 3.x and 4.x, wire-identical for semaphores):

* RPermitExpirableSemaphore: one limit across both sides; a release on one
  side wakes a waiter of the other by that waiter's own mechanism (Redisson
  by the count published on redisson_sc:{name}, SQL by the same channel);
  a lease that runs out on one side frees the permit for the other, not
  earlier; the SQL watchdog keeps a lease-less SQL permit past its lease,
  and a terminated backend gives it back; nobody releases another's permit.
* RSemaphore: the same count without ids, taken and given back by both.
* A stress run (test_stress_*): SQL sessions and Java threads loop on one
  semaphore of 3 permits with cancels and a terminated holder, while a
  monitor checks the limit at every sample.

The peer is t/interop/java (peers.JavaPeer; ops sem*, rsem*, semloop).
Hand-over latencies are printed (run with -s): medians of several."""
import os
import random
import signal
import statistics
import threading
import time

import psycopg2
import pytest

from checks import report_latency
from conftest import Session, wait_for_wait_event
from peers import (REDISSON_LINES, JavaError, JavaPeer, java_library_version,
                   redisson_name)
import testbed
from testbed import TIME_SCALE as S

WAKE_BOUND = testbed.WAKE_BOUND
INF = 922337203685477           # Redisson's score of a permit without a lease
ROUNDS = 5                      # hand-overs measured per direction
# the stress run's length (RL_SEM_STRESS_SECONDS shortens it for a dev run):
# the full minute on the newest line, a quarter of it on the older one,
# whose semaphores send the same bytes (the same scripts, keys and channel)
STRESS_SECONDS = float(os.environ.get("RL_SEM_STRESS_SECONDS", "60"))
STRESS_SECONDS_OLDER_LINE = STRESS_SECONDS / 4


@pytest.fixture(scope="module", params=REDISSON_LINES, ids=lambda l: "redisson" + l)
def java(request, redis_srv):
    peer = JavaPeer([redis_srv.port], line=request.param)
    peer.version = java_library_version(request.param, "redisson")
    # a fresh Redisson's first calls (connections, scripts) took over 1 s:
    # not in a measured hand-over
    assert peer.call("admin", "semset", "warm-up", 1) is True
    assert peer.call("admin", "semavail", "warm-up") == "1"
    yield peer
    peer.close()


def timeout_key(name):
    """Redisson's suffix rule: braces unless the name has a '{'."""
    return name + ":timeout" if "{" in name else "{%s}:timeout" % name


def channel(name):
    return redisson_name("redisson_sc", name)


def now_ms():
    return int(time.time() * 1000)


def wall(mono):
    """The wall-clock time (epoch s) of a time.monotonic() reading."""
    return mono + (time.time() - time.monotonic())


def taken(rc, name):
    """Permits whose lease runs now, both sides' (Redisson's expiry is the
    score, in Unix ms)."""
    return rc.zcount(timeout_key(name), "(%d" % now_ms(), "+inf")


def expiries(rc, name):
    return [int(s) for _, s in rc.zrange(timeout_key(name), 0, -1, withscores=True)]


def wait_for_subscriber(rc, name):
    testbed.wait_until(lambda: int(rc.execute_command("PUBSUB", "NUMSUB", channel(name))[1]) > 0,
                       10, 0.005, what="a subscriber on " + channel(name))


def sql_holds(s, name):
    """(permits, permit_ids) this session holds of name, or None."""
    return s.run("SELECT permits, permit_ids FROM redis_semaphores_held() "
                 "WHERE semaphore_name = %s", (name,))


def init_semaphore(java, rc, name, permits):
    assert java.call("admin", "semset", name, permits) is True
    assert rc.get(name) == str(permits).encode()


# ================================================================ one limit

def test_sql_and_java_holders_count_against_one_limit(java, sessions, rc):
    """Limit 2: one Java permit and one SQL permit fill it, whichever came
    first; a third is refused on both sides (SQL: false, or 55P03 after
    its wait; Java: null after its wait) until one side gives one back."""
    name = "sem-limit"
    a, b = sessions(), sessions()
    init_semaphore(java, rc, name, 2)
    # Java first
    ids = java.call("t1", "semacquire", name, 1, 0, 60000)
    assert ids != "null" and len(ids) == 32
    assert a.run("SELECT redis_semaphore_acquire(%s)", (name,)) is True
    (n, (sql_id,)) = sql_holds(a, name)
    assert n == 1 and len(sql_id) == 32 and sql_id != ids
    # both permits are in the one set, by their raw 16 bytes
    assert set(rc.zrange(timeout_key(name), 0, -1)) == {bytes.fromhex(ids), bytes.fromhex(sql_id)}
    assert rc.get(name) == b"0" and taken(rc, name) == 2
    assert b.run("SELECT redis_semaphore_try_acquire(%s)", (name,)) is False
    with pytest.raises(psycopg2.errors.LockNotAvailable, match="within 300ms"):
        b.run("SELECT redis_semaphore_acquire(%s, wait => '300ms')", (name,))
    assert java.call("t2", "semacquire", name, 1, 300, 60000) == "null"
    assert java.call("t2", "semavail", name) == "0"
    assert b.run("SELECT (available, taken) FROM redis_semaphore_status(%s)",
                 (name,)) == "(0,2)"
    # Java gives its permit back: SQL's third gets it, and Java is refused
    assert java.call("t1", "semrelease", name, ids) is True
    assert b.run("SELECT redis_semaphore_try_acquire(%s)", (name,)) is True
    assert java.call("t2", "semacquire", name, 1, 300, 60000) == "null"
    # the reverse: SQL first (two sessions), Java's third is refused until
    # SQL gives one back
    assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is True
    ids = java.call("t1", "semacquire", name, 1, 0, 60000)
    assert ids != "null"
    assert a.run("SELECT redis_semaphore_try_acquire(%s)", (name,)) is False
    assert b.run("SELECT redis_semaphore_release(%s)", (name,)) is True
    assert a.run("SELECT redis_semaphore_try_acquire(%s, permits => 2)", (name,)) is False
    assert a.run("SELECT redis_semaphore_try_acquire(%s)", (name,)) is True
    assert java.call("t2", "semacquire", name, 1, 0, 60000) == "null"
    assert java.call("t1", "semrelease", name, ids) is True
    assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is True
    assert rc.get(name) == b"2" and rc.zcard(timeout_key(name)) == 0


def test_sql_takes_several_permits_against_java(java, sessions, rc):
    """permits => 2 of 3 beside a Java permit: SQL's two fill the limit,
    Java's second is refused, and SQL's one release gives both back."""
    name = "sem-many"
    a = sessions()
    init_semaphore(java, rc, name, 3)
    ids = java.call("t1", "semacquire", name, 1, 0, 60000)
    assert a.run("SELECT redis_semaphore_acquire(%s, permits => 2)", (name,)) is True
    n, sql_ids = sql_holds(a, name)
    assert n == 2 and len(set(sql_ids)) == 2
    assert rc.get(name) == b"0" and taken(rc, name) == 3
    assert java.call("t2", "semacquire", name, 1, 200, 60000) == "null"
    assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is True
    assert rc.get(name) == b"2"
    both = java.call("t2", "semacquire", name, 2, 0, 60000)
    assert len(both.split(",")) == 2
    assert java.call("t2", "semrelease", name, both) is True
    assert java.call("t1", "semrelease", name, ids) is True
    assert rc.get(name) == b"3" and rc.zcard(timeout_key(name)) == 0


# ================================================================ hand-over

@pytest.mark.parametrize("name", ["sem-to-java", "{tenant:1}:sem"])
def test_sql_release_wakes_a_java_waiter(java, sessions, rc, name):
    """A Java thread blocked in tryAcquire(wait) behind a SQL permit with a
    30 s lease: its only timely wake-up is the count SQL's release publishes
    on redisson_sc:{name} (redisson_sc:name for a name with a hash tag).
    Median of ROUNDS hand-overs."""
    a = sessions()
    init_semaphore(java, rc, name, 1)
    latencies = []
    for _ in range(ROUNDS):
        assert a.run("SELECT redis_semaphore_acquire(%s)", (name,)) is True
        assert a.run("SELECT redis_key FROM redis_semaphores_held()") == name
        assert expiries(rc, name)[0] > now_ms() + 20000
        waiting = java.send("t1", "semacquire", name, 1, 20000, 60000)
        wait_for_subscriber(rc, name)
        time.sleep(0.05)                     # a window for a wrong grant
        assert not java.done(waiting)
        t0 = time.time()
        assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is True
        ids, at = java.result(waiting)
        assert ids != "null"
        latencies.append(at - t0)
        assert a.run("SELECT redis_semaphore_try_acquire(%s)", (name,)) is False
        assert java.call("t1", "semrelease", name, ids) is True
    median = statistics.median(latencies)
    report_latency("Redisson " + java.version,
                   "SQL redis_semaphore_release -> Java tryAcquire waiter (%s, median of %d)"
                   % (name, ROUNDS),
                   median)
    assert max(latencies) < WAKE_BOUND, latencies


def test_java_release_wakes_a_sql_waiter(java, sessions, rc):
    """A SQL session waiting in redis_semaphore_acquire behind a Java
    permit with a 60 s lease: Redisson's release publishes the new count
    on redisson_sc:{name}, which the SQL waiter listens to; its other
    wake-up, the expiry, is a minute away.  Median of ROUNDS."""
    name = "sem-to-sql"
    a, admin = sessions(), sessions()
    init_semaphore(java, rc, name, 1)
    latencies = []
    for _ in range(ROUNDS):
        ids = java.call("t1", "semacquire", name, 1, 0, 60000)
        assert ids != "null"
        a.start("SELECT redis_semaphore_acquire(%s, wait => '20s')", (name,))
        wait_for_wait_event(admin.conn, a.pid)
        time.sleep(0.05)
        assert a.thread.is_alive()
        t0 = time.monotonic()
        assert java.call("t1", "semrelease", name, ids) is True
        a.join()
        assert a.error is None and a.result is True
        latencies.append(a.finished_at - t0)
        assert java.call("t1", "semacquire", name, 1, 0, 60000) == "null"
        assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is True
    median = statistics.median(latencies)
    report_latency("Redisson " + java.version,
                   "Java release -> SQL redis_semaphore_acquire waiter (median of %d)" % ROUNDS,
                   median)
    assert max(latencies) < WAKE_BOUND, latencies


def test_a_semaphore_set_up_on_one_side_wakes_a_waiter_of_the_other(java, sessions, rc):
    """A semaphore nobody has set up has no permits: a SQL waiter waits
    until Redisson's trySetPermits publishes the count, and a Java waiter
    until redis_semaphore_init does."""
    a, admin = sessions(), sessions()
    a.start("SELECT redis_semaphore_acquire('sem-new-1', wait => '20s')")
    wait_for_wait_event(admin.conn, a.pid)
    assert a.thread.is_alive() and rc.exists("sem-new-1") == 0
    t0 = time.monotonic()
    assert java.call("t1", "semset", "sem-new-1", 1) is True
    a.join()
    assert a.error is None and a.result is True and a.finished_at - t0 < WAKE_BOUND
    assert a.run("SELECT redis_semaphore_release('sem-new-1')") is True
    waiting = java.send("t1", "semacquire", "sem-new-2", 1, 20000, 60000)
    wait_for_subscriber(rc, "sem-new-2")
    assert not java.done(waiting)
    t0 = time.time()
    assert admin.run("SELECT redis_semaphore_init('sem-new-2', 1)") is True
    ids, at = java.result(waiting)
    assert ids != "null" and at - t0 < WAKE_BOUND
    assert admin.run("SELECT redis_semaphore_init('sem-new-2', 5)") is False
    assert java.call("t1", "semrelease", "sem-new-2", ids) is True
    assert rc.get("sem-new-2") == b"1"


def test_a_transaction_permit_goes_back_at_commit_and_wakes_java(java, sessions, rc):
    """xact => true: the permit is given back when the transaction ends,
    which publishes like a release and wakes the Java waiter."""
    name = "sem-xact"
    a = sessions()
    init_semaphore(java, rc, name, 1)
    a.run("BEGIN")
    assert a.run("SELECT redis_semaphore_acquire(%s, xact => true)", (name,)) is True
    waiting = java.send("t1", "semacquire", name, 1, 20000, 60000)
    wait_for_subscriber(rc, name)
    time.sleep(0.05)
    assert not java.done(waiting)
    t0 = time.time()
    a.run("COMMIT")
    ids, at = java.result(waiting)
    assert ids != "null" and at - t0 < WAKE_BOUND
    assert a.run("SELECT count(*) FROM redis_semaphores_held()") == 0
    assert java.call("t1", "semrelease", name, ids) is True


# ================================================================ leases

def test_a_java_lease_that_runs_out_frees_the_permit_for_sql(java, sessions, rc):
    """Java takes the only permit with a 1 s lease, stretches it with
    updateLeaseTime to 2 s from then, and never gives it back: nothing is
    published when it runs out; the SQL waiter retries at the expiry each
    busy reply names (the first one is stale by then) and gets the permit
    at the stretched expiry, not earlier."""
    name = "sem-java-lease"
    a, admin = sessions(), sessions()
    init_semaphore(java, rc, name, 1)
    ids = java.call("t1", "semacquire", name, 1, 0, 1000)
    first, = expiries(rc, name)
    a.start("SELECT redis_semaphore_acquire(%s, wait => '10s')", (name,))
    wait_for_wait_event(admin.conn, a.pid)
    assert java.call("t1", "semlease", name, ids, 2000) is True
    expiry, = expiries(rc, name)
    assert expiry > first + 500
    a.join()
    assert a.error is None and a.result is True
    got = wall(a.finished_at)
    print("\n[Redisson %s] SQL got the permit %.1f ms after the Java lease ended"
          % (java.version, (got - expiry / 1000) * 1000))
    assert expiry / 1000 - 0.005 <= got < expiry / 1000 + WAKE_BOUND
    assert rc.zrange(timeout_key(name), 0, -1) == [bytes.fromhex(sql_holds(a, name)[1][0])]
    # Java's own release of its expired permit fails (Redisson's message)
    with pytest.raises(JavaError, match="IllegalArgumentException"):
        java.call("t1", "semrelease", name, ids)
    assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is True
    assert rc.get(name) == b"1"


def test_a_sql_lease_that_runs_out_frees_the_permit_for_java(java, sessions, rc):
    """ttl => '1s' has no watchdog: the permit is Java's at its expiry (the
    Java waiter's own retry at the nearest expiry), not before; the SQL
    session then learns it lost it (release: false with a WARNING)."""
    name = "sem-sql-lease"
    a = sessions()
    init_semaphore(java, rc, name, 1)
    assert a.run("SELECT redis_semaphore_acquire(%s, ttl => '1s')", (name,)) is True
    expiry, = expiries(rc, name)
    assert a.run("SELECT watchdog FROM redis_semaphores_held()") is False
    waiting = java.send("t1", "semacquire", name, 1, 10000, 60000)
    ids, at = java.result(waiting, timeout=15)
    assert ids != "null"
    print("\n[Redisson %s] Java got the permit %.1f ms after the SQL lease ended"
          % (java.version, (at - expiry / 1000) * 1000))
    assert expiry / 1000 - 0.005 <= at < expiry / 1000 + WAKE_BOUND
    a.conn.notices.clear()
    assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is False
    assert any("WARNING" in n for n in a.conn.notices), a.conn.notices
    assert rc.get(name) == b"0" and rc.zrange(timeout_key(name), 0, -1) == [bytes.fromhex(ids)]
    assert java.call("t1", "semrelease", name, ids) is True


def test_the_watchdog_keeps_a_sql_permit_and_a_terminated_backend_gives_it_back(
        java, sessions, rc):
    """ttl NULL with a 3 s lease: the watchdog renews it, so Java is refused
    well past the first lease; pg_terminate_backend of the holder gives the
    permit back, and the blocked Java waiter gets it promptly."""
    name = "sem-watchdog"
    a, admin = sessions(), sessions()
    init_semaphore(java, rc, name, 1)
    a.run("SET redis_lock.lease_time = '3s'")
    assert a.run("SELECT redis_semaphore_acquire(%s)", (name,)) is True
    assert a.run("SELECT watchdog FROM redis_semaphores_held()") is True
    first, = expiries(rc, name)
    assert first - now_ms() <= 3000
    end = time.monotonic() + 7.5            # two and a half leases
    while time.monotonic() < end:
        assert java.call("t1", "semacquire", name, 1, 0, 60000) == "null"
        assert taken(rc, name) == 1
        time.sleep(0.25)
    last, = expiries(rc, name)
    assert last > first + 4000, "the lease was not renewed (%d -> %d)" % (first, last)
    waiting = java.send("t1", "semacquire", name, 1, 20000, 60000)
    wait_for_subscriber(rc, name)
    t0 = time.time()
    assert admin.run("SELECT pg_terminate_backend(%s)", (a.pid,)) is True
    ids, at = java.result(waiting)
    assert ids != "null"
    report_latency("Redisson " + java.version,
                   "pg_terminate_backend(SQL holder) -> Java tryAcquire waiter", at - t0)
    assert at - t0 < WAKE_BOUND
    assert java.call("t1", "semrelease", name, ids) is True
    assert rc.get(name) == b"1" and rc.zcard(timeout_key(name)) == 0


def test_a_sql_release_never_frees_a_java_permit(java, sessions, rc):
    """SQL holds nothing, Java holds a permit: redis_semaphore_release says
    false with a WARNING and Redis is untouched; so is a SQL session whose
    permit is gone (never someone else's)."""
    name = "sem-not-mine"
    a = sessions()
    init_semaphore(java, rc, name, 2)
    ids = java.call("t1", "semacquire", name, 1, 0, 60000)
    before = (rc.get(name), rc.zrange(timeout_key(name), 0, -1, withscores=True))
    a.conn.notices.clear()
    assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is False
    assert any("WARNING" in n for n in a.conn.notices), a.conn.notices
    assert (rc.get(name), rc.zrange(timeout_key(name), 0, -1, withscores=True)) == before
    # nor does a second release of a permit SQL did hold
    assert a.run("SELECT redis_semaphore_acquire(%s)", (name,)) is True
    assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is True
    assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is False
    assert (rc.get(name), rc.zrange(timeout_key(name), 0, -1, withscores=True)) == before
    assert java.call("t1", "semrelease", name, ids) is True
    assert rc.get(name) == b"2"


# ================================================================ RSemaphore

def test_rsemaphore_and_sql_share_one_count(java, sessions, rc):
    """An RSemaphore of the same name takes from the count SQL takes from
    (it has no ids and no leases), and SQL's release, which publishes the
    new count on redisson_sc:{name}, wakes an RSemaphore waiter."""
    name = "rsem-shared"
    a, b = sessions(), sessions()
    assert java.call("t1", "rsemset", name, 2) is True
    assert java.call("t1", "rsemacquire", name, 1, 0) is True
    assert rc.get(name) == b"1" and rc.exists(timeout_key(name)) == 0
    assert a.run("SELECT redis_semaphore_acquire(%s)", (name,)) is True
    assert java.call("t1", "rsemavail", name) == "0"
    assert b.run("SELECT redis_semaphore_try_acquire(%s)", (name,)) is False
    assert java.call("t2", "rsemacquire", name, 1, 200) is False
    latencies = []
    for _ in range(ROUNDS):
        waiting = java.send("t2", "rsemacquire", name, 1, 20000)
        wait_for_subscriber(rc, name)
        time.sleep(0.05)
        assert not java.done(waiting)
        t0 = time.time()
        assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is True
        got, at = java.result(waiting)
        assert got is True
        latencies.append(at - t0)
        assert rc.get(name) == b"0"
        assert a.run("SELECT redis_semaphore_try_acquire(%s)", (name,)) is False
        assert java.call("t2", "rsemrelease", name, 1) is True
        assert a.run("SELECT redis_semaphore_try_acquire(%s)", (name,)) is True
    report_latency("Redisson " + java.version,
                   "SQL redis_semaphore_release -> Java RSemaphore waiter (median of %d)" % ROUNDS,
                   statistics.median(latencies))
    assert max(latencies) < WAKE_BOUND, latencies
    # SQL waits for the RSemaphore's release too
    waiting = b.start("SELECT redis_semaphore_acquire(%s, wait => '20s')", (name,))
    time.sleep(0.1)
    assert b.thread.is_alive()
    t0 = time.monotonic()
    assert java.call("t1", "rsemrelease", name, 1) is True
    waiting.join()
    assert b.error is None and b.result is True and b.finished_at - t0 < WAKE_BOUND
    assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is True
    assert b.run("SELECT redis_semaphore_release(%s)", (name,)) is True
    assert rc.get(name) == b"2" and rc.zcard(timeout_key(name)) == 0


def test_rsemaphore_after_a_sql_holder_crashed(java, pg, sessions, rc):
    """What a crashed SQL holder means to an RSemaphore: a SQL permit always
    has a lease in "{name}:timeout" (here ttl => '1s'; the watchdog's lease
    stops being renewed when the server crashes), but RSemaphore's acquire
    script only reads the count: it never puts an expired permit back, and
    nothing is published when a lease runs out.  A Java RSemaphore waiter
    therefore waits past the lease, until a script of the
    RPermitExpirableSemaphore kind runs: a SQL redis_semaphore_acquire or
    try_acquire (any session, even one that gets no permit), or an
    RPermitExpirableSemaphore client's call.  That script puts the permit
    back and publishes the new count, which wakes the waiter.
    redis_semaphore_status is read only: it counts the expired permit as
    available but puts nothing back.  (A backend that merely exits gives
    its permits back at exit, crashed or not: hence the SIGKILL, after
    which the postmaster restarts every backend and no exit code runs.)"""
    name = "rsem-crashed"
    a, admin = sessions(), sessions()
    assert java.call("t1", "rsemset", name, 1) is True
    assert a.run("SELECT redis_semaphore_acquire(%s, ttl => '1s')", (name,)) is True
    expiry, = expiries(rc, name)
    ready = pg.ready_count()
    os.kill(a.pid, signal.SIGKILL)              # no exit callback runs
    waiting = java.send("t2", "rsemacquire", name, 1, 30000)
    wait_for_subscriber(rc, name)
    pg.wait_reinitialized(ready)
    b = testbed.wait_until(lambda: try_session(pg), 30, 0.2, what="PostgreSQL back after the crash")
    admin.close()
    testbed.wait_until(lambda: now_ms() > expiry + 300, 5, what="the SQL lease to run out")
    assert not java.done(waiting), "RSemaphore took an expired permit by itself"
    assert rc.get(name) == b"0" and rc.zcard(timeout_key(name)) == 1
    # status: the expired permit counts as available, but stays in the set
    assert b.run("SELECT (initialized, available, taken) FROM redis_semaphore_status(%s)",
                 (name,)) == "(t,1,0)"
    time.sleep(0.2)
    assert not java.done(waiting)
    assert rc.get(name) == b"0" and rc.zcard(timeout_key(name)) == 1
    # an acquire that cannot be granted (2 of 1) still puts it back and
    # publishes the count: the RSemaphore waiter takes it
    t0 = time.time()
    assert b.run("SELECT redis_semaphore_try_acquire(%s, permits => 2)", (name,)) is False
    got, at = java.result(waiting)
    assert got is True and at - t0 < WAKE_BOUND
    report_latency("Redisson " + java.version,
                   "SQL acquire reclaiming an expired SQL permit -> Java RSemaphore waiter", at - t0)
    assert rc.get(name) == b"0" and rc.zcard(timeout_key(name)) == 0
    assert java.call("t2", "rsemrelease", name, 1) is True
    # the same with an RPermitExpirableSemaphore call (availablePermits)
    # putting back the permit of a SQL session stalled past its lease
    assert b.run("SELECT redis_semaphore_acquire(%s, ttl => '500ms')", (name,)) is True
    expiry, = expiries(rc, name)
    waiting = java.send("t2", "rsemacquire", name, 1, 30000)
    wait_for_subscriber(rc, name)
    testbed.wait_until(lambda: now_ms() > expiry + 300, 5, what="the SQL lease to run out")
    assert not java.done(waiting)
    java.call("t1", "semavail", name)
    got, at = java.result(waiting)
    assert got is True
    assert b.run("SELECT redis_semaphore_release(%s)", (name,)) is False      # lost
    assert java.call("t2", "rsemrelease", name, 1) is True
    assert rc.get(name) == b"1" and rc.zcard(timeout_key(name)) == 0
    b.close()


def try_session(pg):
    try:
        return Session(pg)
    except psycopg2.OperationalError:
        return None


# ================================================================ stress

class Monitor(threading.Thread):
    """Samples the semaphore atomically (MULTI: count, set size, permits
    whose lease runs) until stopped; the invariants are checked per sample."""

    def __init__(self, rc, name, limit):
        super().__init__(daemon=True)
        self.rc, self.name, self.limit = rc, name, limit
        self.stop = threading.Event()
        self.samples = 0
        self.peak = 0
        self.violations = []
        self.error = None

    def run(self):
        try:
            self.sample()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def sample(self):
        while not self.stop.is_set():
            p = self.rc.pipeline(transaction=True)
            p.get(self.name)
            p.zcard(timeout_key(self.name))
            p.zcount(timeout_key(self.name), "(%d" % now_ms(), "+inf")
            count, card, live = p.execute()
            count = int(count)
            self.samples += 1
            self.peak = max(self.peak, live)
            if live > self.limit or count < 0 or count + card != self.limit:
                self.violations.append((time.time(), count, card, live))
            time.sleep(0.002)


def sql_worker(pg, name, stop, stats, errors):
    """Loop: acquire (wait up to 200 ms), hold 1-8 ms, release; a cancel may
    land in either.  stats (this worker's own): its pid, permits taken,
    waits that ran out, cancels that landed."""
    s = Session(pg)
    stats["pid"] = s.pid
    try:
        while not stop.is_set():
            try:
                if not s.run("SELECT redis_semaphore_try_acquire(%s, wait => '200ms')", (name,)):
                    stats["timeouts"] += 1
                    continue
                stats["taken"] += 1
                s.run("SELECT pg_sleep(%s)", (random.uniform(0.001, 0.008),))
            except psycopg2.errors.QueryCanceled:
                stats["cancels"] += 1
            # whatever a cancel interrupted, give back what is held
            while True:
                try:
                    if s.run("SELECT count(*) FROM redis_semaphores_held()") > 0:
                        if not s.run("SELECT redis_semaphore_release(%s)", (name,)):
                            errors.append("a held permit was not released")
                    break
                except psycopg2.errors.QueryCanceled:
                    stats["cancels"] += 1
    except Exception as e:  # noqa: BLE001 - reported by the test
        errors.append(repr(e))
    finally:
        s.close()


@pytest.mark.serial  # 8 clients looping for a minute: a neighbour's load would slow the hand-overs
def test_stress_sql_and_java_never_exceed_the_limit(java, pg, sessions, rc, redis_srv):
    """3 permits, 4 SQL sessions and 4 Java threads looping acquire / hold
    1-8 ms / release for STRESS_SECONDS (a quarter of it on the older
    Redisson line), random pg_cancel_backend of the SQL
    sessions (waiting or holding), and one SQL holder terminated mid-hold;
    a monitor checks, per atomic sample, that at most 3 permits have a
    running lease and that count + set size stays 3.  At the end, all
    permits are back."""
    name, limit = "sem-stress", 3
    seconds = STRESS_SECONDS if java.line == REDISSON_LINES[-1] else STRESS_SECONDS_OLDER_LINE
    admin = sessions()
    init_semaphore(java, rc, name, limit)
    monitor = Monitor(redis_srv.client(), name, limit)
    monitor.start()
    stop = threading.Event()
    stats = [{"pid": None, "taken": 0, "timeouts": 0, "cancels": 0} for _ in range(4)]
    errors = []
    ms = int(seconds * 1000)
    loops = [java.send("j%d" % i, "semloop", name, ms, random.randint(1, 8), 10000)
             for i in range(4)]
    workers = [threading.Thread(target=sql_worker, args=(pg, name, stop, st, errors),
                                daemon=True) for st in stats]
    for w in workers:
        w.start()
    testbed.wait_until(lambda: all(st["pid"] for st in stats), 10, what="the SQL workers")
    pids = [st["pid"] for st in stats]
    victim = sessions()
    start = time.monotonic()
    killed = False
    cancels_sent = 0
    while time.monotonic() - start < seconds:
        time.sleep(random.uniform(0.05, 0.3))
        admin.run("SELECT pg_cancel_backend(%s)", (random.choice(pids),))
        cancels_sent += 1
        # half-way, a SQL holder is terminated while it holds its permit
        if not killed and time.monotonic() - start > seconds / 2:
            assert victim.run("SELECT redis_semaphore_acquire(%s, wait => '10s')", (name,))
            victim.start("SELECT pg_sleep(60)")
            testbed.wait_until(lambda: admin.run(
                "SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = %s",
                (victim.pid,)), 10, what="the victim to sleep")
            assert admin.run("SELECT pg_terminate_backend(%s)", (victim.pid,)) is True
            killed = True
    stop.set()
    java_taken = [int(java.result(rid, timeout=STRESS_SECONDS + 60)[0]) for rid in loops]
    for w in workers:
        w.join(30 * S)
        assert not w.is_alive(), "a SQL worker hangs"
    monitor.stop.set()
    monitor.join(5)
    assert monitor.error is None, monitor.error
    sql_taken = [st["taken"] for st in stats]
    print("\n[Redisson %s] stress %.0f s, %d permits: SQL %d acquisitions %s (%d waits ran "
          "out, %d cancels sent, %d landed), Java %d acquisitions %s; a holder terminated: %s; "
          "monitor: %d samples, at most %d held at once"
          % (java.version, seconds, limit, sum(sql_taken), sql_taken,
             sum(st["timeouts"] for st in stats), cancels_sent,
             sum(st["cancels"] for st in stats), sum(java_taken), java_taken, killed,
             monitor.samples, monitor.peak))
    assert errors == []
    assert killed
    assert monitor.violations == [], monitor.violations[:10]
    assert monitor.peak == limit
    assert all(n > 0 for n in sql_taken) and all(n > 0 for n in java_taken)
    # quiescent: every permit back (the terminated holder's too)
    testbed.wait_until(lambda: rc.get(name) == str(limit).encode(), 10,
                       what="every permit to be back")
    assert rc.zcard(timeout_key(name)) == 0



# ================================================================ Cluster

@pytest.fixture(scope="module")
def cluster():
    nodes = [testbed.cluster_node().start() for _ in range(3)]
    testbed.create_cluster(nodes)
    pg = testbed.Postgres(conf={"redis_lock.url": nodes[0].url, "redis_lock.cluster": "on"}
                          ).init().start().with_extension()
    yield nodes, pg
    pg.cleanup()
    for n in nodes:
        n.stop()


@pytest.mark.parametrize("line", REDISSON_LINES, ids=lambda l: "redisson" + l)
def test_cluster_sharded_pubsub_hands_permits_over_both_ways(cluster, line):
    """On a Redis 7 Cluster Redisson's semaphore waiters SSUBSCRIBE and its
    scripts SPUBLISH: with redis_lock.sharded_pubsub = on, SQL's release
    wakes a Java waiter and Java's release a SQL waiter."""
    nodes, pg = cluster
    peer = JavaPeer([n.port for n in nodes], line=line, mode="cluster")
    a, admin = Session(pg), Session(pg)
    try:
        version = java_library_version(line, "redisson")
        a.run("SET redis_lock.sharded_pubsub = on")
        name = "sem-cluster-" + line
        owner = testbed.slot_owner(nodes, name)[0].client()
        assert peer.call("c1", "semavail", name) == "0"          # warm-up, not measured
        assert peer.call("c1", "semset", name, 1) is True
        # Java -> SQL
        ids = peer.call("c1", "semacquire", name, 1, 0, 60000)
        assert ids != "null"
        a.start("SELECT redis_semaphore_acquire(%s, wait => '20s')", (name,))
        wait_for_wait_event(admin.conn, a.pid)
        t0 = time.monotonic()
        assert peer.call("c1", "semrelease", name, ids) is True
        a.join()
        assert a.error is None and a.result is True
        report_latency("Redisson " + version, "Cluster: Java release -> SQL semaphore waiter "
                       "(sharded)", a.finished_at - t0)
        assert a.finished_at - t0 < WAKE_BOUND
        # SQL -> Java
        waiting = peer.send("c2", "semacquire", name, 1, 20000, 60000)
        testbed.wait_until(lambda: int(owner.execute_command(
            "PUBSUB", "SHARDNUMSUB", channel(name))[1]) > 0, 10, 0.005,
            what="a sharded subscriber")
        t0 = time.time()
        assert a.run("SELECT redis_semaphore_release(%s)", (name,)) is True
        ids, at = peer.result(waiting)
        assert ids != "null"
        report_latency("Redisson " + version, "Cluster: SQL release -> Java semaphore waiter "
                       "(sharded)", at - t0)
        assert at - t0 < WAKE_BOUND
        assert peer.call("c2", "semrelease", name, ids) is True
        assert owner.get(name) == b"1"
    finally:
        a.close()
        admin.close()
        peer.close()
