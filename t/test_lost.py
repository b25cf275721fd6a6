"""Issue 34: a lost lock stops the work it protected.  The watchdog worker
finds a held lock lost (its owner value gone or replaced, or no renewal
answered before the lease ran out) and, as redis_lock.on_lost asked when the
lock was taken, cancels the holder's running statement (reported as 40001
naming the lock), ends its backend, or leaves it a WARNING for the next
call.  Foreign owners here are real redis-py clients."""
import contextlib
import threading
import time

import psycopg2
import pytest

from conftest import Session
import testbed

LEASE = 3.0                 # s; renewals every lease/3
DETECT = LEASE / 3 + 0.2    # the bound: lease/3 + 200 ms after the loss


@pytest.fixture(scope="module")
def lenv():
    r = testbed.Redis().start()
    pg = testbed.Postgres(conf={"redis_lock.url": r.url,
                                "redis_lock.lease_time": "3s",
                                "redis_lock.command_timeout": "1s",
                                "redis_lock.connect_timeout": "1s"}).init().start().with_extension()
    admin = pg.connect()
    yield r, pg, admin
    admin.close()
    pg.cleanup()
    r.stop()


@pytest.fixture
def env(lenv):
    r, pg, admin = lenv
    if r.proc.poll() is not None:
        r.start()
    rc = r.client()
    rc.flushall()
    made = []

    def session(**kw):
        s = Session(pg, **kw)
        made.append(s)
        return s
    yield r, rc, pg, admin, session
    r.resume()                  # a test that froze it and failed
    for s in made:
        s.close()


def running(admin, pid):
    return testbed.sql_one(admin, "SELECT state = 'active' FROM pg_stat_activity "
                           "WHERE pid = %s", (pid,))


def sleeping(admin, pid):
    """In pg_sleep itself: inside a PL/pgSQL block's protected part, not
    still parsing or planning the statement (a cancel there is outside
    the block and no handler sees it)."""
    return testbed.sql_one(admin, "SELECT wait_event = 'PgSleep' FROM pg_stat_activity "
                           "WHERE pid = %s", (pid,))


def ended_with(s, timeout):
    s.join(timeout)
    return s.error


def take_over(rc, key, how):
    """What a foreign redis-py service does to the key."""
    if how == "deleted":
        rc.delete(key)
    else:
        rc.delete(key)
        assert rc.set(key, "service-token", nx=True, px=60000)


@pytest.mark.parametrize("how", ["deleted", "taken"])
def test_a_running_statement_fails_with_40001_when_a_service_takes_the_lock(env, how):
    r, rc, pg, admin, session = env
    a = session()
    a.run("CREATE TABLE IF NOT EXISTS lost_work (i int)")
    a.run("TRUNCATE lost_work")
    assert a.run("SELECT redis_lock_acquire('job') > 0")
    a.start("INSERT INTO lost_work SELECT g FROM generate_series(1, 1000) g; "
            "SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    t0 = time.monotonic()
    take_over(rc, "job", how)
    err = ended_with(a, DETECT + 2)
    took = time.monotonic() - t0
    print("\n%s: statement failed %.3f s after the loss" % (how, took))
    assert err is not None and err.pgcode == "40001", err
    assert 'Redis lock "job" was lost' in str(err)
    assert took < DETECT, took
    # the writes rolled back, the service's key untouched
    assert a.run("SELECT count(*) FROM lost_work") == 0
    if how == "taken":
        assert rc.get("job") == b"service-token"
    else:
        assert not rc.exists("job")
    # reported once: no WARNING about it at the next call
    del a.conn.notices[:]
    a.run("SELECT redis_lock_held()")
    assert not [n for n in a.conn.notices if "was lost" in n]
    assert a.run("SELECT interrupted >= 1 FROM redis_lock_stats()")


def test_the_loss_is_logged_once_with_its_cause(env):
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire('logged') > 0")
    a.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    rc.delete("logged")
    ended_with(a, DETECT + 2)
    log = pg.log_text()
    lines = [l for l in log.splitlines()
             if 'Redis lock "logged" of process %d was lost' % a.pid in l]
    assert len(lines) == 1, lines
    assert "cancelling its statement" in lines[0]
    assert "The statement was cancelled" in log


def test_on_lost_warn_keeps_todays_behaviour(env):
    r, rc, pg, admin, session = env
    a = session()
    a.run("SET redis_lock.on_lost = warn")
    assert a.run("SELECT redis_lock_acquire('warned') > 0")
    a.start("SELECT pg_sleep(2.5)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    rc.delete("warned")
    assert ended_with(a, 10) is None            # ran to its end
    del a.conn.notices[:]
    a.run("SELECT 1 FROM redis_lock_held()")
    assert [n for n in a.conn.notices if 'Redis lock "warned" was lost' in n]


def test_on_lost_is_taken_with_the_lock(env):
    """The value in effect when the lock was taken decides, not a later SET."""
    r, rc, pg, admin, session = env
    a = session()
    a.run("SET redis_lock.on_lost = warn")
    assert a.run("SELECT redis_lock_acquire('asked-warn') > 0")
    a.run("SET redis_lock.on_lost = error")
    a.start("SELECT pg_sleep(2.5)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    rc.delete("asked-warn")
    assert ended_with(a, 10) is None


def test_on_lost_terminate_ends_the_backend(env):
    r, rc, pg, admin, session = env
    a = session()
    a.run("SET redis_lock.on_lost = terminate")
    assert a.run("SELECT redis_lock_acquire('fatal') > 0")
    log_start = len(pg.log_text())
    a.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    t0 = time.monotonic()
    rc.delete("fatal")
    testbed.wait_until(lambda: not testbed.sql_one(
        admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (a.pid,)),
        DETECT + 2, 0.01, what="backend to end")
    assert time.monotonic() - t0 < DETECT + 0.5
    assert isinstance(ended_with(a, 5), psycopg2.OperationalError)
    # PostgreSQL's own FATAL for a SIGTERM (57P01), not made a loss
    assert "[%d] FATAL:  terminating connection due to administrator command" % a.pid \
        in pg.log_text()[log_start:]


def test_idle_in_transaction_fails_at_its_next_statement(env):
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire('idle-x') > 0")
    a.run("BEGIN")
    a.run("SELECT 1")
    rc.delete("idle-x")
    # the worker found it lost (the cancel found nothing running)
    testbed.wait_until(lambda: testbed.sql_one(
        admin, "SELECT bool_or(lost) FROM redis_lock_locks WHERE lock_name = 'idle-x'"),
        DETECT + 2, 0.02, what="the worker to find it lost")
    with pytest.raises(psycopg2.Error) as ei:
        a.run("SELECT 2")
    assert ei.value.pgcode == "40001"
    a.run("ROLLBACK")
    # once only
    assert a.run("SELECT 3") == 3


def test_idle_outside_a_transaction_gets_a_warning_at_its_next_call(env):
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire('idle') > 0")
    rc.delete("idle")
    testbed.wait_until(lambda: testbed.sql_one(
        admin, "SELECT bool_or(lost) FROM redis_lock_locks WHERE lock_name = 'idle'"),
        DETECT + 2, 0.02, what="the worker to find it lost")
    del a.conn.notices[:]
    assert a.run("SELECT 1") == 1       # no error: nothing relied on it
    a.run("SELECT redis_lock_held()")
    assert [n for n in a.conn.notices if 'Redis lock "idle" was lost' in n]


def test_redis_lock_check_raises_between_batches(env):
    r, rc, pg, admin, session = env
    a = session()
    a.run("SET redis_lock.on_lost = warn")
    assert a.run("SELECT redis_lock_check('batch')") is False     # not held
    assert a.run("SELECT redis_lock_acquire('batch') > 0")
    assert a.run("SELECT redis_lock_check('batch')") is True
    rc.delete("batch")
    a.start("DO $$ BEGIN FOR i IN 1..600 LOOP PERFORM pg_sleep(0.05); "
            "PERFORM redis_lock_check('batch'); END LOOP; END $$")
    err = ended_with(a, DETECT + 3)
    assert err is not None and err.pgcode == "40001", err


@pytest.mark.parametrize("mode", ["read", "write"])
def test_a_read_or_write_hold_lost_fails_its_statement(env, mode):
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire_%s('shared-r')" % mode) is True
    a.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    rc.delete("shared-r")
    err = ended_with(a, DETECT + 2)
    assert err is not None and err.pgcode == "40001", err


def test_redis_frozen_past_the_lease_fails_the_statement(env):
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire('frozen') > 0")
    a.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    t0 = time.monotonic()
    r.pause()
    try:
        err = ended_with(a, LEASE + 4)
        took = time.monotonic() - t0
    finally:
        r.resume()
    print("\nfrozen: statement failed %.3f s after Redis froze" % took)
    assert err is not None and err.pgcode == "40001", err
    assert "before its lease ran out" in str(err)
    # presumed lost at the lease's end, not only once Redis answers
    assert took < LEASE + 1.5


def test_a_lock_renewed_under_load_is_never_reported_lost(env):
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire('steady') > 0")
    a.start("SELECT pg_sleep(8)")
    assert ended_with(a, 15) is None
    assert a.run("SELECT lost FROM redis_lock_held()") is False


@pytest.mark.parametrize("protocol", ["redisson", "redisson_fair"])
def test_redisson_layouts_lost_fail_the_statement(env, protocol):
    r, rc, pg, admin, session = env
    a = session()
    a.run("SET redis_lock.protocol = '%s'" % protocol)
    assert a.run("SELECT redis_lock_acquire('hashed') > 0")
    assert rc.type("hashed") == b"hash"
    a.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    # another Redisson client's hold replaces ours (its field, count 1)
    rc.delete("hashed")
    rc.hset("hashed", "f2c1b6a4-0000-4000-8000-000000000000:1", 1)
    rc.pexpire("hashed", 60000)
    err = ended_with(a, DETECT + 2)
    assert err is not None and err.pgcode == "40001", err
    assert rc.hgetall("hashed") == {b"f2c1b6a4-0000-4000-8000-000000000000:1": b"1"}


def test_a_transaction_scoped_lock_lost_fails_its_transaction(env):
    r, rc, pg, admin, session = env
    a = session()
    a.run("CREATE TABLE IF NOT EXISTS lost_x (i int)")
    a.run("TRUNCATE lost_x")
    a.run("BEGIN")
    assert a.run("SELECT redis_lock_acquire('x-scoped', xact => true) > 0")
    a.run("INSERT INTO lost_x VALUES (1)")
    a.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    rc.delete("x-scoped")
    err = ended_with(a, DETECT + 2)
    assert err is not None and err.pgcode == "40001", err
    a.run("ROLLBACK")
    assert a.run("SELECT count(*) FROM lost_x") == 0


def test_with_lock_query_is_cancelled_and_the_release_spares_the_new_owner(env):
    r, rc, pg, admin, session = env
    a = session()
    a.start("SELECT redis_lock_with_lock('wrapped', 'SELECT pg_sleep(60)')")
    testbed.wait_until(lambda: rc.exists("wrapped") and running(admin, a.pid), 5,
                       what="wrapped query running")
    take_over(rc, "wrapped", "taken")
    err = ended_with(a, DETECT + 2)
    assert err is not None and err.pgcode == "40001", err
    a.run("SELECT 1")           # reads the release's answer
    assert rc.get("wrapped") == b"service-token"


def test_rollback_of_a_transaction_idle_at_the_loss_succeeds(env):
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire('idle-rb') > 0")
    a.run("BEGIN")
    a.run("SELECT 1")
    rc.delete("idle-rb")
    testbed.wait_until(lambda: testbed.sql_one(
        admin, "SELECT bool_or(lost) FROM redis_lock_locks WHERE lock_name = 'idle-rb'"),
        DETECT + 2, 0.02, what="the worker to find it lost")
    a.run("ROLLBACK")           # no error


def test_a_serialization_failure_handler_catches_the_loss(env):
    """The loss is raised where the worker's cancel is, before any handler
    has it: PL/pgSQL's handler for serialization_failure catches it (the
    usual way to retry on 40001), the query_canceled one does not run, and
    it is reported once."""
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire('caught') > 0")
    a.start("DO $$ BEGIN PERFORM pg_sleep(60); "
            "EXCEPTION WHEN serialization_failure THEN RAISE NOTICE 'caught %: %', SQLSTATE, SQLERRM; "
            "WHEN query_canceled THEN RAISE NOTICE 'cancel %', SQLSTATE; END $$")
    testbed.wait_until(lambda: sleeping(admin, a.pid), 5, what="the block sleeping")
    rc.delete("caught")
    assert ended_with(a, DETECT + 2) is None
    notices = list(a.conn.notices)
    assert [n for n in notices if 'caught 40001: Redis lock "caught" was lost' in n], notices
    assert not [n for n in notices if "cancel" in n], notices
    del a.conn.notices[:]
    a.run("SELECT redis_lock_held()")
    assert not [n for n in a.conn.notices if "was lost" in n], a.conn.notices


def test_a_procedure_retries_a_lost_lock_on_serialization_failure(env):
    """A procedure that retries on 40001 sees the loss and retries: its
    second attempt takes the lock again and ends."""
    r, rc, pg, admin, session = env
    a = session()
    a.run("CREATE OR REPLACE PROCEDURE lost_retry() LANGUAGE plpgsql AS $$ "
          "DECLARE tries int := 0; BEGIN LOOP tries := tries + 1; BEGIN "
          "  PERFORM redis_lock_acquire('retried', xact => true); "
          "  PERFORM pg_sleep(CASE WHEN tries = 1 THEN 60 ELSE 0 END); "
          "  RAISE NOTICE 'done after % tries', tries; EXIT; "
          "EXCEPTION WHEN serialization_failure THEN RAISE NOTICE 'retry after %', SQLSTATE; "
          "END; END LOOP; END $$")
    a.start("CALL lost_retry()")
    testbed.wait_until(lambda: rc.exists("retried") and running(admin, a.pid), 5,
                       what="the first attempt running")
    rc.delete("retried")
    assert ended_with(a, DETECT + 2) is None
    notices = list(a.conn.notices)
    assert [n for n in notices if "retry after 40001" in n], notices
    assert [n for n in notices if "done after 2 tries" in n], notices


@pytest.mark.parametrize("how", ["pg_cancel_backend", "statement_timeout"])
def test_a_cancel_not_the_workers_stays_57014_while_a_lock_is_held(env, how):
    """A user's cancel and statement_timeout in a statement holding a lock
    (not lost) are what they are: 57014 to a PL/pgSQL handler and to the
    client, the lock still held and not reported lost."""
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire('kept') > 0")
    block = ("DO $$ BEGIN PERFORM pg_sleep(60); "
             "EXCEPTION WHEN serialization_failure THEN RAISE NOTICE 'loss %', SQLSTATE; "
             "WHEN query_canceled THEN RAISE NOTICE 'cancel %', SQLSTATE; END $$")
    for caught in (True, False):
        if how == "statement_timeout":
            a.run("SET statement_timeout = '1s'")
        a.start(block if caught else "SELECT pg_sleep(60)")
        if how == "pg_cancel_backend":
            testbed.wait_until(lambda: sleeping(admin, a.pid), 5, what="statement sleeping")
            assert testbed.sql_one(admin, "SELECT pg_cancel_backend(%s)", (a.pid,))
        err = ended_with(a, 10)
        a.run("RESET statement_timeout")
        if caught:
            assert err is None, err
            assert [n for n in a.conn.notices if "cancel 57014" in n], a.conn.notices
        else:
            assert err is not None and err.pgcode == "57014", err
    assert not [n for n in a.conn.notices if "loss" in n], a.conn.notices
    assert a.run("SELECT redis_lock_check('kept')") is True


def test_a_fixed_ttl_lock_is_not_watched(env):
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire('fixed-ttl', ttl => '60s') > 0")
    a.start("SELECT pg_sleep(2.5)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    rc.delete("fixed-ttl")
    assert ended_with(a, 10) is None


def test_without_preloading_nothing_interrupts_the_holder():
    r = testbed.Redis().start()
    pg = testbed.Postgres(preload=False, conf={"redis_lock.url": r.url}).init().start().with_extension()
    try:
        rc = r.client()
        a = Session(pg)
        assert a.run("SELECT redis_lock_acquire('np') > 0")
        a.start("SELECT pg_sleep(1.5)")
        testbed.wait_until(lambda: rc.exists("np"), 5, what="lock taken")
        rc.delete("np")
        assert ended_with(a, 10) is None
        # redis_lock_check knows only what the session's calls saw
        assert a.run("SELECT redis_lock_check('np')") is True
        assert a.run("SELECT redis_lock_extend('np', NULL)") is False   # finds it lost
        with pytest.raises(psycopg2.Error) as ei:
            a.run("SELECT redis_lock_check('np')")
        assert ei.value.pgcode == "40001"
        a.close()
    finally:
        pg.cleanup()
        r.stop()


def test_redlock_lost_on_a_majority_fails_the_statement():
    """On Redlock masters a lock is lost once a majority no longer holds our
    owner value: one master losing it is not enough."""
    masters = [testbed.Redis().start() for _ in range(3)]
    pg = testbed.Postgres(conf={"redis_lock.nodes": ",".join(m.url for m in masters),
                                "redis_lock.lease_time": "3s"}).init().start().with_extension()
    try:
        admin = pg.connect()
        a = Session(pg)
        assert a.run("SELECT redis_lock_acquire('rl-job')") is None      # no fence
        a.start("SELECT pg_sleep(60)")
        testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
        masters[0].client().delete("rl-job")
        # a minority lost: renewed on, never reported (two renewals pass)
        time.sleep(2 * LEASE / 3 + 0.3)     # no condition to poll: nothing may happen
        assert a.thread.is_alive()
        assert not testbed.sql_one(admin, "SELECT bool_or(lost) FROM redis_lock_locks")
        masters[1].client().delete("rl-job")
        err = ended_with(a, DETECT + 2)
        assert err is not None and err.pgcode == "40001", err
        admin.close()
        a.close()
    finally:
        pg.cleanup()
        for m in masters:
            m.stop()


def test_a_redis_restart_with_aof_that_keeps_the_key_is_no_loss():
    """No false positive: Redis restarts (AOF, fsync always) while the
    holder's statement runs; the key comes back with our owner value, the
    renewals fail only briefly, within the lease, and the statement runs to
    its end."""
    r = testbed.Redis(args=["--appendonly", "yes", "--appendfsync", "always"]).start()
    pg = testbed.Postgres(conf={"redis_lock.url": r.url, "redis_lock.lease_time": "3s",
                                "redis_lock.command_timeout": "500ms",
                                "redis_lock.connect_timeout": "500ms"}).init().start().with_extension()
    try:
        admin = pg.connect()
        a = Session(pg)
        assert a.run("SELECT redis_lock_acquire('durable') > 0")
        a.start("SELECT pg_sleep(5)")
        testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
        r.restart()
        assert r.client().exists("durable")
        assert ended_with(a, 15) is None
        assert a.run("SELECT lost FROM redis_lock_held()") is False
        assert not testbed.sql_one(admin, "SELECT bool_or(lost) FROM redis_lock_locks")
        admin.close()
        a.close()
    finally:
        pg.cleanup()
        r.stop()


def test_a_users_cancel_after_an_idle_loss_stays_a_cancel(env):
    """The worker's cancel for a loss found while the session was idle was
    ignored; a later cancel of the user's is reported as what it is (57014),
    and the loss as a WARNING at the next redis_lock call."""
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire('idle-then-cancel') > 0")
    rc.delete("idle-then-cancel")
    testbed.wait_until(lambda: testbed.sql_one(
        admin, "SELECT bool_or(lost) FROM redis_lock_locks WHERE lock_name = 'idle-then-cancel'"),
        DETECT + 2, 0.02, what="the worker to find it lost")
    a.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    assert testbed.sql_one(admin, "SELECT pg_cancel_backend(%s)", (a.pid,))
    err = ended_with(a, 5)
    assert err is not None and err.pgcode == "57014", err
    del a.conn.notices[:]
    a.run("SELECT redis_lock_held()")
    assert [n for n in a.conn.notices if 'Redis lock "idle-then-cancel" was lost' in n]


def test_a_login_only_role_can_check_and_choose_only_for_itself(env):
    """redis_lock_check is PUBLIC and reads only the caller's own locks;
    redis_lock.on_lost is a user setting: it decides only for the locks of
    the session that sets it."""
    r, rc, pg, admin, session = env
    admin.cursor().execute("DROP ROLE IF EXISTS lost_tenant")
    admin.cursor().execute("CREATE ROLE lost_tenant LOGIN")
    owner = session()
    assert owner.run("SELECT redis_lock_acquire('owned-elsewhere') > 0")
    t = session(user="lost_tenant")
    t.run("SET redis_lock.on_lost = terminate")
    assert t.run("SELECT redis_lock_check('owned-elsewhere')") is False
    owner.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, owner.pid), 5, what="statement running")
    rc.delete("owned-elsewhere")
    err = ended_with(owner, DETECT + 2)
    assert err is not None and err.pgcode == "40001", err   # its own error, not terminate


# ----------------------------------------------------------------------
# Detection by keyspace notification (watchevents.c): where the server
# sends them, the worker is subscribed to every lock it renews, and a key
# deleted, expired or evicted is renewed at once, so the loss is found
# without waiting for the next renewal.  A 30 s lease is renewed every
# 10 s: a loss found within a second was found by the event.
# ----------------------------------------------------------------------
EVENT_BOUND = 1.0       # s; measured ~0.01 s, doc/leases.md


def keyspace_channel(key):
    return "__keyspace@0__:" + key


def worker_watches(rc, key):
    ch = keyspace_channel(key)
    return dict(rc.pubsub_numsub(ch)).get(ch.encode(), 0) >= 1


def sleep_under_a_watched_lock(a, admin, rc, name, lease):
    """a takes name with lease and runs a long statement once the worker
    is subscribed to the key's notifications."""
    a.run("SET redis_lock.lease_time = %s", (lease,))
    assert a.run("SELECT redis_lock_acquire(%s) > 0", (name,))
    testbed.wait_until(lambda: worker_watches(rc, name), 10,
                       what="the worker subscribed to the key's notifications")
    a.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")


def assert_loss_stops_a_statement(a, admin, rc, key, bound):
    """A statement of a's, run now, fails with 40001 within bound (s) of a
    foreign client deleting key; returns how long it took."""
    a.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    t0 = time.monotonic()
    rc.delete(key)
    err = ended_with(a, bound + 15)
    took = time.monotonic() - t0
    assert err is not None and err.pgcode == "40001", err
    assert took < bound, took
    return took


def channel_refusals(rc):
    """Subscriptions the server's ACL refused so far (ACL LOG)."""
    return sum(int(e[e.index(b"count") + 1]) for e in rc.execute_command("ACL", "LOG")
               if b"channel" in e[e.index(b"reason") + 1])


@contextlib.contextmanager
def server_for_acl_user(user, rules, lease):
    """A Redis sending keyspace notifications, its ACL user `user` (password
    pw) given rules, and a preloaded PostgreSQL that connects as that user:
    yields (rc, pg, admin)."""
    r = testbed.Redis().start()
    pg = admin = None
    try:
        rc = r.client()
        rc.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw", *rules)
        rc.config_set("notify-keyspace-events", "Kgx")
        pg = testbed.Postgres(conf={
            "redis_lock.url": "redis://%s@127.0.0.1:%d/0" % (user, r.port),
            "redis_lock.password": "pw",
            "redis_lock.lease_time": lease}).init().start().with_extension()
        admin = pg.connect()
        yield rc, pg, admin
    finally:
        if admin is not None:
            admin.close()
        if pg is not None:
            pg.cleanup()
        r.stop()


@pytest.fixture
def events(env):
    r, rc, pg, admin, session = env
    rc.config_set("notify-keyspace-events", "Kgx")
    yield env
    rc.config_set("notify-keyspace-events", "")


@pytest.mark.parametrize("how", ["deleted", "taken", "expired"])
def test_a_keyspace_notification_finds_the_loss_at_once(events, how):
    r, rc, pg, admin, session = events
    a = session()
    sleep_under_a_watched_lock(a, admin, rc, "evented", "30s")
    t0 = time.monotonic()
    if how == "expired":
        rc.pexpire("evented", 1)        # a foreign client cuts the lease
        testbed.wait_until(lambda: not rc.exists("evented"), 5, what="expired")
    else:
        take_over(rc, "evented", how)
    err = ended_with(a, 15)
    took = time.monotonic() - t0
    print("\n%s, by keyspace notification: statement failed %.3f s after the loss"
          % (how, took))
    assert err is not None and err.pgcode == "40001", err
    assert 'Redis lock "evented" was lost' in str(err)
    assert took < EVENT_BOUND, took
    if how == "taken":
        assert rc.get("evented") == b"service-token"
    # the lost lock is watched no more
    testbed.wait_until(lambda: not worker_watches(rc, "evented"), 10,
                       what="the worker unsubscribed")


def test_without_notifications_the_loss_waits_for_the_renewal(env):
    """The other side of the measurement: the same loss with the server
    sending no notifications is found by the next renewal only."""
    r, rc, pg, admin, session = env
    a = session()
    # renewed every 2 s; subscribed, though nothing will be sent
    sleep_under_a_watched_lock(a, admin, rc, "polled", "6s")
    t0 = time.monotonic()
    rc.delete("polled")
    err = ended_with(a, 10)
    took = time.monotonic() - t0
    print("\ndeleted, by renewal: statement failed %.3f s after the loss" % took)
    assert err is not None and err.pgcode == "40001", err
    assert took < 2.0 + 0.2 + 1.0, took


def test_a_holders_own_renewals_and_releases_raise_no_alarm(events):
    """Its own PEXPIREs publish "expire" and its own releases "del": neither
    makes a renewal due nor a lock lost, however often."""
    r, rc, pg, admin, session = events
    rc.config_set("notify-keyspace-events", "KEA")
    a = session()
    a.run("SET redis_lock.lease_time = '3s'")
    lost_before = a.run("SELECT lost FROM redis_lock_stats()")
    assert a.run("SELECT redis_lock_acquire('quiet') > 0")
    testbed.wait_until(lambda: worker_watches(rc, "quiet"), 10, what="subscribed")
    for _ in range(100):
        assert a.run("SELECT redis_lock_release('quiet')")
        assert a.run("SELECT redis_lock_acquire('quiet') > 0")

    def renewals():
        return a.run("SELECT renewals FROM redis_lock_stats()")
    # the releases' "del"s may each have made a renewal due once (early, not
    # wrong); from the next renewal on, only the lease/3 period counts
    r0 = renewals()
    testbed.wait_until(lambda: renewals() > r0, 10, what="a renewal")
    r1 = renewals()
    t0 = time.monotonic()
    testbed.wait_until(lambda: renewals() >= r1 + 2, 10, what="two more renewals")
    took = time.monotonic() - t0
    # two renewals of a 3 s lease take about two periods (1 s each), not the
    # milliseconds of a loop; on a loaded machine the renewal seen at t0 may
    # itself have been late by a good part of a period (CI12, 2026-11-28:
    # 1.45 s), so at least one whole period
    assert took > 1.0, took
    assert renewals() <= r1 + 3
    assert a.run("SELECT lost FROM redis_lock_stats()") == lost_before
    assert a.run("SELECT NOT lost FROM redis_lock_held() WHERE lock_name = 'quiet'")


def test_a_user_denied_the_channels_is_told_once_and_renewals_still_find_losses():
    """Redis 7 gives new ACL users no channels: the worker's subscription is
    refused, logged once for as long as it keeps being refused (it tries
    again, backing off), and the loss is found by the renewal instead."""
    with server_for_acl_user("nochan", ["~*", "resetchannels", "+@all"], "3s") as (rc, pg, admin):
        a = Session(pg)
        try:
            assert a.run("SELECT redis_lock_acquire('denied') > 0")
            # refused, and tried again after backing off
            testbed.wait_until(lambda: channel_refusals(rc) >= 3, 20,
                               what="three refused subscriptions")
            line = "could not subscribe to the keyspace notifications"
            assert pg.log_text().count(line) == 1
            assert_loss_stops_a_statement(a, admin, rc, "denied", DETECT)
        finally:
            a.close()
