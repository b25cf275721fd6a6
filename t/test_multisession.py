"""Several backends contending for the same Redis locks."""
import os
import threading
import time

import psycopg2
import pytest

from checks import report_latency
from conftest import wait_for_wait_event
import testbed
from testbed import TIME_SCALE as S


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / float(os.sysconf("SC_CLK_TCK"))


def test_waiter_is_woken_by_the_release(sessions, rc):
    a, b, admin = sessions(), sessions(), sessions()
    for _ in range(5):
        assert a.run("SELECT redis_lock_acquire('wake') > 0")
        b.start("SELECT redis_lock_acquire('wake', wait => '10s')")
        wait_for_wait_event(admin.conn, b.pid)
        a.run("SELECT redis_lock_release('wake')")
        released = time.monotonic()
        b.join()
        assert b.error is None
        latency = b.finished_at - released
        report_latency("SQL", "SQL release -> SQL waiter", latency)
        # a 1 s poll is the alternative to the release message
        assert latency < testbed.WAKE_BOUND, "waiter took %.1f ms after release" % (latency * 1000)
        assert b.run("SELECT redis_lock_release('wake')")


def test_wait_shows_extension_wait_event_and_burns_no_cpu(sessions, rc):
    a, b, idle, admin = sessions(), sessions(), sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('idle') > 0")
    b.start("SELECT redis_lock_acquire('idle', wait => '10s')")
    idle.start("SELECT pg_sleep(2.5)")
    wait_for_wait_event(admin.conn, b.pid)
    # PostgreSQL 17 and later show the extension's own wait event names; the
    # waiter passes through RedisLockReply (its first attempt being
    # answered) before it settles in the wait for a release
    named = int(admin.run("SHOW server_version_num")) >= 170000
    want = ("Extension", "RedisLockRelease" if named else "Extension", "active")
    rows = []

    def settled():
        rows.append(admin.run("SELECT wait_event_type, wait_event, state FROM pg_stat_activity "
                              "WHERE pid = %s", (b.pid,)))
        return rows[-1] == want
    try:
        testbed.wait_until(settled, 10, what="the waiter to show %s" % (want,))
    except TimeoutError:
        raise AssertionError("waiter showed %s, never %s" % (sorted(set(rows)), want))
    before, before_idle = cpu_seconds(b.pid), cpu_seconds(idle.pid)
    time.sleep(2.0)
    used, used_idle = cpu_seconds(b.pid) - before, cpu_seconds(idle.pid) - before_idle
    # clock-tick resolution is 10 ms: allow one tick either way
    assert used <= used_idle + 0.011 * S, "waiting backend used %.3f s CPU in 2 s (idle: %.3f)" % (
        used, used_idle)
    a.run("SELECT redis_lock_release('idle')")
    b.join()
    idle.join()
    assert b.error is None


@pytest.mark.parametrize("workers,iterations", [(8, 400)])
def test_mutual_exclusion_read_modify_write(pg, sessions, rc, workers, iterations):
    setup = sessions()
    setup.run("DROP TABLE IF EXISTS counter; CREATE TABLE counter(v bigint); "
              "INSERT INTO counter VALUES (0)")

    def worker(locked, n, errors):
        s = sessions()
        try:
            for _ in range(n):
                if locked:
                    s.run("SELECT redis_lock_acquire('counter', wait => '60s')")
                v = s.run("SELECT v FROM counter")          # read ...
                s.run("UPDATE counter SET v = %s", (v + 1,))  # ... then write
                if locked:
                    assert s.run("SELECT redis_lock_release('counter')")
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def run(locked, n):
        setup.run("UPDATE counter SET v = 0")
        errors = []
        ts = [threading.Thread(target=worker, args=(locked, n, errors)) for _ in range(workers)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        assert not errors, errors
        return setup.run("SELECT v FROM counter")

    # the workload really races without the lock (the test can fail) ...
    assert run(False, 100) < workers * 100
    # ... and never with it
    assert run(True, iterations) == workers * iterations
    assert rc.exists("counter") == 0


def test_cancel_ends_a_30s_wait_within_1s(sessions, rc):
    a, b, admin = sessions(), sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('cancel-me') > 0")
    b.start("SELECT redis_lock_acquire('cancel-me', wait => '30s')")
    wait_for_wait_event(admin.conn, b.pid)
    t0 = time.monotonic()
    assert admin.run("SELECT pg_cancel_backend(%s)", (b.pid,))
    b.join(5)
    assert isinstance(b.error, psycopg2.errors.QueryCanceled)
    assert b.finished_at - t0 < S * 1.0
    # the session is usable and holds nothing
    assert b.run("SELECT count(*) FROM redis_lock_held()") == 0
    a.run("SELECT redis_lock_release('cancel-me')")
    assert b.run("SELECT redis_lock_acquire('cancel-me', wait => '1s') > 0")
    b.run("SELECT redis_lock_release('cancel-me')")


def test_statement_timeout_ends_a_30s_wait_within_1s(sessions, rc):
    a, b = sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('st') > 0")
    b.run("SET statement_timeout = '300ms'")
    t0 = time.monotonic()
    with pytest.raises(psycopg2.errors.QueryCanceled) as ei:
        b.run("SELECT redis_lock_acquire('st', wait => '30s')")
    assert "statement timeout" in str(ei.value)
    assert time.monotonic() - t0 < S * 1.0
    b.run("RESET statement_timeout")
    a.run("SELECT redis_lock_release('st')")


def test_terminate_ends_a_wait_and_frees_held_locks(pg, sessions, rc):
    a, b, admin = sessions(), sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('term-wait') > 0")
    assert b.run("SELECT redis_lock_acquire('term-held') > 0")
    b.start("SELECT redis_lock_acquire('term-wait', wait => '30s')")
    wait_for_wait_event(admin.conn, b.pid)
    assert rc.exists("term-held") == 1
    t0 = time.monotonic()
    assert admin.run("SELECT pg_terminate_backend(%s)", (b.pid,))
    b.join(5)
    assert isinstance(b.error, psycopg2.OperationalError)
    # its session lock is released by the exiting backend itself
    testbed.wait_until(lambda: rc.exists("term-held") == 0, 1.0, what="term-held released")
    assert time.monotonic() - t0 < S * 1.0
    a.run("SELECT redis_lock_release('term-wait')")


def test_xact_lock_handed_over_at_commit_and_rollback(sessions, rc):
    a, b, admin = sessions(), sessions(), sessions()
    for end in ("COMMIT", "ROLLBACK"):
        a.run("BEGIN")
        assert a.run("SELECT redis_lock_acquire('tx-handover', xact => true) > 0")
        b.start("SELECT redis_lock_acquire('tx-handover', wait => '10s')")
        wait_for_wait_event(admin.conn, b.pid)
        assert rc.exists("tx-handover") == 1
        a.run(end)
        ended = time.monotonic()
        b.join()
        assert b.error is None
        assert b.finished_at - ended < testbed.WAKE_BOUND
        assert b.run("SELECT lock_name FROM redis_lock_held()") == "tx-handover"
        assert b.run("SELECT redis_lock_release('tx-handover')")
        assert rc.exists("tx-handover") == 0


def test_foreign_holder_that_never_publishes(sessions, rc):
    """redis-py style holder: plain SET NX PX, plain DEL, no PUBLISH."""
    a, admin = sessions(), sessions()
    rc.set("foreign", "their-token", px=60000, nx=True)
    a.start("SELECT redis_lock_acquire('foreign', wait => '10s')")
    wait_for_wait_event(admin.conn, a.pid)
    time.sleep(0.3)          # let the poll back off to its cap
    rc.delete("foreign")
    deleted = time.monotonic()
    a.join()
    assert a.error is None
    # bounded backoff: a poll at most every 100 ms, not the holder's 60 s TTL
    assert a.finished_at - deleted < testbed.WAKE_BOUND
    assert rc.get("foreign").startswith(b"pgrl:")
    a.run("SELECT redis_lock_release('foreign')")


def test_holder_expiry_is_noticed_without_a_message(sessions, rc):
    """The wait is capped by the holder's remaining TTL."""
    a = sessions()
    rc.set("expiring-holder", "pgrl:not-a-live-session", px=400)
    t0 = time.monotonic()
    # marked as ours, so the waiter relies on pub/sub plus the TTL cap
    assert a.run("SELECT redis_lock_acquire('expiring-holder', wait => '5s') > 0")
    took = time.monotonic() - t0
    # a holder marked as ours is polled every 1 s: back well before that
    assert 0.35 < took < 0.8 * S, "took %.3f s for a 400 ms holder" % took
    a.run("SELECT redis_lock_release('expiring-holder')")


def test_try_acquire_does_not_wait(sessions, rc):
    a, b = sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('try') > 0")
    t0 = time.monotonic()
    assert b.run("SELECT redis_lock_try_acquire('try')") is False
    assert time.monotonic() - t0 < testbed.WAKE_BOUND     # not the 10 s wait_timeout
    a.run("SELECT redis_lock_release('try')")
    assert b.run("SELECT redis_lock_try_acquire('try')") is True
    assert a.run("SELECT redis_lock_try_acquire('try')") is False
    b.run("SELECT redis_lock_release('try')")


def commands_of(rc, call):
    """{command: calls} Redis counted while call() ran (nothing else talks
    to it: the holder's lock has a fixed ttl, so no worker renews it)."""
    rc.config_resetstat()
    call()
    return {k[len("cmdstat_"):]: v["calls"] for k, v in rc.info("commandstats").items()
            if k not in ("cmdstat_config|resetstat", "cmdstat_config")}


def test_try_acquire_with_wait_null_does_not_wait(sessions, rc):
    """wait => NULL means no wait (0), not redis_lock.wait_timeout
    (doc/reference.md): one attempt, the same commands as wait => '0', no
    subscription, false at once although wait_timeout is a minute."""
    a, b = sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('try-null', ttl => '5min') > 0")
    b.run("SET redis_lock.wait_timeout = '60s'")
    assert b.run("SELECT redis_lock_try_acquire('try-null')") is False   # connected, scripts loaded
    zero = commands_of(rc, lambda: b.run("SELECT redis_lock_try_acquire('try-null', wait => '0')"))
    t0 = time.monotonic()
    null = commands_of(rc, lambda: b.run("SELECT redis_lock_try_acquire('try-null', wait => NULL)"))
    took = time.monotonic() - t0
    assert null == zero and null.get("evalsha") == 1, (null, zero)     # one attempt
    assert not any("subscribe" in k for k in null), null
    assert took < 10 * S, "waited %.1f s" % took           # not the 60 s wait_timeout
    assert b.run("SELECT redis_lock_try_acquire('try-null', wait => NULL)") is False
    assert a.run("SELECT redis_lock_release('try-null')") is True


def test_fence_increases_across_sessions(sessions, rc):
    a, b = sessions(), sessions()
    fences = []
    for s in (a, b, a, b):
        fences.append(s.run("SELECT redis_lock_acquire('fenced')"))
        s.run("SELECT redis_lock_release('fenced')")
    assert fences == sorted(fences) and len(set(fences)) == 4


def test_force_release_deletes_any_holder_and_wakes_waiters(sessions, rc):
    holder, waiter, admin = sessions(), sessions(), sessions()
    # a holder marked as ours (a crashed session): a waiter polls it every 1 s
    rc.set("stuck", "pgrl:a-crashed-session", px=60000)
    waiter.start("SELECT redis_lock_acquire('stuck', wait => '20s')")
    wait_for_wait_event(admin.conn, waiter.pid)
    assert admin.run("SELECT redis_lock_force_release('stuck')") is True
    forced = time.monotonic()
    waiter.join()
    assert waiter.error is None
    assert waiter.finished_at - forced < testbed.WAKE_BOUND  # woken by the publish, not a poll
    assert rc.get("stuck").startswith(b"pgrl:") and rc.get("stuck") != b"pgrl:a-crashed-session"
    # forcing out a lock a session of ours holds: that session learns it lost it
    assert admin.run("SELECT redis_lock_force_release('stuck')") is True
    assert waiter.run("SELECT redis_lock_release('stuck')") is False
    assert admin.run("SELECT redis_lock_force_release('stuck')") is False
    assert holder.run("SELECT count(*) FROM redis_lock_held()") == 0
