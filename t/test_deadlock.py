"""Deadlocks across Redis locks and PostgreSQL locks (src/wait/deadlock.c, issue 24
item 4).  Session A holds Redis lock R and waits for a row lock of session B,
which waits for R: PostgreSQL's detector cannot see R.  With preloading, B
finds the cycle once it has waited deadlock_timeout and fails with 40P01.

What each test would catch: a cycle not found (through a row lock, an
advisory lock, three sessions, two Redis locks, a read-write lock, a waiter
asleep in the local wait queue, a cycle that closes after the first check),
two victims for one cycle, a false positive (the holder waits for someone
else; a wait that ended left its record behind), a check before
deadlock_timeout, cancel no longer ending the wait, and a change without
preloading.  Each but the one without preloading fails on the build
without the detector (ad34ddb, re-run 2026-11-26: 33 of 34 failed, the
cycles with 55P03 after the full wait).

Checks are logged at DEBUG1 ("redis_lock deadlock check: ..."); a waiter
with SET log_min_messages = debug1 lets the test see that its checks ran."""
import os
import re
import subprocess
import time

import psycopg2
import pytest

from conftest import Session, terminating_sessions, wait_for_queue_lead
import testbed
from testbed import TIME_SCALE as S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLOCK_TIMEOUT = "SET deadlock_timeout = '100ms'"
CHECK_LINE = r"\[%d\] DEBUG:  redis_lock deadlock check: "
HINT = "See server log for query details."


@pytest.fixture
def sessions(pg):
    """Sessions whose backends are terminated at the end of the test, so
    that one left waiting by a failed assertion (for a row lock of another)
    cannot hang the teardown."""
    yield from terminating_sessions(pg)


@pytest.fixture(scope="module")
def table(pg):
    c = pg.connect()
    c.cursor().execute("CREATE TABLE dl_rows (id int PRIMARY KEY, v int NOT NULL DEFAULT 0);"
                       "INSERT INTO dl_rows (id) SELECT g FROM generate_series(1, 100) g")
    c.close()
    return "dl_rows"


def update(row):
    return "UPDATE dl_rows SET v = v + 1 WHERE id = %d" % row


def wait_for_lock_wait(admin, pid, timeout=10):
    """Poll until backend pid waits for a PostgreSQL heavyweight lock."""
    testbed.wait_until(lambda: testbed.sql_one(
        admin.conn, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
        (pid,)), timeout, what="backend %d to wait for a PostgreSQL lock" % pid)


def checks(pg, pid):
    """The deadlock checks backend pid logged (it set log_min_messages)."""
    return re.findall((CHECK_LINE % pid) + r"(.*)", pg.log_text())


def wait_for_checks(pg, pid, n=1, timeout=10):
    testbed.wait_until(lambda: len(checks(pg, pid)) >= n, timeout,
                       what="%d deadlock check(s) of backend %d" % (n, pid))


def verbose(s):
    """A waiter whose checks show in the log, with deadlock_timeout 100 ms."""
    s.run(DEADLOCK_TIMEOUT)
    s.run("SET log_min_messages = debug1")
    return s


def xid(s):
    return int(s.run("SELECT pg_current_xact_id()::text"))


def deadlocks(admin):
    return testbed.sql_one(admin.conn, "SELECT deadlocks FROM pg_stat_database "
                           "WHERE datname = current_database()")


def assert_deadlock(s, lines, within=5, since="its wait began"):
    """s's statement failed with 40P01 within `within` seconds of its start
    (its wait was 10 s), its detail exactly `lines`."""
    s.join(15)
    err = s.error
    assert err is not None, "no deadlock detected; the statement returned %r" % (s.result,)
    assert err.pgcode == "40P01", "%s: %s" % (err.pgcode, err)
    assert err.diag.message_primary == "deadlock detected"
    assert err.diag.message_detail == "\n".join(lines), err.diag.message_detail
    assert err.diag.message_hint == HINT
    assert s.finished_at - s.started_at < within * S, \
        "found after %.1f s" % (s.finished_at - s.started_at)
    print("\n40P01 %.0f ms after %s" % (1000 * (s.finished_at - s.started_at), since))


def start(s, q, args=None):
    s.started_at = time.monotonic()
    return s.start(q, args)


WAITS = {
    "acquire": "SELECT redis_lock_acquire('dl:row', wait => '10s')",
    "try_acquire": "SELECT redis_lock_try_acquire('dl:row', wait => '10s')",
    "with_lock": "SELECT redis_lock_with_lock('dl:row', 'SELECT 1', wait => '10s')",
}


@pytest.mark.parametrize("call", sorted(WAITS))
def test_row_lock_cycle_between_two_sessions(pg, sessions, rc, table, call):
    """Also the try variant (40P01, not false) and with_lock while they wait."""
    a, b, admin = sessions(), sessions(), sessions()
    b.run(DEADLOCK_TIMEOUT)
    before = deadlocks(admin)
    a.run("BEGIN")
    assert a.run("SELECT redis_lock_acquire('dl:row', xact => true) > 0")
    b.run("BEGIN")
    b.run(update(1))
    b_xid = xid(b)
    a.start(update(1))
    wait_for_lock_wait(admin, a.pid)
    start(b, WAITS[call])
    assert_deadlock(b, [
        'Process %d waits for Redis lock "dl:row"; blocked by process %d.' % (b.pid, a.pid),
        "Process %d waits for ShareLock on transaction %d; blocked by process %d."
        % (a.pid, b_xid, b.pid)])
    # B's transaction is aborted: its row lock goes, A's UPDATE goes through
    b.run("ROLLBACK")
    a.join(10)
    assert a.error is None, a.error
    a.run("COMMIT")
    assert rc.get("dl:row") is None, "A's transaction-scoped lock released at COMMIT"
    # the server log has each process's query, like PostgreSQL's own report
    log = pg.log_text()
    assert "Process %d: UPDATE dl_rows SET v = v + 1 WHERE id = 1" % a.pid in log
    assert "Process %d: %s" % (b.pid, WAITS[call]) in log
    # and it counts in pg_stat_database.deadlocks (flushed at B's exit at the
    # latest; once is enough)
    if call == "acquire":
        b.close()
        testbed.wait_until(lambda: deadlocks(admin) > before, 15,
                           what="pg_stat_database.deadlocks to count it")


def test_advisory_lock_cycle(sessions, rc):
    a, b, admin = sessions(), sessions(), sessions()
    b.run(DEADLOCK_TIMEOUT)
    dboid = testbed.sql_one(admin.conn, "SELECT oid FROM pg_database "
                            "WHERE datname = current_database()")
    b.run("BEGIN")
    b.run("SELECT pg_advisory_xact_lock(4711)")
    assert a.run("SELECT redis_lock_acquire('dl:adv') > 0")
    a.start("SELECT pg_advisory_lock(4711)")
    wait_for_lock_wait(admin, a.pid)
    start(b, "SELECT redis_lock_acquire('dl:adv', wait => '10s')")
    assert_deadlock(b, [
        'Process %d waits for Redis lock "dl:adv"; blocked by process %d.' % (b.pid, a.pid),
        "Process %d waits for ExclusiveLock on advisory lock [%d,0,4711,1]; blocked by process %d."
        % (a.pid, dboid, b.pid)])
    b.run("ROLLBACK")
    a.join(10)
    assert a.error is None, a.error
    a.run("SELECT pg_advisory_unlock(4711)")
    assert a.run("SELECT redis_lock_release('dl:adv')") is True


def test_three_sessions(sessions, rc, table):
    """A holds R1 and waits for a row lock of B; B waits for an advisory
    lock of C; C waits for R1.  Only C waits for Redis: C finds it."""
    a, b, c, admin = sessions(), sessions(), sessions(), sessions()
    c.run(DEADLOCK_TIMEOUT)
    dboid = testbed.sql_one(admin.conn, "SELECT oid FROM pg_database "
                            "WHERE datname = current_database()")
    c.run("BEGIN")
    c.run("SELECT pg_advisory_xact_lock(4712)")
    b.run("BEGIN")
    b.run(update(2))
    b_xid = xid(b)
    a.run("BEGIN")
    assert a.run("SELECT redis_lock_acquire('dl:three', xact => true) > 0")
    a.start(update(2))
    wait_for_lock_wait(admin, a.pid)
    b.start("SELECT pg_advisory_xact_lock(4712)")
    wait_for_lock_wait(admin, b.pid)
    start(c, "SELECT redis_lock_acquire('dl:three', wait => '10s')")
    assert_deadlock(c, [
        'Process %d waits for Redis lock "dl:three"; blocked by process %d.' % (c.pid, a.pid),
        "Process %d waits for ShareLock on transaction %d; blocked by process %d."
        % (a.pid, b_xid, b.pid),
        "Process %d waits for ExclusiveLock on advisory lock [%d,0,4712,1]; blocked by process %d."
        % (b.pid, dboid, c.pid)])
    c.run("ROLLBACK")
    b.join(10)
    assert b.error is None, b.error
    b.run("COMMIT")
    a.join(10)
    assert a.error is None, a.error
    a.run("COMMIT")


@pytest.mark.parametrize("round_", range(8))
def test_two_redis_locks_one_victim(sessions, rc, round_):
    """A holds R1 and waits for R2; B holds R2 and waits for R1, both with
    the same deadlock_timeout, started together: both may find the cycle,
    exactly one fails (40P01), the other gets its lock once the victim's
    transaction-scoped lock is released at its abort."""
    a, b = sessions(), sessions()
    for s, mine in ((a, "dl:r1"), (b, "dl:r2")):
        s.run(DEADLOCK_TIMEOUT)
        s.run("BEGIN")
        assert s.run("SELECT redis_lock_acquire(%s, xact => true) > 0", (mine,))
    start(a, "SELECT redis_lock_acquire('dl:r2', wait => '10s', xact => true)")
    start(b, "SELECT redis_lock_acquire('dl:r1', wait => '10s', xact => true)")
    a.join(15)
    b.join(15)
    victims = [s for s in (a, b) if s.error is not None]
    assert len(victims) == 1, "errors: %r, %r" % (a.error, b.error)
    victim = victims[0]
    other = b if victim is a else a
    v_lock, o_lock = ("dl:r1", "dl:r2") if victim is a else ("dl:r2", "dl:r1")
    assert victim.error.pgcode == "40P01", victim.error
    assert victim.error.diag.message_detail == "\n".join([
        'Process %d waits for Redis lock "%s"; blocked by process %d.'
        % (victim.pid, o_lock, other.pid),
        'Process %d waits for Redis lock "%s"; blocked by process %d.'
        % (other.pid, v_lock, victim.pid)])
    assert other.result > 0, "the other one got its lock"
    assert other.finished_at - other.started_at < 5 * S
    victim.run("ROLLBACK")
    other.run("COMMIT")
    assert rc.get("dl:r1") is None and rc.get("dl:r2") is None


def test_two_redis_waiters_on_a_cycle_closed_later_one_victim(pg, sessions, rc, table):
    """A holds R1 and waits for R2; B holds R2 and waits for R3; both are
    checked (no cycle yet).  C holds R3 and waits for A's row lock: now both
    A and B are on the cycle and check every 100 ms; exactly one fails."""
    a, b, c, admin = sessions(), sessions(), sessions(), sessions()
    verbose(a)
    verbose(b)
    a.run("BEGIN")
    a.run(update(9))
    a_xid = xid(a)
    assert a.run("SELECT redis_lock_acquire('dl:c1', xact => true) > 0")
    b.run("BEGIN")
    assert b.run("SELECT redis_lock_acquire('dl:c2', xact => true) > 0")
    c.run("BEGIN")
    assert c.run("SELECT redis_lock_acquire('dl:c3', xact => true) > 0")
    # waits far longer than the test: on a loaded machine a 10 s wait ran
    # out before C came, and A's abort let C through without waiting
    start(a, "SELECT redis_lock_acquire('dl:c2', wait => '60s', xact => true)")
    start(b, "SELECT redis_lock_acquire('dl:c3', wait => '60s', xact => true)")
    wait_for_checks(pg, a.pid, 2)
    wait_for_checks(pg, b.pid, 2)
    c.start(update(9))
    wait_for_lock_wait(admin, c.pid)
    closed_at = time.monotonic()
    testbed.wait_until(lambda: a.error is not None or b.error is not None, 10,
                       what="a victim")
    time.sleep(0.3)     # would the other one fail too?  (three of its checks)
    failed = [s for s in (a, b) if s.error is not None]
    assert len(failed) == 1, "both waiters failed: %r, %r" % (a.error, b.error)
    victim = failed[0]
    assert victim.error.pgcode == "40P01", victim.error
    assert victim.finished_at - closed_at < 5 * S
    if victim is a:
        # A's abort releases R1 and its row: C goes on, and B gets R3 at C's end
        c.join(10)
        assert c.error is None, c.error
        c.run("COMMIT")
        b.join(10)
        assert b.error is None and b.result > 0, b.error
        assert victim.error.diag.message_detail == "\n".join([
            'Process %d waits for Redis lock "dl:c2"; blocked by process %d.' % (a.pid, b.pid),
            'Process %d waits for Redis lock "dl:c3"; blocked by process %d.' % (b.pid, c.pid),
            "Process %d waits for ShareLock on transaction %d; blocked by process %d."
            % (c.pid, a_xid, a.pid)])
    else:
        # B's abort releases R2: A gets it and can end, then C goes on
        a.join(10)
        assert a.error is None and a.result > 0, a.error
        a.run("COMMIT")
        c.join(10)
        assert c.error is None, c.error
        c.run("COMMIT")
        assert victim.error.diag.message_detail == "\n".join([
            'Process %d waits for Redis lock "dl:c3"; blocked by process %d.' % (b.pid, c.pid),
            "Process %d waits for ShareLock on transaction %d; blocked by process %d."
            % (c.pid, a_xid, a.pid),
            'Process %d waits for Redis lock "dl:c2"; blocked by process %d.' % (a.pid, b.pid)])
    for s in (a, b, c):
        s.run("ROLLBACK")


def test_a_victim_keeps_its_session_scoped_locks(pg, sessions, rc):
    """Two Redis locks, session-scoped: the victim's abort does not release
    its lock (as for a session-level advisory lock), so the other keeps
    waiting until the victim releases it."""
    a, b = sessions(), sessions()
    verbose(a)
    verbose(b)
    assert a.run("SELECT redis_lock_acquire('dl:s1') > 0")
    assert b.run("SELECT redis_lock_acquire('dl:s2') > 0")
    start(a, "SELECT redis_lock_acquire('dl:s2', wait => '10s')")
    wait_for_checks(pg, a.pid, 1)
    start(b, "SELECT redis_lock_acquire('dl:s1', wait => '10s')")
    testbed.wait_until(lambda: a.error is not None or b.error is not None, 10,
                       what="a victim")
    victim, other = (a, b) if a.error is not None else (b, a)
    mine, theirs = ("dl:s1", "dl:s2") if victim is a else ("dl:s2", "dl:s1")
    victim.join(5)
    assert victim.error.pgcode == "40P01", victim.error
    # still held by the victim, in Redis and in its session
    assert rc.exists(mine) == 1
    assert victim.run("SELECT hold_count FROM redis_lock_held() WHERE lock_name = %s",
                      (mine,)) == 1
    n = len(checks(pg, other.pid))
    wait_for_checks(pg, other.pid, n + 2)
    assert other.thread.is_alive(), "the other one waits on"
    assert victim.run("SELECT redis_lock_release(%s)", (mine,)) is True
    other.join(5)
    assert other.error is None and other.result > 0, other.error
    assert other.run("SELECT redis_lock_release_all()") == 2
    assert victim.run("SELECT redis_lock_release_all()") == 0


@pytest.mark.parametrize("held,wanted,words", [
    ("read", "write", "the write hold of Redis lock"),
    ("write", "read", "a read hold of Redis lock"),
    ("write", "write", "the write hold of Redis lock")])
def test_read_write_lock_cycle(sessions, rc, table, held, wanted, words):
    """Modes: a writer waits for readers and writers, a reader for writers."""
    a, b, admin = sessions(), sessions(), sessions()
    b.run(DEADLOCK_TIMEOUT)
    a.run("BEGIN")
    assert a.run("SELECT redis_lock_acquire_%s('dl:rw', xact => true)" % held) is True
    b.run("BEGIN")
    b.run(update(3))
    b_xid = xid(b)
    a.start(update(3))
    wait_for_lock_wait(admin, a.pid)
    start(b, "SELECT redis_lock_acquire_%s('dl:rw', wait => '10s')" % wanted)
    assert_deadlock(b, [
        'Process %d waits for %s "dl:rw"; blocked by process %d.' % (b.pid, words, a.pid),
        "Process %d waits for ShareLock on transaction %d; blocked by process %d."
        % (a.pid, b_xid, b.pid)])
    b.run("ROLLBACK")
    a.join(10)
    a.run("COMMIT")
    assert rc.exists("dl:rw") == 0


@pytest.mark.parametrize("outcome", ["timeout", "granted"])
def test_no_false_positive_when_the_holder_waits_for_someone_else(pg, sessions, rc, table,
                                                                  outcome):
    """A holds R and waits for a row lock of C, who never waits for B: B's
    checks find no cycle, B waits its whole wait (55P03) or gets R when C and
    then A are done."""
    a, b, c, admin = sessions(), sessions(), sessions(), sessions()
    verbose(b)
    assert a.run("SELECT redis_lock_acquire('dl:nofp') > 0")
    c.run("BEGIN")
    c.run(update(4))
    a.start(update(4))
    wait_for_lock_wait(admin, a.pid)
    wait = "1s" if outcome == "timeout" else "10s"
    start(b, "SELECT redis_lock_acquire('dl:nofp', wait => %s)", (wait,))
    wait_for_checks(pg, b.pid, 3)
    if outcome == "timeout":
        b.join(10)
        assert b.error is not None and b.error.pgcode == "55P03", b.error
        assert b.finished_at - b.started_at >= 1.0
    else:
        c.run("ROLLBACK")
        a.join(10)
        assert a.error is None, a.error
        assert a.run("SELECT redis_lock_release('dl:nofp')") is True
        b.join(10)
        assert b.error is None, b.error
        assert b.result > 0
        assert b.run("SELECT redis_lock_release('dl:nofp')") is True
    assert all(line.startswith("no ") for line in checks(pg, b.pid)), checks(pg, b.pid)
    if outcome == "timeout":
        c.run("ROLLBACK")
        a.join(10)
        assert a.run("SELECT redis_lock_release('dl:nofp')") is True


def test_foreign_holder_never_closes_a_cycle(pg, sessions, rc, table):
    """R is held by a redis-py client (no backend of this server): however
    the sessions wait for each other, B waits out its wait."""
    a, b, admin = sessions(), sessions(), sessions()
    verbose(b)
    foreign = rc.lock("dl:foreign", timeout=30)
    assert foreign.acquire(blocking=False)
    try:
        b.run("BEGIN")
        b.run(update(5))
        a.start(update(5))
        wait_for_lock_wait(admin, a.pid)
        start(b, "SELECT redis_lock_acquire('dl:foreign', wait => '700ms')")
        b.join(10)
        assert b.error is not None and b.error.pgcode == "55P03", b.error
        assert len(checks(pg, b.pid)) >= 1
        b.run("ROLLBACK")
        a.join(10)
    finally:
        foreign.release()


def test_a_cycle_that_closes_after_the_first_check_is_found(pg, sessions, rc, table):
    """B waits for R held by A, and is checked (no cycle: A is not waiting);
    only then does A wait for B's row lock.  A later check finds it."""
    a, b, admin = sessions(), sessions(), sessions()
    verbose(b)
    a.run("BEGIN")
    assert a.run("SELECT redis_lock_acquire('dl:late', xact => true) > 0")
    b.run("BEGIN")
    b.run(update(6))
    b_xid = xid(b)
    start(b, "SELECT redis_lock_acquire('dl:late', wait => '10s')")
    wait_for_checks(pg, b.pid, 1)
    assert b.thread.is_alive()
    closed_at = time.monotonic()
    a.start(update(6))
    # A's wait closes the cycle, and B's next check may end it before a poll
    # of pg_stat_activity sees A waiting (CI's cold run, under load): B's
    # statement ending is as good a sign that A waited
    testbed.wait_until(lambda: not b.thread.is_alive() or testbed.sql_one(
        admin.conn, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
        (a.pid,)), 10, what="A to wait for B's row lock, or B's check to end the cycle")
    b.started_at = closed_at
    assert_deadlock(b, [
        'Process %d waits for Redis lock "dl:late"; blocked by process %d.' % (b.pid, a.pid),
        "Process %d waits for ShareLock on transaction %d; blocked by process %d."
        % (a.pid, b_xid, b.pid)], since="the cycle closed")
    b.run("ROLLBACK")
    a.join(10)
    a.run("COMMIT")


def test_a_waiter_asleep_in_the_local_queue_is_checked(pg, sessions, rc, table):
    """Q1 waits for R first and leads the local queue; Q2 sleeps behind it.
    A holds R and waits for Q2's row lock: Q2, asleep, finds the cycle; Q1
    gets R once A is done."""
    a, q1, q2, admin = sessions(), sessions(), sessions(), sessions()
    verbose(q2)
    a.run("BEGIN")
    assert a.run("SELECT redis_lock_acquire('dl:queue', xact => true) > 0")
    q1.start("SELECT redis_lock_acquire('dl:queue', wait => '30s')")
    wait_for_queue_lead(rc, q1)
    q2.run("BEGIN")
    q2.run(update(7))
    q2_xid = xid(q2)
    start(q2, "SELECT redis_lock_acquire('dl:queue', wait => '10s')")
    wait_for_checks(pg, q2.pid, 1)
    # Q2 sleeps in the queue: only Q1 is subscribed in Redis (to the key's
    # notifications the watchdog worker may be subscribed too: A's lock is
    # one it renews)
    chans = ["redis_lock:release:{dl:queue}", "__keyspace@0__:dl:queue"]
    release, keyspace = [n for _, n in rc.pubsub_numsub(*chans)]
    assert release == 1 and keyspace in (1, 2), (release, keyspace)
    q2.started_at = time.monotonic()
    a.start(update(7))
    wait_for_lock_wait(admin, a.pid)
    assert_deadlock(q2, [
        'Process %d waits for Redis lock "dl:queue"; blocked by process %d.' % (q2.pid, a.pid),
        "Process %d waits for ShareLock on transaction %d; blocked by process %d."
        % (a.pid, q2_xid, q2.pid)], since="the cycle closed")
    q2.run("ROLLBACK")
    a.join(10)
    a.run("COMMIT")
    q1.join(10)
    assert q1.error is None and q1.result > 0, q1.error
    assert q1.run("SELECT redis_lock_release('dl:queue')") is True


def test_no_check_before_deadlock_timeout(pg, sessions, rc):
    """A wait shorter than deadlock_timeout is never checked (and publishes
    nothing); one longer is; checks are at least 10 ms apart."""
    a, b = sessions(), sessions()
    verbose(b)
    assert a.run("SELECT redis_lock_acquire('dl:short') > 0")
    b.run("SET deadlock_timeout = '2s'")
    with pytest.raises(psycopg2.Error) as e:
        b.run("SELECT redis_lock_acquire('dl:short', wait => '500ms')")
    assert e.value.pgcode == "55P03"
    assert checks(pg, b.pid) == []
    b.run("SET deadlock_timeout = '100ms'")
    with pytest.raises(psycopg2.Error) as e:
        b.run("SELECT redis_lock_acquire('dl:short', wait => '500ms')")
    assert e.value.pgcode == "55P03"
    found = checks(pg, b.pid)
    assert 1 <= len(found) <= 6, found
    # a deadlock_timeout of 1 ms: the first check at 1 ms, then 10 ms apart
    b.run("SET deadlock_timeout = '1ms'")
    t0 = time.monotonic()
    with pytest.raises(psycopg2.Error) as e:
        b.run("SELECT redis_lock_acquire('dl:short', wait => '300ms')")
    assert e.value.pgcode == "55P03"
    elapsed_ms = 1000 * (time.monotonic() - t0)
    more = len(checks(pg, b.pid)) - len(found)
    assert 3 <= more <= elapsed_ms / 10 + 2, "%d checks in %.0f ms" % (more, elapsed_ms)
    assert a.run("SELECT redis_lock_release('dl:short')") is True


def test_checks_cost_no_redis_round_trips(pg, sessions, rc):
    """A waiter for a lock whose holder publishes its release polls Redis
    once a second; its checks every 100 ms add no attempt of their own."""
    a, b = sessions(), sessions()
    verbose(b)
    assert a.run("SELECT redis_lock_acquire('dl:trips') > 0")
    rc.config_resetstat()
    with pytest.raises(psycopg2.Error) as e:
        b.run("SELECT redis_lock_acquire('dl:trips', wait => '1500ms')")
    assert e.value.pgcode == "55P03"
    calls = rc.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    print("\n%d EVALSHA in a 1.5 s wait, %d checks" % (calls, len(checks(pg, b.pid))))
    assert len(checks(pg, b.pid)) >= 8, checks(pg, b.pid)
    # the first try, one after subscribing, one at 1 s, one at the end
    assert calls <= 4, "%d EVALSHA in a 1.5 s wait" % calls
    assert a.run("SELECT redis_lock_release('dl:trips')") is True


@pytest.mark.parametrize("queued", [False, True])
def test_cancel_ends_a_checked_wait_within_1s(pg, sessions, rc, queued):
    a, b, admin = sessions(), sessions(), sessions()
    verbose(b)
    assert a.run("SELECT redis_lock_acquire('dl:cancel') > 0")
    if queued:
        ahead = sessions()
        ahead.start("SELECT redis_lock_acquire('dl:cancel', wait => '30s')")
        wait_for_queue_lead(rc, ahead)
    start(b, "SELECT redis_lock_acquire('dl:cancel', wait => '30s')")
    wait_for_checks(pg, b.pid, 2)
    t0 = time.monotonic()
    admin.run("SELECT pg_cancel_backend(%s)", (b.pid,))
    b.join(5)
    assert b.error is not None and b.error.pgcode == "57014", b.error
    assert b.finished_at - t0 < 1.0 * S
    assert a.run("SELECT redis_lock_release('dl:cancel')") is True
    if queued:
        ahead.join(10)
        assert ahead.result > 0
        ahead.run("SELECT redis_lock_release('dl:cancel')")


ENDINGS = {
    "timeout": "SELECT redis_lock_acquire('dl:stale', wait => '600ms')",
    "cancel": "SELECT redis_lock_acquire('dl:stale', wait => '30s')",
    "caught cancel": ("DO $$ BEGIN "
                      "  BEGIN PERFORM redis_lock_acquire('dl:stale', wait => '30s'); "
                      "  EXCEPTION WHEN query_canceled THEN NULL; END; "
                      "END $$"),
    "victim": "SELECT redis_lock_acquire('dl:stale', wait => '30s')",
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_wait_that_ended_leaves_nothing_behind(pg, sessions, rc, table, ending):
    """B waits for R held by A, is checked (so its wait is published), and
    the wait ends (its wait runs out, it is cancelled, PL/pgSQL catches the
    cancel, or it is a deadlock's victim).  Then B holds R3 without waiting
    and A waits for R3: had B's wait stayed published, A would see A -> B ->
    A and fail; it must wait out its wait instead."""
    a, b, admin = sessions(), sessions(), sessions()
    verbose(b)
    verbose(a)
    assert a.run("SELECT redis_lock_acquire('dl:stale') > 0")
    # in a transaction block: a caught cancel then ends only a subtransaction
    b.run("BEGIN")
    if ending == "victim":
        b.run(update(8))
    start(b, ENDINGS[ending])
    wait_for_checks(pg, b.pid, 2)
    if ending in ("cancel", "caught cancel"):
        admin.run("SELECT pg_cancel_backend(%s)", (b.pid,))
    elif ending == "victim":
        a.start(update(8))
        wait_for_lock_wait(admin, a.pid)
    b.join(10)
    expected = {"timeout": "55P03", "cancel": "57014", "caught cancel": None,
                "victim": "40P01"}[ending]
    assert (b.error.pgcode if b.error else None) == expected, b.error
    if ending == "victim":
        a.join(10)
        assert a.error is None, a.error
    if b.error is not None:
        b.run("ROLLBACK")
        b.run("BEGIN")
    assert b.run("SELECT redis_lock_acquire('dl:stale3', xact => true) > 0")
    with pytest.raises(psycopg2.Error) as e:
        a.run("SELECT redis_lock_acquire('dl:stale3', wait => '600ms')")
    assert e.value.pgcode == "55P03", e.value
    assert len(checks(pg, a.pid)) >= 1
    b.run("COMMIT")
    assert a.run("SELECT redis_lock_release('dl:stale')") is True


def test_without_preloading_nothing_changes(redis_srv, rc):
    """Without shared_preload_libraries the cycle is not detected: B waits
    out its whole wait and gets 55P03, as before."""
    plain = testbed.Postgres(preload=False, conf={"redis_lock.url": redis_srv.url}).init().start()
    made = []
    try:
        plain.with_extension()
        a, b, admin = (Session(plain) for _ in range(3))
        made += [a, b, admin]
        a.run("CREATE TABLE np_rows (id int PRIMARY KEY, v int); INSERT INTO np_rows VALUES (1, 0)")
        b.run(DEADLOCK_TIMEOUT)
        a.run("BEGIN")
        assert a.run("SELECT redis_lock_acquire('dl:plain', xact => true) > 0")
        b.run("BEGIN")
        b.run("UPDATE np_rows SET v = v + 1 WHERE id = 1")
        a.start("UPDATE np_rows SET v = v + 1 WHERE id = 1")
        wait_for_lock_wait(admin, a.pid)
        start(b, "SELECT redis_lock_acquire('dl:plain', wait => '1s')")
        b.join(10)
        assert b.error is not None and b.error.pgcode == "55P03", b.error
        assert b.finished_at - b.started_at >= 1.0
        b.run("ROLLBACK")
        a.join(10)
        a.run("COMMIT")
    finally:
        plain.cleanup()         # stops the server first: no session hangs
        for s in made:
            s.close()


SCALE_LOCKS = int(os.environ.get("RL_DEADLOCK_SCALE_LOCKS", "20000"))
FULL = re.compile(r"no cycle; .* (\d+) us$")
CACHED = re.compile(r"no wait began since the last check, (\d+) us$")


def test_check_cost_with_many_locks_held():
    """The cost of a check with SCALE_LOCKS locks in the registry (20 000;
    RL_DEADLOCK_SCALE_LOCKS=100000 for doc/reference.md's figure): the first check
    of a wait passes over the whole registry; the later ones, while no wait
    begins, look at the PGPROCs only.  Printed with -s; bounded loosely."""
    r = testbed.Redis().start()
    pg = testbed.Postgres(conf={"redis_lock.url": r.url,
                                "redis_lock.max_locks": str(SCALE_LOCKS + 64),
                                "redis_lock.max_locks_per_session": str(SCALE_LOCKS + 64)}).init().start()
    made = []
    try:
        pg.with_extension()
        takers = [Session(pg) for _ in range(4)]
        made += takers
        per = SCALE_LOCKS // len(takers)
        for i, t in enumerate(takers):
            t.start("SELECT count(redis_lock_acquire('bulk:' || g, ttl => '10min')) "
                    "FROM generate_series(%s, %s) g", (1 + i * per, (i + 1) * per))
        for t in takers:
            t.join(300)
            assert t.error is None and t.result == per, t.error
        a, b, c, admin = (Session(pg) for _ in range(4))
        made += [a, b, c, admin]
        a.run("CREATE TABLE cost_rows (id int PRIMARY KEY); INSERT INTO cost_rows VALUES (1)")
        assert a.run("SELECT redis_lock_acquire('dl:cost') > 0")
        # someone waits (A, for C's row): B's first check of each wait is full
        c.run("BEGIN")
        c.run("UPDATE cost_rows SET id = 1")
        a.start("UPDATE cost_rows SET id = 1")
        wait_for_lock_wait(admin, a.pid)
        verbose(b)
        for _ in range(5):
            with pytest.raises(psycopg2.Error) as e:
                b.run("SELECT redis_lock_acquire('dl:cost', wait => '1s')")
            assert e.value.pgcode == "55P03"
        lines = checks(pg, b.pid)
        full = sorted(int(m.group(1)) for m in map(FULL.search, lines) if m)
        cached = sorted(int(m.group(1)) for m in map(CACHED.search, lines) if m)
        print("\n%d locks held: %d full checks, median %d us, max %d us; "
              "%d repeated checks, median %d us, max %d us"
              % (SCALE_LOCKS, len(full), full[len(full) // 2], full[-1], len(cached),
                 cached[len(cached) // 2] if cached else 0, cached[-1] if cached else 0))
        assert full[len(full) // 2] < SCALE_LOCKS * 5 * S, "over 5 us per lock held"
        if int(admin.run("SHOW server_version_num")) >= 140000:
            # one full check per wait, then nothing began: the fingerprint
            assert len(full) == 5 and len(cached) >= 20, lines
            assert cached[len(cached) // 2] < 5000 * S
        else:
            # 13 has no waitStart to tell that nothing began: every check is full
            assert cached == [] and len(full) >= 20, lines
        c.run("ROLLBACK")
        a.join(10)
    finally:
        pg.cleanup()
        r.stop()
        for s in made:
            s.close()


def test_acquire_many_waiter_closes_a_cycle(sessions, rc, table):
    """A waiter for several locks waits for every one it does not hold yet:
    A holds one of the set and waits for B's row lock; B's acquire_many of
    the set is the victim."""
    a, b, admin = sessions(), sessions(), sessions()
    b.run(DEADLOCK_TIMEOUT)
    a.run("BEGIN")
    assert a.run("SELECT redis_lock_acquire('dl:many2', xact => true) > 0")
    b.run("BEGIN")
    b.run(update(7))
    b_xid = xid(b)
    a.start(update(7))
    wait_for_lock_wait(admin, a.pid)
    start(b, "SELECT redis_lock_acquire_many(ARRAY['dl:many1', 'dl:many2'], wait => '10s')")
    assert_deadlock(b, [
        'Process %d waits for Redis lock "dl:many2"; blocked by process %d.' % (b.pid, a.pid),
        "Process %d waits for ShareLock on transaction %d; blocked by process %d."
        % (a.pid, b_xid, b.pid)])
    assert rc.get("dl:many1") is None, "the set's waiter holds none of it"
    b.run("ROLLBACK")
    a.join(10)
    assert a.error is None, a.error
    a.run("COMMIT")


# ----------------------------------------------------------------------
# Issue 33, item 7: a hold the registry still shows but Redis no longer
# has never closes a cycle.  The registry marks a hold lost only at the
# worker's next renewal (lease/3, 10 s here), so a check in between sees B
# holding R; each Redis edge of a cycle is confirmed in Redis first.
# ----------------------------------------------------------------------

def _stale_hold_no_false_deadlock(pg, admin, b, c, rc, take_away, row):
    """B holds R (30 s lease) and waits for C's row; take_away() makes
    Redis lose B's hold; a redis-py client takes R for 3 s; C waits for R.
    No cycle (C waits for redis-py, which finishes): C must wait, checked
    again and again, and get R once redis-py's lease runs out."""
    verbose(c)
    assert b.run("SELECT redis_lock_acquire('dl:gone') > 0")
    c.run("BEGIN")
    c.run(update(row))
    b.start(update(row))
    wait_for_lock_wait(admin, b.pid)
    take_away()
    foreign = rc.lock("dl:gone", timeout=3)
    assert foreign.acquire(blocking=False), "R is free in Redis"
    taken_at = time.monotonic()
    start(c, "SELECT redis_lock_acquire('dl:gone', wait => '10s')")
    # the stale cycle is looked at and turned down, check after check
    testbed.wait_until(lambda: c.error is not None or sum(
        "not confirmed" in line for line in checks(pg, c.pid)) >= 3, 10,
        what="three checks of C that turn the stale cycle down")
    assert c.error is None, "C failed while it waits for redis-py: %s" % c.error
    c.join(15)
    assert c.error is None, "C failed while it waits for redis-py: %s" % c.error
    assert c.result > 0, "C got R once redis-py's lease ran out"
    waited = time.monotonic() - taken_at
    turned = [line for line in checks(pg, c.pid) if "not confirmed" in line]
    print("\nC got R %.0f ms after redis-py took it, %d checks turned the stale cycle "
          "down: %s" % (1000 * waited, len(turned), turned[0]))
    assert re.search(r'not confirmed: Redis did not show process %d holding Redis lock "dl:gone"'
                     % b.pid, turned[0]), turned[0]
    assert waited >= 2.5, "C got R only once redis-py's 3 s lease ran out"
    assert all(line.startswith(("no ", "a cycle")) for line in checks(pg, c.pid))
    c.run("ROLLBACK")
    b.join(10)
    assert b.error is None, b.error
    assert c.run("SELECT redis_lock_release('dl:gone')") is True


def test_no_false_deadlock_after_a_force_release(pg, sessions, rc, table):
    """Issue 33 item 7, as reported: an admin force-releases R under B."""
    b, c, admin = sessions(), sessions(), sessions()

    def force():
        assert admin.run("SELECT redis_lock_force_release('dl:gone')") is True
    _stale_hold_no_false_deadlock(pg, admin, b, c, rc, force, 11)
    # B learns it lost R at its release (or the worker's renewal)
    b.run("SET client_min_messages = error")
    assert b.run("SELECT redis_lock_release('dl:gone')") is False


def test_no_false_deadlock_after_a_redis_restart(env):
    """Issue 33 item 7, the restart variant: Redis restarts empty under B."""
    r, pg, session = env
    b, c, admin = session(), session(), session()
    admin.run("CREATE TABLE dl_rows (id int PRIMARY KEY, v int NOT NULL DEFAULT 0);"
              "INSERT INTO dl_rows (id) SELECT g FROM generate_series(1, 20) g")
    try:
        # (redis-py connects at its first command: after the restart)
        _stale_hold_no_false_deadlock(pg, admin, b, c, r.client(), r.restart, 12)
    finally:
        # a failure must not leave B waiting for C's row: closing B's
        # connection would wait for B's statement
        for s in (b, c):
            admin.run("SELECT pg_terminate_backend(%s)", (s.pid,))
        for s in (b, c):
            if s.thread is not None:
                s.thread.join(10 * S)


LAYOUTS = {
    "simple": "SET redis_lock.protocol = 'simple'",
    "redisson": "SET redis_lock.protocol = 'redisson'",
    "redisson_fair": "SET redis_lock.protocol = 'redisson_fair'",
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_cycle_is_confirmed_in_redis_in_every_layout(sessions, rc, table, layout):
    """The confirmation finds the holder's owner value in each layout's
    form (a string's value, a Redisson hash's field; the read-write layout
    in test_read_write_lock_cycle): the real cycle is still found."""
    a, b, admin = sessions(), sessions(), sessions()
    for s in (a, b):
        s.run(LAYOUTS[layout])
    b.run(DEADLOCK_TIMEOUT)
    a.run("BEGIN")
    assert a.run("SELECT redis_lock_acquire('dl:layout', xact => true) > 0")
    b.run("BEGIN")
    b.run(update(15))
    b_xid = xid(b)
    a.start(update(15))
    wait_for_lock_wait(admin, a.pid)
    start(b, "SELECT redis_lock_acquire('dl:layout', wait => '10s')")
    assert_deadlock(b, [
        'Process %d waits for Redis lock "dl:layout"; blocked by process %d.' % (b.pid, a.pid),
        "Process %d waits for ShareLock on transaction %d; blocked by process %d."
        % (a.pid, b_xid, b.pid)])
    b.run("ROLLBACK")
    a.join(10)
    assert a.error is None, a.error
    a.run("COMMIT")
    assert rc.exists("dl:layout") == 0


def test_a_cycle_is_confirmed_without_scripts():
    """On Valkey 9.1 whose ACL denies scripts to the extension's user
    (redis_lock.scripting = off): the confirmation asks with the script-free
    form, and the real cycle is found.  (scripts/get-server valkey-9.1, as
    t/test_scripting.py: fails, never skips, when it cannot be had.)"""
    out = subprocess.run([os.path.join(ROOT, "scripts", "get-server"), "valkey-9.1"],
                         check=True, timeout=1800, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True).stdout
    r = testbed.Redis(server=out.strip().splitlines()[-1]).start()
    r.client().execute_command("ACL", "SETUSER", "rl", "reset", "on", ">rl-secret",
                               "~*", "&*", "+@all", "-@scripting")
    pg = testbed.Postgres(conf={"redis_lock.url": "redis://rl@127.0.0.1:%d/0" % r.port,
                                "redis_lock.password": "rl-secret",
                                "redis_lock.scripting": "off"}).init().start().with_extension()
    made = []
    try:
        a, b, admin = (Session(pg) for _ in range(3))
        made += [a, b, admin]
        admin.run("CREATE TABLE dl_rows (id int PRIMARY KEY, v int NOT NULL DEFAULT 0);"
                  "INSERT INTO dl_rows (id) SELECT g FROM generate_series(1, 20) g")
        b.run(DEADLOCK_TIMEOUT)
        a.run("BEGIN")
        assert a.run("SELECT redis_lock_acquire('dl:noscript', xact => true) > 0")
        b.run("BEGIN")
        b.run(update(16))
        b_xid = xid(b)
        a.start(update(16))
        wait_for_lock_wait(admin, a.pid)
        start(b, "SELECT redis_lock_acquire('dl:noscript', wait => '10s')")
        assert_deadlock(b, [
            'Process %d waits for Redis lock "dl:noscript"; blocked by process %d.'
            % (b.pid, a.pid),
            "Process %d waits for ShareLock on transaction %d; blocked by process %d."
            % (a.pid, b_xid, b.pid)])
        b.run("ROLLBACK")
        a.join(10)
        assert a.error is None, a.error
        a.run("COMMIT")
        assert r.client().execute_command("ACL", "LOG") == [], "no script was tried"
    finally:
        pg.cleanup()            # stops the server first: no session hangs
        r.stop()
        for s in made:
            s.close()


@pytest.mark.parametrize("ending", ["answered later", "cancel"])
def test_a_cycle_redis_does_not_confirm_is_no_deadlock(env, ending):
    """A real cycle: A holds R and waits for Q2's row; Q2 waits for R asleep
    in the local queue behind Q1, so its only Redis traffic is its checks'
    confirmations.  Redis is frozen: while it does not answer, no 40P01 and
    the wait goes on ("answered later": once Redis answers again, the next
    check finds the cycle); a cancel ends the confirmation's round trip
    (command_timeout 10 s) within 1 s ("cancel")."""
    r, pg, session = env
    a, q1, q2, admin = session(), session(), session(), session()
    admin.run("CREATE TABLE dl_rows (id int PRIMARY KEY, v int NOT NULL DEFAULT 0);"
              "INSERT INTO dl_rows (id) SELECT g FROM generate_series(1, 20) g")
    verbose(q2)
    q2.run("SET redis_lock.command_timeout = %s",
           ("300ms" if ending == "answered later" else "10s",))
    q1.run("SET redis_lock.command_timeout = '60s'")
    a.run("BEGIN")
    assert a.run("SELECT redis_lock_acquire('dl:frozen', xact => true) > 0")
    q1.start("SELECT redis_lock_acquire('dl:frozen', wait => '60s')")
    # Q1 in the queue before Redis freezes: else Q2 finds no local waiter
    # and makes its own attempt in the frozen Redis, where no check runs
    wait_for_queue_lead(r.client(), q1)
    q2.run("BEGIN")
    q2.run(update(1))
    q2_xid = xid(q2)
    a.start(update(1))
    wait_for_lock_wait(admin, a.pid)
    r.pause()
    try:
        start(q2, "SELECT redis_lock_acquire('dl:frozen', wait => '30s')")
        if ending == "answered later":
            testbed.wait_until(lambda: q2.error is not None or sum(
                "not confirmed" in line for line in checks(pg, q2.pid)) >= 2, 10,
                what="two checks of Q2 that Redis did not answer")
            assert q2.error is None, "failed while Redis did not answer: %s" % q2.error
            r.resume()
            q2.started_at = time.monotonic()
            assert_deadlock(q2, [
                'Process %d waits for Redis lock "dl:frozen"; blocked by process %d.'
                % (q2.pid, a.pid),
                "Process %d waits for ShareLock on transaction %d; blocked by process %d."
                % (a.pid, q2_xid, q2.pid)], since="Redis answered again")
        else:
            testbed.wait_until(lambda: any("asking Redis" in line
                                           for line in checks(pg, q2.pid)), 10,
                               what="Q2's check to ask Redis")
            t0 = time.monotonic()
            admin.run("SELECT pg_cancel_backend(%s)", (q2.pid,))
            q2.join(5)
            assert q2.error is not None and q2.error.pgcode == "57014", q2.error
            print("\ncancelled %.0f ms into the confirmation" % (1000 * (q2.finished_at - t0)))
            assert q2.finished_at - t0 < 1.0 * S
            r.resume()
        q2.run("ROLLBACK")
        a.join(10)
        assert a.error is None, a.error
        a.run("COMMIT")
        q1.join(10)
        assert q1.error is None and q1.result > 0, q1.error
    finally:
        r.resume()
        for s in (a, q1, q2):
            admin.run("SELECT pg_terminate_backend(%s)", (s.pid,))
        for s in (a, q1, q2):
            if s.thread is not None:
                s.thread.join(10 * S)


# ----------------------------------------------------------------------
# Issue 33, item 8: a cycle through any key of an acquire_many wait, not
# only its first 16.
# ----------------------------------------------------------------------

MANY20 = ["dl:m%02d" % i for i in range(1, 21)]


@pytest.mark.parametrize("nth", [16, 17, 20])
def test_acquire_many_cycle_through_a_late_key(sessions, rc, table, nth):
    """A holds the nth key of B's 20-key set and waits for B's row: B finds
    the cycle (it was never found through the 17th key or later)."""
    a, b, admin = sessions(), sessions(), sessions()
    b.run(DEADLOCK_TIMEOUT)
    key = MANY20[nth - 1]
    a.run("BEGIN")
    assert a.run("SELECT redis_lock_acquire(%s, xact => true) > 0", (key,))
    b.run("BEGIN")
    b.run(update(14))
    b_xid = xid(b)
    a.start(update(14))
    wait_for_lock_wait(admin, a.pid)
    start(b, "SELECT redis_lock_acquire_many(%s, wait => '10s')", (MANY20,))
    assert_deadlock(b, [
        'Process %d waits for Redis lock "%s"; blocked by process %d.' % (b.pid, key, a.pid),
        "Process %d waits for ShareLock on transaction %d; blocked by process %d."
        % (a.pid, b_xid, b.pid)], within=2)
    assert rc.exists(*MANY20) == 1, "B holds none of its set"
    b.run("ROLLBACK")
    a.join(10)
    assert a.error is None, a.error
    a.run("COMMIT")


def test_two_acquire_many_waiters_through_late_keys_one_victim(sessions, rc):
    """A holds the 18th key of B's set and waits for its own 20-key set,
    whose 17th key B holds; B waits for its set.  Each sees the other's
    wait beyond its first 16 keys: exactly one fails, the other gets its
    set once the victim's transaction-scoped lock goes."""
    a, b = sessions(), sessions()
    set_a = ["dl:a%02d" % i for i in range(1, 21)]
    set_b = ["dl:b%02d" % i for i in range(1, 21)]
    set_a[16] = "dl:held-by-b"
    set_b[17] = "dl:held-by-a"
    for s, mine in ((a, "dl:held-by-a"), (b, "dl:held-by-b")):
        s.run(DEADLOCK_TIMEOUT)
        s.run("BEGIN")
        assert s.run("SELECT redis_lock_acquire(%s, xact => true) > 0", (mine,))
    start(a, "SELECT redis_lock_acquire_many(%s, wait => '10s', xact => true)", (set_a,))
    start(b, "SELECT redis_lock_acquire_many(%s, wait => '10s', xact => true)", (set_b,))
    a.join(15)
    b.join(15)
    victims = [s for s in (a, b) if s.error is not None]
    assert len(victims) == 1, "errors: %r, %r" % (a.error, b.error)
    victim = victims[0]
    other = b if victim is a else a
    assert victim.error.pgcode == "40P01", victim.error
    lines = {a.pid: 'Process %d waits for Redis lock "dl:held-by-b"; blocked by process %d.'
             % (a.pid, b.pid),
             b.pid: 'Process %d waits for Redis lock "dl:held-by-a"; blocked by process %d.'
             % (b.pid, a.pid)}
    assert victim.error.diag.message_detail == "\n".join(
        [lines[victim.pid], lines[other.pid]])
    assert victim.finished_at - victim.started_at < 2 * S
    assert other.error is None and other.result is not None, other.error
    victim.run("ROLLBACK")
    other.run("COMMIT")
    assert rc.exists(*(set_a + set_b)) == 0
