"""The fault matrix: every soft path x every fault the test bed can make.

Soft paths are the ones that must never raise for a Redis failure (or must
raise only the caller's own error): the release at COMMIT (with and without
verify_on_commit), at ROLLBACK and at ROLLBACK TO SAVEPOINT, the release on
redis_lock_with_lock's error path, settling a doubt, the watchdog's renewal
and its release of an exited backend's locks, a waiter cancelled at the
moment of its grant, the worker settling a doubt while the session idles,
and the Redlock give-back.

Faults: Redis stopped, frozen (SIGSTOP), answering with an error (ACL), and
slower than command_timeout (a proxy); Sentinel and master down; a Cluster
master down; a majority of Redlock masters stopped or frozen.

Each cell checks, after the fault is healed (t/checks.py): cancel and
statement_timeout still end a wait within 1 s; what the session believes it
holds equals what Redis holds for it; no lease is renewed for a lock no
session holds.  And the soft path itself returned within its bound.
"""
import os
import signal
import threading
import time

import psycopg2
import pytest

from checks import (assert_belief_matches_redis, assert_interruptible,
                    assert_not_renewed, held_names, mine_in_redis)
from conftest import Session
import testbed
from testbed import TIME_SCALE as S

TIMEOUT_MS = 500
LEASE = "1500ms"
# a soft path waits at most command_timeout + connect_timeout, plus slack
BOUND = (2 * TIMEOUT_MS / 1000.0 + 0.7) * S


def fresh_pg(**conf):
    conf.setdefault("redis_lock.command_timeout", "%dms" % TIMEOUT_MS)
    conf.setdefault("redis_lock.connect_timeout", "%dms" % TIMEOUT_MS)
    conf.setdefault("redis_lock.lease_time", LEASE)
    return testbed.Postgres(conf=conf).init().start().with_extension()


# ================================================================ faults

class SingleNode:
    """One Redis behind a proxy whose delay a fault can raise."""

    def __init__(self):
        self.redis = testbed.Redis().start()
        self.proxy = testbed.DelayProxy(self.redis.port, 0.0).start()
        self.pg = fresh_pg(**{"redis_lock.url": self.proxy.url})

    def client(self):
        if self.redis.proc.poll() is not None:
            self.redis.start()
        return self.redis.client()

    def close(self):
        self.pg.cleanup()
        self.proxy.stop()
        self.redis.stop()


def stop(env):
    env.redis.kill()

    def heal():
        env.redis.start()
    return heal


def freeze(env):
    env.redis.pause()
    return env.redis.resume


def error_reply(env):
    c = env.redis.client()
    c.execute_command("ACL", "SETUSER", "default", "-evalsha", "-eval")

    def heal():
        c.execute_command("ACL", "SETUSER", "default", "+@all")
    return heal


def slow(env):
    env.proxy.delay = 3 * TIMEOUT_MS / 1000.0

    def heal():
        env.proxy.delay = 0.0
    return heal


FAULTS = {"stopped": stop, "frozen": freeze, "error-reply": error_reply, "slow": slow}


# ================================================================ soft paths

def timed(fn):
    t0 = time.monotonic()
    out = fn()
    return time.monotonic() - t0, out


def run_expect(s, q, codes):
    """Run q; it may succeed or fail with one of codes, nothing else."""
    try:
        s.run(q)
        return None
    except psycopg2.Error as e:
        assert e.pgcode in codes, "unexpected %s: %s" % (e.pgcode, e)
        return e.pgcode


REDIS_FAILURE = ("08006", "08001", "42501", "38000", "55P03")


def path_commit(s, fault, env, verify):
    s.run("SET redis_lock.verify_on_commit = %s" % ("on" if verify else "off"))
    s.run("BEGIN")
    s.run("SELECT redis_lock_acquire('m-commit', xact => true)")
    heal = fault(env)
    el, code = timed(lambda: run_expect(s, "COMMIT", REDIS_FAILURE + ("40001",)))
    if not verify:
        assert code is None, "COMMIT without verify must not fail"
    s.run("RESET redis_lock.verify_on_commit")
    return el, heal, ["m-commit"]


def path_commit_verify(s, fault, env):
    return path_commit(s, fault, env, True)


def path_commit_no_verify(s, fault, env):
    return path_commit(s, fault, env, False)


def path_rollback(s, fault, env):
    s.run("BEGIN")
    s.run("SELECT redis_lock_acquire('m-rollback', xact => true)")
    heal = fault(env)
    el, code = timed(lambda: run_expect(s, "ROLLBACK", ()))
    return el, heal, ["m-rollback"]


def path_savepoint(s, fault, env):
    s.run("BEGIN")
    s.run("SAVEPOINT sp")
    s.run("SELECT redis_lock_acquire('m-savepoint', xact => true)")
    heal = fault(env)
    el, code = timed(lambda: run_expect(s, "ROLLBACK TO SAVEPOINT sp", ()))
    s.run("COMMIT")
    return el, heal, ["m-savepoint"]


def path_with_lock_error(s, fault, env):
    """The query fails while Redis is faulty: its error comes back as is.
    The fault comes once the query runs (the lock's grant has been read:
    a slow proxy must not hold back the grant's own reply)."""
    box = {}
    admin = env.pg.connect()

    def body():
        try:
            s.run("SELECT redis_lock_with_lock('m-with', "
                  "'SELECT 1 / g FROM pg_sleep(1.0), generate_series(0, 0) g', "
                  "ttl => '%s')" % LEASE)
        except psycopg2.Error as e:
            box["code"] = e.pgcode
        box["done"] = time.monotonic()
    t = threading.Thread(target=body, daemon=True)
    t.start()
    try:
        testbed.wait_until(lambda: testbed.sql_one(
            admin, "SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = %s",
            (s.pid,)), 5, 0.005, what="with_lock's query to run")
    finally:
        admin.close()
    t0 = time.monotonic()
    heal = fault(env)
    t.join(30)
    assert box.get("code") == "22012", "the query's own error must come back, got %r" % box
    return box["done"] - t0 - 1.0, heal, ["m-with"]


def path_settle_doubt(s, fault, env):
    """A release fails: the lock is a doubt; the next call settles it with
    Redis still faulty, without raising for that."""
    s.run("SELECT redis_lock_acquire('m-doubt', ttl => '%s')" % LEASE)
    heal = fault(env)
    run_expect(s, "SELECT redis_lock_release('m-doubt')", REDIS_FAILURE)
    el, _ = timed(lambda: s.run("SELECT count(*) FROM redis_lock_held()"))
    return el, heal, ["m-doubt"]


def path_watchdog_renew(s, fault, env):
    """A watchdog lock while renewals fail for 2 s: afterwards it is held
    and renewed, or reported lost; never renewed once released."""
    s.run("SELECT redis_lock_acquire('m-renew')")
    heal = fault(env)
    time.sleep(2.0)
    return 0.0, heal, ["m-renew"]


def path_cancel_at_hand_over(s, fault, env):
    """A waiter's grant lands in Redis, the fault comes while its reply is
    still on the way, and the waiter is cancelled: nothing is believed, and
    once Redis answers the worker deletes the grant (the session idles).
    The proxy holds the reply back until the cancel has been served, and
    the session's own command_timeout is long, so neither the reply nor the
    session's timeout can overtake the cancel on a slow machine."""
    rc = env.client()
    channel = "redis_lock:release:{m-handover}"
    s.run("SET redis_lock.command_timeout = '20s'")
    rc.set("m-handover", "pgrl:holder", px=60000)
    s.start("SELECT redis_lock_acquire('m-handover', wait => '30s')")
    testbed.wait_until(lambda: dict(rc.pubsub_numsub(channel)).get(channel.encode()) == 1,
                       5, 0.005, what="the waiter to subscribe")
    env.proxy.delay = 1.0            # the grant's reply will be slow...
    rc.delete("m-handover")
    rc.publish(channel, "0")
    testbed.wait_until(lambda: rc.get("m-handover") not in (None, b"pgrl:holder"),
                       5, 0.002, what="the waiter's grant to land")
    env.proxy.held = True            # ...and is kept back until the cancel
    env.proxy.delay = 0.0
    # and is out of Redis: the key is visible before Redis writes the reply,
    # and a server killed in between (the stopped fault, on a loaded
    # machine: CI's cold run) takes the reply with it, and the session sees
    # its connection close before the cancel
    testbed.wait_until(lambda: env.proxy.undelivered_replies("redis_lock:%d" % s.pid) >= 1,
                       5, 0.002, what="the grant's reply to reach the proxy")
    try:
        heal = fault(env)
        t0 = time.monotonic()
        os.kill(s.pid, signal.SIGINT)    # what pg_cancel_backend sends
        s.join(5)
        el = time.monotonic() - t0
    finally:
        env.proxy.held = False
    assert s.error is not None and s.error.pgcode == "57014", s.error
    return el, heal, ["m-handover"]


def path_worker_settles_idle(s, fault, env):
    """A release fails under the fault: after healing, the watchdog worker
    deletes the lock without the session calling again (a pooled session
    may never call again)."""
    s.run("SELECT redis_lock_acquire('m-idle', ttl => '60s')")
    heal = fault(env)
    el, _ = timed(lambda: run_expect(s, "SELECT redis_lock_release('m-idle')",
                                     REDIS_FAILURE))

    def heal_then_wait_for_the_worker():
        heal()
        testbed.wait_until(lambda: not env.client().exists("m-idle"), 3 * S, 0.01,
                           what="the worker to delete the lock")
    return el, heal_then_wait_for_the_worker, ["m-idle"]


PATHS = {
    "commit-verify": path_commit_verify,
    "commit": path_commit_no_verify,
    "rollback": path_rollback,
    "savepoint": path_savepoint,
    "with_lock-error": path_with_lock_error,
    "settle-doubt": path_settle_doubt,
    "watchdog-renew": path_watchdog_renew,
    "cancelled-at-hand-over": path_cancel_at_hand_over,
    "worker-settles-idle": path_worker_settles_idle,
}


def healing(fault, pending):
    """fault, whose heal is also kept in pending until it is called: a path
    that raises after applying its fault still gets it healed (the proxy's
    delay would otherwise stay on for the cases after it)."""
    def apply(env):
        heal = fault(env)
        pending.append(heal)

        def heal_once():
            pending.remove(heal)
            heal()
        return heal_once
    return apply


def check_after(env, s, names, rc):
    """After healing: interruptible; belief = Redis (the worker may need a
    renewal period to notice a loss); locks not held are not renewed."""
    assert_interruptible(env.pg, s.conn, s.pid)

    def consistent():
        return held_names(s.conn) & set(names) == mine_in_redis(s.conn, names)
    testbed.wait_until(consistent, 3, 0.1, what="session belief to match Redis")
    assert_belief_matches_redis(s.conn, names)
    for n in names:
        if n not in held_names(s.conn):
            assert_not_renewed(rc, n, 1.0 * S)
    s.run("SELECT redis_lock_release_all()")


@pytest.fixture(scope="module")
def single():
    env = SingleNode()
    yield env
    env.close()


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("path", list(PATHS))
def test_single_node(single, path, fault):
    env = single
    rc = env.client()
    rc.flushall()
    s = Session(env.pg)
    pending = []
    try:
        el, healed, names = PATHS[path](s, healing(FAULTS[fault], pending), env)
        assert el < BOUND, "%s under %s took %.2fs" % (path, fault, el)
        healed()
        rc = env.client()
        check_after(env, s, names, rc)
    finally:
        for heal in list(pending):
            heal()
        s.close()


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_single_node_orphan_release(single, fault):
    """The backend exits (terminated) while Redis is faulty: the exit is
    prompt, and the worker releases what it left once Redis answers."""
    env = single
    rc = env.client()
    rc.flushall()
    s = Session(env.pg)
    admin = env.pg.connect()
    s.run("SELECT redis_lock_acquire('m-orphan', ttl => '30s')")
    heal = FAULTS[fault](env)
    try:
        t0 = time.monotonic()
        assert testbed.sql_one(admin, "SELECT pg_terminate_backend(%s)", (s.pid,))
        testbed.wait_until(lambda: not testbed.sql_one(
            admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (s.pid,)),
            BOUND, 0.01, what="terminated backend to exit")
        assert time.monotonic() - t0 < 1.0 * S
    finally:
        heal()
    rc = env.client()
    testbed.wait_until(lambda: rc.exists("m-orphan") == 0, 5, 0.05,
                       what="the worker to release the orphan")
    testbed.wait_until(lambda: testbed.sql_one(
        admin, "SELECT count(*) FROM redis_lock_locks") == 0, 5, 0.05, what="registry empty")
    admin.close()
    s.close()


# ================================================================ a release nobody waits for

# After COMMIT the release is sent and its reply read at the next call
# (test_async_release.py).  Here its reply never comes, or comes as an
# error: the fault strikes while the request still sits in the proxy.
ASYNC_DELAY = 0.5 * S


def session_client_id(rc, pid):
    for c in rc.client_list():
        if c.get("name") == "redis_lock:%d" % pid:
            return c["id"]
    raise AssertionError("no connection of backend %d" % pid)


def async_dropped(env, s, rc):
    """The connection is dropped before the reply (the request is lost)."""
    rc.execute_command("CLIENT", "KILL", "ID", session_client_id(rc, s.pid))
    return lambda: None


def async_frozen(env, s, rc):
    """Redis is frozen after the send: no reply within command_timeout."""
    env.redis.pause()
    return env.redis.resume


def async_noperm(env, s, rc):
    """The reply is an error: the ACL no longer allows our scripts."""
    rc.execute_command("ACL", "SETUSER", "default", "-evalsha", "-eval")
    return lambda: rc.execute_command("ACL", "SETUSER", "default", "+@all")


def async_wrongtype(env, s, rc):
    """The key is replaced by one of another type: the release finds it
    not ours."""
    rc.delete("m-async")
    rc.hset("m-async", "someone", "1")
    return lambda: rc.delete("m-async")


ASYNC_FAULTS = {
    # fault: (its function, the WARNING the next call gives)
    "dropped": (async_dropped, 'could not release Redis lock "m-async"'),
    "frozen": (async_frozen, 'could not release Redis lock "m-async"'),
    "error-reply": (async_noperm, 'could not release Redis lock "m-async"'),
    "wrong-type": (async_wrongtype, 'Redis lock "m-async" was lost'),
}


# how the release nobody waits for is sent: (setup, the statement, how many
# round trips the statement itself waits for)
# (every path gets a longer command_timeout than the module's: the release's
# own reply comes a delay after it was sent, which the module's 500 ms would
# only just allow, and on a loaded machine not: its wrong-type answer then
# timed out into "could not release" instead of "was lost")
ASYNC_PATHS = {
    "commit": (["SET redis_lock.command_timeout = '2s'",
                "SET redis_lock.verify_on_commit = off", "BEGIN",
                "SELECT redis_lock_acquire('m-async', xact => true)"], "COMMIT", 0),
    "commit-verify": (["SET redis_lock.command_timeout = '2s'",
                       "SET redis_lock.verify_on_commit = on", "BEGIN",
                       "SELECT redis_lock_acquire('m-async', xact => true)"], "COMMIT", 1),
    "with_lock": (["SET redis_lock.command_timeout = '2s'"],
                  "SELECT redis_lock_with_lock('m-async', 'SELECT 1')", 1),
}


@pytest.mark.parametrize("path", sorted(ASYNC_PATHS))
@pytest.mark.parametrize("fault", sorted(ASYNC_FAULTS))
def test_single_node_unanswered_async_release(single, fault, path):
    """The release after COMMIT (with or without its verify) or at the end of
    redis_lock_with_lock is sent, then its reply never comes or is an
    error: the statement has returned already, having waited only for its
    own round trips; the next call says so (a WARNING), the session holds
    nothing, and once healed Redis holds nothing of ours (the worker
    settles the doubt)."""
    env = single
    rc = env.client()
    rc.flushall()
    s = Session(env.pg)
    apply, expected = ASYNC_FAULTS[fault]
    setup, statement, waited = ASYNC_PATHS[path]
    heal = None
    try:
        for q in setup:
            s.run(q)
        env.proxy.delay = ASYNC_DELAY
        el, code = timed(lambda: run_expect(s, statement, ()))
        heal = apply(env, s, rc)
        env.proxy.delay = 0.0
        # each round trip waited for costs two delays; the release's reply
        # would cost two more
        assert el < (2 * waited + 1) * ASYNC_DELAY, \
            "%s waited %.2fs: it waited for the release's reply" % (statement, el)
        del s.conn.notices[:]

        def warned():
            assert s.run("SELECT count(*) FROM redis_lock_held()") == 0
            return any(expected in n for n in s.conn.notices)
        testbed.wait_until(warned, 5 * S, 0.05, what="the next call to report the release")
        admin = env.pg.connect()
        try:
            assert testbed.sql_one(admin, "SELECT count(*) FROM redis_lock_locks "
                                   "WHERE pid = %s", (s.pid,)) == 0
        finally:
            admin.close()
        heal()
        heal = None
        check_after(env, s, ["m-async"], env.client())
        # the doubt is settled (by the worker): no key of ours is left
        rc = env.client()
        if fault != "wrong-type":
            testbed.wait_until(lambda: not rc.exists("m-async"), 5 * S, 0.05,
                               what="the lock to be gone from Redis")
    finally:
        env.proxy.delay = 0.0
        if heal is not None:
            heal()
        s.close()


def test_single_node_lost_async_release_idle_session(single):
    """The release after COMMIT is lost with its connection (killed while
    the request sits in the proxy), then Redis freezes for longer than
    command_timeout, and the session never calls again (a pooled session
    idling): the worker takes the release over once its reply is overdue
    and deletes the lock within a second of Redis answering again, long
    before its lease ends; it renews nothing."""
    env = single
    rc = env.client()
    rc.flushall()
    s = Session(env.pg)
    admin = env.pg.connect()
    resumed = False
    try:
        s.run("SET redis_lock.verify_on_commit = off")
        s.run("BEGIN")
        s.run("SELECT redis_lock_acquire('m-async-idle', xact => true, ttl => '60s')")
        env.proxy.delay = ASYNC_DELAY
        el, _ = timed(lambda: s.run("COMMIT"))
        assert el < ASYNC_DELAY, "COMMIT waited %.2fs for the release's reply" % el
        async_dropped(env, s, rc)
        env.proxy.delay = 0.0
        env.redis.pause()
        # frozen past the release's deadline (command_timeout, 500 ms)
        time.sleep(3 * TIMEOUT_MS / 1000.0)
        env.redis.resume()
        resumed = True
        t0 = time.monotonic()
        rc = env.client()
        testbed.wait_until(lambda: not rc.exists("m-async-idle"), 3 * S, 0.01,
                           what="the worker to delete the lock")
        el = time.monotonic() - t0
        print("\ndeleted %.2f s after Redis answered again" % el)
        assert el < 1.0 * S, el
        testbed.wait_until(lambda: testbed.sql_one(
            admin, "SELECT count(*) FROM redis_lock_locks") == 0, 5, 0.05, what="registry empty")
        # the session's next call: nothing held, and the lock can be taken
        del s.conn.notices[:]
        assert s.run("SELECT count(*) FROM redis_lock_held()") == 0
        assert s.run("SELECT redis_lock_try_acquire('m-async-idle', ttl => '60s')")
        assert s.run("SELECT redis_lock_release('m-async-idle')")
        check_after(env, s, ["m-async-idle"], env.client())
    finally:
        env.proxy.delay = 0.0
        if not resumed:
            env.redis.resume()
        admin.close()
        s.close()


def test_single_node_exit_with_an_owed_release_into_a_frozen_redis(single):
    """The backend is terminated right after COMMIT, its release on its way
    into a Redis that froze: the exit does not wait for that reply and then
    send the release again (each bounded, together twice the bound); the
    backend is gone within a second, quietly, and the locks are released
    once Redis answers."""
    env = single
    rc = env.client()
    rc.flushall()
    s = Session(env.pg)
    admin = env.pg.connect()
    resumed = False
    try:
        s.run("SET redis_lock.verify_on_commit = off")
        s.run("BEGIN")
        s.run("SELECT redis_lock_acquire('m-exit', xact => true, ttl => '60s')")
        s.run("SELECT redis_lock_acquire('m-exit-held', ttl => '60s')")
        env.proxy.delay = ASYNC_DELAY
        s.run("COMMIT")
        env.redis.pause()
        t0 = time.monotonic()
        assert testbed.sql_one(admin, "SELECT pg_terminate_backend(%s)", (s.pid,))
        testbed.wait_until(lambda: not testbed.sql_one(
            admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (s.pid,)),
            5, 0.01, what="terminated backend to exit")
        el = time.monotonic() - t0
        env.proxy.delay = 0.0
        print("\nexit took %.2f s" % el)
        assert el < 1.0 * S, "exit took %.2f s" % el
        env.redis.resume()
        resumed = True
        rc = env.client()
        testbed.wait_until(lambda: not rc.exists("m-exit") and not rc.exists("m-exit-held"),
                           3 * S, 0.01, what="the locks released")
        testbed.wait_until(lambda: testbed.sql_one(
            admin, "SELECT count(*) FROM redis_lock_locks") == 0, 5, 0.05, what="registry empty")
        log = env.pg.log_text()
        assert 'could not release Redis lock "m-exit"' not in log, "a WARNING at exit"
    finally:
        env.proxy.delay = 0.0
        if not resumed:
            env.redis.resume()
        admin.close()
        s.close()


def test_exit_does_not_wait_for_the_workers_release_under_way():
    """A session's release after COMMIT goes unanswered (Redis froze); the
    session idles until the worker takes the release over and sends it,
    with the worker's 3 s command_timeout, into the frozen Redis.  A
    terminate now is served at once: the exit leaves the release with the
    worker instead of waiting out the worker's command with interrupts
    held.  The lock is released once Redis answers."""
    redis = testbed.Redis().start()
    proxy = testbed.DelayProxy(redis.port, 0.0).start()
    pg = fresh_pg(**{"redis_lock.url": proxy.url, "redis_lock.command_timeout": "3s"})
    s = Session(pg)
    admin = pg.connect()
    resumed = False
    try:
        s.run("SET redis_lock.command_timeout = '300ms'")
        s.run("SET redis_lock.verify_on_commit = off")
        s.run("BEGIN")
        s.run("SELECT redis_lock_acquire('m-worker-exit', xact => true, ttl => '60s')")
        before = proxy.chunks_in
        redis.pause()
        s.run("COMMIT")
        # the session's release, then (after twice its 300 ms) the worker's
        testbed.wait_until(lambda: proxy.chunks_in >= before + 2, 10, 0.01,
                           what="the worker to send the release into the frozen Redis")
        t0 = time.monotonic()
        assert testbed.sql_one(admin, "SELECT pg_terminate_backend(%s)", (s.pid,))
        testbed.wait_until(lambda: not testbed.sql_one(
            admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (s.pid,)),
            5, 0.01, what="terminated backend to exit")
        el = time.monotonic() - t0
        print("\nexit took %.2f s" % el)
        assert el < 1.0 * S, "exit took %.2f s" % el
        redis.resume()
        resumed = True
        rc = redis.client()
        testbed.wait_until(lambda: not rc.exists("m-worker-exit"), 8, 0.01,
                           what="the worker to release the lock")
    finally:
        if not resumed:
            redis.resume()
        admin.close()
        s.close()
        pg.cleanup()
        proxy.stop()
        redis.stop()


# ================================================================ a reply lost, the command sent again

@pytest.fixture(scope="module")
def resend_env():
    """One Redis behind a proxy that can drop a reply and reset the
    connection it was for; command_timeout is long, so the reset (not a
    timeout) ends the wait for that reply however loaded the machine."""
    class Env:
        pass
    env = Env()
    env.redis = testbed.Redis().start()
    env.proxy = testbed.DelayProxy(env.redis.port, 0.0).start()
    env.pg = fresh_pg(**{"redis_lock.url": env.proxy.url,
                         "redis_lock.command_timeout": "10s"})
    yield env
    env.pg.cleanup()
    env.proxy.stop()
    env.redis.stop()


RESENT = {
    # what: (take it, seconds to hold it, give it back, what that returns)
    "release": ("SELECT redis_lock_acquire('rs', ttl => '30s') > 0", 0,
                "SELECT redis_lock_release('rs')", True),
    "release_read": ("SELECT redis_lock_acquire_read('rs', ttl => '30s') IS NOT NULL", 0,
                     "SELECT redis_lock_release_read('rs')", True),
    "release_write": ("SELECT redis_lock_acquire_write('rs', ttl => '30s') IS NOT NULL", 0,
                      "SELECT redis_lock_release_write('rs')", True),
    "release_many": ("SELECT redis_lock_acquire_many(ARRAY['rs', 'rs2'], ttl => '30s') IS NOT NULL", 0,
                     "SELECT redis_lock_release_many(ARRAY['rs', 'rs2'])", 2),
    # held past its first lease (1.5 s), which the worker renewed
    "release-watchdog": ("SELECT redis_lock_acquire('rs') > 0", 2.5,
                         "SELECT redis_lock_release('rs')", True),
}


def lose_reply_and_resend(env, s, rc, sql, done):
    """Run sql with every reply held in the proxy; once Redis has run it
    (done() is true), reset the connection: the reply is lost and the
    command goes again on a fresh connection.  Returns what sql returned."""
    env.proxy.held = True
    try:
        s.start(sql)
        testbed.wait_until(done, 10 * S, 0.005, what="Redis to run it")
        assert env.proxy.reset_clients() >= 1
    finally:
        env.proxy.held = False
    s.join(20)
    assert s.error is None, s.error
    return s.result


@pytest.mark.parametrize("what", list(RESENT))
def test_a_release_sent_again_after_its_reply_was_lost_is_released(resend_env, what):
    """Issue 33 item 10: a lock taken with a 30 s ttl (or renewed by the
    worker past its first lease) is given back; Redis deletes it, but the
    reply is lost with the connection (the proxy resets it), so the
    release is sent again on a fresh connection and finds nothing of ours.
    The first send deleted it: released, true (2 for release_many), no
    WARNING that it was lost.  (Before: false and 'Redis lock "rs" was
    lost', every time.)"""
    env = resend_env
    rc = env.redis.client()
    rc.flushall()
    s = Session(env.pg)
    take, hold, give, released = RESENT[what]
    try:
        assert s.run(take)
        time.sleep(hold)
        assert rc.exists("rs")
        del s.conn.notices[:]
        out = lose_reply_and_resend(env, s, rc, give,
                                    lambda: not rc.exists("rs") and not rc.exists("rs2"))
        print("\n%s returned %r, notices %r" % (what, out, s.conn.notices))
        assert not [n for n in s.conn.notices if "lost" in n], s.conn.notices
        assert out == released
        assert not rc.exists("rs") and not rc.exists("rs2")
        assert s.run("SELECT count(*) FROM redis_lock_held()") == 0
        check_after(env, s, ["rs", "rs2"], rc)
    finally:
        s.close()


def test_an_extend_sent_again_after_its_reply_was_lost_keeps_the_lock(resend_env):
    """The same lost reply for redis_lock_extend (a guard: the extend's
    first send can only restart our lease, so its repeat finds the lock
    ours, as the first would have): true, no WARNING, the new lease set."""
    env = resend_env
    rc = env.redis.client()
    rc.flushall()
    s = Session(env.pg)
    try:
        assert s.run("SELECT redis_lock_acquire('rs', ttl => '30s') > 0")
        del s.conn.notices[:]
        out = lose_reply_and_resend(env, s, rc, "SELECT redis_lock_extend('rs', '90s')",
                                    lambda: rc.pttl("rs") > 60000)
        assert out is True and not s.conn.notices, (out, s.conn.notices)
        assert rc.pttl("rs") > 60000
        assert s.run("SELECT count(*) FROM redis_lock_held() WHERE NOT lost") == 1
        assert s.run("SELECT redis_lock_release('rs')") is True
    finally:
        s.close()


def test_a_release_sent_again_after_the_lease_ran_out_is_still_lost(resend_env):
    """The other side of item 10 (a guard that passes before and after the
    fix): a lock whose 300 ms lease ran out before it was given back is
    lost, and a release sent again after its reply was lost says so too,
    as its first answer would have."""
    env = resend_env
    rc = env.redis.client()
    rc.flushall()
    s = Session(env.pg)
    try:
        assert s.run("SELECT redis_lock_acquire('rs', ttl => '300ms') > 0")
        testbed.wait_until(lambda: not rc.exists("rs"), 5, 0.01, what="the lease to run out")
        del s.conn.notices[:]
        before = env.proxy.chunks_in
        out = lose_reply_and_resend(env, s, rc, "SELECT redis_lock_release('rs')",
                                    lambda: env.proxy.chunks_in > before)
        assert out is False
        assert [n for n in s.conn.notices if 'Redis lock "rs" was lost' in n], s.conn.notices
    finally:
        s.close()


# ================================================================ Sentinel down

@pytest.fixture(scope="module")
def sentinel_env():
    class Env:
        pass
    env = Env()
    env.redis = testbed.Redis().start()
    env.sentinels = [testbed.Sentinel(env.redis.port, quorum=1).start() for _ in range(2)]
    env.pg = fresh_pg(**{"redis_lock.sentinels": ",".join(x.url for x in env.sentinels),
                         "redis_lock.sentinel_master": "mymaster"})
    env.client = lambda: env.redis.client()
    yield env
    env.pg.cleanup()
    for x in env.sentinels + [env.redis]:
        x.stop()


def sentinel_and_master_down(env):
    for x in env.sentinels + [env.redis]:
        x.kill()

    def heal():
        env.redis.start()
        for x in env.sentinels:
            x.start()
    return heal


@pytest.mark.parametrize("path", ["commit", "rollback", "savepoint", "with_lock-error",
                                  "settle-doubt"])
def test_sentinel_and_master_down(sentinel_env, path):
    env = sentinel_env
    env.client().flushall()
    s = Session(env.pg)
    pending = []
    try:
        el, healed, names = PATHS[path](s, healing(sentinel_and_master_down, pending), env)
        assert el < 2 * BOUND, "%s took %.2fs" % (path, el)
        # the backend is not deaf while Redis is still unreachable either
        assert_interruptible(env.pg, s.conn, s.pid)
        healed()
        check_after(env, s, names, env.client())
    finally:
        for heal in list(pending):
            heal()
        s.close()


# ================================================================ Cluster master down

@pytest.fixture(scope="module")
def cluster_env():
    class Env:
        pass
    env = Env()
    env.nodes = [testbed.cluster_node().start() for _ in range(3)]
    testbed.create_cluster(env.nodes)
    env.pg = fresh_pg(**{"redis_lock.url": env.nodes[0].url, "redis_lock.cluster": "on"})
    yield env
    env.pg.cleanup()
    for n in env.nodes:
        n.stop()


def owner_of(nodes, key):
    c = nodes[0].client()
    slot = c.execute_command("CLUSTER", "KEYSLOT", key)
    for start, end, master, *rest in c.execute_command("CLUSTER", "SLOTS"):
        if start <= slot <= end:
            return next(n for n in nodes if n.port == master[1])
    raise AssertionError("no owner")


@pytest.mark.parametrize("path", ["commit", "rollback", "savepoint", "settle-doubt"])
def test_cluster_master_down(cluster_env, path):
    """The master owning the lock's slot is frozen (its slots stay assigned
    to it: no replicas), the others answer."""
    env = cluster_env
    name = {"commit": "m-commit", "rollback": "m-rollback", "savepoint": "m-savepoint",
            "settle-doubt": "m-doubt"}[path]
    owner = owner_of(env.nodes, name)
    env.redis = owner
    env.client = lambda: owner.client()
    s = Session(env.pg)
    pending = []
    try:
        el, healed, names = PATHS[path](s, healing(freeze, pending), env)
        assert el < BOUND, "%s took %.2fs" % (path, el)
        healed()
        check_after(env, s, names, owner.client())
    finally:
        for heal in list(pending):
            heal()
        s.close()


# ================================================================ Redlock give-back

@pytest.fixture(scope="module")
def redlock_env():
    class Env:
        pass
    env = Env()
    env.masters = [testbed.Redis().start() for _ in range(3)]
    env.pg = fresh_pg(**{"redis_lock.nodes": ",".join(m.url for m in env.masters)})
    yield env
    env.pg.cleanup()
    for m in env.masters:
        m.stop()


@pytest.mark.parametrize("fault", ["stopped", "frozen"])
def test_redlock_majority_down_gives_back(redlock_env, fault):
    """Two of three masters fail: the grant on the third is given back (or
    left as a doubt and settled), and the wait stays interruptible."""
    env = redlock_env
    for m in env.masters:
        if m.proc.poll() is not None:
            m.start()
        m.client().flushall()
    s = Session(env.pg)
    down = env.masters[:2]
    for m in down:
        m.kill() if fault == "stopped" else m.pause()
    try:
        el, code = timed(lambda: run_expect(
            s, "SELECT redis_lock_try_acquire('m-redlock', wait => '1500ms')",
            REDIS_FAILURE))
        assert el < 1.5 * S + BOUND
        assert_interruptible(env.pg, s.conn, s.pid)
    finally:
        for m in down:
            m.start() if fault == "stopped" else m.resume()
    assert s.run("SELECT count(*) FROM redis_lock_held()") == 0
    testbed.wait_until(lambda: sum(m.client().exists("m-redlock") for m in env.masters) == 0,
                       3, 0.05, what="partial grants given back")
    s.close()
