"""The server-local wait queue (src/wait/waitqueue.c): backends of one server that
wait for the same lock queue in shared memory; only the head works in Redis.

What each test would catch: a herd (every waiter subscribed and retrying),
waiters served out of arrival order, and a waiter that stops (cancel, a
caught cancel, terminate, its wait running out) leaving the queue stuck."""
import os
import signal
import threading
import time

import psycopg2
import pytest

from conftest import wait_for_queue_lead, wait_for_wait_event
import testbed
from testbed import TIME_SCALE as S

KEY = "herd"
CHANNEL = "redis_lock:release:{%s}" % KEY
KEYSPACE = "__keyspace@0__:" + KEY
# the holder's lock has a fixed lease: the watchdog worker subscribes to the
# keyspace notifications of the locks it renews (watchevents.c), and the
# subscriptions counted here are the waiters' alone
HOLD = "SELECT redis_lock_acquire(%s, ttl => '60s') > 0"
# a waiter whose cancel is caught by PL/pgSQL (a subtransaction abort) and
# that then stays in its transaction, on advisory lock 4242
CATCH_CANCEL_THEN_STAY = (
    "DO $$ BEGIN "
    "  BEGIN PERFORM redis_lock_acquire('herd', wait => '30s'); "
    "  EXCEPTION WHEN query_canceled THEN PERFORM pg_advisory_lock(4242); END; "
    "END $$")


def subscribers(rc):
    """Waiters of this lock subscribed in Redis (release channel, keyspace)."""
    return {(k.decode() if isinstance(k, bytes) else k): v
            for k, v in rc.pubsub_numsub(CHANNEL, KEYSPACE)}


def sub_clients(rc):
    """Names of the connections subscribed in Redis."""
    return sorted(c["name"] for c in rc.client_list()
                  if c.get("sub", "0") != "0" or c.get("ssub", "0") != "0")


def queue_up(sessions, admin, rc, n, wait="30s"):
    """n sessions waiting for KEY, started one after the other (each seen
    waiting before the next starts, so arrival order is known)."""
    out = []
    for _ in range(n):
        s = sessions()
        s.start("SELECT redis_lock_acquire(%s, wait => %s)", (KEY, wait))
        wait_for_wait_event(admin.conn, s.pid)
        out.append(s)
    # the first to arrive is the only one subscribed
    testbed.wait_until(lambda: subscribers(rc) == {CHANNEL: 1, KEYSPACE: 1}, 5,
                       what="exactly one waiter subscribed")
    return out


def granted_one(waiters, timeout=10):
    """The one waiter whose acquire returned; all others still wait."""
    deadline = time.monotonic() + timeout * S
    while time.monotonic() < deadline:
        done = [w for w in waiters if not w.thread.is_alive()]
        if done:
            time.sleep(0.05)        # would a second one finish too?
            done = [w for w in waiters if not w.thread.is_alive()]
            assert len(done) == 1, "%d waiters returned after one release" % len(done)
            w = done[0]
            assert w.error is None, w.error
            assert w.result and w.result > 0
            return w
        time.sleep(0.002)
    raise AssertionError("no waiter got the lock within %ss" % timeout)


def test_only_the_first_waiter_works_in_redis_and_order_is_fifo(sessions, rc):
    holder, admin = sessions(), sessions()
    assert holder.run(HOLD, (KEY,))
    waiters = queue_up(sessions, admin, rc, 5)
    # five waiters, one subscription of each kind: no herd
    assert subscribers(rc) == {CHANNEL: 1, KEYSPACE: 1}
    rc.config_resetstat()
    holder.run("SELECT redis_lock_release(%s)", (KEY,))
    order = []
    pending = list(waiters)
    while pending:
        w = granted_one(pending)
        order.append(waiters.index(w))
        pending.remove(w)
        w.run("SELECT redis_lock_release(%s)", (KEY,))
    assert order == [0, 1, 2, 3, 4], order
    # per hand-over at most 4: the release, the woken head's attempt, and
    # the next head's two that find the lock still held (one on its turn,
    # one after subscribing).  (Five waiters are too few for this bound to
    # tell a herd apart; the subscriber count above does, and the next test
    # bounds the attempts with 16.)
    calls = rc.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert calls <= 4 * 6, "%d EVALSHA for 6 releases and 5 hand-overs" % calls


def test_a_newcomer_queues_behind_local_waiters_instead_of_trying_first(sessions, rc):
    """The lock is free while the head cannot look (its backend is stopped):
    a newcomer that tried first would take it; it queues behind the head."""
    admin = sessions()
    foreign = rc.lock(KEY, timeout=30)
    assert foreign.acquire(blocking=False)
    (head,) = queue_up(sessions, admin, rc, 1)
    newcomer = sessions()
    os.kill(head.pid, signal.SIGSTOP)
    try:
        foreign.release()
        newcomer.start("SELECT redis_lock_acquire(%s, wait => '30s')", (KEY,))
        wait_for_wait_event(admin.conn, newcomer.pid)
        assert rc.get(KEY) is None, "the lock is free, and the newcomer waits"
    finally:
        os.kill(head.pid, signal.SIGCONT)
    assert granted_one([head, newcomer]) is head
    head.run("SELECT redis_lock_release(%s)", (KEY,))
    newcomer.join(5)
    assert newcomer.error is None and newcomer.result > 0
    newcomer.run("SELECT redis_lock_release(%s)", (KEY,))


def test_redis_work_per_hand_over_does_not_grow_with_waiters(sessions, rc):
    """16 sessions, each acquiring and releasing in one statement, 10 times:
    the lock commands per cycle stay bounded however many wait."""
    admin = sessions()
    workers = [sessions() for _ in range(16)]
    holder = sessions()
    assert holder.run(HOLD, (KEY,))
    for w in workers:
        w.start("SELECT count(*) FROM (SELECT redis_lock_acquire(%s, wait => '60s'), "
                "redis_lock_release(%s) FROM generate_series(1, 10)) s", (KEY, KEY))
    for w in workers:
        wait_for_wait_event(admin.conn, w.pid)
    rc.config_resetstat()
    holder.run("SELECT redis_lock_release(%s)", (KEY,))
    for w in workers:
        w.join(60)
        assert w.error is None and w.result == 10
    calls = rc.info("commandstats")["cmdstat_evalsha"]["calls"]
    cycles = 16 * 10
    assert calls <= 4 * cycles, "%.1f EVALSHA per cycle with 16 waiters" % (calls / cycles)


def test_cancelled_sleeper_and_caught_cancel_leave_the_queue(sessions, rc):
    holder, admin = sessions(), sessions()
    assert holder.run(HOLD, (KEY,))
    first = sessions()
    first.start("SELECT redis_lock_acquire(%s, wait => '30s')", (KEY,))
    wait_for_queue_lead(rc, first)
    cancelled = sessions()
    cancelled.start("SELECT redis_lock_acquire(%s, wait => '30s')", (KEY,))
    wait_for_wait_event(admin.conn, cancelled.pid)
    # a PL/pgSQL block that catches the cancel: its subtransaction's abort
    # must give the seat back
    caught = sessions()
    # (it then stays in its transaction, on an advisory lock the admin holds)
    admin.run("SELECT pg_advisory_lock(4242)")
    caught.start(CATCH_CANCEL_THEN_STAY)
    wait_for_wait_event(admin.conn, caught.pid)
    last = sessions()
    last.start("SELECT redis_lock_acquire(%s, wait => '30s')", (KEY,))
    wait_for_wait_event(admin.conn, last.pid)

    t0 = time.monotonic()
    admin.run("SELECT pg_cancel_backend(%s)", (cancelled.pid,))
    cancelled.join(5)
    assert time.monotonic() - t0 < 1.0 * S, "cancel took %.2f s" % (time.monotonic() - t0)
    assert isinstance(cancelled.error, psycopg2.errors.QueryCanceled)
    admin.run("SELECT pg_cancel_backend(%s)", (caught.pid,))
    testbed.wait_until(lambda: testbed.sql_one(
        admin.conn, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
        (caught.pid,)), 5, what="the caught cancel to reach the advisory lock")
    # the seats they left are gone: the others are served as if they never came
    holder.run("SELECT redis_lock_release(%s)", (KEY,))
    assert granted_one([first, last]) is first
    t0 = time.monotonic()
    first.run("SELECT redis_lock_release(%s)", (KEY,))
    last.join(5)
    assert last.error is None and last.result > 0
    # promptly: woken by the promotion, not by a nap or its own timeout
    assert last.finished_at - t0 < 0.5 * S
    last.run("SELECT redis_lock_release(%s)", (KEY,))
    admin.run("SELECT pg_advisory_unlock(4242)")
    caught.join(5)
    assert caught.error is None


@pytest.mark.parametrize("how", ["cancel", "terminate", "caught cancel"])
def test_a_head_that_stops_hands_the_lead_on(sessions, rc, how):
    holder, admin = sessions(), sessions()
    assert holder.run(HOLD, (KEY,))
    head = sessions()
    if how == "caught cancel":
        admin.run("SELECT pg_advisory_lock(4242)")
        head.start(CATCH_CANCEL_THEN_STAY)
    else:
        head.start("SELECT redis_lock_acquire(%s, wait => '30s')", (KEY,))
    wait_for_wait_event(admin.conn, head.pid)
    testbed.wait_until(lambda: rc.pubsub_numsub(KEYSPACE)[0][1] == 1, 5, what="head subscribed")
    second = sessions()
    second.start("SELECT redis_lock_acquire(%s, wait => '30s')", (KEY,))
    wait_for_wait_event(admin.conn, second.pid)
    # polled: the subscriber connections of an earlier test's sessions go
    # when their backends have exited, which a loaded machine delays
    testbed.wait_until(lambda: rc.pubsub_numsub(KEYSPACE)[0][1] == 1, 5,
                       what="the second waiter not subscribed")
    admin.run("SELECT %s(%%s)" % ("pg_terminate_backend" if how == "terminate"
                                  else "pg_cancel_backend"), (head.pid,))
    if how != "caught cancel":
        head.join(5)
    # the second takes the lead: it subscribes in Redis, and gets the lock
    # as soon as it is released; the head listens no more, even where it
    # caught the cancel and stays in its transaction
    testbed.wait_until(lambda: sub_clients(rc) == ["redis_lock:%d:sub" % second.pid]
                       and rc.pubsub_numsub(KEYSPACE)[0][1] == 1 and second.thread.is_alive(),
                       5, what="the second waiter to lead, and it alone to listen")
    t0 = time.monotonic()
    holder.run("SELECT redis_lock_release(%s)", (KEY,))
    second.join(5)
    assert second.error is None and second.result > 0
    assert second.finished_at - t0 < 0.5 * S
    second.run("SELECT redis_lock_release(%s)", (KEY,))
    if how == "caught cancel":
        assert head.thread.is_alive()   # still in its transaction all along
        admin.run("SELECT pg_advisory_unlock(4242)")
        head.join(5)
        assert head.error is None


def test_wait_runs_out_in_the_queue_and_leaves_it(sessions, rc):
    holder, admin = sessions(), sessions()
    assert holder.run(HOLD, (KEY,))
    head = sessions()
    head.start("SELECT redis_lock_acquire(%s, wait => '30s')", (KEY,))
    # queued, not only waiting: its first attempt waits on Redis too, and a
    # waiter that comes then finds no queue and works in Redis (CI24, PG 13)
    wait_for_queue_lead(rc, head)
    short = sessions()
    t0 = time.monotonic()
    with pytest.raises(psycopg2.errors.LockNotAvailable):
        short.run("SELECT redis_lock_acquire(%s, wait => '300ms')", (KEY,))
    took = time.monotonic() - t0
    assert 0.29 < took < 0.29 + 0.5 * S, "a 300 ms wait took %.3f s" % took
    # it never worked in Redis: it has no connection there, and the head is
    # the one subscriber (polled: under load the head may be between two of
    # its subscriptions)
    assert not [c for c in rc.client_list() if c["name"] == "redis_lock:%d" % short.pid]
    testbed.wait_until(lambda: rc.pubsub_numsub(KEYSPACE)[0][1] == 1, 5, 0.01,
                       what="the head to be the one subscriber")
    holder.run("SELECT redis_lock_release(%s)", (KEY,))
    head.join(5)
    assert head.error is None and head.result > 0
    head.run("SELECT redis_lock_release(%s)", (KEY,))


def test_two_servers_and_a_redis_py_client_exclude_each_other(redis_srv, pg, rc, sessions):
    """Local queues order each server's waiters; across servers and foreign
    clients Redis still decides every grant."""
    other = testbed.Postgres(conf={"redis_lock.url": redis_srv.url}).init().start().with_extension()
    try:
        inside = []
        overlaps = []
        lock = threading.Lock()
        errors = []

        def critical(who):
            with lock:
                inside.append(who)
                if len(inside) > 1:
                    overlaps.append(tuple(inside))
            time.sleep(0.001)
            with lock:
                inside.remove(who)

        def sql_worker(server, n):
            try:
                conn = server.connect()
                cur = conn.cursor()
                for _ in range(n):
                    cur.execute("SELECT redis_lock_acquire(%s, wait => '60s')", (KEY,))
                    assert cur.fetchone()[0] > 0
                    critical(conn)
                    cur.execute("SELECT redis_lock_release(%s)", (KEY,))
                    assert cur.fetchone()[0]
                conn.close()
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        def py_worker(n):
            try:
                for _ in range(n):
                    lk = rc.lock(KEY, timeout=30, blocking_timeout=60, sleep=0.001)
                    assert lk.acquire()
                    critical(lk)
                    lk.release()
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=sql_worker, args=(srv, 15))
                   for srv in (pg, other) for _ in range(4)]
        threads.append(threading.Thread(target=py_worker, args=(30,)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120 * S)
        assert not any(t.is_alive() for t in threads), "a worker did not finish"
        assert not errors, errors
        assert not overlaps, "%d overlapping critical sections" % len(overlaps)
    finally:
        other.cleanup()


def lock_subscribers(rc, name):
    """Backends subscribed in Redis for lock name, on any of its channels."""
    chans = [c for c in rc.pubsub_channels() if name in (c.decode() if isinstance(c, bytes) else c)]
    return sum(n for _, n in rc.pubsub_numsub(*chans)) if chans else 0


def test_read_holds_do_not_queue_locally(sessions, rc):
    """Read holds share the lock: each waiting reader works in Redis itself,
    and all of them get it at the writer's release."""
    writer, admin = sessions(), sessions()
    assert writer.run("SELECT redis_lock_acquire_write('rq')") is True
    readers = [sessions() for _ in range(3)]
    for r in readers:
        r.start("SELECT redis_lock_acquire_read('rq', wait => '30s')")
        wait_for_wait_event(admin.conn, r.pid)
    testbed.wait_until(lambda: lock_subscribers(rc, "rq") >= 3, 5,
                       what="every waiting reader subscribed")
    writer.run("SELECT redis_lock_release_write('rq')")
    for r in readers:
        r.join(5)
        assert r.error is None and r.result is True


def test_without_preload_every_waiter_works_in_redis(redis_srv, rc):
    """The queue needs shared memory: without preloading, each waiter
    subscribes (and retries) in Redis, as before the queue existed."""
    plain = testbed.Postgres(preload=False, conf={"redis_lock.url": redis_srv.url}).init().start()
    try:
        plain.with_extension()
        holder = plain.connect()
        admin = plain.connect()
        testbed.sql_one(holder, "SELECT redis_lock_acquire('np') > 0")
        conns, threads = [], []
        for _ in range(3):
            c = plain.connect()
            conns.append(c)
            pid = testbed.sql_one(c, "SELECT pg_backend_pid()")
            t = threading.Thread(target=lambda c=c: c.cursor().execute(
                "SELECT redis_lock_acquire('np', wait => '30s') > 0 "
                "AND redis_lock_release('np')"), daemon=True)
            t.start()
            threads.append(t)
            wait_for_wait_event(admin, pid)
        testbed.wait_until(lambda: lock_subscribers(rc, "np") >= 6, 5,
                           what="three waiters subscribed to the channel and the keyspace")
        testbed.sql_one(holder, "SELECT redis_lock_release('np')")
        for t in threads:
            t.join(10)
            assert not t.is_alive()
    finally:
        plain.cleanup()
