"""Read-write locks among SQL sessions: sharing, exclusion, wake-ups,
cancel, the watchdog, lost holds and backend exit.  (The same against a real
Redisson RReadWriteLock: t/test_interop_java.py.)"""
import time

import psycopg2
import pytest

from checks import count_renewals
from conftest import wait_for_wait_event
import testbed
from testbed import TIME_SCALE as S


def timeout_keys(rc, name):
    return sorted(rc.scan_iter("{%s}:*:rwlock_timeout:*" % name))


def test_readers_share_and_the_last_release_wakes_a_writer(sessions, rc):
    r1, r2, w, admin = sessions(), sessions(), sessions(), sessions()
    assert r1.run("SELECT redis_lock_acquire_read('doc')") is True
    assert r2.run("SELECT redis_lock_acquire_read('doc')") is True
    assert rc.hget("doc", "mode") == b"read" and rc.hlen("doc") == 3
    assert len(timeout_keys(rc, "doc")) == 2
    w.start("SELECT redis_lock_acquire_write('doc', wait => '20s')")
    wait_for_wait_event(admin.conn, w.pid)
    assert r1.run("SELECT redis_lock_release_read('doc')") is True
    time.sleep(0.2)                         # a window for a wrong grant
    assert w.thread.is_alive()
    assert rc.hget("doc", "mode") == b"read"
    released = time.monotonic()
    assert r2.run("SELECT redis_lock_release_read('doc')") is True
    w.join()
    assert w.error is None and w.result is True
    assert w.finished_at - released < testbed.WAKE_BOUND
    assert rc.hget("doc", "mode") == b"write"
    assert timeout_keys(rc, "doc") == []
    # readers now wait for the writer; its release (publish "1") wakes them all
    r1.start("SELECT redis_lock_acquire_read('doc', wait => '20s')")
    r2.start("SELECT redis_lock_acquire_read('doc', wait => '20s')")
    wait_for_wait_event(admin.conn, r1.pid)
    wait_for_wait_event(admin.conn, r2.pid)
    released = time.monotonic()
    assert w.run("SELECT redis_lock_release_write('doc')") is True
    for r in (r1, r2):
        r.join()
        assert r.error is None and r.result is True
        assert r.finished_at - released < testbed.WAKE_BOUND
    assert r1.run("SELECT redis_lock_release_read('doc')") is True
    assert r2.run("SELECT redis_lock_release_read('doc')") is True
    assert rc.exists("doc") == 0


def test_writers_exclude_each_other(sessions, rc):
    a, b = sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire_write('w')") is True
    assert b.run("SELECT redis_lock_try_acquire_write('w')") is False
    assert b.run("SELECT redis_lock_try_acquire_read('w', wait => '50ms')") is False
    with pytest.raises(psycopg2.errors.LockNotAvailable):
        b.run("SELECT redis_lock_acquire_write('w', wait => '50ms')")
    assert b.run("SELECT redis_lock_release_write('w')") is False
    assert rc.hget("w", "mode") == b"write"
    assert a.run("SELECT redis_lock_release_write('w')") is True
    assert b.run("SELECT redis_lock_try_acquire_write('w')") is True
    assert b.run("SELECT redis_lock_release_write('w')") is True


def test_an_exclusive_lock_and_a_read_write_lock_of_one_name_never_mix(sessions, rc):
    a, b = sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire_read('same')") is True
    with pytest.raises(psycopg2.errors.WrongObjectType):
        b.run("SELECT redis_lock_acquire('same')")
    b.run("SET redis_lock.protocol = 'redisson'")
    with pytest.raises(psycopg2.errors.WrongObjectType):
        b.run("SELECT redis_lock_acquire('same')")
    assert rc.hget("same", "mode") == b"read" and rc.hlen("same") == 2
    assert a.run("SELECT redis_lock_release_read('same')") is True


@pytest.mark.parametrize("how", ["cancel", "statement_timeout"])
def test_a_waiting_writer_answers_cancel(sessions, rc, how):
    r, w, admin = sessions(), sessions(), sessions()
    assert r.run("SELECT redis_lock_acquire_read('c')") is True
    if how == "statement_timeout":
        w.run("SET statement_timeout = '300ms'")
    w.start("SELECT redis_lock_acquire_write('c', wait => '30s')")
    wait_for_wait_event(admin.conn, w.pid)
    sent = time.monotonic()
    if how == "cancel":
        assert admin.run("SELECT pg_cancel_backend(%s)", (w.pid,)) is True
    w.join()
    assert isinstance(w.error, psycopg2.errors.QueryCanceled)
    assert w.finished_at - sent < 1.0 * S
    w.run("RESET statement_timeout")
    # nothing of the writer is left: the reader releases, the key goes
    assert w.run("SELECT count(*) FROM redis_lock_held()") == 0
    assert rc.hget("c", "mode") == b"read" and rc.hlen("c") == 2
    assert r.run("SELECT redis_lock_release_read('c')") is True
    assert rc.exists("c") == 0


def test_watchdog_renews_the_hash_and_the_timeout_key(sessions, rc):
    a = sessions()
    a.run("SET redis_lock.lease_time = '1500ms'")
    assert a.run("SELECT redis_lock_acquire_read('long')") is True
    (tkey,) = timeout_keys(rc, "long")
    assert count_renewals(rc, tkey, 4.5, "read hold timeout key") >= 3
    assert rc.pttl("long") > 0 and rc.pttl(tkey) > 0
    assert a.run("SELECT lost, watchdog, mode FROM redis_lock_held()") == (False, True, "read")
    assert a.run("SELECT redis_lock_release_read('long')") is True
    assert rc.exists("long", tkey) == 0
    assert a.run("SELECT redis_lock_acquire_write('long')") is True
    assert count_renewals(rc, "long", 4.5, "write hold") >= 3
    assert a.run("SELECT redis_lock_release_write('long')") is True


def test_a_read_hold_found_gone_is_reported_lost(sessions, rc):
    a, admin = sessions(), sessions()
    a.run("SET redis_lock.lease_time = '1500ms'")
    assert a.run("SELECT redis_lock_acquire_read('vanish')") is True
    rc.delete("vanish")
    testbed.wait_until(lambda: admin.run(
        "SELECT lost FROM redis_lock_locks WHERE lock_name = 'vanish'"), 5,
        what="the watchdog to find the read hold gone")
    assert rc.exists("vanish") == 0, "a lost read hold was re-created"
    assert a.run("SELECT redis_lock_release_read('vanish')") is False
    assert any("was lost" in n for n in a.conn.notices), a.conn.notices


def test_backend_exit_releases_read_and_write_holds(sessions, rc):
    a, b, admin = sessions(), sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire_read('exit1', ttl => '60s')") is True
    assert a.run("SELECT redis_lock_acquire_write('exit2', ttl => '60s')") is True
    b.start("SELECT redis_lock_acquire_write('exit1', wait => '20s')")
    wait_for_wait_event(admin.conn, b.pid)
    a.close()
    b.join()
    assert b.error is None and b.result is True
    testbed.wait_until(lambda: rc.exists("exit2") == 0, 5, what="exit2 released")
    assert timeout_keys(rc, "exit1") == []
    assert b.run("SELECT redis_lock_release_write('exit1')") is True


def test_renewing_a_write_hold_never_shortens_a_longer_read_of_its_own(sessions, rc):
    """A downgrade: the writer's watchdog lease is 1.5 s, its own read hold
    has a 60 s ttl.  Renewals of the write hold must not cut the hash's TTL
    below what the read needs (Redisson's own renewal would)."""
    a, admin = sessions(), sessions()
    a.run("SET redis_lock.lease_time = '1500ms'")
    assert a.run("SELECT redis_lock_acquire_write('dg')") is True
    assert a.run("SELECT redis_lock_acquire_read('dg', ttl => '60s')") is True
    first = admin.run("SELECT last_renewed_at FROM redis_lock_locks "
                      "WHERE lock_name = 'dg' AND mode = 'write'")
    testbed.wait_until(lambda: admin.run(
        "SELECT last_renewed_at > %s FROM redis_lock_locks "
        "WHERE lock_name = 'dg' AND mode = 'write'", (first,)), 5,
        what="a renewal of the write hold")
    assert rc.pttl("dg") > 50000
    assert a.run("SELECT redis_lock_release_write('dg')") is True
    assert rc.hget("dg", "mode") == b"read" and rc.pttl("dg") > 50000
    assert a.run("SELECT redis_lock_release_read('dg')") is True


def test_write_release_sends_1_then_0(sessions, rc):
    """A write release (and a force release of a read-write lock) publishes
    "1", as Redisson's write unlock does, then "0": Redisson answers "1" by
    releasing as many latch permits as threads are asleep on it, so a Java
    waiter that found the lock taken but was not asleep yet would sleep out
    the TTL (seen: 30 s on a loaded machine); "0" leaves it a permit."""
    a, admin = sessions(), sessions()
    p = rc.pubsub()
    p.subscribe("redisson_rwlock:{w10}")
    assert p.get_message(timeout=5)["type"] == "subscribe"

    def published():
        got = []
        while True:
            m = p.get_message(timeout=1)
            if m is None:
                return got
            got.append(m["data"])
    assert a.run("SELECT redis_lock_acquire_write('w10')") is True
    assert a.run("SELECT redis_lock_release_write('w10')") is True
    assert published() == [b"1", b"0"]
    assert a.run("SELECT redis_lock_acquire_write('w10')") is True
    assert admin.run("SELECT redis_lock_force_release('w10')") is True
    assert published() == [b"1", b"0"]
    assert a.run("SELECT redis_lock_release_write('w10')") is False
    p.close()
