"""Semaphores among SQL sessions (issue 36): the limit, waits and wake-ups,
several permits at once, scopes, leases and the watchdog, a lost permit
stopping its statement, refusals, and what a LOGIN-only role may do.  The
same against the real Redisson and redis-semaphore clients:
t/test_semaphore_redisson.py and t/test_semaphore_npm.py."""
import time

import psycopg2
import pytest

from conftest import wait_for_wait_event
import testbed
from testbed import TIME_SCALE as S


def free(rc, name):
    v = rc.get(name)
    return None if v is None else int(v)


def taken(rc, name):
    return rc.zcard("{%s}:timeout" % name)


def held_row(s, name):
    return s.run("SELECT row_to_json(h)::text FROM redis_semaphores_held() h "
                 "WHERE semaphore_name = %s", (name,))


def test_no_more_than_the_permits_are_taken_and_a_release_wakes_a_waiter(sessions, rc):
    a, b, c, admin = sessions(), sessions(), sessions(), sessions()
    assert a.run("SELECT redis_semaphore_init('exports', 2)") is True
    assert a.run("SELECT redis_semaphore_acquire('exports')") is True
    assert b.run("SELECT redis_semaphore_acquire('exports')") is True
    assert c.run("SELECT redis_semaphore_try_acquire('exports')") is False
    with pytest.raises(psycopg2.errors.LockNotAvailable):
        c.run("SELECT redis_semaphore_acquire('exports', wait => '50ms')")
    assert (free(rc, "exports"), taken(rc, "exports")) == (0, 2)
    c.start("SELECT redis_semaphore_acquire('exports', wait => '20s')")
    wait_for_wait_event(admin.conn, c.pid)
    released = time.monotonic()
    assert a.run("SELECT redis_semaphore_release('exports')") is True
    c.join()
    assert c.error is None and c.result is True
    assert c.finished_at - released < testbed.WAKE_BOUND
    assert (free(rc, "exports"), taken(rc, "exports")) == (0, 2)
    assert b.run("SELECT redis_semaphore_release('exports')") is True
    assert c.run("SELECT redis_semaphore_release('exports')") is True
    assert (free(rc, "exports"), taken(rc, "exports")) == (2, 0)


def test_several_permits_are_taken_together_or_not_at_all(sessions, rc):
    a, b = sessions(), sessions()
    a.run("SELECT redis_semaphore_init('pool', 3)")
    assert a.run("SELECT redis_semaphore_acquire('pool', 2)") is True
    assert b.run("SELECT redis_semaphore_try_acquire('pool', 2)") is False
    assert free(rc, "pool") == 1            # nothing taken by the refusal
    ids = a.run("SELECT permit_ids FROM redis_semaphores_held() WHERE semaphore_name = 'pool'")
    assert len(ids) == 2 and len(set(ids)) == 2
    for i in ids:
        # Redisson's form: 16 raw bytes in the set, 32 hex digits shown
        assert len(i) == 32 and rc.zscore("{pool}:timeout", bytes.fromhex(i)) is not None
    assert b.run("SELECT redis_semaphore_try_acquire('pool', 1)") is True
    assert (free(rc, "pool"), taken(rc, "pool")) == (0, 3)
    assert a.run("SELECT redis_semaphore_release('pool')") is True
    assert free(rc, "pool") == 2


def test_a_session_takes_its_permits_of_a_semaphore_in_one_call(sessions, rc):
    a = sessions()
    a.run("SELECT redis_semaphore_init('once', 5)")
    assert a.run("SELECT redis_semaphore_acquire('once')") is True
    with pytest.raises(psycopg2.errors.ObjectInUse):
        a.run("SELECT redis_semaphore_acquire('once', wait => '1s')")
    assert free(rc, "once") == 4


def test_a_semaphore_without_permits_yet_is_waited_for_and_init_wakes_the_waiter(sessions, rc):
    a, admin = sessions(), sessions()
    st = a.run("SELECT (initialized, available, taken)::text FROM redis_semaphore_status('later')")
    assert st == "(f,0,0)"
    assert a.run("SELECT redis_semaphore_try_acquire('later')") is False
    assert rc.exists("later") == 0          # nothing made by asking
    a.start("SELECT redis_semaphore_acquire('later', wait => '20s')")
    wait_for_wait_event(admin.conn, a.pid)
    set_at = time.monotonic()
    assert admin.run("SELECT redis_semaphore_init('later', 1)") is True
    a.join()
    assert a.error is None and a.result is True
    assert a.finished_at - set_at < testbed.WAKE_BOUND
    assert admin.run("SELECT redis_semaphore_init('later', 7)") is False
    assert free(rc, "later") == 0


def given_back(rc, name, permits):
    """Wait for a release sent without waiting (COMMIT, ROLLBACK, ROLLBACK
    TO SAVEPOINT return before Redis has run it) to land: all permits free."""
    testbed.wait_until(lambda: (free(rc, name), taken(rc, name)) == (permits, 0),
                       2 * S, what="the permits of %s back" % name)


def test_transaction_scope_gives_permits_back_at_commit_rollback_and_savepoint(sessions, rc):
    a = sessions()
    a.run("SELECT redis_semaphore_init('tx', 1)")
    for end in ("COMMIT", "ROLLBACK"):
        a.run("BEGIN")
        assert a.run("SELECT redis_semaphore_acquire('tx', xact => true)") is True
        assert free(rc, "tx") == 0
        assert "transaction" in held_row(a, "tx")
        a.run(end)
        given_back(rc, "tx", 1)
    a.run("BEGIN")
    a.run("SAVEPOINT s")
    assert a.run("SELECT redis_semaphore_acquire('tx', xact => true)") is True
    a.run("ROLLBACK TO SAVEPOINT s")
    given_back(rc, "tx", 1)
    a.run("COMMIT")
    assert a.run("SELECT count(*) FROM redis_semaphores_held()") == 0


def test_a_session_that_ends_gives_its_permits_back(sessions, rc):
    a, b, admin = sessions(), sessions(), sessions()
    a.run("SELECT redis_semaphore_init('exit', 2)")
    assert a.run("SELECT redis_semaphore_acquire('exit')") is True
    assert b.run("SELECT redis_semaphore_acquire('exit')") is True
    a.close()
    testbed.wait_until(lambda: free(rc, "exit") == 1, 5, what="the closed session's permit back")
    admin.run("SELECT pg_terminate_backend(%s)", (b.pid,))
    testbed.wait_until(lambda: free(rc, "exit") == 2, 5, what="the ended backend's permit back")
    assert taken(rc, "exit") == 0


def test_a_lease_given_runs_out_and_frees_the_permit_no_sooner(sessions, rc):
    a, b, admin = sessions(), sessions(), sessions()
    a.run("SELECT redis_semaphore_init('lease', 1)")
    taken_at = time.monotonic()
    assert a.run("SELECT redis_semaphore_acquire('lease', ttl => '1500ms')") is True
    b.start("SELECT redis_semaphore_acquire('lease', wait => '20s')")
    wait_for_wait_event(admin.conn, b.pid)
    b.join()
    assert b.error is None and b.result is True
    # the waiter retries at the nearest expiry, which nobody publishes
    assert 1.4 <= b.finished_at - taken_at < 1.5 + testbed.WAKE_BOUND
    a.conn.notices.clear()
    assert a.run("SELECT redis_semaphore_release('lease')") is False
    assert any("permits of Redis semaphore \"lease\" were lost" in n for n in a.conn.notices)
    assert (free(rc, "lease"), taken(rc, "lease")) == (0, 1)     # b's stays


def test_the_watchdog_renews_permits_past_their_lease(sessions, rc):
    a, b = sessions(), sessions()
    a.run("SET redis_lock.lease_time = '2s'")
    a.run("SELECT redis_semaphore_init('renewed', 1)")
    assert a.run("SELECT redis_semaphore_acquire('renewed')") is True
    first = rc.zrange("{renewed}:timeout", 0, 0, withscores=True)[0][1]
    # the time passing is what is tested: three leases
    time.sleep(3 * 2.0)
    assert b.run("SELECT redis_semaphore_try_acquire('renewed')") is False
    assert rc.zrange("{renewed}:timeout", 0, 0, withscores=True)[0][1] > first + 3000
    assert "\"lost\":false" in held_row(a, "renewed")
    assert a.run("SELECT redis_semaphore_release('renewed')") is True


def test_a_permit_put_back_by_another_client_stops_its_holders_statement(sessions, rc):
    a = sessions()
    a.run("SET redis_lock.lease_time = '3s'")
    a.run("SELECT redis_semaphore_init('stolen', 1)")
    assert a.run("SELECT redis_semaphore_acquire('stolen')") is True
    a.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: a.thread.is_alive(), 5)
    # another client judges the permit expired and counts it back
    for m in rc.zrange("{stolen}:timeout", 0, -1):
        rc.zrem("{stolen}:timeout", m)
        rc.incr("stolen")
    taken_at = time.monotonic()
    a.join(20)
    assert isinstance(a.error, psycopg2.errors.SerializationFailure), a.error
    assert 'permits of Redis semaphore "stolen" were lost' in str(a.error)
    assert a.finished_at - taken_at < (1.0 + 1.0) * S        # lease/3 and a round
    assert "\"lost\":true" in held_row(a, "stolen")
    assert a.run("SELECT redis_semaphore_release('stolen')") is False
    assert (free(rc, "stolen"), taken(rc, "stolen")) == (1, 0)   # nothing made


def test_cancel_ends_a_semaphore_wait_and_takes_nothing(sessions, rc):
    a, c, admin = sessions(), sessions(), sessions()
    a.run("SELECT redis_semaphore_init('busy', 1)")
    assert a.run("SELECT redis_semaphore_acquire('busy')") is True
    c.start("SELECT redis_semaphore_acquire('busy', wait => '60s')")
    wait_for_wait_event(admin.conn, c.pid)
    cancelled = time.monotonic()
    admin.run("SELECT pg_cancel_backend(%s)", (c.pid,))
    c.join(5)
    assert isinstance(c.error, psycopg2.errors.QueryCanceled)
    assert c.finished_at - cancelled < 1.0 * S
    assert (free(rc, "busy"), taken(rc, "busy")) == (0, 1)


@pytest.mark.parametrize("xact", [False, True], ids=["session", "xact"])
def test_a_cancel_after_the_grant_leaves_session_permits_held(sessions, rc, xact):
    """The waiter's grant was read and counted; its statement goes on (into
    a pg_sleep here) and the cancel lands there.  The statement fails with
    57014; session-scoped permits stay held, as a lock (and
    pg_advisory_lock) does, until released; transaction-scoped ones go with
    the abort (doc/semaphores.md, "Waiting")."""
    a, c, admin = sessions(), sessions(), sessions()
    a.run("SELECT redis_semaphore_init('late', 1)")
    assert a.run("SELECT redis_semaphore_acquire('late')") is True
    c.start("SELECT redis_semaphore_acquire('late', wait => '60s', xact => %s), pg_sleep(60)",
            (xact,))
    wait_for_wait_event(admin.conn, c.pid)
    assert a.run("SELECT redis_semaphore_release('late')") is True
    testbed.wait_until(lambda: admin.run("SELECT wait_event FROM pg_stat_activity "
                                         "WHERE pid = %s", (c.pid,)) == "PgSleep",
                       10 * S, what="the waiter granted, in its pg_sleep")
    admin.run("SELECT pg_cancel_backend(%s)", (c.pid,))
    c.join(5)
    assert isinstance(c.error, psycopg2.errors.QueryCanceled)
    if xact:
        testbed.wait_until(lambda: (free(rc, "late"), taken(rc, "late")) == (1, 0), 5 * S,
                           what="the transaction's permit back at the abort")
        assert c.run("SELECT count(*) FROM redis_semaphores_held()") == 0
        return
    assert (free(rc, "late"), taken(rc, "late")) == (0, 1)
    assert c.run("SELECT permits FROM redis_semaphores_held() "
                 "WHERE semaphore_name = 'late' AND NOT lost") == 1
    assert a.run("SELECT redis_semaphore_try_acquire('late')") is False
    assert c.run("SELECT redis_semaphore_release('late')") is True
    assert (free(rc, "late"), taken(rc, "late")) == (1, 0)


def test_a_key_of_another_kind_is_refused_and_left_as_it_is(sessions, rc):
    a = sessions()
    rc.set("a-lock", "redis_lock:0123456789abcdef")
    rc.hset("a-hash", "f", "1")
    for key in ("a-lock", "a-hash"):
        with pytest.raises(psycopg2.errors.WrongObjectType):
            a.run("SELECT redis_semaphore_acquire(%s, wait => '0')", (key,))
    assert rc.get("a-lock") == b"redis_lock:0123456789abcdef" and rc.hlen("a-hash") == 1
    a.run("SET redis_lock.semaphore_protocol = 'redis_semaphore'")
    with pytest.raises(psycopg2.errors.WrongObjectType):
        a.run("SELECT redis_semaphore_acquire('a-lock', max_permits => 2, wait => '0')")


def test_arguments_are_checked(sessions):
    a = sessions()
    for q in ("SELECT redis_semaphore_acquire('x', 0)",
              "SELECT redis_semaphore_acquire('x', 1001)",
              "SELECT redis_semaphore_acquire('x', max_permits => 3)",
              "SELECT redis_semaphore_init('x', -1)"):
        with pytest.raises(psycopg2.errors.InvalidParameterValue):
            a.run(q)
    with pytest.raises(psycopg2.errors.NullValueNotAllowed):
        a.run("SELECT redis_semaphore_acquire('x', NULL)")
    a.run("SET redis_lock.semaphore_protocol = 'redis_semaphore'")
    for q in ("SELECT redis_semaphore_acquire('x')",
              "SELECT redis_semaphore_acquire('x', 3, max_permits => 2)"):
        with pytest.raises(psycopg2.errors.InvalidParameterValue):
            a.run(q)
    with pytest.raises(psycopg2.errors.FeatureNotSupported):
        a.run("SELECT redis_semaphore_init('x', 3)")


def test_a_refused_semaphore_name_is_named_as_semaphore_name(sessions, rc):
    """Every semaphore function names its parameter, semaphore_name, when it
    refuses the name (it said lock_name before issue 43)."""
    a = sessions()
    calls = ["redis_semaphore_acquire(%s)", "redis_semaphore_try_acquire(%s)",
             "redis_semaphore_release(%s)", "redis_semaphore_extend(%s)",
             "redis_semaphore_status(%s)", "redis_semaphore_init(%s, 1)"]
    names = [(None, psycopg2.errors.NullValueNotAllowed, "semaphore_name must not be null"),
             ("", psycopg2.errors.InvalidParameterValue, "semaphore_name must not be empty"),
             ("x" * 513, psycopg2.errors.InvalidParameterValue,
              "semaphore_name must not be longer than 512 bytes"),
             ("redis_lock:fence:{x}", psycopg2.errors.InvalidParameterValue,
              'semaphore_name "redis_lock:fence:{x}" is reserved')]
    for call in calls:
        for name, error, message in names:
            with pytest.raises(error) as e:
                a.run("SELECT " + call % "%s::text", (name,))
            assert e.value.diag.message_primary == message, call
    # the lock functions keep theirs
    with pytest.raises(psycopg2.errors.InvalidParameterValue) as e:
        a.run("SELECT redis_lock_acquire('')")
    assert e.value.diag.message_primary == "lock_name must not be empty"
    assert rc.dbsize() == 0


def test_without_scripts_semaphores_are_refused(sessions, rc):
    a = sessions()
    a.run("SET redis_lock.scripting = off")
    with pytest.raises(psycopg2.errors.FeatureNotSupported) as e:
        a.run("SELECT redis_semaphore_acquire('noscript')")
    assert "needs Lua scripts" in str(e.value)
    assert rc.keys("*noscript*") == []


def test_permits_are_not_locks_in_redis_lock_held_but_show_in_the_cluster_view(sessions, rc):
    a, admin = sessions(), sessions()
    a.run("SELECT redis_semaphore_init('listed', 2)")
    before = admin.run("SELECT acquired FROM redis_lock_stats()")
    assert a.run("SELECT redis_semaphore_acquire('listed', 2)") is True
    assert a.run("SELECT count(*) FROM redis_lock_held()") == 0
    assert admin.run("SELECT hold_count FROM redis_lock_locks WHERE pid = %s "
                     "AND lock_name = 'listed' AND mode = 'permit'", (a.pid,)) == 1
    assert admin.run("SELECT acquired FROM redis_lock_stats()") == before + 1
    st = admin.run("SELECT (initialized, available, taken, held_by_me)::text "
                   "FROM redis_semaphore_status('listed')")
    assert st == "(t,0,2,0)"
    assert a.run("SELECT held_by_me FROM redis_semaphore_status('listed')") == 2


# ----------------------------------------------------------------------------
# Who may do what
# ----------------------------------------------------------------------------

def make_role(admin, name):
    admin.run("DROP ROLE IF EXISTS %s" % name)
    admin.run("CREATE ROLE %s LOGIN" % name)


def test_a_login_only_role_takes_no_permits_and_reads_no_keys_until_granted(pg, sessions, rc):
    admin = sessions()
    make_role(admin, "sem_login")
    rc.set("app:counter", "1000")           # another application's integer
    u = sessions(user="sem_login")
    for q in ("SELECT redis_semaphore_acquire('app:counter')",
              "SELECT redis_semaphore_try_acquire('app:counter')",
              "SELECT redis_semaphore_status('app:counter')",
              "SELECT redis_semaphore_init('app:counter', 1)"):
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            u.run(q)
    assert rc.get("app:counter") == b"1000"
    # its own permits only: nothing to give back, nothing listed
    assert u.run("SELECT redis_semaphore_release('app:counter')") is False
    assert u.run("SELECT count(*) FROM redis_semaphores_held()") == 0


def test_a_granted_role_cannot_set_limits_or_give_back_others_permits(pg, sessions, rc):
    admin, holder = sessions(), sessions()
    make_role(admin, "sem_user")
    admin.run("GRANT EXECUTE ON FUNCTION redis_semaphore_acquire(text, integer, interval, "
              "interval, boolean, integer) TO sem_user")
    admin.run("SELECT redis_semaphore_init('shared', 2)")
    assert holder.run("SELECT redis_semaphore_acquire('shared')") is True
    u = sessions(user="sem_user")
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        u.run("SELECT redis_semaphore_init('shared', 100)")
    assert u.run("SELECT redis_semaphore_release('shared')") is False
    assert (free(rc, "shared"), taken(rc, "shared")) == (1, 1)
    assert u.run("SELECT redis_semaphore_acquire('shared')") is True
    assert u.run("SELECT redis_semaphore_release('shared')") is True
    assert (free(rc, "shared"), taken(rc, "shared")) == (1, 1)   # the holder's stays
    # its key prefix confines it as it confines its locks
    admin.run("ALTER ROLE sem_user SET redis_lock.key_prefix = 'tenantS:'")
    rc.set("tenantS:shared", "1")
    u2 = sessions(user="sem_user")
    assert u2.run("SELECT redis_semaphore_acquire('shared', wait => '0')") is True
    assert free(rc, "tenantS:shared") == 0 and free(rc, "shared") == 1
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        u2.run("SET redis_lock.key_prefix = ''")


def test_redis_lock_release_all_gives_permits_back_too(sessions, rc):
    a = sessions()
    a.run("SELECT redis_semaphore_init('all', 2)")
    assert a.run("SELECT redis_semaphore_acquire('all', 2)") is True
    assert a.run("SELECT redis_lock_acquire('a-lock-too')") > 0
    assert a.run("SELECT redis_lock_release_all()") == 2
    assert (free(rc, "all"), taken(rc, "all")) == (2, 0)
    assert a.run("SELECT count(*) FROM redis_semaphores_held()") == 0


def test_a_set_of_permits_counts_as_one_of_the_sessions_locks(sessions, rc):
    a = sessions()
    a.run("SET redis_lock.max_locks_per_session = 1")
    a.run("SELECT redis_semaphore_init('counted', 5)")
    assert a.run("SELECT redis_semaphore_acquire('counted', 3)") is True
    with pytest.raises(psycopg2.errors.ConfigurationLimitExceeded):
        a.run("SELECT redis_lock_acquire('one-more')")
    assert a.run("SELECT redis_semaphore_release('counted')") is True


def test_a_redis_semaphore_wait_polls_and_ends_on_cancel(sessions, rc):
    a, c, admin = sessions(), sessions(), sessions()
    for s in (a, c):
        s.run("SET redis_lock.semaphore_protocol = 'redis_semaphore'")
    assert a.run("SELECT redis_semaphore_acquire('semaphore:p', max_permits => 1)") is True
    c.start("SELECT redis_semaphore_acquire('semaphore:p', max_permits => 1, wait => '60s')")
    wait_for_wait_event(admin.conn, c.pid)
    released = time.monotonic()
    assert a.run("SELECT redis_semaphore_release('semaphore:p')") is True
    c.join()
    assert c.error is None and c.result is True
    assert c.finished_at - released < 0.1 * S + testbed.WAKE_BOUND   # a 100 ms poll at most
    a.start("SELECT redis_semaphore_acquire('semaphore:p', max_permits => 1, wait => '60s')")
    wait_for_wait_event(admin.conn, a.pid)
    cancelled = time.monotonic()
    admin.run("SELECT pg_cancel_backend(%s)", (a.pid,))
    a.join(5)
    assert isinstance(a.error, psycopg2.errors.QueryCanceled)
    assert a.finished_at - cancelled < 1.0 * S
    assert rc.zcard("semaphore:p") == 1


def test_permits_whose_acquire_outcome_was_lost_are_given_back_and_not_reused():
    """The acquire goes to a frozen Redis and times out (08006): its outcome
    is unknown.  When Redis thaws it runs the acquire (the permit is
    taken); the worker must give it back, and the session's next acquire
    uses ids of its own, so exactly one permit is taken in the end."""
    r = testbed.Redis().start()
    pg = testbed.Postgres(conf={"redis_lock.url": r.url,
                                "redis_lock.lease_time": "4s",
                                "redis_lock.command_timeout": "300ms",
                                "redis_lock.connect_timeout": "300ms"}).init().start()
    pg.with_extension()
    rc = r.client()
    a = None
    try:
        a = pg.connect()
        testbed.sql_one(a, "SELECT redis_semaphore_init('doubt', 3)")
        rc.config_resetstat()
        r.pause()
        with pytest.raises(psycopg2.errors.ConnectionFailure):
            testbed.sql_one(a, "SELECT redis_semaphore_acquire('doubt')")
        r.resume()
        thawed = time.monotonic()
        # only the acquire script decrements: it ran (the permit was taken)
        testbed.wait_until(lambda: rc.info("commandstats").get("cmdstat_decrby", {}).get("calls", 0) >= 1,
                           3 * S, what="the frozen acquire to run")
        testbed.wait_until(lambda: free(rc, "doubt") == 3 and taken(rc, "doubt") == 0,
                           3 * S, what="the late grant to be given back")
        print("late permit back %.0f ms after Redis thawed" % ((time.monotonic() - thawed) * 1000))
        assert testbed.sql_one(a, "SELECT redis_semaphore_acquire('doubt')") is True
        ids = testbed.sql_one(a, "SELECT permit_ids FROM redis_semaphores_held()")
        time.sleep(0.5)                         # a window for a stray release
        assert (free(rc, "doubt"), taken(rc, "doubt")) == (2, 1)
        assert rc.zscore("{doubt}:timeout", bytes.fromhex(ids[0])) is not None
    finally:
        r.resume()
        if a is not None:
            a.close()
        pg.cleanup()
        r.stop()


def test_on_a_cluster_the_keys_share_a_slot_and_a_broken_hash_tag_is_refused():
    nodes = [testbed.cluster_node().start() for _ in range(3)]
    pg = None
    try:
        testbed.create_cluster(nodes)
        pg = testbed.Postgres(conf={"redis_lock.url": nodes[0].url,
                                    "redis_lock.cluster": "on"}).init().start().with_extension()
        a = pg.connect()
        for name in ("c-sem", "{tag}sem"):
            assert testbed.sql_one(a, "SELECT redis_semaphore_init(%s, 1)", (name,)) is True
            assert testbed.sql_one(a, "SELECT redis_semaphore_acquire(%s)", (name,)) is True
            owner, _ = testbed.slot_owner(nodes, name)
            timeout_key = ("{%s}:timeout" % name) if "{" not in name else name + ":timeout"
            assert owner.client().zcard(timeout_key) == 1
            assert owner.client().get(name) == b"0"
            assert testbed.sql_one(a, "SELECT redis_semaphore_release(%s)", (name,)) is True
        with pytest.raises(psycopg2.errors.FeatureNotSupported):
            testbed.sql_one(a, "SELECT redis_semaphore_acquire('half{tag')")
        a.close()
    finally:
        if pg is not None:
            pg.cleanup()
        for n in nodes:
            n.stop()


def test_several_independent_masters_are_refused():
    ms = [testbed.Redis().start() for _ in range(3)]
    pg = None
    try:
        pg = testbed.Postgres(conf={"redis_lock.nodes": ",".join(m.url for m in ms)}
                              ).init().start().with_extension()
        a = pg.connect()
        for q in ("SELECT redis_semaphore_acquire('rl')",
                  "SELECT redis_semaphore_status('rl')",
                  "SELECT redis_semaphore_init('rl', 1)"):
            with pytest.raises(psycopg2.errors.FeatureNotSupported):
                testbed.sql_one(a, q)
        assert all(m.client().dbsize() == 0 for m in ms)
        a.close()
    finally:
        if pg is not None:
            pg.cleanup()
        for m in ms:
            m.stop()


def test_an_uncontended_acquire_and_release_are_one_round_trip_each(sessions, rc):
    a = sessions()
    a.run("SELECT redis_semaphore_init('rt', 5)")
    assert a.run("SELECT redis_semaphore_acquire('rt', 2)") is True      # scripts loaded
    assert a.run("SELECT redis_semaphore_release('rt')") is True
    rc.config_resetstat()
    assert a.run("SELECT redis_semaphore_acquire('rt', 2)") is True
    assert a.run("SELECT redis_semaphore_release('rt')") is True
    stats = rc.info("commandstats")
    sent = {k[len("cmdstat_"):]: v["calls"] for k, v in stats.items()
            if k not in ("cmdstat_info", "cmdstat_config|resetstat", "cmdstat_config")}
    # one EVALSHA each; the commands the scripts run are counted by name too
    assert sent.pop("evalsha") == 2, sent
    assert set(sent) <= {"type", "strlen", "get", "zrangebyscore", "zscore", "decrby",
                         "zadd", "pttl", "zrem", "incrby", "publish"}, sent
