"""SQL sessions and the real Java clients share locks, both ways:

* Redisson RLock / RFencedLock, the latest 3.x and the latest 4.x (every
  Redisson test runs once per line), against SQL with
  redis_lock.protocol = 'redisson': on one Redis, on a master with a replica
  (Redisson then follows each lock script with WAIT), and on a 3-master
  Cluster with Redisson's sharded pub/sub against redis_lock.sharded_pubsub.
* Jedis, hand-written SET NX PX + compare-and-delete, against the default
  'simple' protocol.

The peer is t/interop/java (peers.JavaPeer).  Hand-over latencies are
printed (run with -s) and bounded: the wake-ups Redisson publishes within
50 ms, the polled ones (Jedis) within the poll cap."""
import os
import signal
import threading
import time

import psycopg2
import pytest
import redis

from checks import report_latency
from conftest import Session, wait_for_wait_event
from renewals import watchdog_pids
from peers import (REDISSON_LINES, JavaError, JavaPeer, java_library_version,
                   redisson_name)
import testbed
from testbed import TIME_SCALE as S

WATCHDOG_MS = 1500          # Redisson's lockWatchdogTimeout: renewal every 500 ms
# A waiter woken within testbed.WAKE_BOUND was woken by the published
# release message: the alternatives are a SQL waiter's 1 s poll and the 30 s
# TTL a Java waiter would sleep on (a slow JVM on a loaded machine took
# 58-282 ms).
WAKE_BOUND = testbed.WAKE_BOUND


@pytest.fixture(scope="module", params=REDISSON_LINES, ids=lambda l: "redisson" + l)
def java(request, redis_srv):
    peer = JavaPeer([redis_srv.port], line=request.param, watchdog_ms=WATCHDOG_MS)
    peer.version = java_library_version(request.param, "redisson")
    yield peer
    peer.close()


def java_waiter_latency(peer, waiting, release):
    """release() (a SQL or Java call returning true) while the peer's request
    waiting blocks for the lock; seconds from the start of release() to the
    JVM holding it."""
    assert not peer.done(waiting)
    t0 = time.time()
    assert release() is True
    got, at = peer.result(waiting)
    assert got is True
    return at - t0


def wait_for_subscriber(rc, channel, sharded=False):
    def subscribed():
        if sharded:
            counts = rc.execute_command("PUBSUB", "SHARDNUMSUB", channel)
        else:
            counts = rc.execute_command("PUBSUB", "NUMSUB", channel)
        return int(counts[1]) > 0
    testbed.wait_until(subscribed, 10, what="a subscriber on " + channel)


# ================================================================ Redisson, one Redis

def test_redisson_taking_an_expired_lock_fails_the_sql_holders_statement(java, rsql, sessions, pg, rc):
    """Issue 34 with the real jar: the SQL holder's lease runs out (its
    watchdog worker stopped), Redisson takes the expired RLock, and once the
    worker runs again it finds another owner and the SQL statement fails
    with 40001; Redisson's hold is untouched."""
    if os.environ.get("RL_POSTGRES_BIN"):
        pytest.skip("the worker cannot be found by its title under valgrind")
    a, admin = rsql(), sessions()
    a.run("SET redis_lock.lease_time = '2s'")
    assert a.run("SELECT redis_lock_acquire('expiring') > 0")
    a.start("SELECT pg_sleep(60)")
    workers = watchdog_pids(pg.postmaster_pid())
    assert workers, "no watchdog worker"
    for w in workers:
        os.kill(w, signal.SIGSTOP)
    try:
        testbed.wait_until(lambda: not rc.exists("expiring"), 5, 0.02,
                           what="the SQL lease to run out")
        assert java.call("t1", "trylock", "expiring", "0", "60000") is True
    finally:
        for w in workers:
            os.kill(w, signal.SIGCONT)
    t0 = time.monotonic()
    a.join(5)
    print("\nSQL statement failed %.3f s after the worker resumed" % (time.monotonic() - t0))
    assert a.error is not None and a.error.pgcode == "40001", a.error
    assert java.call("t1", "held", "expiring") is True
    assert java.call("t1", "unlock", "expiring") is True
    admin.close()


def test_java_holder_excludes_sql_and_its_last_unlock_wakes_sql(java, rsql, sessions, rc):
    a, admin = rsql(), sessions()
    field = java.call("t1", "hello")
    assert java.call("t1", "lock", "orders") is True
    assert java.call("t1", "lock", "orders") is True           # reentrant
    assert java.call("t1", "count", "orders") == "2"
    assert rc.hgetall("orders") == {field.encode(): b"2"}
    assert 0 < rc.pttl("orders") <= WATCHDOG_MS
    # redis_lock_status shows Redisson's holder as the owner
    assert admin.run("SELECT locked, held_by_me, owner, redis_type "
                     "FROM redis_lock_status('orders')") == (True, False, field, "hash")
    # SQL neither gets it nor releases it
    assert a.run("SELECT redis_lock_try_acquire('orders')") is False
    assert a.run("SELECT redis_lock_release('orders')") is False
    assert rc.hgetall("orders") == {field.encode(): b"2"}
    a.start("SELECT redis_lock_acquire('orders', wait => '20s') > 0")
    wait_for_wait_event(admin.conn, a.pid)
    assert java.call("t1", "unlock", "orders") is True         # one hold left
    assert rc.hget("orders", field) == b"1"
    time.sleep(0.2)                                            # a window for a wrong wake-up
    assert a.thread.is_alive()
    released = time.monotonic()
    assert java.call("t1", "unlock", "orders") is True         # DEL + PUBLISH 0
    a.join()
    assert a.error is None and a.result is True
    report_latency("Redisson " + java.version, "Java unlock() -> SQL waiter",
                   a.finished_at - released)
    assert a.finished_at - released < WAKE_BOUND
    # and Java neither takes nor unlocks the SQL session's lock
    assert java.call("t1", "trylock", "orders", 0, -1) is False
    with pytest.raises(JavaError, match="IllegalMonitorStateException"):
        java.call("t1", "unlock", "orders")
    assert java.call("t1", "held", "orders") is False
    assert rc.hget("orders", field) is None and rc.hlen("orders") == 1
    assert a.run("SELECT redis_lock_release('orders')") is True


def test_redisson_readme_code_hands_over_both_ways(java, rsql, rc):
    """The README's Redisson quick start (exportOrders) behind a SQL holder,
    then in front of a SQL waiter; neither runs while the other holds."""
    a, b = rsql(), rsql()
    assert a.run("SELECT redis_lock_acquire('orders:export') > 0")
    sql_field, = rc.hkeys("orders:export")
    rid = java.send("svc", "export", 1000)
    wait_for_subscriber(rc, redisson_name("redisson_lock__channel", "orders:export"))
    assert not java.done(rid), "exportOrders ran while SQL held the lock"
    assert a.run("SELECT redis_lock_release('orders:export')") is True
    # Java takes it and exports for 1 s: SQL cannot have it meanwhile, and
    # gets it once exportOrders lets go
    testbed.wait_until(lambda: rc.hkeys("orders:export") not in ([], [sql_field]), 10, 0.005,
                       what="exportOrders to take the lock")
    assert b.run("SELECT redis_lock_try_acquire('orders:export')") is False
    assert b.run("SELECT redis_lock_acquire('orders:export', wait => '30s') > 0")
    assert java.result(rid, 10)[0] is True
    assert b.run("SELECT redis_lock_release('orders:export')") is True
    assert rc.exists("orders:export") == 0


@pytest.mark.parametrize("key", ["report", "{user:1}:cart"])
def test_sql_release_wakes_a_java_thread_blocked_in_lock(java, rsql, rc, key):
    """The Java waiter has a 30 s TTL to sleep on: only the published 0 on
    redisson_lock__channel (braces per Redisson's rule) wakes it in time."""
    a = rsql()
    assert a.run("SELECT redis_lock_acquire(%s, ttl => '30s') > 0", (key,))
    waiting = java.send("t2", "lock", key)
    wait_for_subscriber(rc, redisson_name("redisson_lock__channel", key))
    latency = java_waiter_latency(java, waiting, lambda: a.run(
        "SELECT redis_lock_release(%s)", (key,)))
    report_latency("Redisson " + java.version, "SQL release -> Java lock() waiter", latency)
    assert latency < WAKE_BOUND
    assert java.call("t2", "held", key) is True
    assert java.call("t2", "unlock", key) is True


def test_lease_time_and_try_lock_with_a_lease(java, rsql, rc):
    a = rsql()
    # lock(leaseTime): no watchdog, the lock just expires; a SQL waiter
    # gets it then (nothing is published on expiry: it polls)
    assert java.call("t3", "lock", "lease", 800) is True
    assert 0 < rc.pttl("lease") <= 800
    t0 = time.monotonic()
    assert a.run("SELECT redis_lock_acquire('lease', wait => '5s') > 0") is True
    assert 0.3 < time.monotonic() - t0 < 1.5
    # tryLock(wait, lease): gives up while SQL holds, ...
    assert java.call("t3", "trylock", "lease", 100, 10000) is False
    # ... and gets it with its own lease once SQL releases
    waiting = java.send("t3", "trylock", "lease", 10000, 10000)
    wait_for_subscriber(rc, "redisson_lock__channel:{lease}")
    assert a.run("SELECT redis_lock_release('lease')") is True
    assert java.result(waiting)[0] is True
    assert 9000 < rc.pttl("lease") <= 10000
    assert java.call("t3", "unlock", "lease") is True


def test_watchdog_renewal_from_both_sides(java, rsql, rc):
    a = rsql()
    # Java's watchdog keeps its lock past three leases while SQL is refused
    assert java.call("t4", "lock", "batch") is True
    renewals, last = 0, rc.pttl("batch")
    t_end = time.monotonic() + 3 * WATCHDOG_MS / 1000
    while time.monotonic() < t_end:
        pttl = rc.pttl("batch")
        assert pttl > 0
        renewals += pttl > last + 100
        last = pttl
        time.sleep(0.02)
    assert renewals >= 3
    assert a.run("SELECT redis_lock_try_acquire('batch')") is False
    assert java.call("t4", "unlock", "batch") is True
    # SQL's watchdog keeps its lock past three leases while Java is refused
    a.run("SET redis_lock.lease_time = '1500ms'")
    assert a.run("SELECT redis_lock_acquire('batch') > 0") is True
    t_end = time.monotonic() + 4.5
    while time.monotonic() < t_end:
        assert rc.pttl("batch") > 0
        time.sleep(0.05)
    assert java.call("t4", "trylock", "batch", 0, -1) is False
    assert a.run("SELECT redis_lock_release('batch')") is True


def test_force_unlock_both_ways(java, rsql, sessions, rc):
    admin = rsql()
    # redis_lock_force_release on a Java lock wakes a Java thread blocked in lock()
    assert java.call("t5a", "lock", "stuck") is True
    waiting = java.send("t5b", "lock", "stuck")
    wait_for_subscriber(rc, "redisson_lock__channel:{stuck}")
    latency = java_waiter_latency(java, waiting, lambda: admin.run(
        "SELECT redis_lock_force_release('stuck')"))
    report_latency("Redisson " + java.version, "SQL force_release -> Java lock() waiter", latency)
    assert latency < WAKE_BOUND
    with pytest.raises(JavaError, match="IllegalMonitorStateException"):
        java.call("t5a", "unlock", "stuck")                   # it was taken from t5a
    assert java.call("t5b", "unlock", "stuck") is True
    # Java's forceUnlock() on a SQL lock: the session finds it lost
    a = rsql()
    assert a.run("SELECT redis_lock_acquire('stuck', ttl => '30s') > 0")
    assert java.call("t5a", "forceunlock", "stuck") is True
    assert rc.exists("stuck") == 0
    assert a.run("SELECT redis_lock_release('stuck')") is False
    assert any("no longer held" in n or "lost" in n for n in a.conn.notices), a.conn.notices


def test_fencing_tokens_form_one_sequence_with_rfencedlock(java, rsql, rc):
    """With redis_lock.redisson_token_counter on, SQL counts RFencedLock's
    own counter too: one sequence with lockAndGetToken().  Java's first
    INCR starts it at 1; SQL's first grant raises it to the slot's
    sequence (started at the server clock), and from there both sides
    count one by one."""
    a = rsql()
    a.run("SET redis_lock.redisson_token_counter = on")
    tokens = []
    for turn in range(3):
        tokens.append(int(java.call("t6", "fenced", "fenced")))
        assert java.call("t6", "unlock", "fenced") is True
        tokens.append(a.run("SELECT redis_lock_acquire('fenced', ttl => '10s')"))
        assert a.run("SELECT redis_lock_release('fenced')") is True
    assert tokens[0] == 1
    assert tokens[1] > 10 ** 15
    assert tokens[1:] == list(range(tokens[1], tokens[1] + 5))
    assert int(rc.get("redisson_lock_token:{fenced}")) == tokens[-1]
    assert rc.ttl("redisson_lock_token:{fenced}") == -1


def test_sql_tokens_by_default_leave_no_key_per_name(java, rsql, rc):
    """The default: SQL's tokens come from the slot's fence counter, and no
    redisson_lock_token:{name} is made; Java's RFencedLock keeps its own."""
    a = rsql()
    names = ["plain%d" % i for i in range(20)]
    for n in names:
        assert a.run("SELECT redis_lock_acquire(%s, ttl => '10s') > 0", (n,)) is True
        assert a.run("SELECT redis_lock_release(%s)", (n,)) is True
    assert not rc.keys("redisson_lock_token:*")
    assert all(k.startswith(b"redis_lock:fence:{") for k in rc.keys("*"))
    # a Java RLock taken after SQL's is unaffected, and an RFencedLock still
    # counts its own counter from 1
    assert java.call("t8", "lock", names[0]) is True
    assert java.call("t8", "unlock", names[0]) is True
    assert int(java.call("t8", "fenced", names[1])) == 1
    assert java.call("t8", "unlock", names[1]) is True


def test_mixed_layouts_fail_safe_with_a_real_rlock(java, sessions, rc):
    simple = sessions()
    field = java.call("t7", "hello")
    assert java.call("t7", "lock", "mixed") is True
    with pytest.raises(psycopg2.errors.WrongObjectType) as ei:
        simple.run("SELECT redis_lock_acquire('mixed')")
    assert 'holds a hash, not a lock of protocol "simple"' in str(ei.value)
    with pytest.raises(psycopg2.errors.WrongObjectType):
        simple.run("SELECT redis_lock_force_release('mixed')")
    # nor is a Redisson RLock taken as a read-write lock
    with pytest.raises(psycopg2.errors.WrongObjectType):
        simple.run("SELECT redis_lock_acquire_read('mixed')")
    assert rc.hgetall("mixed") == {field.encode(): b"1"}
    assert java.call("t7", "unlock", "mixed") is True


# ================================================================ Redisson RReadWriteLock

def rw_timeout_keys(rc, name):
    return sorted(rc.scan_iter("{%s}:*:rwlock_timeout:*" % name))


def test_java_and_sql_readers_share_and_exclude_writers_both_ways(java, sessions, rc):
    a, b = sessions(), sessions()
    field = java.call("r1", "hello")
    assert java.call("r1", "rwlock", "read", "catalog") is True
    assert a.run("SELECT redis_lock_acquire_read('catalog')") is True
    assert rc.hget("catalog", "mode") == b"read"
    assert rc.hget("catalog", field) == b"1"
    assert len(rw_timeout_keys(rc, "catalog")) == 2          # one per reader
    # redis_lock_status takes Redisson's read-write hash for a lock
    locked, owner = b.run("SELECT locked, owner FROM redis_lock_status('catalog')")
    assert locked is True and owner in [f.decode() for f in rc.hkeys("catalog") if f != b"mode"]
    # neither side's writer gets in while the other side reads
    assert b.run("SELECT redis_lock_try_acquire_write('catalog', wait => '100ms')") is False
    assert java.call("w1", "rwtrylock", "write", "catalog", 100, -1) is False
    # Java's read unlock leaves SQL's hold and its TTL alone
    assert java.call("r1", "rwunlock", "read", "catalog") is True
    assert rc.hget("catalog", "mode") == b"read" and rc.hlen("catalog") == 2
    assert rc.pttl("catalog") > 0
    assert java.call("w1", "rwtrylock", "write", "catalog", 100, -1) is False
    assert a.run("SELECT redis_lock_release_read('catalog')") is True
    assert rc.exists("catalog") == 0 and rw_timeout_keys(rc, "catalog") == []
    # a Java writer excludes SQL readers and writers; SQL cannot release it
    assert java.call("w1", "rwlock", "write", "catalog") is True
    assert b.run("SELECT locked, owner FROM redis_lock_status('catalog')") == \
        (True, java.call("w1", "hello") + ":write")
    assert a.run("SELECT redis_lock_try_acquire_read('catalog', wait => '100ms')") is False
    assert a.run("SELECT redis_lock_try_acquire_write('catalog')") is False
    assert a.run("SELECT redis_lock_release_write('catalog')") is False
    assert rc.hget("catalog", "mode") == b"write"
    assert java.call("w1", "rwunlock", "write", "catalog") is True
    # and Java cannot release SQL's holds
    assert a.run("SELECT redis_lock_acquire_write('catalog')") is True
    with pytest.raises(JavaError, match="IllegalMonitorStateException"):
        java.call("w1", "rwunlock", "write", "catalog")
    assert rc.hget("catalog", "mode") == b"write"
    assert a.run("SELECT redis_lock_release_write('catalog')") is True


def test_last_java_read_unlock_wakes_a_sql_writer_and_vice_versa(java, sessions, rc):
    w, admin = sessions(), sessions()
    assert java.call("r2", "rwlock", "read", "schema") is True
    assert java.call("r3", "rwlock", "read", "schema") is True
    w.start("SELECT redis_lock_acquire_write('schema', wait => '20s')")
    wait_for_wait_event(admin.conn, w.pid)
    assert java.call("r2", "rwunlock", "read", "schema") is True
    time.sleep(0.2)                                            # a window for a wrong grant
    assert w.thread.is_alive()
    released = time.monotonic()
    assert java.call("r3", "rwunlock", "read", "schema") is True   # DEL + PUBLISH 0
    w.join()
    assert w.error is None and w.result is True
    report_latency("Redisson " + java.version, "RReadWriteLock: last Java read unlock -> SQL writer",
                   w.finished_at - released)
    assert w.finished_at - released < WAKE_BOUND
    # SQL write release -> a Java reader blocked in lock() (PUBLISH 1)
    waiting = java.send("r2", "rwlock", "read", "schema")
    wait_for_subscriber(rc, "redisson_rwlock:{schema}")
    latency = java_waiter_latency(java, waiting, lambda: w.run(
        "SELECT redis_lock_release_write('schema')"))
    report_latency("Redisson " + java.version, "RReadWriteLock: SQL write release -> Java reader",
                   latency)
    assert latency < WAKE_BOUND
    # SQL read release -> a Java writer blocked in lock()
    assert w.run("SELECT redis_lock_acquire_read('schema')") is True
    assert java.call("r2", "rwunlock", "read", "schema") is True
    waiting = java.send("w2", "rwlock", "write", "schema")
    wait_for_subscriber(rc, "redisson_rwlock:{schema}")
    latency = java_waiter_latency(java, waiting, lambda: w.run(
        "SELECT redis_lock_release_read('schema')"))
    report_latency("Redisson " + java.version, "RReadWriteLock: SQL read release -> Java writer",
                   latency)
    assert latency < WAKE_BOUND
    # Java write unlock -> a SQL reader
    w.start("SELECT redis_lock_acquire_read('schema', wait => '20s')")
    wait_for_wait_event(admin.conn, w.pid)
    released = time.monotonic()
    assert java.call("w2", "rwunlock", "write", "schema") is True
    w.join()
    assert w.error is None and w.result is True
    report_latency("Redisson " + java.version, "RReadWriteLock: Java write unlock -> SQL reader",
                   w.finished_at - released)
    assert w.finished_at - released < WAKE_BOUND
    assert w.run("SELECT redis_lock_release_read('schema')") is True


def test_rw_watchdog_renewal_seen_from_both_sides(java, sessions, rc):
    a = sessions()
    a.run("SET redis_lock.lease_time = '1500ms'")
    field = java.call("r4", "hello")
    assert java.call("r4", "rwlock", "read", "nightly-rw") is True
    assert a.run("SELECT redis_lock_acquire_read('nightly-rw')") is True
    keys = rw_timeout_keys(rc, "nightly-rw")
    (java_key,) = [k for k in keys if field.encode() in k]
    (sql_key,) = [k for k in keys if k != java_key]
    # both watchdogs renew their own timeout key, and the hash lives on
    t_end = time.monotonic() + 3 * WATCHDOG_MS / 1000
    renewed = {java_key: 0, sql_key: 0}
    last = {k: rc.pttl(k) for k in renewed}
    while time.monotonic() < t_end:
        assert rc.pttl("nightly-rw") > 0
        for k in renewed:
            pttl = rc.pttl(k)
            assert pttl > 0, k
            renewed[k] += pttl > last[k] + 100
            last[k] = pttl
        time.sleep(0.02)
    assert renewed[java_key] >= 3 and renewed[sql_key] >= 3, renewed
    assert java.call("w4", "rwtrylock", "write", "nightly-rw", 0, -1) is False
    assert java.call("r4", "rwunlock", "read", "nightly-rw") is True
    # SQL alone keeps it past more leases; Java's writer stays out
    time.sleep(2.0)
    assert rc.hget("nightly-rw", "mode") == b"read"
    assert java.call("w4", "rwtrylock", "write", "nightly-rw", 0, -1) is False
    assert a.run("SELECT redis_lock_release_read('nightly-rw')") is True
    assert java.call("w4", "rwtrylock", "write", "nightly-rw", 0, -1) is True
    assert java.call("w4", "rwunlock", "write", "nightly-rw") is True


def test_java_downgrade_and_force_unlock_of_a_rw_lock(java, sessions, rc):
    a, admin = sessions(), sessions()
    # a Java writer that also reads, then drops the write hold: SQL readers
    # may join, SQL writers may not
    assert java.call("w5", "rwlock", "write", "ledger-rw") is True
    assert java.call("w5", "rwlock", "read", "ledger-rw") is True
    assert java.call("w5", "rwunlock", "write", "ledger-rw") is True
    assert rc.hget("ledger-rw", "mode") == b"read"
    assert a.run("SELECT redis_lock_try_acquire_write('ledger-rw')") is False
    assert a.run("SELECT redis_lock_acquire_read('ledger-rw')") is True
    assert java.call("w5", "rwunlock", "read", "ledger-rw") is True
    assert a.run("SELECT redis_lock_release_read('ledger-rw')") is True
    assert rc.exists("ledger-rw") == 0
    # redis_lock_force_release wakes a Java thread blocked on a stuck writer
    assert java.call("w6", "rwlock", "write", "ledger-rw") is True
    waiting = java.send("r6", "rwlock", "read", "ledger-rw")
    wait_for_subscriber(rc, "redisson_rwlock:{ledger-rw}")
    latency = java_waiter_latency(java, waiting, lambda: admin.run(
        "SELECT redis_lock_force_release('ledger-rw')"))
    assert latency < WAKE_BOUND
    assert java.call("r6", "rwunlock", "read", "ledger-rw") is True
    # Java's forceUnlock() of a SQL writer: the session finds its hold lost
    assert a.run("SELECT redis_lock_acquire_write('ledger-rw', ttl => '30s')") is True
    assert java.call("w6", "rwforceunlock", "write", "ledger-rw") is True
    assert a.run("SELECT redis_lock_release_write('ledger-rw')") is False
    assert any("was lost" in n for n in a.conn.notices), a.conn.notices


# ================================================================ Redisson, non-reentrant

@pytest.mark.parametrize("kind,protocol", [("lock", "redisson"), ("fairlock", "redisson_fair")],
                         ids=["RLock", "RFairLock"])
def test_non_reentrant_locks_exclude_and_hand_over_both_ways(java, sessions, rc, kind, protocol):
    """Redisson 4.4+'s getNonReentrantLock / getNonReentrantFairLock write
    the hash of RLock / RFairLock (one field, count 1) and refuse a second
    hold by the same thread; against SQL under redis_lock.protocol
    'redisson' / 'redisson_fair' they exclude and hand over both ways like
    the reentrant ones.  Redisson 3.x has neither method."""
    if java.line == "3":
        with pytest.raises(JavaError, match="NoSuchMethodException"):
            java.call("n1", "nrlock", kind, "nr-absent")
        pytest.skip("Redisson %s has no non-reentrant locks (4.4+)" % java.version)
    key = "nr-" + kind
    a, admin = sessions(), sessions()
    a.run("SET redis_lock.protocol = %s", (protocol,))
    field = java.call("n1", "hello")
    assert java.call("n1", "nrlock", kind, key) is True
    assert rc.hgetall(key) == {field.encode(): b"1"}
    assert 0 < rc.pttl(key) <= WATCHDOG_MS
    # not reentrant: the same thread's second lock fails, the hold stays 1
    with pytest.raises(JavaError, match="IllegalMonitorStateException.*is non-reentrant"):
        java.call("n1", "nrtrylock", kind, key, 0, -1)
    assert rc.hgetall(key) == {field.encode(): b"1"}
    assert admin.run("SELECT locked, held_by_me, owner FROM redis_lock_status(%s)",
                     (key,)) == (True, False, field)
    assert a.run("SELECT redis_lock_try_acquire(%s)", (key,)) is False
    a.start("SELECT redis_lock_acquire(%s, wait => '20s') > 0", (key,))
    wait_for_wait_event(admin.conn, a.pid)
    released = time.monotonic()
    assert java.call("n1", "nrunlock", kind, key) is True
    a.join()
    assert a.error is None and a.result is True
    report_latency("Redisson " + java.version, "non-reentrant %s: Java unlock -> SQL waiter" % kind,
                   a.finished_at - released)
    assert a.finished_at - released < WAKE_BOUND
    # SQL holds: Java is refused, then waits and is woken by SQL's release
    assert java.call("n2", "nrtrylock", kind, key, 0, -1) is False
    waiting = java.send("n2", "nrtrylock", kind, key, 20000, -1)
    if kind == "fairlock":
        testbed.wait_until(lambda: rc.llen("redisson_lock_queue:{%s}" % key) == 1, 10,
                           what="the Java thread to queue")
    else:
        wait_for_subscriber(rc, redisson_name("redisson_lock__channel", key))
    latency = java_waiter_latency(java, waiting, lambda: a.run(
        "SELECT redis_lock_release(%s)", (key,)))
    report_latency("Redisson " + java.version, "non-reentrant %s: SQL release -> Java waiter" % kind,
                   latency)
    assert latency < WAKE_BOUND
    assert java.call("n2", "nrheld", kind, key) is True
    assert rc.hlen(key) == 1
    assert java.call("n2", "nrunlock", kind, key) is True
    assert rc.exists(key) == 0


# ================================================================ Redisson RFairLock

def test_a_mixed_queue_of_java_threads_and_sql_sessions_is_served_in_arrival_order(
        java, sessions, rc):
    """Holder: a Java thread.  Then, in this order, a SQL session, a Java
    thread, a SQL session, a Java thread queue up.  Each release must grant
    exactly the next arrival, SQL or Java, woken on its own channel."""
    admin = sessions()
    a, b = sessions(), sessions()
    for s in (a, b):
        s.run("SET redis_lock.protocol = 'redisson_fair'")
    queue = "redisson_lock_queue:{fair-mix}"

    def queued(n):
        testbed.wait_until(lambda: rc.llen(queue) == n, 10, what="%d waiters queued" % n)

    assert java.call("f0", "fairlock", "fair-mix") is True
    assert admin.run("SELECT locked, owner FROM redis_lock_status('fair-mix')") == \
        (True, java.call("f0", "hello"))
    a.start("SELECT redis_lock_acquire('fair-mix', wait => '30s') > 0")
    queued(1)
    j1 = java.send("f1", "fairlock", "fair-mix")
    queued(2)
    b.start("SELECT redis_lock_acquire('fair-mix', wait => '30s') > 0")
    queued(3)
    j2 = java.send("f2", "fairlock", "fair-mix")
    queued(4)
    arrivals = ["sql a", "java f1", "sql b", "java f2"]
    granted = []

    def still_waiting():
        """Who has not been granted yet (a Java answer read by
        java_waiter_latency is no longer pending, so granted counts too)."""
        return ({"sql a"} if a.thread.is_alive() else set()) | \
               ({"sql b"} if b.thread.is_alive() else set()) | \
               ({"java f1"} if not java.done(j1) and "java f1" not in granted else set()) | \
               ({"java f2"} if not java.done(j2) and "java f2" not in granted else set())

    # Java unlock -> SQL a
    released = time.monotonic()
    assert java.call("f0", "fairunlock", "fair-mix") is True
    a.join()
    assert a.error is None and a.result is True
    granted.append("sql a")
    report_latency("Redisson " + java.version, "RFairLock: Java unlock -> next SQL waiter",
                   a.finished_at - released)
    assert a.finished_at - released < WAKE_BOUND
    assert still_waiting() == {"java f1", "sql b", "java f2"}
    # SQL release -> Java f1
    latency = java_waiter_latency(java, j1, lambda: a.run("SELECT redis_lock_release('fair-mix')"))
    granted.append("java f1")
    report_latency("Redisson " + java.version, "RFairLock: SQL release -> next Java waiter", latency)
    assert latency < WAKE_BOUND
    assert still_waiting() == {"sql b", "java f2"}
    # Java unlock -> SQL b
    assert java.call("f1", "fairunlock", "fair-mix") is True
    b.join()
    assert b.error is None and b.result is True
    granted.append("sql b")
    assert still_waiting() == {"java f2"}
    # SQL release -> Java f2
    java_waiter_latency(java, j2, lambda: b.run("SELECT redis_lock_release('fair-mix')"))
    granted.append("java f2")
    assert granted == arrivals
    assert java.call("f2", "fairunlock", "fair-mix") is True
    assert rc.exists("fair-mix", queue, "redisson_lock_timeout:{fair-mix}") == 0


def test_a_sql_waiter_that_gives_up_does_not_hold_up_java_threads_behind_it(java, sessions, rc):
    admin, a = sessions(), sessions()
    a.run("SET redis_lock.protocol = 'redisson_fair'")
    queue = "redisson_lock_queue:{fair-quit}"
    # g0 holds with a 30 s lease (not the 1.5 s watchdog lease): a queued
    # Redisson thread sleeps on the lock's pttl between tries, so only the
    # message g0's unlock publishes to the new head wakes g1 in time
    lease_ms = 30000
    assert java.call("g0", "fairlock", "fair-quit", lease_ms) is True
    a.start("SELECT redis_lock_acquire('fair-quit', wait => '30s') > 0")
    testbed.wait_until(lambda: rc.llen(queue) == 1, 10, what="SQL queued")
    waiting = java.send("g1", "fairlock", "fair-quit")
    testbed.wait_until(lambda: rc.llen(queue) == 2, 10, what="Java queued")
    # Redisson queues g1 before it subscribes to its own channel and tries
    # again: until then a release would find it by that try, not wake it
    g1_owner = rc.lindex(queue, 1).decode()
    wait_for_subscriber(rc, "redisson_lock__channel:{fair-quit}:" + g1_owner)
    assert admin.run("SELECT pg_cancel_backend(%s)", (a.pid,)) is True
    a.join()
    assert isinstance(a.error, psycopg2.errors.QueryCanceled)
    testbed.wait_until(lambda: rc.llen(queue) == 1, 1, what="the SQL waiter to leave")
    # the Java thread, now at the head, is woken by the release's message
    # to it, not by its ~30 s sleep (nor held up behind the SQL waiter's
    # turn); that alternative is so far off that the bound is a third of it,
    # not WAKE_BOUND: a JVM on a loaded machine took 529 ms
    latency = java_waiter_latency(java, waiting, lambda: java.call(
        "g0", "fairunlock", "fair-quit"))
    report_latency("Redisson " + java.version,
                   "RFairLock: Java unlock -> Java waiter behind a SQL waiter that left",
                   latency)
    assert latency < lease_ms / 1000 / 3
    assert java.call("g1", "fairunlock", "fair-quit") is True


# ================================================================ Redisson with a replica

@pytest.fixture
def replicated(java, redis_srv):
    """redis_srv gets a replica for one test; a second Redisson client of
    the same line sees both and follows every lock script with WAIT."""
    replica = testbed.Redis(args=["--replicaof", "127.0.0.1", str(redis_srv.port)]).start()
    master = redis_srv.client()
    testbed.wait_until(lambda: master.info("replication")["connected_slaves"] == 1
                       and master.info("replication").get("slave0", {}).get("state") == "online",
                       10, what="the replica to sync")
    peer = JavaPeer([redis_srv.port, replica.port], line=java.line, mode="replicated",
                    watchdog_ms=WATCHDOG_MS)
    yield peer
    peer.close()
    replica.stop()


class Monitor:
    """Every command the Redis server runs, as strings, from a MONITOR connection.

    On once it has shown a command sent after it (under load the MONITOR
    connection can come up after the first commands it is meant to see);
    a reader that died fails the test instead of showing nothing."""

    START = "ECHO start-of-monitor"
    END = "ECHO end-of-monitor"

    def __init__(self, client):
        self.client = client
        self.seen = []
        self.error = None
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

        def on():
            assert self.error is None, self.error
            self.client.execute_command(*self.START.split())
            return self.started.wait(0.1)
        testbed.wait_until(on, 10, 0, what="MONITOR to show a command")

    def _read(self):
        # its own connection without a read timeout: under load (or while a
        # JVM call is slow) Redis may run no command for longer than the
        # test client's 5 s, which is no failure
        kw = dict(self.client.connection_pool.connection_kwargs, socket_timeout=None)
        try:
            with redis.Redis(connection_pool=redis.ConnectionPool(**kw)).monitor() as mon:
                for cmd in mon.listen():
                    if cmd["command"] == self.END:
                        return
                    if cmd["command"] == self.START:
                        self.started.set()
                    elif self.started.is_set():
                        self.seen.append(cmd["command"])
        except Exception as e:      # reported by the test's thread
            self.error = e

    def stop(self):
        self.client.execute_command(*self.END.split())
        self.thread.join(5 * S)
        assert self.error is None, self.error
        assert not self.thread.is_alive(), "MONITOR never showed the end marker"


def test_redissons_wait_and_unlock_latches_do_not_confuse_sql(replicated, rsql, rc):
    a = rsql()
    mon = Monitor(rc)
    try:
        assert replicated.call("t8", "lock", "synced") is True
        assert replicated.call("t8", "unlock", "synced") is True
        # SQL takes and releases it at once, latch keys or not
        assert a.run("SELECT redis_lock_try_acquire('synced')") is True
        assert a.run("SELECT redis_lock_release('synced')") is True
        assert replicated.call("t8", "lock", "synced") is True
        assert a.run("SELECT redis_lock_try_acquire('synced')") is False
        assert replicated.call("t8", "unlock", "synced") is True
    finally:
        mon.stop()
    # the test exercised what it claims: WAIT after each of the 4 Java
    # scripts, latch keys; and doc/clients.md's finding on their clean-up
    assert sum(c.startswith("WAIT 1 ") for c in mon.seen) >= 4, mon.seen
    assert any(c.startswith("set redisson_unlock_latch:{synced}:") for c in mon.seen), mon.seen
    if replicated.line == "3":          # 3.52.0 deletes a different name: latches expire
        left = rc.keys("redisson_unlock_latch:{synced}:*")
        assert left and all(rc.pttl(k) > 10000 for k in left)
    else:                               # 4.7.0 deletes them
        testbed.wait_until(lambda: not rc.keys("redisson_unlock_latch:*"), 2,
                           what="Redisson to delete its unlock latches")


# ================================================================ Jedis, by hand

@pytest.fixture(scope="module")
def jedis(redis_srv):
    peer = JavaPeer([redis_srv.port], line=REDISSON_LINES[-1])
    peer.jedis_version = java_library_version(REDISSON_LINES[-1], "jedis")
    yield peer
    peer.close()


def test_jedis_holder_excludes_sql_and_sql_cannot_release_it(jedis, sessions, rc):
    a, admin = sessions(), sessions()
    assert jedis.call("j1", "jlock", "nightly", 30000) is True
    token = rc.get("nightly")
    assert len(token) == 36 and 29000 < rc.pttl("nightly") <= 30000
    assert a.run("SELECT redis_lock_try_acquire('nightly')") is False
    assert a.run("SELECT redis_lock_release('nightly')") is False
    assert rc.get("nightly") == token
    a.start("SELECT redis_lock_acquire('nightly', wait => '10s') > 0")
    wait_for_wait_event(admin.conn, a.pid)
    released = time.monotonic()
    assert jedis.call("j1", "junlock", "nightly") is True
    a.join()
    assert a.error is None and a.result is True
    report_latency("Jedis " + jedis.jedis_version, "Jedis release -> SQL waiter (polls)",
                   a.finished_at - released)
    # a poll at most every 100 ms (the holder publishes nothing), not its 30 s TTL
    assert a.finished_at - released < WAKE_BOUND
    assert a.run("SELECT redis_lock_release('nightly')") is True


def test_sql_holder_excludes_jedis_and_jedis_cannot_release_it(jedis, sessions, rc):
    a = sessions()
    assert a.run("SELECT redis_lock_acquire('nightly', ttl => '30s') > 0")
    assert jedis.call("j2", "jlock", "nightly", 30000) is False
    assert jedis.call("j2", "junlock", "nightly") is False     # compare fails: not deleted
    assert rc.get("nightly").startswith(b"pgrl:")
    # a Jedis loop retrying every 10 ms gets it once SQL releases
    waiting = jedis.send("j2", "jwait", "nightly", 30000, 10, 10000)
    time.sleep(0.1)                                  # let it fail a few tries
    latency = java_waiter_latency(jedis, waiting, lambda: a.run(
        "SELECT redis_lock_release('nightly')"))
    report_latency("Jedis " + jedis.jedis_version, "SQL release -> Jedis loop retrying every 10 ms",
                   latency)
    assert latency < WAKE_BOUND
    assert jedis.call("j2", "junlock", "nightly") is True
    assert rc.exists("nightly") == 0


# ================================================================ Redisson on a Cluster

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
def test_cluster_sharded_pubsub_wakes_both_ways(cluster, line):
    nodes, pg = cluster
    peer = JavaPeer([n.port for n in nodes], line=line, mode="cluster", watchdog_ms=WATCHDOG_MS)
    a, admin = Session(pg), Session(pg)
    try:
        version = java_library_version(line, "redisson")
        a.run("SET redis_lock.protocol = 'redisson'")
        a.run("SET redis_lock.sharded_pubsub = on")
        key = "ledger-" + line
        channel = redisson_name("redisson_lock__channel", key)
        owner = testbed.slot_owner(nodes, key)[0].client()
        # Java -> SQL: the SQL waiter sits in SSUBSCRIBE, Java SPUBLISHes 0
        assert peer.call("c1", "lock", key) is True
        a.start("SELECT redis_lock_acquire(%s, wait => '20s') > 0", (key,))
        wait_for_wait_event(admin.conn, a.pid)
        wait_for_subscriber(owner, channel, sharded=True)
        released = time.monotonic()
        assert peer.call("c1", "unlock", key) is True
        a.join()
        assert a.error is None and a.result is True
        report_latency("Redisson " + version, "Cluster: Java unlock() -> SQL waiter (sharded)",
                       a.finished_at - released)
        assert a.finished_at - released < WAKE_BOUND
        # SQL -> Java: Redisson's waiter is sharded too (SSUBSCRIBE on the key's node)
        waiting = peer.send("c2", "lock", key)
        wait_for_subscriber(owner, channel, sharded=True)
        latency = java_waiter_latency(peer, waiting, lambda: a.run(
            "SELECT redis_lock_release(%s)", (key,)))
        report_latency("Redisson " + version, "Cluster: SQL release -> Java lock() waiter (sharded)",
                       latency)
        assert latency < WAKE_BOUND
        assert peer.call("c2", "unlock", key) is True
    finally:
        a.close()
        admin.close()
        peer.close()


def test_cluster_sharded_write_hold_with_an_unbalanced_brace_is_refused(cluster):
    """With sharded pub/sub a write hold's release publishes on
    redisson_rwlock:<key>, which for a key with a "{" but no complete hash
    tag hashes to another slot: the release would fail (38000) after
    deleting the key.  Such a name is refused up front (0A000), nothing is
    taken; with classic pub/sub it works."""
    nodes, pg = cluster
    s = Session(pg)
    owner = testbed.slot_owner(nodes, "we{ird")[0].client()
    try:
        s.run("SET redis_lock.sharded_pubsub = on")
        with pytest.raises(psycopg2.Error) as ei:
            s.run("SELECT redis_lock_acquire_write('we{ird')")
        assert ei.value.pgcode == "0A000", ei.value
        assert not owner.exists("we{ird")
        s.run("SET redis_lock.sharded_pubsub = off")
        assert s.run("SELECT redis_lock_acquire_write('we{ird') IS NOT NULL")
        assert s.run("SELECT redis_lock_release_write('we{ird')") is True
        assert not owner.exists("we{ird")
    finally:
        s.close()
