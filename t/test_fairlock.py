"""Fair locks (redis_lock.protocol = 'redisson_fair', Redisson's RFairLock
layout) among SQL sessions: grants in arrival order, waiters that give up
leave the queue at once, a crashed waiter stalls the queue no longer than
its time in the timeout set.  (Mixed with real Redisson threads:
t/test_interop_java.py.)"""
import os
import signal
import time

import psycopg2
import pytest

from conftest import wait_for_wait_event
import testbed
from testbed import TIME_SCALE as S

QUEUE = "redisson_lock_queue:{%s}"
TIMEOUTS = "redisson_lock_timeout:{%s}"


@pytest.fixture
def fair(sessions):
    def make():
        s = sessions()
        s.run("SET redis_lock.protocol = 'redisson_fair'")
        return s
    return make


def join_queue(session, admin, rc, name, position, wait="30s"):
    """Start session waiting for name; return the owner id it queued with
    (every grant has one of its own, doc/failures.md "Owner values") once
    it is queued at position."""
    session.start("SELECT redis_lock_acquire(%s, wait => %s) > 0", (name, wait))
    wait_for_wait_event(admin.conn, session.pid)
    testbed.wait_until(lambda: rc.llen(QUEUE % name) == position + 1, 5,
                       what="waiter %d in the queue" % position)
    return rc.lindex(QUEUE % name, position).decode()


def test_sql_waiters_are_granted_in_arrival_order(fair, sessions, rc):
    holder, admin = fair(), sessions()
    waiters = [fair() for _ in range(4)]
    assert holder.run("SELECT redis_lock_acquire('fifo') > 0")
    # an attempt that does not wait never joins the queue
    assert waiters[0].run("SELECT redis_lock_try_acquire('fifo')") is False
    assert rc.llen(QUEUE % "fifo") == 0
    owners = [join_queue(w, admin, rc, "fifo", i) for i, w in enumerate(waiters)]
    assert [o.decode() for o in rc.lrange(QUEUE % "fifo", 0, -1)] == owners
    assert len(set(owners)) == len(owners)
    # each release wakes exactly the head, on its own channel
    current = holder
    for i, w in enumerate(waiters):
        released = time.monotonic()
        assert current.run("SELECT redis_lock_release('fifo')") is True
        w.join()
        assert w.error is None and w.result is True
        assert w.finished_at - released < testbed.WAKE_BOUND
        assert w.run("SELECT owner FROM redis_lock_status('fifo')") == owners[i]
        for later in waiters[i + 1:]:
            assert later.thread.is_alive(), "waiter granted out of turn"
        assert rc.llen(QUEUE % "fifo") == len(waiters) - i - 1
        current = w
    assert current.run("SELECT redis_lock_release('fifo')") is True
    assert rc.exists("fifo", QUEUE % "fifo", TIMEOUTS % "fifo") == 0


@pytest.mark.parametrize("how", ["timeout", "cancel", "terminate"])
def test_a_waiter_that_gives_up_leaves_the_queue_at_once(fair, sessions, rc, how):
    holder, quitter, next_, admin = fair(), fair(), fair(), sessions()
    assert holder.run("SELECT redis_lock_acquire('q') > 0")
    quitter.start("SELECT redis_lock_acquire('q', wait => %s) > 0",
                  ("500ms" if how == "timeout" else "30s",))
    wait_for_wait_event(admin.conn, quitter.pid)
    testbed.wait_until(lambda: rc.llen(QUEUE % "q") == 1, 5, what="first waiter queued")
    quitter_owner = rc.lindex(QUEUE % "q", 0).decode()
    join_queue(next_, admin, rc, "q", 1)
    gave_up = time.monotonic()
    if how == "cancel":
        assert admin.run("SELECT pg_cancel_backend(%s)", (quitter.pid,)) is True
    elif how == "terminate":
        assert admin.run("SELECT pg_terminate_backend(%s)", (quitter.pid,)) is True
    quitter.join()
    if how == "timeout":
        assert isinstance(quitter.error, psycopg2.errors.LockNotAvailable)
    else:
        assert quitter.error is not None
    testbed.wait_until(lambda: rc.lrange(QUEUE % "q", 0, -1) != [quitter_owner.encode()]
                       and quitter_owner.encode() not in rc.lrange(QUEUE % "q", 0, -1),
                       1.0 * S, what="the quitter to leave the queue")
    assert time.monotonic() - gave_up < 1.0 * S
    assert rc.zscore(TIMEOUTS % "q", quitter_owner) is None
    # the next waiter is head now and gets the lock on release at once
    released = time.monotonic()
    assert holder.run("SELECT redis_lock_release('q')") is True
    next_.join()
    assert next_.error is None and next_.result is True
    assert next_.finished_at - released < testbed.WAKE_BOUND
    assert next_.run("SELECT redis_lock_release('q')") is True


def test_a_crashed_waiter_stalls_the_queue_only_until_its_time(env):
    r, pg, session = env
    rc = r.client()
    # a foreign holder (a Redisson thread) with a 1 s lease
    rc.hset("crash", "0e2c6f5a-0000-4000-8000-000000000001:7", 1)
    rc.pexpire("crash", 1000)
    doomed, admin = session(), session()
    doomed.run("SET redis_lock.protocol = 'redisson_fair'")
    doomed.start("SELECT redis_lock_acquire('crash', wait => '2s') > 0")
    wait_for_wait_event(admin.conn, doomed.pid)
    testbed.wait_until(lambda: rc.llen(QUEUE % "crash") == 1, 5, what="the waiter queued")
    (dead_owner, deadline_ms), = rc.zrange(TIMEOUTS % "crash", 0, -1, withscores=True)
    ready = pg.ready_count()
    os.kill(doomed.pid, signal.SIGKILL)         # no exit callback runs
    doomed.join()
    pg.wait_reinitialized(ready)

    def back():
        try:
            pg.connect().close()
            return True
        except psycopg2.OperationalError:
            return False
    testbed.wait_until(back, 30, what="PostgreSQL back after the crash")
    assert rc.lrange(QUEUE % "crash", 0, -1) == [dead_owner], "the crashed waiter is still queued"
    late = session()
    late.run("SET redis_lock.protocol = 'redisson_fair'")
    assert late.run("SELECT redis_lock_acquire('crash', wait => '10s') > 0") is True
    granted_ms = time.time() * 1000
    # not before the dead waiter's time, and not much after it
    assert granted_ms >= deadline_ms - 50
    assert granted_ms - deadline_ms < 1200 * S
    assert rc.llen(QUEUE % "crash") == 0
    assert late.run("SELECT redis_lock_release('crash')") is True


def fair_channel(name, owner):
    """The channel a fair waiter with this owner id listens on."""
    return "redisson_lock__channel:{%s}:%s" % (name, owner)


def listen(rc, channel):
    p = rc.pubsub()
    p.subscribe(channel)
    assert p.get_message(timeout=5)["type"] == "subscribe"
    return p


def heard(p, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = p.get_message(timeout=0.05)
        if m is not None and m["type"] == "message":
            return True
    return False


def test_force_release_skips_expired_queue_heads(fair, rc):
    """The queue's head is a waiter whose time has passed (it crashed); a
    live waiter is behind it (a foreign one that only listens on its
    channel).  A force release must drop the dead head and wake the live
    waiter on its own channel, as Redisson's forceUnlock does, not wake the
    dead one and leave the live one to its own timer."""
    rc.hset("pf", "0e2c6f5a-0000-4000-8000-000000000002:9", 1)   # a foreign holder
    rc.pexpire("pf", 60000)
    dead = "0e2c6f5a-0000-4000-8000-000000000003:11"
    live = "0e2c6f5a-0000-4000-8000-000000000005:15"
    rc.rpush(QUEUE % "pf", dead, live)
    now_ms = time.time() * 1000
    rc.zadd(TIMEOUTS % "pf", {dead: now_ms - 5000, live: now_ms + 60000})
    sub = listen(rc, fair_channel("pf", live))
    forcer = fair()
    assert forcer.run("SELECT redis_lock_force_release('pf')") is True
    assert heard(sub, 1 * S), "the live waiter was not woken on its channel"
    assert rc.lrange(QUEUE % "pf", 0, -1) == [live.encode()]


def test_a_release_after_the_lease_ran_out_still_wakes_the_queue(fair, sessions, rc):
    """Our lease ran out while a waiter that is not polling (a foreign one,
    here a live entry at the head of the queue) waits: our release finds the
    lock gone, says so, and still wakes that head, who would otherwise wait
    for its own timer."""
    a = fair()
    assert a.run("SELECT redis_lock_acquire('fx', ttl => '300ms') > 0")
    head = "0e2c6f5a-0000-4000-8000-000000000004:13"
    rc.rpush(QUEUE % "fx", head)
    rc.zadd(TIMEOUTS % "fx", {head: time.time() * 1000 + 60000})
    sub = listen(rc, fair_channel("fx", head))
    testbed.wait_until(lambda: not rc.exists("fx"), 5, 0.01, what="the lease to run out")
    assert a.run("SELECT redis_lock_release('fx')") is False     # lost: a WARNING
    assert heard(sub, 1 * S), "the queue's head was not woken"
