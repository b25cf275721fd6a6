"""Security (issue 32): what a role with LOGIN only -- the default TEMP
privilege, nothing granted -- can do with the extension installed by a
superuser, against a real preloaded PostgreSQL and a real Redis.  Each test
names the hole it closes and fails on the build that had it.

* The fence guard runs the writer's code with the writer's rights: no
  escalation to the extension owner, also on an install upgraded from 1.3,
  whose guard was a SECURITY DEFINER PL/pgSQL function.
* One session, or one role's sessions, cannot take the whole shared lock
  registry: redis_lock.max_locks_per_session and max_locks_per_role.
* redis_lock_all_locks() is for monitoring roles, like redis_lock_locks.
"""
import psycopg2
import psycopg2.errors
import pytest

import testbed

MAX_LOCKS = 64          # an eighth per session: 8; half per role: 32


@pytest.fixture(scope="module")
def pg(redis_srv):
    p = testbed.Postgres(conf={"redis_lock.url": redis_srv.url,
                               "redis_lock.max_locks": str(MAX_LOCKS)}
                         ).init().start().with_extension()
    yield p
    p.cleanup()


@pytest.fixture
def admin(pg):
    c = pg.connect()
    yield c
    c.close()


def make_login_role(admin, name):
    """A role with LOGIN and nothing else (PUBLIC's defaults: TEMP)."""
    with admin.cursor() as cur:
        cur.execute("DROP OWNED BY %s" % name if role_exists(admin, name) else "SELECT 1")
        cur.execute("DROP ROLE IF EXISTS %s" % name)
        cur.execute("CREATE ROLE %s LOGIN" % name)


def role_exists(admin, name):
    return testbed.sql_one(admin, "SELECT count(*) FROM pg_roles WHERE rolname = %s",
                           (name,)) == 1


def is_superuser(admin, name):
    return testbed.sql_one(admin, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (name,))


# ----------------------------------------------------------------------------
# 1. redis_lock_fence_guard() ran the writer's casts as the extension owner
# ----------------------------------------------------------------------------

# A cast to json of a type the writer owns, whose function makes the writer
# superuser: to_jsonb(NEW) in the old SECURITY DEFINER guard called it with
# the owner's (a superuser's) rights.
ESCALATE = """
CREATE TYPE {s}.mood AS ENUM ('happy');
CREATE FUNCTION {s}.mood_json({s}.mood) RETURNS json LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE 'ALTER ROLE {role} SUPERUSER';
  RETURN '"happy"'::json;
END $$;
CREATE CAST ({s}.mood AS json) WITH FUNCTION {s}.mood_json({s}.mood);
CREATE {temp} TABLE {s}.fenced (m {s}.mood, fence bigint);
CREATE TRIGGER guard BEFORE INSERT ON {s}.fenced
  FOR EACH ROW EXECUTE FUNCTION {ext}redis_lock_fence_guard('victim');
"""


def attempt_escalation(pg, role, schema, temp, ext=""):
    """Run the attack as role; returns the error of its INSERT, or None."""
    c = pg.connect(user=role)
    try:
        with c.cursor() as cur:
            cur.execute(ESCALATE.format(s=schema, role=role, temp=temp, ext=ext))
            try:
                cur.execute("INSERT INTO %s.fenced VALUES ('happy', 7)" % schema)
            except psycopg2.Error as e:
                return e
        return None
    finally:
        c.close()


def test_fence_guard_on_a_temporary_table_runs_nothing_as_the_owner(pg, admin):
    make_login_role(admin, "hostile")
    err = attempt_escalation(pg, "hostile", "pg_temp", "TEMP")
    assert not is_superuser(admin, "hostile"), "the LOGIN-only role made itself superuser"
    # a temporary table has one writer: nothing to fence, and marks that
    # would outlive it
    assert err is not None and err.pgcode == "0A000", err
    assert testbed.sql_one(admin, "SELECT count(*) FROM redis_lock_fence_marks") == 0


def test_fence_guard_reads_the_row_with_the_writers_rights(pg, admin):
    # a role that may create tables of its own (PUBLIC's CREATE on public
    # before PostgreSQL 15): the guard works for it, as the writer
    make_login_role(admin, "tenant")
    with admin.cursor() as cur:
        cur.execute("DROP SCHEMA IF EXISTS tenant_s CASCADE")
        cur.execute("CREATE SCHEMA tenant_s AUTHORIZATION tenant")
    err = attempt_escalation(pg, "tenant", "tenant_s", "")
    assert not is_superuser(admin, "tenant"), "the role made itself superuser"
    assert err is None, err
    mark = testbed.sql_one(admin, "SELECT fence FROM redis_lock_fence_marks "
                                  "WHERE protected_table = 'tenant_s.fenced'::regclass")
    assert mark == 7
    # a stale token is still refused, and a function of the writer's named
    # like the extension's on its search_path is not called in its place
    c = pg.connect(user="tenant")
    try:
        with c.cursor() as cur:
            cur.execute("CREATE FUNCTION tenant_s.redis_lock_fence_advance(regclass, text, bigint) "
                        "RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint'")
            cur.execute("SET search_path = tenant_s, public")
            with pytest.raises(psycopg2.errors.SerializationFailure):
                cur.execute("INSERT INTO tenant_s.fenced VALUES ('happy', 6)")
    finally:
        c.close()
    with admin.cursor() as cur:
        cur.execute("DROP SCHEMA tenant_s CASCADE")


def test_upgrade_to_1_4_replaces_the_guard_of_an_existing_install(pg, admin):
    """An install of 1.3 has the old SECURITY DEFINER body, and a trigger
    using it; ALTER EXTENSION UPDATE replaces the body under the trigger."""
    with admin.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS sec13")
        cur.execute("CREATE DATABASE sec13")
    old = pg.connect(dbname="sec13")
    try:
        with old.cursor() as cur:
            cur.execute("CREATE EXTENSION redis_lock VERSION '1.3'")
            cur.execute("SELECT prosecdef FROM pg_proc WHERE proname = 'redis_lock_fence_guard'")
            assert cur.fetchone()[0] is True        # the hole is there
            cur.execute("DROP ROLE IF EXISTS upgraded_tenant")
            cur.execute("CREATE ROLE upgraded_tenant LOGIN")
            cur.execute("CREATE SCHEMA up_s AUTHORIZATION upgraded_tenant")
            cur.execute("ALTER EXTENSION redis_lock UPDATE TO '1.4'")
            cur.execute("SELECT prosecdef, l.lanname FROM pg_proc p JOIN pg_language l "
                        "ON l.oid = p.prolang WHERE proname = 'redis_lock_fence_guard'")
            assert cur.fetchone() == (False, "c")
    finally:
        old.close()
    c = pg.connect(dbname="sec13", user="upgraded_tenant")
    try:
        with c.cursor() as cur:
            cur.execute(ESCALATE.format(s="up_s", role="upgraded_tenant", temp="", ext=""))
            cur.execute("INSERT INTO up_s.fenced VALUES ('happy', 3)")
    finally:
        c.close()
    assert not is_superuser(admin, "upgraded_tenant")
    with admin.cursor() as cur:
        cur.execute("DROP DATABASE sec13")
        cur.execute("DROP ROLE upgraded_tenant")


def test_every_security_definer_function_pins_search_path_and_is_not_public(pg, admin):
    """The review of issue 32 as a check: no SECURITY DEFINER function of the
    extension is executable by PUBLIC, and each pins its search_path."""
    rows = testbed.sql_one(admin, """
        SELECT array_agg(p.proname || ':' || has_function_privilege('public', p.oid, 'EXECUTE')
                         || ':' || coalesce(array_to_string(p.proconfig, ','), ''))
        FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
        JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'
        WHERE p.prosecdef""")
    assert rows, "expected the fence functions"
    for row in rows:
        name, public, config = row.split(":", 2)
        assert public == "false", row
        assert "search_path=pg_catalog, pg_temp" in config, row


# ----------------------------------------------------------------------------
# 2. One role filled the shared registry for everyone
# ----------------------------------------------------------------------------

def test_one_session_cannot_take_more_than_its_share(pg, admin):
    make_login_role(admin, "hostile")
    c = pg.connect(user="hostile")
    try:
        names = ["exhaust:%d" % i for i in range(MAX_LOCKS)]
        # the whole registry in one call: refused before anything is taken
        with pytest.raises(psycopg2.errors.ConfigurationLimitExceeded):
            testbed.sql_one(c, "SELECT redis_lock_acquire_many(%s)", (names,))
        assert testbed.sql_one(c, "SELECT count(*) FROM redis_lock_held()") == 0
        per_session = MAX_LOCKS // 8
        testbed.sql_one(c, "SELECT redis_lock_acquire_many(%s)", (names[:per_session],))
        # one more, alone or in a set, is refused; a held one again is not new
        with pytest.raises(psycopg2.errors.ConfigurationLimitExceeded) as e:
            testbed.sql_one(c, "SELECT redis_lock_acquire(%s)", (names[per_session],))
        assert "max_locks_per_session" in e.value.diag.message_detail
        with pytest.raises(psycopg2.errors.ConfigurationLimitExceeded):
            testbed.sql_one(c, "SELECT redis_lock_acquire_many(%s)",
                            (names[per_session - 1:per_session + 1],))
        assert testbed.sql_one(c, "SELECT redis_lock_acquire(%s) > 0", (names[0],))
        assert testbed.sql_one(c, "SELECT count(*) FROM redis_lock_held()") == per_session
        # a user cannot raise its own limit
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            testbed.sql_one(c, "SET redis_lock.max_locks_per_session = 1000")
        testbed.sql_one(c, "SELECT redis_lock_release_all()")
    finally:
        c.close()


def test_one_roles_sessions_leave_room_for_everyone_else(pg, admin, rc):
    make_login_role(admin, "hostile")
    make_login_role(admin, "bystander")
    per_session, per_role = MAX_LOCKS // 8, MAX_LOCKS // 2
    conns = []
    try:
        taken = 0
        # as many sessions as the role likes, each filling its share
        for s in range(MAX_LOCKS // per_session):
            c = pg.connect(user="hostile")
            conns.append(c)
            names = ["fill:%d:%d" % (s, i) for i in range(per_session)]
            try:
                testbed.sql_one(c, "SELECT redis_lock_acquire_many(%s)", (names,))
                taken += per_session
            except psycopg2.errors.ConfigurationLimitExceeded as e:
                assert "max_locks_per_role" in e.diag.message_detail
                break
        assert taken == per_role
        # another role and a superuser still find room
        b = pg.connect(user="bystander")
        conns.append(b)
        assert testbed.sql_one(b, "SELECT redis_lock_acquire('bystander') > 0")
        assert testbed.sql_one(admin, "SELECT redis_lock_acquire('admin') > 0")
        testbed.sql_one(admin, "SELECT redis_lock_release('admin')")
        # the role's exited sessions count until the worker released their
        # locks: closing one gives its share back once the worker is done
        conns[0].close()
        testbed.wait_until(lambda: testbed.sql_one(
            admin, "SELECT count(*) FROM redis_lock_locks WHERE lock_name LIKE 'fill:0:%%'") == 0,
            what="the exited session's locks released by the worker")
        # the session that was refused kept nothing of the refused set and
        # takes a lock now that there is room
        refused = conns[-2]
        assert testbed.sql_one(refused, "SELECT count(*) FROM redis_lock_held()") == 0
        assert testbed.sql_one(refused, "SELECT redis_lock_acquire('again') > 0")
    finally:
        for c in conns:
            c.close()
    testbed.wait_until(lambda: testbed.sql_one(
        admin, "SELECT count(*) FROM redis_lock_locks") == 0, what="every lock released")


# ----------------------------------------------------------------------------
# 8. redis_lock_all_locks() was executable by PUBLIC, its view by pg_monitor
# ----------------------------------------------------------------------------

def test_other_sessions_locks_are_for_monitoring_roles_only(pg, admin):
    make_login_role(admin, "hostile")
    make_login_role(admin, "watcher")
    with admin.cursor() as cur:
        cur.execute("GRANT pg_monitor TO watcher")
    testbed.sql_one(admin, "SELECT redis_lock_acquire('payroll:run') > 0")
    try:
        c = pg.connect(user="hostile")
        try:
            for q in ("SELECT * FROM redis_lock_all_locks()", "SELECT * FROM redis_lock_locks"):
                with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                    testbed.sql_one(c, q)
            # its own locks it sees in redis_lock_held()
            testbed.sql_one(c, "SELECT redis_lock_acquire('mine') > 0")
            assert testbed.sql_one(c, "SELECT array_agg(lock_name) FROM redis_lock_held()") == ["mine"]
        finally:
            c.close()
        w = pg.connect(user="watcher")
        try:
            for q in ("SELECT array_agg(lock_name) FROM redis_lock_all_locks()",
                      "SELECT array_agg(lock_name) FROM redis_lock_locks"):
                assert "payroll:run" in testbed.sql_one(w, q)
        finally:
            w.close()
    finally:
        testbed.sql_one(admin, "SELECT redis_lock_release('payroll:run')")
