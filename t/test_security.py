"""Security (issue 32): what a role with LOGIN only -- PUBLIC's default TEMP
privilege, nothing granted -- can do with the extension a superuser
installed, against real PostgreSQL and Redis servers (and, for what only a
hostile server can show, a fake Redis).  Each section names the hole it
closes; its tests failed on version 1.3 (the controls among them, which
show that a lock's own data still comes through, are named so).
doc/security.md is the threat model these tests prove.

1. The fence guard ran the writer's casts as the extension owner.
2. One session, or one role's sessions, filled the shared lock registry.
3. Each Redisson-layout name left a permanent counter key behind.
4. redis_lock_status() returned any key's content.
5. Passwords set per role or database were readable by every role.
6. A lock name could take the place of another lock's fence counter.
7. A hostile Redis could make a backend buffer replies without bound.
8. redis_lock_all_locks() showed every session's locks to every role.

Issue 42, the second round (each section's tests failed on the build before
its fix; the sections are at the end of the file):

9. An upgrade script's operator resolved to one a role planted in public
   (superuser on 13/14); every install and update path is now checked with
   look-alikes planted.
10. A semaphore status answered with an integer crashed the server (and
    t/test_reply_fuzz.py: no malformed reply crashes a backend).
11. redis_lock_force_release deleted keys redis_lock_status calls no lock.
12. One role could take every keyspace watch of the worker.
13. The password file's path reached any session in a WARNING.
14. The worker's signal could reach a process that no longer held the lost
    grant (assert-enabled builds); a user's cancel before the worker's
    signal stays 57014 (issue 43).
15. A lock taken in another role's SECURITY DEFINER function was charged
    to that role (to no limit for a superuser's).
"""
import fnmatch
import os
import pwd
import re
import signal
import subprocess
import time
import uuid

import psycopg2
import psycopg2.errors
import pytest
import redis
from redis.crc import key_slot
from redis.lock import Lock

import testbed
from conftest import Session, wait_for_wait_event
from renewals import process_stopped, watchdog_pids
from test_hostile import Armed, FakeRedis, array, bulk, integer
from testbed import TIME_SCALE as S


# ============================================================================
# Items 1, 2 and 8: the fence guard, the lock limits, other sessions' locks
# ============================================================================
# Security (issue 32): what a role with LOGIN only -- the default TEMP
# privilege, nothing granted -- can do with the extension installed by a
# superuser, against a real preloaded PostgreSQL and a real Redis.  Each test
# names the hole it closes and fails on the build that had it.
#
# * The fence guard runs the writer's code with the writer's rights: no
#   escalation to the extension owner, also on an install upgraded from 1.3,
#   whose guard was a SECURITY DEFINER PL/pgSQL function.
# * One session, or one role's sessions, cannot take the whole shared lock
#   registry: redis_lock.max_locks_per_session and max_locks_per_role.
# * redis_lock_all_locks() is for monitoring roles, like redis_lock_locks.

MAX_LOCKS = 64          # an eighth per session: 8; half per role: 32


@pytest.fixture(scope="module")
def pg_limits(redis_srv):
    p = testbed.Postgres(conf={"redis_lock.url": redis_srv.url,
                               "redis_lock.max_locks": str(MAX_LOCKS)}
                         ).init().start().with_extension()
    yield p
    p.cleanup()


@pytest.fixture
def admin(pg_limits):
    c = pg_limits.connect()
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


def attempt_escalation(pg_limits, role, schema, temp, ext=""):
    """Run the attack as role; returns the error of its INSERT, or None."""
    c = pg_limits.connect(user=role)
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


def test_fence_guard_on_a_temporary_table_runs_nothing_as_the_owner(pg_limits, admin):
    make_login_role(admin, "hostile")
    err = attempt_escalation(pg_limits, "hostile", "pg_temp", "TEMP")
    assert not is_superuser(admin, "hostile"), "the LOGIN-only role made itself superuser"
    # a temporary table has one writer: nothing to fence, and marks that
    # would outlive it
    assert err is not None and err.pgcode == "0A000", err
    assert testbed.sql_one(admin, "SELECT count(*) FROM redis_lock_fence_marks") == 0


def test_fence_guard_reads_the_row_with_the_writers_rights(pg_limits, admin):
    # a role that may create tables of its own (PUBLIC's CREATE on public
    # before PostgreSQL 15): the guard works for it, as the writer
    make_login_role(admin, "tenant")
    with admin.cursor() as cur:
        cur.execute("DROP SCHEMA IF EXISTS tenant_s CASCADE")
        cur.execute("CREATE SCHEMA tenant_s AUTHORIZATION tenant")
    err = attempt_escalation(pg_limits, "tenant", "tenant_s", "")
    assert not is_superuser(admin, "tenant"), "the role made itself superuser"
    assert err is None, err
    mark = testbed.sql_one(admin, "SELECT fence FROM redis_lock_fence_marks "
                                  "WHERE protected_table = 'tenant_s.fenced'::regclass")
    assert mark == 7
    # a stale token is still refused, and a function of the writer's named
    # like the extension's on its search_path is not called in its place
    c = pg_limits.connect(user="tenant")
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


def test_upgrade_to_1_4_replaces_the_guard_of_an_existing_install(pg_limits, admin):
    """An install of 1.3 has the old SECURITY DEFINER body, and a trigger
    using it; ALTER EXTENSION UPDATE replaces the body under the trigger."""
    with admin.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS sec13")
        cur.execute("CREATE DATABASE sec13")
    old = pg_limits.connect(dbname="sec13")
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
    c = pg_limits.connect(dbname="sec13", user="upgraded_tenant")
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


def test_every_security_definer_function_pins_search_path_and_is_not_public(pg_limits, admin):
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

def test_one_session_cannot_take_more_than_its_share(pg_limits, admin):
    make_login_role(admin, "hostile")
    c = pg_limits.connect(user="hostile")
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


def test_one_roles_sessions_leave_room_for_everyone_else(pg_limits, admin, rc):
    make_login_role(admin, "hostile")
    make_login_role(admin, "bystander")
    per_session, per_role = MAX_LOCKS // 8, MAX_LOCKS // 2
    conns = []
    try:
        taken = 0
        # as many sessions as the role likes, each filling its share
        for s in range(MAX_LOCKS // per_session):
            c = pg_limits.connect(user="hostile")
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
        b = pg_limits.connect(user="bystander")
        conns.append(b)
        assert testbed.sql_one(b, "SELECT redis_lock_acquire('bystander') > 0")
        assert testbed.sql_one(admin, "SELECT redis_lock_acquire('admin') > 0")
        testbed.sql_one(admin, "SELECT redis_lock_release('admin')")
        # the role's exited sessions count until the worker released their
        # locks: closing one gives its share back once the worker is done
        conns[0].close()
        # (redis_lock_locks stops showing them when the session exits, before
        # the worker has released them: on a loaded machine the refused
        # session below could ask while the role still counted them)
        testbed.wait_until(lambda: testbed.sql_one(
            admin, "SELECT count(*) FROM redis_lock_locks WHERE lock_name LIKE 'fill:0:%%'") == 0
            and not rc.keys("*fill:0:*"),
            what="the exited session's locks released by the worker")
        # the session that was refused kept nothing of the refused set and
        # takes a lock now that there is room (once the worker has also
        # freed the slots, just after its deletes)
        refused = conns[-2]
        assert testbed.sql_one(refused, "SELECT count(*) FROM redis_lock_held()") == 0

        def takes():
            try:
                return testbed.sql_one(refused, "SELECT redis_lock_acquire('again') > 0")
            except psycopg2.errors.ConfigurationLimitExceeded:
                return False
        testbed.wait_until(takes, what="the refused session to find room")
    finally:
        for c in conns:
            c.close()
    testbed.wait_until(lambda: testbed.sql_one(
        admin, "SELECT count(*) FROM redis_lock_locks") == 0, what="every lock released")


# ----------------------------------------------------------------------------
# 8. redis_lock_all_locks() was executable by PUBLIC, its view by pg_monitor
# ----------------------------------------------------------------------------

def test_other_sessions_locks_are_for_monitoring_roles_only(pg_limits, admin):
    make_login_role(admin, "hostile")
    make_login_role(admin, "watcher")
    with admin.cursor() as cur:
        cur.execute("GRANT pg_monitor TO watcher")
    testbed.sql_one(admin, "SELECT redis_lock_acquire('payroll:run') > 0")
    try:
        c = pg_limits.connect(user="hostile")
        try:
            for q in ("SELECT * FROM redis_lock_all_locks()", "SELECT * FROM redis_lock_locks"):
                with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                    testbed.sql_one(c, q)
            # its own locks it sees in redis_lock_held()
            testbed.sql_one(c, "SELECT redis_lock_acquire('mine') > 0")
            assert testbed.sql_one(c, "SELECT array_agg(lock_name) FROM redis_lock_held()") == ["mine"]
        finally:
            c.close()
        w = pg_limits.connect(user="watcher")
        try:
            for q in ("SELECT array_agg(lock_name) FROM redis_lock_all_locks()",
                      "SELECT array_agg(lock_name) FROM redis_lock_locks"):
                assert "payroll:run" in testbed.sql_one(w, q)
        finally:
            w.close()
    finally:
        testbed.sql_one(admin, "SELECT redis_lock_release('payroll:run')")


# ============================================================================
# Item 4: redis_lock_status reads only locks
# ============================================================================
# Security (issue 32, item 4): redis_lock_status() shows a lock's owner,
# and nothing of a Redis key that is not a lock.
#
# Every call is made by a role with LOGIN only (nothing granted) under the
# default empty redis_lock.key_prefix, so that any lock name is any key of
# the Redis the extension uses.  Another application's keys -- a JSON secret,
# a long value, a value that is not UTF-8, a persistent string that looks
# like an owner value, hashes with secret fields, a list, a set, a sorted set
# -- come back as "not a lock": locked NULL, held_by_me false, no ttl, no
# owner, only the key's type; and no more than a few kilobytes leave the
# server for a value or hash of a megabyte.  The locks of every layout still
# report their owner: redis-py's, hand-written Java's, redsync's, Redisson's
# RLock hash and RReadWriteLock hash (written as Redisson writes them), and
# the role's own locks of each layout (held_by_me).
#
# Each test runs twice: with Lua scripts on Debian's Redis 7.0 (the inspect
# script decides in the server), and with redis_lock.scripting = off on
# Valkey 9.1 (scripts/get-server valkey-9.1; the script-free MULTI ... EXEC,
# decided in the backend), where no script may be sent.  A last test does the
# same over Redlock on three masters.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATUS_ROLE = "status_probe"
SECRET = b'{"api_token": "sk_live_4eC39HqLyjWDarjtT1zdp7dc"}'
TTL_MS = 60000
# what one redis_lock_status() call may make a server send, however large
# the key (the largest lock reply is a few hundred bytes; INFO's own reply,
# counted too, is a few kilobytes)
WIRE_BOUND = 32 * 1024

STATUS = ("SELECT locked, held_by_me, ttl, textsend(owner), redis_key, redis_type "
          "FROM redis_lock_status(%s)")


def valkey_91():
    """Path of scripts/get-server valkey-9.1's build; fails, never skips."""
    out = subprocess.run([os.path.join(ROOT, "scripts", "get-server"), "valkey-9.1"],
                         check=True, timeout=1800, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True).stdout
    path = out.strip().splitlines()[-1]
    assert os.access(path, os.X_OK), path
    return path


def add_role(pg):
    c = pg.connect()
    try:
        c.cursor().execute("CREATE ROLE %s LOGIN" % STATUS_ROLE)
    finally:
        c.close()


class World:
    """A Redis (or several, Redlock), a PostgreSQL using it, sessions of the
    LOGIN-only role."""

    def __init__(self, servers, scripting=True):
        self.servers = servers
        self.scripting = scripting
        conf = {"redis_lock.scripting": "on" if scripting else "off"}
        if len(servers) == 1:
            conf["redis_lock.url"] = servers[0].url
        else:
            conf["redis_lock.nodes"] = ",".join(r.url for r in servers)
        self.pg = testbed.Postgres(conf=conf).init().start().with_extension()
        add_role(self.pg)
        self.made = []

    @property
    def rc(self):
        return self.servers[0].client()

    def probe(self):
        s = Session(self.pg, user=STATUS_ROLE)
        self.made.append(s)
        assert s.run("SELECT rolsuper OR rolcreaterole FROM pg_roles "
                     "WHERE rolname = current_user") is False
        assert s.run("SHOW redis_lock.key_prefix") == ""
        return s

    def reset(self):
        for r in self.servers:
            c = r.client()
            c.flushall()
            c.config_resetstat()

    def end_test(self):
        for s in self.made:
            s.close()
        self.made = []
        if not self.scripting:
            # the script-free path really ran: not one script was sent
            for r in self.servers:
                stats = r.client().info("commandstats")
                assert not [k for k in stats if "eval" in k or "fcall" in k], stats

    def close(self):
        self.pg.cleanup()
        for r in self.servers:
            r.stop()


@pytest.fixture(scope="module", params=["scripts", "no-scripts"])
def world(request):
    if request.param == "scripts":
        w = World([testbed.Redis().start()])
    else:
        w = World([testbed.Redis(server=valkey_91()).start()], scripting=False)
    yield w
    w.close()


@pytest.fixture
def env(world):
    world.reset()
    yield world, world.rc
    world.end_test()


def status_row(s, name):
    locked, mine, ttl, owner, key, typ = s.run(STATUS, (name,))
    return locked, mine, ttl, (bytes(owner) if owner is not None else None), key, typ


def not_a_lock(key, redis_type):
    return (None, False, None, None, key, redis_type)


def assert_not_a_lock(s, key, redis_type, wire=None):
    """status() of key says "not a lock" and shows nothing of it; with wire
    (a Redis client), fewer than WIRE_BOUND bytes left that server."""
    before = out_bytes(wire) if wire is not None else 0
    row = status_row(s, key)
    assert row[3] is None, "owner shows %r" % row[3][:80]
    if wire is not None:
        sent = out_bytes(wire) - before
        assert sent < WIRE_BOUND, "%d bytes sent for one status" % sent
    assert row == not_a_lock(key, redis_type)


def out_bytes(c):
    return int(c.info("stats")["total_net_output_bytes"])


def redisson_id():
    return str(uuid.uuid4())


# ---------------------------------------------------------------- strings

FOREIGN_STRINGS = {
    # name: (value, TTL in ms or None)
    "json-secret": (SECRET, None),
    "json-secret-with-ttl": (SECRET, TTL_MS),
    "long": (b"a" * 129, TTL_MS),
    "megabyte": (b"s" * (1 << 20), TTL_MS),
    "invalid-utf8": (b"\xff\xfe\xc3(owner", TTL_MS),
    "spaces": (b"session of alice", TTL_MS),
    "nul-byte": (b"pgrl:\x00" + b"0" * 32, TTL_MS),
    "empty": (b"", TTL_MS),
    "persistent-pgrl-lookalike": (b"pgrl:" + b"0123456789abcdef" * 2, None),
    "persistent-uuid": (str(uuid.uuid4()).encode(), None),
    # what redis-py's Lock(timeout=None) leaves: its token, no TTL
    "persistent-redis-py-token": (uuid.uuid1().hex.encode(), None),
}


@pytest.mark.parametrize("case", sorted(FOREIGN_STRINGS))
def test_another_applications_string_reveals_nothing(env, case):
    w, rc = env
    value, ttl = FOREIGN_STRINGS[case]
    key = "app:" + case
    rc.set(key, value, px=ttl)
    s = w.probe()
    assert_not_a_lock(s, key, "string", wire=rc)
    assert rc.get(key) == value


def test_a_value_of_128_bytes_is_an_owner_and_129_is_not(env):
    w, rc = env
    s = w.probe()
    rc.set("v128", b"k" * 128, px=TTL_MS)
    rc.set("v129", b"k" * 129, px=TTL_MS)
    locked, mine, ttl, owner, _, typ = status_row(s, "v128")
    assert (locked, mine, owner, typ) == (True, False, b"k" * 128, "string")
    assert ttl.total_seconds() > 50
    assert_not_a_lock(s, "v129", "string")


# ---------------------------------------------------------------- hashes

def foreign_hashes():
    rid = redisson_id()
    holder = rid + ":1"
    many = {"%s:%d" % (rid, i): "1" for i in range(65)}
    return {
        # name: (mapping, TTL in ms or None)
        "secret-fields": ({"password": "hunter2", "email": "alice@example.com",
                           "api_token": SECRET}, TTL_MS),
        "secret-fields-persistent": ({"password": "hunter2"}, None),
        "holder-with-secret-value": ({holder: "hunter2"}, TTL_MS),
        "holder-beside-a-secret": ({holder: "1", "api_token": SECRET}, TTL_MS),
        "rlock-without-ttl": ({holder: "1"}, None),
        "bad-mode": ({"mode": "hunter2", holder: "1"}, TTL_MS),
        "mode-alone": ({"mode": "read"}, TTL_MS),
        "writer-in-read-mode": ({"mode": "read", holder + ":write": "1"}, TTL_MS),
        "write-mode-without-writer": ({"mode": "write", holder: "1"}, TTL_MS),
        "not-a-uuid": ({"user:42": "7"}, TTL_MS),
        "thread-id-too-long": ({rid + ":" + "9" * 20: "1"}, TTL_MS),
        "zero-count": ({holder: "0"}, TTL_MS),
        "other-writer": ({"mode": "write", "other:write": "1"}, TTL_MS),
        "too-many-fields": (many, TTL_MS),
    }


@pytest.mark.parametrize("case", sorted(foreign_hashes()))
def test_a_hash_that_is_not_a_lock_reveals_nothing(env, case):
    w, rc = env
    mapping, ttl = foreign_hashes()[case]
    key = "app:" + case
    rc.hset(key, mapping=mapping)
    if ttl is not None:
        rc.pexpire(key, ttl)
    s = w.probe()
    assert_not_a_lock(s, key, "hash")
    assert len(rc.hgetall(key)) == len(mapping)


def test_a_megabyte_hash_is_not_sent(env):
    w, rc = env
    rc.hset("app:big", mapping={"field-%05d" % i: "v" * 100 for i in range(10000)})
    rc.pexpire("app:big", TTL_MS)
    s = w.probe()
    assert_not_a_lock(s, "app:big", "hash", wire=rc)


# ---------------------------------------------------------------- other types

def test_lists_sets_and_sorted_sets_reveal_nothing(env):
    w, rc = env
    rc.rpush("app:list", SECRET)
    rc.sadd("app:set", SECRET)
    rc.zadd("app:zset", {SECRET: 1})
    for key in ("app:list", "app:set", "app:zset"):
        rc.pexpire(key, TTL_MS)
    s = w.probe()
    assert_not_a_lock(s, "app:list", "list")
    assert_not_a_lock(s, "app:set", "set")
    assert_not_a_lock(s, "app:zset", "zset")
    assert status_row(s, "app:nothing") == (False, False, None, None, "app:nothing", "none")


# ---------------------------------------------------------------- real locks

def lock_row(s, key):
    locked, mine, ttl, owner, k, typ = status_row(s, key)
    assert k == key
    assert ttl is not None and 0 < ttl.total_seconds() <= 60
    return locked, mine, owner, typ


def test_foreign_clients_string_locks_report_their_owner(env):
    w, rc = env
    s = w.probe()
    lk = Lock(rc, "py-lock", timeout=30)                          # redis-py
    assert lk.acquire(blocking=False)
    assert lock_row(s, "py-lock") == (True, False, lk.local.token, "string")
    jedis = str(uuid.uuid4()).encode()                            # hand-written Java
    rc.set("java-lock", jedis, nx=True, px=30000)
    assert lock_row(s, "java-lock") == (True, False, jedis, "string")
    redsync = b"q2Zl+N0/hZP8kxgWc1Zt6g=="                         # base64 of 16 bytes
    rc.set("go-lock", redsync, nx=True, px=30000)
    assert lock_row(s, "go-lock") == (True, False, redsync, "string")
    rc.delete("py-lock")        # (lk.release() would run redis-py's script)
    assert status_row(s, "py-lock") == (False, False, None, None, "py-lock", "none")


def test_redisson_hashes_report_their_holder(env):
    w, rc = env
    s = w.probe()
    rid = redisson_id()
    # RLock (and RFairLock): "<client uuid>:<thread id>" -> hold count
    rc.hset("rlock", rid + ":57", 2)
    rc.pexpire("rlock", 30000)
    assert lock_row(s, "rlock") == (True, False, (rid + ":57").encode(), "hash")
    # a reactive client's random thread id may be negative
    rc.hset("rlock-rx", rid + ":-4611686018427387904", 1)
    rc.pexpire("rlock-rx", 30000)
    assert lock_row(s, "rlock-rx")[2] == (rid + ":-4611686018427387904").encode()
    # RReadWriteLock read holds: "mode" = "read", one field per reader,
    # and a timeout key per hold
    readers = [rid + ":61", redisson_id() + ":12"]
    rc.hset("rw", mapping={"mode": "read", readers[0]: 1, readers[1]: 2})
    for i, r in enumerate(readers):
        rc.set("{rw}:%s:rwlock_timeout:1" % r, 1, px=30000)
    rc.pexpire("rw", 30000)
    locked, mine, owner, typ = lock_row(s, "rw")
    assert (locked, mine, typ) == (True, False, "hash")
    assert owner.decode() in readers
    # the write hold: "<uuid>:<thread id>:write", the writer also reading
    rc.delete("rw")
    rc.hset("rw", mapping={"mode": "write", rid + ":61": 1, rid + ":61:write": 1})
    rc.pexpire("rw", 30000)
    assert lock_row(s, "rw") == (True, False, (rid + ":61:write").encode(), "hash")


def test_the_roles_own_locks_are_held_by_it(env):
    w, rc = env
    s = w.probe()
    assert s.run("SELECT redis_lock_try_acquire('own-simple', ttl => '30s')") is True
    locked, mine, owner, typ = lock_row(s, "own-simple")
    assert (locked, mine, typ) == (True, True, "string")
    assert owner == rc.get("own-simple") and owner.startswith(b"pgrl:")
    assert status_row(w.probe(), "own-simple")[:2] == (True, False)   # another session
    if not w.scripting:
        return                  # only the simple layout exists without scripts
    s.run("SET redis_lock.protocol = 'redisson'")
    assert s.run("SELECT redis_lock_try_acquire('own-redisson', ttl => '30s')") is True
    locked, mine, owner, typ = lock_row(s, "own-redisson")
    assert (locked, mine, typ) == (True, True, "hash")
    assert rc.hkeys("own-redisson") == [owner]
    assert s.run("SELECT redis_lock_try_acquire_read('own-rw', ttl => '30s')") is True
    locked, mine, owner, typ = lock_row(s, "own-rw")
    assert (locked, mine, typ) == (True, True, "hash")
    assert rc.hget("own-rw", owner) == b"1"
    assert s.run("SELECT redis_lock_release_read('own-rw')") is True
    assert s.run("SELECT redis_lock_try_acquire_write('own-rw', ttl => '30s')") is True
    locked, mine, owner, typ = lock_row(s, "own-rw")
    assert (locked, mine, typ) == (True, True, "hash")
    assert owner.endswith(b":write") and rc.hget("own-rw", "mode") == b"write"


# ---------------------------------------------------------------- Redlock

@pytest.fixture(scope="module")
def redlock():
    w = World([testbed.Redis().start() for _ in range(3)])
    yield w
    w.close()


def test_redlock_reveals_nothing_of_other_keys(redlock):
    w = redlock
    w.reset()
    try:
        s = w.probe()
        for r in w.servers:
            r.client().set("app:secret", SECRET, px=TTL_MS)
        assert_not_a_lock(s, "app:secret", "string")
        # one master with a foreign lock, two with the secret: no majority,
        # and only the lock's owner value can be shown
        w.servers[0].client().set("app:secret", b"their-token", px=TTL_MS)
        locked, mine, ttl, owner, _, typ = status_row(s, "app:secret")
        assert (locked, mine, typ) == (None, False, "string")
        assert owner in (None, b"their-token")
        assert s.run("SELECT redis_lock_try_acquire('rl-own', ttl => '30s')") is True
        locked, mine, ttl, owner, _, typ = status_row(s, "rl-own")
        assert (locked, mine, typ) == (True, True, "string")
        assert owner == w.rc.get("rl-own")
    finally:
        w.end_test()


def test_the_role_has_only_login(world):
    """The premise: the probe role is a plain LOGIN role."""
    s = Session(world.pg, user=STATUS_ROLE)
    try:
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            s.run("SELECT redis_lock_force_release('x')")
    finally:
        s.close()


# ============================================================================
# Item 5: passwords out of the catalogs every role reads
# ============================================================================
# Issue 32, item 5: Redis passwords must not be readable by other roles.
#
# A password set per role, per database or per function (ALTER ROLE/ALTER
# DATABASE ... SET, CREATE FUNCTION ... SET) is stored in pg_db_role_setting or
# pg_proc, which every role can read. redis_lock refuses to store
# redis_lock.password and redis_lock.sentinel_password there (a URL with a
# password is refused everywhere), ignores with a WARNING a value stored there
# before, and offers redis_lock.password_file instead: a file of
# host:port:user:password lines readable only by the server's OS user, used by
# backends and by the watchdog worker alike.
#
# The reader is a role with LOGIN only, against real servers; each test failed
# on the code before the change (see the report of the change).

SECRETS = {"redis_lock.password": "s3cret-Master-9f2",
           "redis_lock.sentinel_password": "s3cret-Sentinel-41c"}
# URLs with a password (refused everywhere) and without (accepted)
URL_SECRET = "UrlPw-77d1"
URL_SETTINGS = {"redis_lock.url": "redis://app:%s@127.0.0.1:6390/0",
                "redis_lock.nodes": "redis://127.0.0.1:6391,redis://app:%s@127.0.0.1:6392",
                "redis_lock.sentinels": "redis://app:%s@127.0.0.1:26390"}
ACL_USER, ACL_PASSWORD = "locker", "lo:ck\\er-pw"      # a ":" and a "\" to escape


def write_private(path, text, mode=0o600):
    """A file owned by the server's OS user, with the given mode."""
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    if os.geteuid() == 0:
        pw = pwd.getpwnam(testbed.RLTEST_USER)
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return path


def escape(field):
    return field.replace("\\", "\\\\").replace(":", "\\:")


def setup_roles(admin):
    cur = admin.cursor()
    for role in ("rl_intruder", "rl_app", "rl_app_old", "rl_app_placeholder"):
        cur.execute("DROP ROLE IF EXISTS %s" % role)
        cur.execute("CREATE ROLE %s LOGIN" % role)


def catalog_text(conn):
    """Everything a role can read of stored settings: pg_db_role_setting,
    pg_roles.rolconfig, pg_proc.proconfig."""
    return testbed.sql_one(conn, """
        SELECT concat_ws(' ',
          (SELECT string_agg(array_to_string(setconfig, ' '), ' ') FROM pg_db_role_setting),
          (SELECT string_agg(array_to_string(rolconfig, ' '), ' ') FROM pg_roles),
          (SELECT string_agg(array_to_string(proconfig, ' '), ' ') FROM pg_proc))""")


@pytest.fixture(scope="module")
def redis_pw():
    """A Redis whose default user needs SECRETS['redis_lock.password'], and
    an ACL user whose password holds characters the file escapes."""
    r = testbed.Redis(password=SECRETS["redis_lock.password"]).start()
    r.client().execute_command("ACL", "SETUSER", ACL_USER, "reset", "on", ">" + ACL_PASSWORD,
                               "~*", "&*", "+@all")
    yield r
    r.stop()


@pytest.fixture(scope="module")
def pg_secrets(redis_pw):
    """Preloaded, no password in any setting."""
    p = testbed.Postgres(conf={"redis_lock.url": redis_pw.url}).init().start().with_extension()
    admin = p.connect()
    setup_roles(admin)
    admin.close()
    yield p
    p.cleanup()


# ====================================================== refused in catalogs

def test_secrets_are_not_stored_where_every_role_reads_them(pg_secrets, redis_pw):
    admin = pg_secrets.connect()
    cur = admin.cursor()
    stored, echoed = [], []

    def attempt(sql, secret):
        try:
            cur.execute(sql)
        except psycopg2.Error as e:
            assert e.pgcode == "22023", (sql, e.pgcode, str(e))
            if secret in str(e):
                echoed.append(str(e))
            return str(e)
        stored.append(sql)
        return None

    for name, secret in SECRETS.items():
        for target in ("ROLE rl_app", "ROLE rl_app IN DATABASE postgres",
                       "DATABASE postgres", "ROLE ALL"):
            err = attempt("ALTER %s SET %s = '%s'" % (target, name, secret), secret)
            if err is not None:
                assert "cannot be set per role, per database or per function" in err
                assert "redis_lock.password_file" in err          # the hint
        attempt("CREATE FUNCTION rl_f_%s() RETURNS int LANGUAGE sql SET %s = '%s' AS 'SELECT 1'"
                % (name.split(".")[1], name, secret), secret)
        # FROM CURRENT stores the session's value: refused as well
        cur.execute("SET %s = '%s'" % (name, secret))
        attempt("ALTER ROLE rl_app SET %s FROM CURRENT" % name, secret)
        cur.execute("RESET %s" % name)
        # an empty one carries no secret and may be stored
        cur.execute("ALTER ROLE rl_app SET %s = ''" % name)
        cur.execute("ALTER ROLE rl_app RESET %s" % name)
    for name, url in URL_SETTINGS.items():
        attempt("ALTER ROLE rl_app SET %s = '%s'" % (name, url % URL_SECRET), URL_SECRET)
        # the same URL without the password is a valid setting
        cur.execute("ALTER ROLE rl_app SET %s = '%s'" % (name, url.replace(":%s", "")))
        cur.execute("ALTER ROLE rl_app RESET %s" % name)

    # not stored in a catalog, so still allowed: a session's SET, and
    # ALTER SYSTEM (postgresql.auto.conf, PGC_S_FILE)
    cur.execute("SET redis_lock.password = %s", (SECRETS["redis_lock.password"],))
    assert testbed.sql_one(admin, "SELECT redis_lock_acquire('session-pw')") > 0
    assert testbed.sql_one(admin, "SELECT redis_lock_release('session-pw')") is True
    cur.execute("RESET redis_lock.password")
    cur.execute("ALTER SYSTEM SET redis_lock.sentinel_password = %s",
                (SECRETS["redis_lock.sentinel_password"],))
    cur.execute("ALTER SYSTEM RESET redis_lock.sentinel_password")
    # a URL's refusal says why (asserted last)
    url_err = attempt("SET redis_lock.url = '%s'"
                      % (URL_SETTINGS["redis_lock.url"] % URL_SECRET), URL_SECRET)

    # what a LOGIN-only role can read of every stored setting
    intruder = pg_secrets.connect(user="rl_intruder")
    seen = catalog_text(intruder)
    intruder.close()
    leaked = [s for s in list(SECRETS.values()) + [URL_SECRET] if s in (seen or "")]
    for sql in stored:                          # leave nothing for later tests
        if sql.startswith("CREATE FUNCTION"):
            cur.execute("DROP FUNCTION %s()" % sql.split()[2].split("(")[0])
        else:
            cur.execute(sql.split(" SET ")[0] + " RESET ALL")
    admin.close()
    assert not stored and not leaked, \
        "a LOGIN-only role read %s; stored in a catalog: %s" % (leaked, stored)
    assert not echoed, "a refusal repeats the secret: %s" % echoed
    assert "carries a password" in url_err and "redis_lock.password_file" in url_err


# ====================================================== stored before

def test_a_password_stored_before_is_ignored_at_login(pg_secrets, redis_pw):
    """As an install older than the refusal left it: the value is in
    pg_db_role_setting; at login PostgreSQL warns and does not apply it."""
    secret = SECRETS["redis_lock.password"]
    admin = pg_secrets.connect()
    admin.cursor().execute(
        "INSERT INTO pg_db_role_setting VALUES "
        "(0, (SELECT oid FROM pg_roles WHERE rolname = 'rl_app_old'), %s)",
        (["redis_lock.password=" + secret],))
    try:
        app = pg_secrets.connect(user="rl_app_old")
        # a WARNING at login (before psycopg2 collects notices: in the log)
        pid = testbed.sql_one(app, "SELECT pg_backend_pid()")
        assert ('[%d] WARNING:  parameter "redis_lock.password" cannot be set per role' % pid
                in pg_secrets.log_text())
        # not applied: without it the Redis refuses us
        with pytest.raises(psycopg2.Error) as ei:
            testbed.sql_one(app, "SELECT redis_lock_acquire('old-pw')")
        assert ei.value.pgcode == "28000", str(ei.value)
        assert secret not in str(ei.value)
        app.close()
        assert not [line for line in pg_secrets.log_text().splitlines()
                    if "[%d]" % pid in line and secret in line]
    finally:
        admin.cursor().execute("ALTER ROLE rl_app_old RESET ALL")
        admin.close()


@pytest.fixture(scope="module")
def pg_unloaded(redis_pw):
    """Not preloaded: the module loads when a session first uses it; the
    right password in postgresql.conf."""
    p = testbed.Postgres(preload=False, conf={
        "redis_lock.url": redis_pw.url,
        "redis_lock.password": SECRETS["redis_lock.password"]}).init().start().with_extension()
    admin = p.connect()
    setup_roles(admin)
    admin.close()
    yield p
    p.cleanup()


def test_a_placeholder_stored_before_the_module_loaded_is_ignored(pg_unloaded):
    """PostgreSQL cannot check a value stored by a session that has not
    loaded the module; when the module loads in a session that got it at
    login, the value is refused (WARNING)."""
    secret = SECRETS["redis_lock.password"]
    admin = pg_unloaded.connect()           # has not loaded the module: stored unchecked
    admin.cursor().execute("ALTER ROLE rl_app_placeholder SET redis_lock.password = %s",
                           (secret,))
    admin.close()
    try:
        app = pg_unloaded.connect(user="rl_app_placeholder")
        with pytest.raises(psycopg2.Error) as ei:
            testbed.sql_one(app, "SELECT redis_lock_acquire('placeholder-pw')")
        assert ei.value.pgcode == "28000", str(ei.value)
        assert any("cannot be set per role" in n for n in app.notices), app.notices
        assert not any(secret in n for n in app.notices)
        app.close()
    finally:
        admin = pg_unloaded.connect()
        admin.cursor().execute("ALTER ROLE rl_app_placeholder RESET ALL")
        admin.close()


def test_without_preloading_a_password_in_postgresql_conf_is_refused(pg_unloaded):
    """Until a session loads the module, postgresql.conf's value is a
    placeholder any role can SHOW; the module then refuses to use it, so
    that such a setup fails rather than works while leaking."""
    secret = SECRETS["redis_lock.password"]
    intruder = pg_unloaded.connect(user="rl_intruder")
    # (current_setting('redis_lock.password') shows it here: PostgreSQL's
    # placeholder, which the module cannot hide; hence the refusal)
    with pytest.raises(psycopg2.Error) as ei:
        testbed.sql_one(intruder, "SELECT redis_lock_acquire('conf-pw')")
    assert ei.value.pgcode == "28000", str(ei.value)
    assert any("requires redis_lock in shared_preload_libraries" in n and
               "redis_lock.password_file" in n for n in intruder.notices), intruder.notices
    assert not any(secret in n for n in intruder.notices)
    intruder.close()
    # ALTER SYSTEM in a session that has loaded the module is refused too
    admin = pg_unloaded.connect()
    admin.cursor().execute("LOAD 'redis_lock'")
    with pytest.raises(psycopg2.Error) as ei:
        admin.cursor().execute("ALTER SYSTEM SET redis_lock.sentinel_password = 'x'")
    assert ei.value.pgcode == "22023", str(ei.value)
    admin.close()


# ====================================================== the password file

def doc_example(port):
    """The example of doc/reference.md (Passwords): redis_lock.url and the
    file's text, with the port of our Redis for 6379."""
    ref = open(os.path.join(os.path.dirname(__file__), "..", "doc", "reference.md")).read()
    url = re.search(r"^redis_lock\.url = '([^']*)'", ref, re.M).group(1)
    text = re.search(r"<!-- password-file-example -->\n```text\n(.*?)```", ref, re.S).group(1)
    assert "locker:" + escape(ACL_PASSWORD) in text
    return url.replace(":6379/", ":%d/" % port), text.replace(":6379:", ":%d:" % port)


@pytest.fixture(scope="module")
def pf(redis_pw):
    """Preloaded, redis_lock.url naming the ACL user, its password only in
    redis_lock.password_file: the reference's example, after lines that
    come first and must not match."""
    url, example = doc_example(redis_pw.port)
    p = testbed.Postgres(conf={"redis_lock.url": url}).init()
    path = os.path.join(p.base, "redis.pass")
    p.set_conf(redis_lock__password_file=path)
    p.pwfile = path
    p.write = lambda text, mode=0o600: write_private(path, text, mode)
    p.write("127.0.0.1:1:%(user)s:wrong-port\n"
            "127.0.0.1:%(port)d:someone-else:wrong-user\n"
            "\n" % {"port": redis_pw.port, "user": ACL_USER} + example)
    p.start().with_extension()
    admin = p.connect()
    setup_roles(admin)
    admin.close()
    yield p
    p.cleanup()


def wait_renewed(rclient, key, timeout=15):
    """Poll until key's PTTL goes back up (a renewal); it must exist all along."""
    last = [None]

    def renewed():
        pttl = rclient.pttl(key)
        assert pttl > 0, "%s expired: not renewed" % key
        up = last[0] is not None and pttl > last[0] + 200
        last[0] = pttl
        return up
    testbed.wait_until(renewed, timeout, what="the watchdog to renew %s" % key)


def test_password_file_authenticates_backends_and_the_watchdog(pf, redis_pw):
    intruder = pf.connect(user="rl_intruder")
    cur = intruder.cursor()
    cur.execute("SET redis_lock.lease_time = '3s'")
    assert testbed.sql_one(intruder, "SELECT redis_lock_acquire('pf-lock') > 0")
    assert not intruder.notices, intruder.notices
    rc = redis_pw.client()
    assert rc.exists("pf-lock")
    # only the worker renews (every lease/3): it authenticated with the file too
    wait_renewed(rc, "pf-lock")
    wait_renewed(rc, "pf-lock")
    assert testbed.sql_one(intruder, "SELECT redis_lock_release('pf-lock')") is True
    # the LOGIN-only role reads neither the path's setting nor the password
    with pytest.raises(psycopg2.Error) as ei:
        testbed.sql_one(intruder, "SHOW redis_lock.password_file")
    assert ei.value.pgcode == "42501"
    assert ACL_PASSWORD not in (catalog_text(intruder) or "")
    intruder.close()
    log = pf.log_text()
    assert ACL_PASSWORD not in log and escape(ACL_PASSWORD) not in log


def test_a_password_file_open_to_others_is_ignored(pf):
    pf.write(open(pf.pwfile).read(), mode=0o640)
    try:
        s = pf.connect(user="rl_intruder")      # a new backend: a new connection
        with pytest.raises(psycopg2.Error) as ei:
            testbed.sql_one(s, "SELECT redis_lock_acquire('pf-open')")
        assert ei.value.pgcode == "28P01", str(ei.value)
        # (what the session is told, and what the log gets: see the last section)
        assert any("ignoring the Redis password file" in n for n in s.notices), s.notices
        s.close()
    finally:
        pf.write(open(pf.pwfile).read(), mode=0o600)


def test_no_matching_line_is_the_usual_authentication_error(pf, redis_pw):
    saved = open(pf.pwfile).read()
    pf.write("127.0.0.1:%d:%s:wrong\n127.0.0.1:%d:%s\n" % (redis_pw.port + 1, ACL_USER,
                                                            redis_pw.port, ACL_USER))
    try:
        s = pf.connect(user="rl_intruder")
        with pytest.raises(psycopg2.Error) as ei:
            testbed.sql_one(s, "SELECT redis_lock_acquire('pf-none')")
        assert ei.value.pgcode == "28P01", str(ei.value)
        assert "password authentication failed for Redis" in str(ei.value)
        assert "redis_lock.password_file" in str(ei.value)          # the hint
        # the malformed second line is named by its number, not its text
        assert any("skipping line 2 of the Redis password file" in n for n in s.notices), s.notices
        assert not [n for n in s.notices if pf.pwfile in n], s.notices
        s.close()
    finally:
        pf.write(saved)


def test_password_file_for_sentinels_and_their_master():
    """A Sentinel connection is matched by the Sentinel's host:port, the
    master it names by the master's, each with its own password."""
    master = testbed.Redis(password="master-pw").start()
    sentinel = testbed.Sentinel(master.port, quorum=1)
    with open(sentinel.conf, "a") as f:
        f.write("sentinel auth-pass mymaster master-pw\nrequirepass sentinel-pw\n")
    sentinel.password = "sentinel-pw"
    sentinel.start()
    p = testbed.Postgres(conf={"redis_lock.url": "redis://127.0.0.1:%d/0" % master.port,
                               "redis_lock.sentinels": sentinel.url}).init()
    try:
        path = write_private(os.path.join(p.base, "redis.pass"),
                             "127.0.0.1:%d:default:sentinel-pw\n"
                             "127.0.0.1:%d:*:master-pw\n" % (sentinel.port, master.port))
        p.set_conf(redis_lock__password_file=path)
        p.start().with_extension()
        s = p.connect()
        s.cursor().execute("SET redis_lock.lease_time = '3s'")
        assert testbed.sql_one(s, "SELECT redis_lock_acquire('sentinel-pf') > 0")
        wait_renewed(master.client(), "sentinel-pf")
        assert testbed.sql_one(s, "SELECT redis_lock_release('sentinel-pf')") is True
        s.close()
    finally:
        p.cleanup()
        sentinel.stop()
        master.stop()


def test_a_password_file_that_is_no_regular_file_is_ignored_without_hanging(pf):
    """A FIFO: opened without blocking, refused as not a regular file."""
    fifo = os.path.join(pf.base, "redis.fifo")
    os.mkfifo(fifo, 0o600)
    if os.geteuid() == 0:
        pw = pwd.getpwnam(testbed.RLTEST_USER)
        os.chown(fifo, pw.pw_uid, pw.pw_gid)
    admin = pf.connect()
    pf.set_conf(redis_lock__password_file=fifo)
    pf.reload()
    try:
        testbed.wait_until(lambda: testbed.sql_one(admin, "SHOW redis_lock.password_file") == fifo,
                           what="the reload")
        s = pf.connect(user="rl_intruder")
        s.cursor().execute("SET statement_timeout = '20s'")
        with pytest.raises(psycopg2.Error) as ei:
            testbed.sql_one(s, "SELECT redis_lock_acquire('pf-fifo')")
        assert ei.value.pgcode == "28P01", str(ei.value)
        assert any("ignoring the Redis password file" in n for n in s.notices), s.notices
        assert '"%s" is not a regular file' % fifo in pf.log_text()
        s.close()
    finally:
        pf.set_conf(redis_lock__password_file=pf.pwfile)
        pf.reload()
        testbed.wait_until(
            lambda: testbed.sql_one(admin, "SHOW redis_lock.password_file") == pf.pwfile,
            what="the reload")
        admin.close()


# ============================================================================
# Items 3 and 6: what stays in Redis, reserved names, key patterns and ACLs
# ============================================================================
# Issue 32, items 3 and 6, and the key patterns an operator confines a
# tenant with (doc/operations.md, "Key patterns and Redis ACLs").
#
# Item 3: under redis_lock.protocol = 'redisson' or 'redisson_fair' (a user
# setting) every distinct lock name used to leave Redisson's RFencedLock
# counter redisson_lock_token:{name}, a key without expiry.  Tokens now come
# from the per-slot fence counters the simple layout uses (at most 16384 per
# key prefix); redis_lock.redisson_token_counter (superuser only) opts into
# the per-name counter, and tokens never go down across any change
# (doc/clients.md, "Fencing tokens and what stays in Redis").
#
# Item 6: a lock name could be an extension key (prefix ||
# 'redis_lock:fence:{T}'), so taking it as a hash broke every simple acquire
# in that slot with WRONGTYPE.  A name whose key contains a reserved mark is
# now refused (22023) by every function that takes a lock name.
#
# Key patterns: a Redis ACL user confined to the documented patterns of its
# prefix runs every operation of every layout (the watchdog's renewals, the
# wake-ups on its channels and keyspace notifications included: ACL LOG stays
# empty), and cannot reach another prefix's keys or channels.
#
# The attacks run as a role with LOGIN only (nothing granted).

PLAIN = "rl_names_plain"

# Every mark a lock's Redis key must not contain (src/redis/protocol.c,
# reserved_marks), and a name that contains it.
RESERVED = [
    ("redis_lock:fence:", "redis_lock:fence:{x}"),
    ("redisson_lock_token:", "redisson_lock_token:{orders}"),
    ("redisson_lock_queue:", "redisson_lock_queue:{orders}"),
    ("redisson_lock_timeout:", "redisson_lock_timeout:{orders}"),
    (":rwlock_timeout:", "{orders}:5b1c-uuid:42:rwlock_timeout:1"),
    ("redisson_unlock_latch:", "redisson_unlock_latch:{orders}:f00d"),
]


@pytest.fixture(scope="module")
def roles(pg):
    c = pg.connect()
    with c.cursor() as cur:
        cur.execute("CREATE ROLE %s LOGIN" % PLAIN)
    c.close()
    return PLAIN


@pytest.fixture
def plain_sessions(sessions, roles):
    """Sessions of the LOGIN-only role."""
    return lambda: sessions(user=roles)


def permanent_keys(rc):
    return {k for k in rc.scan_iter(count=1000) if rc.ttl(k) == -1}


def sqlstate(excinfo):
    return excinfo.value.pgcode


# ================================================================ item 3

@pytest.mark.parametrize("protocol", ["redisson", "redisson_fair"])
def test_redisson_layouts_leave_no_key_per_name(plain_sessions, rc, protocol):
    s = plain_sessions()
    s.run("SET redis_lock.protocol = %s", (protocol,))
    # 200 names in one slot: at most its one fence counter stays
    before = permanent_keys(rc)
    for i in range(200):
        assert s.run("SELECT redis_lock_acquire(%s, ttl => '10s') > 0",
                     ("{one}n%d" % i,)) is True
        assert s.run("SELECT redis_lock_release(%s)", ("{one}n%d" % i,)) is True
    if protocol == "redisson":
        names = ["{one}m%d" % i for i in range(50)]
        assert s.run("SELECT cardinality(redis_lock_acquire_many(%s, ttl => '10s'))",
                     (names,)) == 50
        assert s.run("SELECT redis_lock_release_many(%s)", (names,)) == 50
    new = permanent_keys(rc) - before
    assert len(new) <= 1, sorted(new)[:5]
    # 200 names anywhere: what stays is one fence counter per slot, never a
    # key per name (so never more than 16384, however many names)
    names = ["free:%d" % i for i in range(200)]
    for n in names:
        assert s.run("SELECT redis_lock_acquire(%s, ttl => '10s') > 0", (n,)) is True
        assert s.run("SELECT redis_lock_release(%s)", (n,)) is True
    new = permanent_keys(rc) - before
    assert all(k.startswith(b"redis_lock:fence:{") for k in new), sorted(new)[:5]
    assert len(new) <= len({key_slot(n.encode()) for n in names} | {key_slot(b"one")})
    assert not list(rc.scan_iter("redisson_lock_*"))
    assert rc.dbsize() == len(permanent_keys(rc))      # no lock left behind


def test_tokens_increase_across_the_layouts_sharing_a_counter(plain_sessions, rc):
    s = plain_sessions()
    tokens = []

    def take(protocol, name):
        s.run("SET redis_lock.protocol = %s", (protocol,))
        tokens.append(s.run("SELECT redis_lock_acquire(%s, ttl => '10s')", (name,)))
        assert s.run("SELECT redis_lock_release(%s)", (name,)) is True

    def take_many(protocol, names):
        s.run("SET redis_lock.protocol = %s", (protocol,))
        tokens.extend(s.run("SELECT redis_lock_acquire_many(%s, ttl => '10s')", (names,)))
        assert s.run("SELECT redis_lock_release_many(%s)", (names,)) == len(names)

    for turn in range(2):
        take("simple", "{t}a")
        take("redisson", "{t}a")
        take("redisson_fair", "{t}a")
        take("redisson", "{t}b")
        take_many("redisson", ["{t}b", "{t}a"])
        take("simple", "{t}b")
        take_many("simple", ["{t}a", "{t}b"])
        take("redisson_fair", "{t}b")
    assert all(b > a for a, b in zip(tokens, tokens[1:])), tokens
    assert tokens[0] > 10 ** 15            # the counter started at the server clock
    # one counter, the slot's, for every layout
    counter, = permanent_keys(rc)
    assert counter.startswith(b"redis_lock:fence:{") and key_slot(counter) == key_slot(b"t")


def test_the_per_name_counter_is_a_superusers_choice(plain_sessions, sessions, rc):
    s = plain_sessions()
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        s.run("SET redis_lock.redisson_token_counter = on")
    admin = sessions()
    assert admin.run("SHOW redis_lock.redisson_token_counter") == "off"


def test_tokens_never_go_down_when_the_per_name_counter_comes_and_goes(sessions, rc):
    """Every transition doc/clients.md lists, with one name; Java's
    RFencedLock.lockAndGetToken() is its INCR of the per-name counter."""
    s = sessions()
    s.run("SET redis_lock.protocol = 'redisson'")
    per_name = "redisson_lock_token:{fx}"
    marks = []          # (what, token) in the order handed out

    def sql(what):
        marks.append((what, s.run("SELECT redis_lock_acquire('fx', ttl => '10s')")))
        assert s.run("SELECT redis_lock_release('fx')") is True

    def java(what):
        marks.append((what, rc.incr(per_name)))

    def counter_on(on):
        s.run("SET redis_lock.redisson_token_counter = %s" % ("on" if on else "off"))

    sql("default")
    assert not rc.exists(per_name)
    counter_on(True)
    sql("on, per-name counter made by SQL")
    assert int(rc.get(per_name)) == marks[-1][1] and rc.ttl(per_name) == -1
    sql("on")
    java("Java after SQL")
    sql("on after Java")
    counter_on(False)
    sql("off after on")
    java("Java while off")
    counter_on(True)
    sql("on again")
    # a per-name counter Java's INCR started at 1
    rc.delete(per_name)
    java("Java makes the counter")
    assert marks[-1][1] == 1
    counter_on(True)
    sql("on, per-name counter made by Java")
    java("Java after that")
    # Redis loses the counters
    rc.flushall()
    sql("on, counters lost")
    counter_on(False)
    for k in rc.scan_iter("redis_lock:fence:*"):
        rc.delete(k)
    sql("off, slot counter lost")
    # what SQL hands out never goes down, whatever the setting did
    sql_tokens = [t for w, t in marks if not w.startswith("Java")]
    assert all(b > a for a, b in zip(sql_tokens, sql_tokens[1:])), marks
    # with the setting on, SQL and Java are one sequence: each of those
    # tokens is above every token handed out before it, Java's too (also
    # Java's while the setting was off, and SQL's when Java's INCR had
    # started the per-name counter at 1)
    for i, (w, t) in enumerate(marks):
        if w.startswith(("on", "Java after")):
            assert t > max(t0 for _, t0 in marks[:i]), (w, marks)
    # the one tie: with the setting off, SQL counts only the slot's counter,
    # so a token Java counted meanwhile may equal one of SQL's
    m = dict(marks)
    assert m["Java while off"] > m["on after Java"]
    assert m["Java while off"] == m["off after on"]


def test_per_name_counter_with_acquire_many_and_fair_locks(sessions, rc):
    s = sessions()
    s.run("SET redis_lock.redisson_token_counter = on")
    s.run("SET redis_lock.protocol = 'redisson'")
    names = ["{m}x", "{m}y"]
    rows = s.run("SELECT redis_lock_acquire_many(%s, ttl => '10s')", (names,))
    assert rows[1] > rows[0] > 0
    assert [int(rc.get("redisson_lock_token:" + n)) for n in names] == rows
    assert s.run("SELECT redis_lock_release_many(%s)", (names,)) == 2
    s.run("SET redis_lock.protocol = 'redisson_fair'")
    f = s.run("SELECT redis_lock_acquire('{m}x', ttl => '10s')")
    assert f > rows[1] and int(rc.get("redisson_lock_token:{m}x")) == f
    assert s.run("SELECT redis_lock_release('{m}x')") is True


# ================================================================ item 6

# Every SQL function that takes lock names, called with one name (%s).
ENTRY_POINTS = [
    "SELECT redis_lock_acquire(%s, ttl => '10s', wait => '0')",
    "SELECT redis_lock_try_acquire(%s, ttl => '10s')",
    "SELECT redis_lock_acquire(%s, ttl => '10s', xact => true)",
    "SELECT redis_lock_acquire_read(%s, ttl => '10s', wait => '0')",
    "SELECT redis_lock_try_acquire_read(%s, ttl => '10s')",
    "SELECT redis_lock_acquire_write(%s, ttl => '10s', wait => '0')",
    "SELECT redis_lock_try_acquire_write(%s, ttl => '10s')",
    "SELECT redis_lock_with_lock(%s, 'SELECT 1')",
    "SELECT redis_lock_acquire_many(ARRAY['ok', %s], ttl => '10s')",
    "SELECT redis_lock_release_many(ARRAY[%s])",
    "SELECT redis_lock_release(%s)",
    "SELECT redis_lock_release_read(%s)",
    "SELECT redis_lock_release_write(%s)",
    "SELECT redis_lock_extend(%s, '10s')",
    "SELECT redis_lock_fence(%s)",
    "SELECT * FROM redis_lock_status(%s)",
]


@pytest.mark.parametrize("protocol", ["simple", "redisson", "redisson_fair"])
def test_reserved_names_are_refused_everywhere(plain_sessions, sessions, rc, protocol):
    s = plain_sessions()
    s.run("SET redis_lock.protocol = %s", (protocol,))
    admin = sessions()
    admin.run("SET redis_lock.protocol = %s", (protocol,))
    # the marks anywhere in the key: whatever prefix another role has, and
    # a prefix of another role could be part of this name
    names = RESERVED + [("redis_lock:fence:", "tenantA:redis_lock:fence:{x}"),
                        ("redisson_lock_token:", "x:redisson_lock_token:{tenantA:y}")]
    for mark, name in names:
        for q in ENTRY_POINTS:
            with pytest.raises(psycopg2.Error) as ei:
                s.run(q, (name,))
            assert sqlstate(ei) == "22023", (q, name, ei.value)
            assert '"%s"' % mark in ei.value.diag.message_detail, (q, ei.value.diag.message_detail)
        with pytest.raises(psycopg2.Error) as ei:
            admin.run("SELECT redis_lock_force_release(%s)", (name,))
        assert sqlstate(ei) == "22023"
    assert rc.dbsize() == 0
    assert s.run("SELECT count(*) FROM redis_lock_held()") == 0
    # names near a mark are not refused
    for name in ["redis_lock:fences", "redis_lock_fence:x", "redisson_lock_token",
                 "orders:rwlock_timeout", "redisson_lock__channel:{x}"]:
        assert s.run("SELECT redis_lock_acquire(%s, ttl => '10s') > 0", (name,)) is True
        assert s.run("SELECT redis_lock_release(%s)", (name,)) is True


def test_a_mark_made_by_prefix_and_name_together_is_refused(pg, sessions, rc):
    c = pg.connect()
    with c.cursor() as cur:
        cur.execute("CREATE ROLE rl_names_split LOGIN")
        cur.execute("ALTER ROLE rl_names_split SET redis_lock.key_prefix = 'redis_lock:'")
    c.close()
    s = sessions(user="rl_names_split")
    with pytest.raises(psycopg2.errors.InvalidParameterValue) as ei:
        s.run("SELECT redis_lock_acquire('fence:{x}', ttl => '10s')")
    assert ei.value.diag.message_primary == 'lock_name "fence:{x}" is reserved'
    assert ei.value.diag.message_detail.startswith(
        'Its Redis key "redis_lock:fence:{x}" contains "redis_lock:fence:"')
    with pytest.raises(psycopg2.errors.InvalidParameterValue) as ei:
        s.run("SELECT redis_lock_acquire_many(ARRAY['a', 'fence:{x}'])")
    assert ei.value.diag.message_primary == "lock_names must not contain a reserved name"
    assert ei.value.diag.message_detail.startswith('Element 2, "fence:{x}", has the Redis key')
    assert rc.dbsize() == 0


def counter_of(rc, key):
    k, = [k for k in rc.scan_iter(b"*redis_lock:fence:*") if key_slot(k) == key_slot(key)]
    return k.decode()


@pytest.mark.parametrize("attack", ["redisson", "redisson_fair", "write"])
def test_no_name_can_take_another_locks_fence_counter(plain_sessions, sessions, rc, pg, attack):
    """The audit's attack: the lock named like the counter of a victim's
    slot, taken while that counter is not there (a slot not used yet, or a
    counter lost with a Redis restart), then the victim's simple acquire in
    that slot."""
    victim = sessions()
    first = victim.run("SELECT redis_lock_acquire('acct:7', ttl => '10s')")
    assert victim.run("SELECT redis_lock_release('acct:7')") is True
    counter = counter_of(rc, b"acct:7")
    rc.delete(counter)
    attacker = plain_sessions()
    q = {"redisson": "SELECT redis_lock_acquire(%s, ttl => '60s')",
         "redisson_fair": "SELECT redis_lock_acquire(%s, ttl => '60s')",
         "write": "SELECT redis_lock_acquire_write(%s, ttl => '60s')"}[attack]
    if attack.startswith("redisson"):
        attacker.run("SET redis_lock.protocol = %s", (attack,))
    refused = attempt(attacker, q, counter)
    # the victim's acquire in that slot is unharmed
    second = victim.run("SELECT redis_lock_acquire('acct:7', ttl => '10s')")
    assert second > first
    assert victim.run("SELECT redis_lock_release('acct:7')") is True
    assert refused == "22023"


def attempt(session, q, name):
    """Run q with name; the SQLSTATE it failed with, None if it succeeded."""
    try:
        session.run(q, (name,))
    except psycopg2.Error as e:
        return e.pgcode
    return None


def test_no_name_reaches_another_prefixes_counter(plain_sessions, sessions, rc, pg):
    c = pg.connect()
    with c.cursor() as cur:
        cur.execute("CREATE ROLE rl_names_tenant LOGIN")
        cur.execute("ALTER ROLE rl_names_tenant SET redis_lock.key_prefix = 'tenantA:'")
    c.close()
    victim = sessions(user="rl_names_tenant")
    first = victim.run("SELECT redis_lock_acquire('acct:7', ttl => '10s')")
    assert victim.run("SELECT redis_lock_release('acct:7')") is True
    counter = counter_of(rc, b"tenantA:acct:7")
    assert counter.startswith("tenantA:redis_lock:fence:{")
    rc.delete(counter)
    attacker = plain_sessions()          # empty prefix, same Redis user
    attacker.run("SET redis_lock.protocol = 'redisson'")
    refused = attempt(attacker, "SELECT redis_lock_acquire(%s, ttl => '60s')", counter)
    assert victim.run("SELECT redis_lock_acquire('acct:7', ttl => '10s')") > first
    assert refused == "22023"


# ================================================================ key patterns and ACLs

def tenant_acl(prefix, db=0):
    """The rules doc/operations.md gives for a tenant of key prefix `prefix`
    (no glob character in it), on database db, every layout, scripts on."""
    p = prefix
    return ["resetkeys", "resetchannels", "-@all",
            "+client|setname", "+evalsha", "+eval", "+script|load",
            "+get", "+set", "+del", "+incr", "+time", "+type", "+pexpire", "+pttl",
            "+exists", "+hincrby", "+hexists", "+hset", "+hget", "+hdel", "+hlen",
            "+hkeys", "+strlen", "+hgetall",
            "+lindex", "+lpop", "+rpush", "+lrange", "+lrem", "+zscore",
            "+zrem", "+zadd", "+zincrby", "+zrange",
            "+publish", "+subscribe", "+unsubscribe",
            "~%s*" % p, "~{%s*:rwlock_timeout:*" % p,
            "~redisson_lock_token:{%s*" % p, "~redisson_lock_token:%s*" % p,
            "~redisson_lock_queue:{%s*" % p, "~redisson_lock_queue:%s*" % p,
            "~redisson_lock_timeout:{%s*" % p, "~redisson_lock_timeout:%s*" % p,
            "&redis_lock:release:{%s*" % p, "&redis_lock:release:%s*" % p,
            "&redisson_lock__channel:{%s*" % p, "&redisson_lock__channel:%s*" % p,
            "&redisson_rwlock:{%s*" % p, "&redisson_rwlock:%s*" % p,
            "&__keyspace@%d__:%s*" % (db, p)]


@pytest.fixture(scope="module")
def acl_env():
    """A Redis whose user tenanta is confined to tenantA:'s patterns (and
    tenantb to tenantB:'s), and a PostgreSQL that reaches it as tenanta."""
    r = testbed.Redis().start()
    c = r.client()
    c.execute_command("ACL", "SETUSER", "tenanta", "reset", "on", ">pw-a",
                      *tenant_acl("tenantA:"))
    c.execute_command("ACL", "SETUSER", "tenantb", "reset", "on", ">pw-b",
                      *tenant_acl("tenantB:"))
    c.config_set("notify-keyspace-events", "KEA")
    pg = testbed.Postgres(conf={
        "redis_lock.url": "redis://tenanta@127.0.0.1:%d/0" % r.port,
        "redis_lock.password": "pw-a",
        "redis_lock.key_prefix": "tenantA:"}).init().start().with_extension()
    conn = pg.connect()
    with conn.cursor() as cur:
        cur.execute("CREATE ROLE %s LOGIN" % PLAIN)
        cur.execute("CREATE ROLE rl_names_b LOGIN")
        cur.execute("ALTER ROLE rl_names_b SET redis_lock.key_prefix = 'tenantB:'")
    conn.close()
    yield r, pg
    pg.cleanup()
    r.stop()


def acl_log(r):
    return r.client().execute_command("ACL", "LOG")


def woken(waiter, release, bound=testbed.WAKE_BOUND):
    """release() while waiter waits; waiter must get the lock within bound
    (only a wake-up message is that fast: a holder of ours is polled once a
    second)."""
    t0 = time.monotonic()
    release()
    waiter.join(20)
    assert waiter.error is None, waiter.error
    assert waiter.finished_at - t0 < bound, waiter.finished_at - t0


def test_a_tenant_confined_by_acl_runs_every_layout(acl_env):
    r, pg = acl_env
    rc = r.client()
    rc.flushall()
    rc.execute_command("ACL", "LOG", "RESET")
    made = []

    def session(**kw):
        s = Session(pg, **kw)
        made.append(s)
        return s
    try:
        admin, watch = session(), session()
        a, b = session(user=PLAIN), session(user=PLAIN)
        for protocol in ["simple", "redisson", "redisson_fair"]:
            for s in (a, b, admin):
                s.run("SET redis_lock.protocol = %s", (protocol,))
            name = "x:" + protocol
            assert a.run("SELECT redis_lock_acquire(%s, ttl => '20s') > 0", (name,))
            assert a.run("SELECT redis_lock_extend(%s, '20s')", (name,)) is True
            assert a.run("SELECT redis_lock_fence(%s) > 0", (name,)) is True
            assert a.run("SELECT locked FROM redis_lock_status(%s)", (name,)) is True
            assert b.run("SELECT redis_lock_try_acquire(%s)", (name,)) is False
            b.start("SELECT redis_lock_acquire(%s, ttl => '20s', wait => '20s') > 0", (name,))
            wait_for_wait_event(watch.conn, b.pid)
            woken(b, lambda: a.run("SELECT redis_lock_release(%s)", (name,)))
            assert b.result is True
            if protocol == "redisson_fair":
                # a waiter that gives up leaves the queue
                with pytest.raises(psycopg2.errors.LockNotAvailable):
                    a.run("SELECT redis_lock_acquire(%s, wait => '200ms')", (name,))
                assert rc.llen("redisson_lock_queue:{tenantA:%s}" % name) == 0
            assert admin.run("SELECT redis_lock_force_release(%s)", (name,)) is True
            assert b.run("SELECT redis_lock_release(%s)", (name,)) is False
            b.conn.notices.clear()
            # a name with a hash tag: the other form of every auxiliary name
            tagged = "{t}y:" + protocol
            assert a.run("SELECT redis_lock_acquire(%s, ttl => '20s') > 0", (tagged,))
            b.start("SELECT redis_lock_acquire(%s, ttl => '20s', wait => '20s') > 0", (tagged,))
            wait_for_wait_event(watch.conn, b.pid)
            woken(b, lambda: a.run("SELECT redis_lock_release(%s)", (tagged,)))
            assert b.run("SELECT redis_lock_release(%s)", (tagged,)) is True
            if protocol != "redisson_fair":
                names = ["m1", "m2", "{t}m3"]
                assert a.run("SELECT cardinality(redis_lock_acquire_many(%s))", (names,)) == 3
                assert a.run("SELECT redis_lock_release_many(%s)", (names,)) == 3
            assert a.run("SELECT redis_lock_with_lock(%s, 'SELECT 1')", (name,)) == 1
            a.run("BEGIN")
            a.run("SELECT redis_lock_acquire(%s, xact => true)", (name,))
            a.run("COMMIT")                                 # verify on commit
        # Redisson's per-name counter, both forms of its name
        admin.run("SET redis_lock.redisson_token_counter = on")
        for protocol in ["redisson", "redisson_fair"]:
            admin.run("SET redis_lock.protocol = %s", (protocol,))
            for name in ["c:" + protocol, "{t}c:" + protocol]:
                assert admin.run("SELECT redis_lock_acquire(%s, ttl => '20s') > 0", (name,))
                assert admin.run("SELECT redis_lock_release(%s)", (name,)) is True
        admin.run("SET redis_lock.protocol = 'redisson'")
        assert admin.run("SELECT cardinality(redis_lock_acquire_many(ARRAY['cm1', 'cm2']))") == 2
        assert admin.run("SELECT redis_lock_release_many(ARRAY['cm1', 'cm2'])") == 2
        admin.run("RESET redis_lock.redisson_token_counter")
        assert rc.exists("redisson_lock_token:{tenantA:c:redisson}",
                         "redisson_lock_token:tenantA:{t}c:redisson_fair") == 2
        # read-write locks, both forms of the timeout keys' names
        for name in ["rw", "{t}rw"]:
            assert a.run("SELECT redis_lock_acquire_read(%s, ttl => '20s')", (name,))
            assert b.run("SELECT redis_lock_acquire_read(%s, ttl => '20s')", (name,))
            admin.start("SELECT redis_lock_acquire_write(%s, ttl => '20s', wait => '20s')",
                        (name,))
            wait_for_wait_event(watch.conn, admin.pid)
            assert a.run("SELECT redis_lock_release_read(%s)", (name,)) is True
            woken(admin, lambda: b.run("SELECT redis_lock_release_read(%s)", (name,)))
            assert admin.run("SELECT redis_lock_release_write(%s)", (name,)) is True
            assert a.run("SELECT redis_lock_acquire_write(%s, ttl => '20s')", (name,))
            assert admin.run("SELECT redis_lock_force_release(%s)", (name,)) is True
            assert a.run("SELECT redis_lock_release_write(%s)", (name,)) is False
        # a holder that never publishes (redis-py): woken by keyspace events
        admin.run("RESET redis_lock.protocol")
        a.run("RESET redis_lock.protocol")
        tenant = redis.Redis(host="127.0.0.1", port=r.port, username="tenanta",
                             password="pw-a", socket_timeout=5)
        foreign = tenant.lock("tenantA:foreign", timeout=30)
        assert foreign.acquire(blocking=False)
        a.start("SELECT redis_lock_acquire('foreign', ttl => '20s', wait => '20s') > 0")
        wait_for_wait_event(watch.conn, a.pid)
        woken(a, foreign.release, bound=0.5)
        assert a.run("SELECT redis_lock_release('foreign')") is True
        # the watchdog renews every layout with the tenant's credentials
        admin.run("SET redis_lock.lease_time = '900ms'")
        for protocol, q in [("simple", "redis_lock_acquire('w1')"),
                            ("redisson", "redis_lock_acquire('w2')"),
                            ("redisson_fair", "redis_lock_acquire('w3')"),
                            ("simple", "redis_lock_acquire_read('w4')::int"),
                            ("simple", "redis_lock_acquire_write('w5')::int")]:
            admin.run("SET redis_lock.protocol = %s", (protocol,))
            assert admin.run("SELECT " + q + " > 0") is True
        testbed.wait_until(lambda: admin.run(
            "SELECT count(*) FROM redis_lock_locks WHERE pid = pg_backend_pid() "
            "AND last_renewed_at IS NOT NULL") == 5, 10, what="renewals of every layout")
        assert admin.run("SELECT redis_lock_release_all()") == 5
        assert acl_log(r) == []
        # every key left matches one of the tenant's patterns
        patterns = [p[1:] for p in tenant_acl("tenantA:") if p.startswith("~")]
        left = [k.decode() for k in rc.scan_iter()]
        assert left and all(any(fnmatch.fnmatchcase(k, p) for p in patterns)
                            for k in left), left
    finally:
        for s in made:
            s.close()


def test_each_tenant_role_reaches_redis_as_its_own_acl_user(acl_env):
    """doc/security.md, Isolating tenants: each role's URL names its ACL
    user (ALTER ROLE ... SET, no secret in it) and its password comes from
    redis_lock.password_file; each tenant's keys land under its own prefix,
    through its own user."""
    r, _ = acl_env
    pg = testbed.Postgres(conf={"redis_lock.url": "redis://127.0.0.1:%d/0" % r.port}).init()
    try:
        path = os.path.join(pg.base, "redis.pass")
        write_private(path, "127.0.0.1:%d:tenanta:pw-a\n127.0.0.1:%d:tenantb:pw-b\n"
                      % (r.port, r.port))
        pg.set_conf(redis_lock__password_file=path)
        pg.start().with_extension()
        admin = pg.connect()
        with admin.cursor() as cur:
            for t in "ab":
                cur.execute("CREATE ROLE rl_tenant_%s LOGIN" % t)
                cur.execute("ALTER ROLE rl_tenant_%s SET redis_lock.key_prefix = %%s" % t,
                            ("tenant%s:" % t.upper(),))
                cur.execute("ALTER ROLE rl_tenant_%s SET redis_lock.url = %%s" % t,
                            ("redis://tenant%s@127.0.0.1:%d/0" % (t, r.port),))
        admin.close()
        rc = r.client()
        for t in "ab":
            c = pg.connect(user="rl_tenant_" + t)
            try:
                assert testbed.sql_one(c, "SELECT redis_lock_acquire('own', ttl => '30s') > 0")
                assert rc.exists("tenant%s:own" % t.upper()) == 1
                clients = rc.client_list()
                assert any(cl["user"] == "tenant" + t for cl in clients), clients
                assert testbed.sql_one(c, "SELECT redis_lock_release('own')") is True
                assert rc.exists("tenant%s:own" % t.upper()) == 0
            finally:
                c.close()
    finally:
        pg.cleanup()


def test_a_tenant_cannot_reach_another_tenants_keys(acl_env):
    r, pg = acl_env
    rc = r.client()
    rc.flushall()
    rc.execute_command("ACL", "LOG", "RESET")
    theirs = {"tenantB:orders": "pgrl:theirs",
              "redisson_lock_token:{tenantB:orders}": "7",
              "tenantB:redis_lock:fence:{x}": "1700000000000000"}
    for k, v in theirs.items():
        rc.set(k, v)
    # a role whose prefix names tenantB's keys, through tenanta's Redis user
    s = Session(pg, user="rl_names_b")
    try:
        for q in ["SELECT redis_lock_acquire('orders', ttl => '10s')",
                  "SELECT * FROM redis_lock_status('orders')",
                  "SELECT redis_lock_acquire_write('orders', ttl => '10s')"]:
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                s.run(q)
        s.run("SET redis_lock.protocol = 'redisson_fair'")
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            s.run("SELECT redis_lock_acquire('orders', ttl => '10s')")
    finally:
        s.close()
    # nor directly, with tenanta's password
    tenant = redis.Redis(host="127.0.0.1", port=r.port, username="tenanta",
                         password="pw-a", socket_timeout=5)
    for cmd in [("GET", "tenantB:orders"), ("DEL", "tenantB:orders"),
                ("INCR", "redisson_lock_token:{tenantB:orders}"),
                ("SET", "redisson_lock_queue:{tenantB:orders}", "x"),
                ("INCR", "tenantB:redis_lock:fence:{x}"),
                ("PUBLISH", "redis_lock:release:{tenantB:orders}", "0"),
                ("PUBLISH", "redisson_lock__channel:{tenantB:orders}", "0"),
                ("KEYS", "*"), ("FLUSHALL",)]:
        with pytest.raises(redis.exceptions.NoPermissionError):
            tenant.execute_command(*cmd)
    p = tenant.pubsub()
    with pytest.raises(redis.exceptions.NoPermissionError):
        p.subscribe("__keyspace@0__:tenantB:orders")
        p.get_message(timeout=5)
    p.close()
    for k, v in theirs.items():
        assert rc.get(k) == v.encode()
    assert rc.dbsize() == len(theirs)


def tenant_acl_without_scripts(prefix, db=0):
    """doc/operations.md's rules for redis_lock.scripting = off (the simple
    layout only), on Valkey 9.0 or later (DELIFEQ; Redis 8.4: +delex)."""
    p = prefix
    return ["resetkeys", "resetchannels", "-@all",
            "+client|setname", "+command|info", "+multi", "+exec",
            "+set", "+get", "+incr", "+pttl", "+type", "+hkeys", "+getrange",
            "+hrandfield", "+delifeq",
            "+publish", "+subscribe", "+unsubscribe",
            "~%s*" % p,
            "&redis_lock:release:{%s*" % p, "&redis_lock:release:%s*" % p,
            "&__keyspace@%d__:%s*" % (db, p)]


def test_a_tenant_confined_by_acl_without_scripts():
    r = testbed.Redis(server=valkey_91()).start()
    pg = None
    made = []
    try:
        rc = r.client()
        rc.execute_command("ACL", "SETUSER", "tenanta", "reset", "on", ">pw-a",
                           *tenant_acl_without_scripts("tenantA:"))
        rc.config_set("notify-keyspace-events", "KEA")
        pg = testbed.Postgres(conf={
            "redis_lock.url": "redis://tenanta@127.0.0.1:%d/0" % r.port,
            "redis_lock.password": "pw-a",
            "redis_lock.scripting": "off",
            "redis_lock.key_prefix": "tenantA:"}).init().start().with_extension()

        def session(**kw):
            s = Session(pg, **kw)
            made.append(s)
            return s
        admin, watch = session(), session()
        with admin.conn.cursor() as cur:
            cur.execute("CREATE ROLE %s LOGIN" % PLAIN)
        a, b = session(user=PLAIN), session(user=PLAIN)
        for name in ["x", "{t}x"]:
            assert a.run("SELECT redis_lock_acquire(%s, ttl => '20s') > 0", (name,))
            assert a.run("SELECT redis_lock_extend(%s, '20s')", (name,)) is True
            assert a.run("SELECT locked FROM redis_lock_status(%s)", (name,)) is True
            b.start("SELECT redis_lock_acquire(%s, ttl => '20s', wait => '20s') > 0", (name,))
            wait_for_wait_event(watch.conn, b.pid)
            woken(b, lambda: a.run("SELECT redis_lock_release(%s)", (name,)))
            assert admin.run("SELECT redis_lock_force_release(%s)", (name,)) is True
        # a holder that never publishes: woken by the key's keyspace event
        assert rc.set("tenantA:foreign", "theirs", nx=True, px=30000)
        a.start("SELECT redis_lock_acquire('foreign', ttl => '20s', wait => '20s') > 0")
        wait_for_wait_event(watch.conn, a.pid)
        woken(a, lambda: rc.delete("tenantA:foreign"), bound=0.5)
        admin.run("SET redis_lock.lease_time = '900ms'")
        assert admin.run("SELECT redis_lock_acquire('w') > 0") is True
        testbed.wait_until(lambda: admin.run(
            "SELECT last_renewed_at IS NOT NULL FROM redis_lock_locks "
            "WHERE pid = pg_backend_pid()"), 10, what="a renewal")
        assert admin.run("SELECT redis_lock_release_all()") == 1
        assert acl_log(r) == []
    finally:
        for s in made:
            s.close()
        if pg is not None:
            pg.cleanup()
        r.stop()


# ============================================================================
# Item 7: the size of a Redis reply
# ============================================================================
# Security, issue 32 item 7: a hostile or spoofed Redis cannot blow up a
# backend's or the watchdog worker's memory.
#
# A fake Redis (test_hostile.FakeRedis, which answers like a real one until a
# kind of command is armed) answers one command with a reply larger than any
# reply redis_lock gets from a real server, sent as fast as the socket takes
# it and then nothing more:
#
# - a bulk string announced at 777 MB whose bytes keep coming (the bytes a
#   reply not yet whole waits with in hiredis' buffer);
# - wide arrays of empty arrays, 4 million values in 16 MB (each value a
#   hiredis object of ~72 bytes);
# - an array of 1 MB bulk strings, 100 MB (bytes already made into values).
#
# Each must fail the operation promptly (long before command_timeout) with
# 08P01 and a message saying the reply was too large, the process's peak
# memory (VmHWM) must grow by less than 64 MB, the connection must be closed
# (the fake sees its write fail), the session must go on working, and what
# the session believes must be what it would be after a lost reply: an
# acquire whose grant was cut off is not held, and the grant it may have made
# is deleted by the watchdog (a doubt).  The same for the watchdog worker's
# renewals.  A reply made to stay just under both limits costs a bounded
# amount too.  And a legitimately large reply (CLUSTER SLOTS of a Cluster
# whose slots lie in 8192 ranges over masters with three replicas each)
# still works.
#
# The SQL runs as a role with LOGIN only, but for the Cluster case
# (redis_lock.cluster is a superuser's setting).

COMMAND_TIMEOUT_MS = 10000
# the fake sends this much at most, then nothing; an unbounded reader would
# hold it all until command_timeout
SEND_LIMIT = 256 * 1024 * 1024
# a refused reply must end the call long before command_timeout
PROMPT_S = 4.0 * S
HWM_GROWTH_LIMIT_KB = 64 * 1024
REPLIES_ROLE = "rl_plain"


# ----------------------------------------------------------------------
# What the fake sends
# ----------------------------------------------------------------------
def huge_bulk():
    """A bulk string announced at 777 MB, its bytes 1 MB at a time."""
    yield b"$777000000\r\n"
    chunk = b"x" * (1024 * 1024)
    while True:
        yield chunk


def wide_arrays():
    """400 arrays of 10 000 empty arrays each: 4 000 401 values in 16 MB."""
    yield b"*400\r\n"
    inner = b"*10000\r\n" + b"*0\r\n" * 10000
    for _ in range(400):
        yield inner


def many_strings():
    """100 bulk strings of 1 MB each in one array."""
    yield b"*100\r\n"
    one = b"$1048576\r\n" + b"y" * 1048576 + b"\r\n"
    for _ in range(100):
        yield one


SHAPES = {"huge-bulk": huge_bulk, "wide-arrays": wide_arrays, "many-strings": many_strings}


class Stream:
    """Armed reply: the chunks of gen, sent until the client stops taking
    them (cut: it closed the connection) or SEND_LIMIT is reached."""

    mode = "stream"

    def __init__(self, gen):
        self.gen = gen
        self.hits = 0
        self.sent = 0
        self.cut = False


class StreamingRedis(FakeRedis):
    """FakeRedis with one more way to answer an armed command: Stream."""

    def _handle(self, c, argv):
        kind = self._kind(argv)
        with self.lock:
            armed = self.armed.get(kind)
        if not isinstance(armed, Stream):
            return super()._handle(c, argv)
        with self.lock:
            self.commands.append((kind, argv))
            armed.hits += 1
            self._normal(kind, argv)    # what the server did: a grant, say
        try:
            for chunk in armed.gen():
                if armed.sent >= SEND_LIMIT:
                    break
                c.sendall(chunk)
                armed.sent += len(chunk)
        except OSError:
            armed.cut = True
            raise
        # (a reply cut short stays so: the next command gets its own reply)
        return True


# ----------------------------------------------------------------------
# Fixtures and helpers
# ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def fake():
    f = StreamingRedis()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def pg_fake(fake):
    p = testbed.Postgres(conf={
        "redis_lock.url": fake.url,
        "redis_lock.command_timeout": "%dms" % COMMAND_TIMEOUT_MS,
        "redis_lock.connect_timeout": "2s",
        "redis_lock.wait_timeout": "300ms",
    }).init().start().with_extension()
    c = p.connect()
    c.cursor().execute("CREATE ROLE %s LOGIN" % REPLIES_ROLE)
    c.close()
    yield p
    p.cleanup()


def one(conn, q, args=None):
    with conn.cursor() as cur:
        cur.execute(q, args)
        if cur.description is None:
            return None
        row = cur.fetchone()
        return row[0] if row else None


def status_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s for pid %d" % (field, pid))


def held(conn):
    return one(conn, "SELECT coalesce(array_agg(lock_name ORDER BY lock_name), '{}') "
               "FROM redis_lock_held()")


def assert_alive(pg_fake, log_start):
    log = pg_fake.log_text()[log_start:]
    assert "terminated by signal" not in log, log[-3000:]
    assert "was terminated" not in log, log[-3000:]


def assert_too_large(err):
    assert err is not None, "the call succeeded"
    msg = err.diag.message_primary or ""
    assert err.pgcode == "08P01" and "sent a reply that is too large" in msg, \
        "%s: %s" % (err.pgcode, (err.pgerror or "").strip())


# ----------------------------------------------------------------------
# A backend
# ----------------------------------------------------------------------
@pytest.mark.parametrize("fn", ["acquire", "release"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_huge_reply_fails_the_call_promptly_with_bounded_memory(pg_fake, fake, shape, fn):
    fake.reset()
    log_start = len(pg_fake.log_text())
    conn = pg_fake.connect(user=REPLIES_ROLE)
    try:
        pid = one(conn, "SELECT pg_backend_pid()")
        # connected, scripts loaded: what is measured is the reply alone
        assert one(conn, "SELECT redis_lock_try_acquire('warm', ttl => '5s')") is True
        assert one(conn, "SELECT redis_lock_release('warm')") is True
        if fn == "release":
            assert one(conn, "SELECT redis_lock_acquire('hl', ttl => '60s')") > 0
        hwm_before = status_kb(pid, "VmHWM")
        armed = Stream(SHAPES[shape])
        fake.arm(fn, armed)
        sql = ("SELECT redis_lock_acquire('hl', ttl => '60s')" if fn == "acquire"
               else "SELECT redis_lock_release('hl')")
        t0 = time.monotonic()
        err = None
        try:
            one(conn, sql)
        except psycopg2.Error as e:
            err = e
        elapsed = time.monotonic() - t0
        hwm_after = status_kb(pid, "VmHWM")
        print("\n%s/%s: %.2fs, VmHWM %d -> %d kB, %d bytes sent, %s"
              % (shape, fn, elapsed, hwm_before, hwm_after, armed.sent,
                 (err.pgerror or "").strip().replace("\n", " | ") if err else "no error"))

        assert armed.hits >= 1     # (the worker's release of the doubt may follow)
        assert_too_large(err)
        assert elapsed < PROMPT_S, "%.2fs" % elapsed
        assert hwm_after - hwm_before < HWM_GROWTH_LIMIT_KB, \
            "VmHWM grew by %d kB" % (hwm_after - hwm_before)
        # the backend closed the connection rather than reading on
        testbed.wait_until(lambda: armed.cut, 5, what="the fake to see its reply cut off")
        fake.disarm()
        assert armed.sent < SEND_LIMIT

        # what the session believes: not held; the grant (or the release's
        # outcome) is a doubt the watchdog settles with a compare-and-delete
        assert held(conn) == []
        testbed.wait_until(lambda: b"hl" not in fake.keys, 10,
                           what="the doubt to be settled (key deleted)")
        # and the session, on a fresh connection, works as before
        assert one(conn, "SELECT redis_lock_try_acquire('after', ttl => '5s')") is True
        assert one(conn, "SELECT redis_lock_release('after')") is True
        assert held(conn) == []
        assert_alive(pg_fake, log_start)
    finally:
        fake.disarm()
        conn.close()


def just_under_the_limits():
    """260 000 bulk strings of 56 bytes: under both limits (263 168 values,
    16 809 984 bytes at the default max_locks), the most values and bytes of
    hiredis objects a reply can make before it is refused."""
    yield b"*260000\r\n"
    thousand = (b"$56\r\n" + b"z" * 56 + b"\r\n") * 1000
    for _ in range(260):
        yield thousand


def test_a_reply_just_under_the_limits_costs_a_bounded_amount(pg_fake, fake):
    """Read whole and copied, then refused as no answer to the command: the
    peak is bounded by the limits (about 75 MB here; doc/reference.md)."""
    fake.reset()
    conn = pg_fake.connect(user=REPLIES_ROLE)
    try:
        pid = one(conn, "SELECT pg_backend_pid()")
        assert one(conn, "SELECT redis_lock_try_acquire('warm', ttl => '5s')") is True
        assert one(conn, "SELECT redis_lock_release('warm')") is True
        hwm_before = status_kb(pid, "VmHWM")
        fake.arm("acquire", Stream(just_under_the_limits))
        with pytest.raises(psycopg2.Error) as e:
            one(conn, "SELECT redis_lock_acquire('hl', ttl => '60s')")
        fake.disarm()
        hwm_after = status_kb(pid, "VmHWM")
        print("\njust under the limits: VmHWM %d -> %d kB, %s"
              % (hwm_before, hwm_after, (e.value.pgerror or "").strip().replace("\n", " | ")))
        assert e.value.pgcode == "08P01"
        # about 73 MB measured; the rest is room for the larger chunks of an
        # assert-enabled server (MEMORY_CONTEXT_CHECKING)
        assert hwm_after - hwm_before < 110 * 1024, "VmHWM grew by %d kB" % (hwm_after - hwm_before)
        assert held(conn) == []
        assert one(conn, "SELECT redis_lock_try_acquire('after', ttl => '5s')") is True
        assert one(conn, "SELECT redis_lock_release('after')") is True
    finally:
        fake.disarm()
        conn.close()


# ----------------------------------------------------------------------
# The watchdog worker
# ----------------------------------------------------------------------
def test_a_huge_reply_to_a_renewal_leaves_the_watchdog_bounded_and_working(pg_fake, fake):
    """The workers read replies with the same code: a renewal answered with
    a bulk string that never ends costs them a bounded amount of memory,
    the renewal fails (it is retried, by the slow-lane worker too), the
    workers stay up, and once the server answers normally the lock is
    renewed again and not lost."""
    fake.reset()
    log_start = len(pg_fake.log_text())
    conn = pg_fake.connect(user=REPLIES_ROLE)
    try:
        # a lease the worker renews (every lease_time / 3)
        one(conn, "SET redis_lock.lease_time = '6s'")
        assert one(conn, "SELECT redis_lock_acquire('wd')") > 0
        workers = sorted(watchdog_pids(pg_fake.postmaster_pid()))
        assert len(workers) == 2, workers
        # the worker has renewed once (its connection and scripts are up)
        testbed.wait_until(lambda: any(k == "extend" for k, _ in fake.commands), 10,
                           what="a first renewal")
        hwm_before = {w: status_kb(w, "VmHWM") for w in workers}
        armed = Stream(huge_bulk)
        fake.arm("extend", armed)
        testbed.wait_until(lambda: armed.hits > 0, 10, what="the next renewal")
        # cut off, or all of it taken (and held until command_timeout)
        testbed.wait_until(lambda: armed.cut or armed.sent >= SEND_LIMIT, PROMPT_S / S,
                           what="the worker to cut the reply off or take all of it")
        hwm_after = {w: status_kb(w, "VmHWM") for w in workers}
        print("\nwatchdog: VmHWM %r -> %r kB, %d hostile replies, %d bytes sent, cut: %s"
              % (hwm_before, hwm_after, armed.hits, armed.sent, armed.cut))
        assert armed.cut and armed.sent < SEND_LIMIT
        for w in workers:
            # (earlier tests' doubts may have raised a worker's peak already)
            assert hwm_after[w] - hwm_before[w] < HWM_GROWTH_LIMIT_KB and \
                hwm_after[w] < 2 * HWM_GROWTH_LIMIT_KB, (w, hwm_before, hwm_after)
        testbed.wait_until(lambda: "sent a reply that is too large" in pg_fake.log_text()[log_start:],
                           5, what="the worker's LOG line")
        fake.disarm()
        with fake.lock:
            seen = len(fake.commands)

        # renewed again, by the same workers, the lock never lost
        def renewed_again():
            with fake.lock:
                return any(k == "extend" for k, _ in fake.commands[seen:])
        testbed.wait_until(renewed_again, 10, what="a renewal after the hostile one")
        assert sorted(watchdog_pids(pg_fake.postmaster_pid())) == workers
        assert one(conn, "SELECT lost FROM redis_lock_held() WHERE lock_name = 'wd'") is False
        assert one(conn, "SELECT redis_lock_release('wd')") is True
        assert_alive(pg_fake, log_start)
    finally:
        fake.disarm()
        conn.close()


# ----------------------------------------------------------------------
# What is not refused
# ----------------------------------------------------------------------
def scattered_slots(port):
    """CLUSTER SLOTS of a Cluster whose 16384 slots lie in 8192 ranges of two,
    each served by a master (the fake) and three replicas, every node with
    its id and a host name (Redis 7's form): 253 953 values, about 4.5 MB.
    The largest reply redis_lock is documented to accept."""
    def node(p, i):
        return array(bulk("127.0.0.1"), integer(p), bulk("%040x" % i),
                     array(bulk("hostname"), bulk("node-%05d.redis.example.internal" % i)))
    parts = [b"*8192\r\n"]
    for s in range(8192):
        parts.append(array(integer(2 * s), integer(2 * s + 1), node(port, 0),
                           node(20000 + s % 1000, 1), node(21000 + s % 1000, 2),
                           node(22000 + s % 1000, 3)))
    return b"".join(parts)


def test_the_largest_legitimate_reply_still_works(pg_fake, fake):
    fake.reset()
    reply = scattered_slots(fake.port)
    assert len(reply) < 16 * 1024 * 1024
    conn = pg_fake.connect()     # a superuser: redis_lock.cluster is one's to set
    try:
        fake.arm("slots", Stream(lambda: iter([reply])))
        one(conn, "SET redis_lock.cluster = on")
        assert one(conn, "SELECT redis_lock_acquire('c', ttl => '5s')") > 0
        fake.disarm()
        assert held(conn) == ["c"]
        assert one(conn, "SELECT redis_lock_release('c')") is True
    finally:
        fake.disarm()
        conn.close()


# ============================================================================
# Issue 42, item 5: the hidden password file's path was shown to any role
# ============================================================================
# redis_lock.password_file is hidden from other roles in SHOW and
# pg_settings, but each WARNING about the file named its path, and why it
# was ignored, to whichever session was connecting.  The session now gets a
# fixed message; the path and why go to the server log only.

def test_a_password_file_warning_tells_the_session_neither_path_nor_why(pf):
    saved = open(pf.pwfile).read()
    log_start = len(pf.log_text())
    pf.write(saved, mode=0o640)
    try:
        s = pf.connect(user="rl_intruder")      # a new backend: a new connection
        with pytest.raises(psycopg2.Error) as ei:
            testbed.sql_one(s, "SELECT redis_lock_acquire('pf-hidden')")
        assert ei.value.pgcode == "28P01", str(ei.value)
        warnings = [n for n in s.notices if "Redis password file" in n]
        s.close()
    finally:
        pf.write(saved, mode=0o600)
    assert warnings, "no WARNING about the file"
    told = "".join(warnings) + str(ei.value)
    for secret in (pf.pwfile, os.path.basename(pf.pwfile), "accessible", "chmod"):
        assert secret not in told, (secret, told)
    assert "The server log names the file" in told
    # the server log has both, in the detail of the same WARNING
    logged = pf.log_text()[log_start:]
    assert re.search(r'WARNING:  ignoring the Redis password file\n'
                     r'.*DETAIL:  "%s" is accessible by group or others'
                     % re.escape(pf.pwfile), logged), logged


# ============================================================================
# Issue 42: locks taken inside another role's SECURITY DEFINER function
# ============================================================================
# A slot was charged to the current user: inside a SECURITY DEFINER function,
# its owner, and to no limit at all when that was a superuser, so a role at
# its redis_lock.max_locks_per_role took more through any such function it
# may execute.  A slot is now charged to the role the session acts as (its
# login role, or the one SET ROLE chose), whichever function takes it.

@pytest.mark.parametrize("owner", ["superuser", "another_role"])
def test_a_security_definer_function_charges_its_caller_not_its_owner(pg_limits, admin, owner):
    make_login_role(admin, "definer_caller")
    func = "take_as_%s" % owner
    with admin.cursor() as cur:
        cur.execute("ALTER ROLE definer_caller SET redis_lock.max_locks_per_role = 1")
        cur.execute("DROP FUNCTION IF EXISTS %s(text)" % func)
        cur.execute("CREATE FUNCTION %s(name text) RETURNS boolean LANGUAGE sql "
                    "SECURITY DEFINER SET search_path = pg_catalog, public "
                    "AS $$ SELECT redis_lock_acquire(name) > 0 $$" % func)
        cur.execute("REVOKE ALL ON FUNCTION %s(text) FROM PUBLIC" % func)
        cur.execute("GRANT EXECUTE ON FUNCTION %s(text) TO definer_caller" % func)
        if owner == "another_role":
            make_login_role(admin, "definer_owner")
            cur.execute("ALTER FUNCTION %s(text) OWNER TO definer_owner" % func)
    c = pg_limits.connect(user="definer_caller")
    try:
        assert testbed.sql_one(c, "SELECT redis_lock_acquire('sd:own') > 0")
        # at its limit: the function's lock is the caller's, and refused
        with pytest.raises(psycopg2.errors.ConfigurationLimitExceeded) as ei:
            testbed.sql_one(c, "SELECT %s('sd:through')" % func)
        assert 'role "definer_caller"' in ei.value.diag.message_primary, str(ei.value)
        assert testbed.sql_one(c, "SELECT count(*) FROM redis_lock_held()") == 1
        # with room, the function takes it, and it fills the caller's share
        assert testbed.sql_one(c, "SELECT redis_lock_release('sd:own')") is True
        assert testbed.sql_one(c, "SELECT %s('sd:through')" % func) is True
        with pytest.raises(psycopg2.errors.ConfigurationLimitExceeded):
            testbed.sql_one(c, "SELECT redis_lock_acquire('sd:own')")
        # control: SET ROLE still charges the role set (its limit is the
        # session's setting: a superuser's session sets the caller's)
        with admin.cursor() as cur:
            cur.execute("SET redis_lock.max_locks_per_role = 1")
            cur.execute("SET ROLE definer_caller")
            try:
                with pytest.raises(psycopg2.errors.ConfigurationLimitExceeded) as ei:
                    cur.execute("SELECT redis_lock_acquire('sd:set-role')")
                assert 'role "definer_caller"' in ei.value.diag.message_primary
            finally:
                admin.rollback()
                cur.execute("RESET ROLE")
                cur.execute("RESET redis_lock.max_locks_per_role")
        testbed.sql_one(c, "SELECT redis_lock_release_all()")
    finally:
        c.close()
        with admin.cursor() as cur:
            cur.execute("DROP FUNCTION IF EXISTS %s(text)" % func)


def test_a_security_restricted_operation_charges_the_tables_owner(pg_limits, admin):
    """Review of the rule above: inside a security-restricted operation
    (REFRESH MATERIALIZED VIEW, VACUUM, ANALYZE, REINDEX, autovacuum) a
    table owner's query runs as that owner while the session's role stays
    the superuser who started it, whom no limit counts: the owner's code
    took any number of locks through a superuser's REFRESH.  There the
    owner is charged."""
    make_login_role(admin, "mv_owner")
    with admin.cursor() as cur:
        cur.execute("DROP MATERIALIZED VIEW IF EXISTS mv_takes_locks")
        cur.execute("GRANT CREATE ON SCHEMA public TO mv_owner")
    c = pg_limits.connect(user="mv_owner")
    try:
        with c.cursor() as cur:
            cur.execute("CREATE MATERIALIZED VIEW mv_takes_locks AS "
                        "SELECT redis_lock_acquire('mv:a') > 0 AND "
                        "redis_lock_acquire('mv:b') > 0 AS taken WITH NO DATA")
        with admin.cursor() as cur:
            cur.execute("SET redis_lock.max_locks_per_role = 1")
            try:
                with pytest.raises(psycopg2.errors.ConfigurationLimitExceeded) as ei:
                    cur.execute("REFRESH MATERIALIZED VIEW mv_takes_locks")
                assert 'role "mv_owner"' in ei.value.diag.message_primary, str(ei.value)
            finally:
                admin.rollback()
                cur.execute("SELECT redis_lock_release_all()")
                cur.execute("RESET redis_lock.max_locks_per_role")
    finally:
        c.close()
        with admin.cursor() as cur:
            cur.execute("DROP MATERIALIZED VIEW IF EXISTS mv_takes_locks")
            cur.execute("REVOKE CREATE ON SCHEMA public FROM mv_owner")


# ============================================================================
# Issue 42: the worker signalled whoever had the pid of a lost lock's holder
# ============================================================================
# Once it found a lock lost, the worker sent SIGINT (on_lost = error) or
# SIGTERM (terminate) to the pid it had read with the loss, after unlocking
# the registry and without looking again: a holder that had released the
# lock, or taken it again (a new grant), meanwhile had its statement
# cancelled or its backend ended, and with pid reuse the signal could reach
# an unrelated backend.  It now signals only a process that, under the
# registry's lock and ProcArrayLock, still holds the grant found lost.  The
# window is a few instructions wide; RL_TEST_STOP_BEFORE_SIGNAL, read by
# assert-enabled builds only (src/worker/watchjobs.c), stops the worker in it.

@pytest.fixture(scope="module")
def pg_stop_before_signal(redis_srv):
    with testbed.server_env("RL_TEST_STOP_BEFORE_SIGNAL=1"):
        p = testbed.Postgres(conf={"redis_lock.url": redis_srv.url,
                                   "redis_lock.lease_time": "3s"}).init().start().with_extension()
    yield p
    for w in watchdog_pids(p.postmaster_pid()):
        os.kill(w, signal.SIGCONT)
    p.cleanup()


@pytest.mark.parametrize("then", ["released", "taken_again"])
@pytest.mark.parametrize("on_lost", ["error", "terminate"])
def test_the_worker_signals_no_process_that_let_the_lost_lock_go(pg_stop_before_signal,
                                                                 redis_srv, on_lost, then):
    pg = pg_stop_before_signal
    admin = Session(pg)
    a = Session(pg)
    workers = watchdog_pids(pg.postmaster_pid())
    name = "sig-%s-%s" % (on_lost, then)
    try:
        if admin.run("SHOW debug_assertions") != "on":
            pytest.skip("the worker is stopped in the window only by assert-enabled builds")
        a.run("SET redis_lock.on_lost = %s", (on_lost,))
        assert a.run("SELECT redis_lock_acquire(%s) > 0", (name,))
        log_start = len(pg.log_text())
        redis_srv.client().delete(name)
        # the worker found the loss and stopped before signalling
        stopped = testbed.wait_until(
            lambda: [w for w in workers if process_stopped(w)], 10,
            what="the worker to find the loss and stop before signalling")
        assert a.run("SELECT redis_lock_release(%s)", (name,)) is False
        if then == "taken_again":
            # the same session and (the free list is LIFO) the same slot
            assert a.run("SELECT redis_lock_acquire(%s, ttl => '60s') > 0", (name,))
        a.start("SELECT pg_sleep(3)")
        testbed.wait_until(lambda: admin.run("SELECT state = 'active' FROM pg_stat_activity "
                                             "WHERE pid = %s", (a.pid,)), 5,
                           what="statement running")
        for w in stopped:
            os.kill(w, signal.SIGCONT)
        line = 'Redis lock "%s" of process %d was lost' % (name, a.pid)
        testbed.wait_until(lambda: line in pg.log_text()[log_start:], 10,
                           what="the worker's LOG line about the loss")
        seen_at = time.monotonic()
        a.join(10)
        assert a.error is None, a.error
        # the worker went on (a signal is sent before the line) while it ran
        assert a.finished_at > seen_at, "the statement ended before the worker went on"
        logged = pg.log_text()[log_start:]
        assert re.search(re.escape(line) + r".*; not signalled: it no longer holds it", logged), logged
        if then == "taken_again":
            assert a.run("SELECT lost FROM redis_lock_held() WHERE lock_name = %s", (name,)) is False
            assert a.run("SELECT redis_lock_release(%s)", (name,)) is True
    finally:
        for w in workers:
            os.kill(w, signal.SIGCONT)
        a.close()
        admin.close()


# ============================================================================
# Issue 42, item 3: redis_lock_force_release deleted keys that were no locks
# ============================================================================
# Its script deleted any string that was not a decimal integer and, under
# redis_lock.protocol = 'redisson', any hash without a "mode" field (and,
# under any protocol, any hash with one), with no TTL or owner-shape check:
# another application's JSON string or hash went while redis_lock_status
# called it no lock.  Force release now deletes exactly what status calls a
# lock (one test: lock_owners in src/redis/lockscripts.c, rl_inspect_reply without
# scripts) and refuses anything else with 42809, leaving it as it was.  Run
# in both worlds above (scripts on Redis 7.0; none on Valkey 9.1) by a
# superuser -- force release is not PUBLIC's -- under the default empty key
# prefix; status is asked by the LOGIN-only role.

def foreign_keys():
    """Every string and hash of the status tests above that is no lock, and
    a counter with a TTL: name -> (value or mapping, TTL in ms or None)."""
    keys = dict(FOREIGN_STRINGS)
    keys.update(foreign_hashes())
    keys["counter-with-ttl"] = (b"12345", TTL_MS)
    keys["negative-counter-with-ttl"] = (b"-42", TTL_MS)
    return keys


def put(rc, key, content, ttl):
    if isinstance(content, dict):
        rc.hset(key, mapping=content)
        if ttl is not None:
            rc.pexpire(key, ttl)
    else:
        rc.set(key, content, px=ttl)


def force(admin, name):
    """force release of name: its result, or the error it raised."""
    try:
        return admin.run("SELECT redis_lock_force_release(%s)", (name,))
    except psycopg2.Error as e:
        return e


def protocols(w):
    """The lock protocols of a world: only simple without scripts."""
    return ["simple", "redisson"] if w.scripting else ["simple"]


def superuser(w):
    s = Session(w.pg)
    w.made.append(s)
    return s


def test_force_release_leaves_every_key_that_status_calls_no_lock(env):
    w, rc = env
    probe, admin = w.probe(), superuser(w)
    deleted, shown = [], []
    for protocol in protocols(w):
        admin.run("SET redis_lock.protocol = %s", (protocol,))
        for case, (content, ttl) in sorted(foreign_keys().items()):
            key = "app:" + case
            rc.delete(key)
            put(rc, key, content, ttl)
            before = rc.dump(key)
            typ = "hash" if isinstance(content, dict) else "string"
            out = force(admin, key)
            if rc.dump(key) != before:
                deleted.append((protocol, case))
                continue
            assert isinstance(out, psycopg2.errors.WrongObjectType), (protocol, case, out)
            assert 'Redis key "%s" holds a' % key in str(out), str(out)
            assert (rc.pttl(key) > 0) == (ttl is not None)
            if status_row(probe, key) != not_a_lock(key, typ):
                shown.append((protocol, case))
    assert not deleted, "force release deleted keys that are no lock: %s" % deleted
    assert not shown, "status calls a lock what force release refuses: %s" % shown


def test_force_release_still_deletes_the_locks_of_every_layout(env):
    """The control: every lock status shows, as each client writes it, is
    deleted; status then finds no key."""
    w, rc = env
    probe, admin = w.probe(), superuser(w)
    rid = redisson_id()
    strings = {"py-lock": uuid.uuid1().hex.encode(),            # redis-py
               "java-lock": str(uuid.uuid4()).encode(),        # hand-written Java
               "go-lock": b"q2Zl+N0/hZP8kxgWc1Zt6g==",         # redsync
               "js-lock": os.urandom(16).hex().encode()}       # node-redlock
    hashes = {"rlock": {rid + ":57": 2},
              "rlock-rx": {rid + ":-4611686018427387904": 1},
              "rw-read": {"mode": "read", rid + ":61": 1, redisson_id() + ":12": 2},
              "rw-write": {"mode": "write", rid + ":61": 1, rid + ":61:write": 1}}
    locks = [("simple", k, v) for k, v in strings.items()]
    if w.scripting:
        locks += [("redisson", k, v) for k, v in hashes.items()]
        # a read-write lock goes whatever the protocol says
        locks += [("simple", k, v) for k, v in hashes.items() if k.startswith("rw-")]
    for protocol, key, content in locks:
        admin.run("SET redis_lock.protocol = %s", (protocol,))
        put(rc, key, content, 30000)
        assert status_row(probe, key)[0] is True, key
        assert force(admin, key) is True, (protocol, key)
        assert rc.exists(key) == 0, key
        assert status_row(probe, key) == (False, False, None, None, key, "none")
    # the session's own lock, of each layout it can take
    for protocol in protocols(w):
        admin.run("SET redis_lock.protocol = %s", (protocol,))
        assert probe.run("SET redis_lock.protocol = %s", (protocol,)) is None
        assert probe.run("SELECT redis_lock_try_acquire('own', ttl => '30s')") is True
        assert force(admin, "own") is True, protocol
        assert rc.exists("own") == 0
        assert probe.run("SELECT redis_lock_release('own')") is False


# ============================================================================
# Issue 42, item 4: one role switched off prompt loss detection for everyone
# ============================================================================
# The watchdog worker subscribes to the keyspace notifications of at most
# 4096 keys (src/worker/watchevents.c), and took them first come, first served: a
# LOGIN-only role holding more locks than that (the per-role limit allows it
# once redis_lock.max_locks >= 8192) left another role's lock unwatched, so
# its loss was found only by its renewal, a third of its lease later, and
# on_lost stopped that role's work that much late.  The watches are now
# shared between the roles holding locks: here the hog gets all but one,
# the victim its one, and the victim's loss is found by its notification.

WATCH_KEYS_MAX = 4096               # src/worker/watchevents.c, RL_WATCH_KEYS_MAX
HOG_LOCKS = WATCH_KEYS_MAX + 104
WATCH_LEASE = "120s"                # renewed every 40 s: the slow path
# the notification path: 0.022 s beside 4200 watched locks (2-core machine,
# loaded, 2026-11-28); the build before took 36.7 s (the renewal, up to 40 s)
WATCHED_LOSS_BOUND = 3.0


@pytest.fixture(scope="module")
def watch_env():
    r = testbed.Redis().start()
    rc = r.client()
    rc.config_set("notify-keyspace-events", "Kgx")
    pg = testbed.Postgres(conf={"redis_lock.url": r.url,
                                "redis_lock.max_locks": "10000",
                                "redis_lock.max_locks_per_session": "5000"}
                          ).init().start().with_extension()
    admin = pg.connect()
    for role in ("watch_hog", "watch_victim"):
        make_login_role(admin, role)
    yield rc, pg, admin
    admin.close()
    pg.cleanup()
    r.stop()


def watched(rc, pattern):
    """Keys matching pattern whose notifications someone subscribes to."""
    return len(rc.pubsub_channels("__keyspace@0__:" + pattern))


def test_one_role_cannot_take_every_keyspace_watch(watch_env):
    from test_lost import assert_loss_stops_a_statement, worker_watches
    rc, pg, admin = watch_env
    hog, victim = Session(pg, user="watch_hog"), Session(pg, user="watch_victim")
    try:
        assert hog.run("SELECT rolsuper FROM pg_roles WHERE rolname = current_user") is False
        hog.run("SET redis_lock.lease_time = %s", (WATCH_LEASE,))
        assert hog.run("SELECT count(*) FROM generate_series(1, %s) i "
                       "WHERE redis_lock_acquire('hog:' || i) > 0", (HOG_LOCKS,)) == HOG_LOCKS
        testbed.wait_until(lambda: watched(rc, "hog:*") == WATCH_KEYS_MAX, 60, 0.2,
                           what="the worker to watch as many of the hog's locks as it may")
        victim.run("SET redis_lock.lease_time = %s", (WATCH_LEASE,))
        assert victim.run("SELECT redis_lock_acquire('victim') > 0")
        testbed.wait_until(lambda: worker_watches(rc, "victim"), 20, 0.05,
                           what="the victim's lock watched beside the hog's")
        assert watched(rc, "hog:*") == WATCH_KEYS_MAX - 1
        took = assert_loss_stops_a_statement(victim, admin, rc, "victim", WATCHED_LOSS_BOUND)
        print("\nthe victim's loss stopped its statement %.3f s after it" % took)
    finally:
        hog.close()
        victim.close()


# ============================================================================
# Issue 42 item 1: no install or upgrade path runs a role's code
# ============================================================================
# CREATE EXTENSION and ALTER EXTENSION UPDATE run the scripts in sql/ as the
# superuser with search_path = the extension's schema, pg_temp (pg_catalog
# implicitly first).  Before PostgreSQL 15 every role may create in public,
# the extension's schema, and elsewhere whoever was granted CREATE there: a
# name a script resolves by search path can be answered from there whenever
# pg_catalog has no exact match.  1.1 -> 1.2 compared an oid with a
# regprocedure, which an operator public.=(oid, regprocedure) matches better
# than pg_catalog's; redis_lock_fence_check() (SECURITY DEFINER) passed an
# integer where redis_lock_fence_advance() takes a regclass.
#
# A role with LOGIN only (and CREATE on public, as on 13 and 14) plants
# look-alikes of everything the scripts use, each of which records that it
# ran (a row, a WARNING that outlives a rollback, and an attempt to make the
# role superuser).  In public: operators of every name the scripts use
# between the types they compare or compute with, and functions of every
# name they call with one argument of another type, and VARIADIC ones.  In
# the pg_temp of the session that then installs and updates (the role
# creates them there after SET ROLE): domains named like pg_catalog's types,
# with a CHECK, and casts to them; composite types named record, trigger and
# event_trigger; tables and views named like the extension's and like the
# catalogs the scripts read; functions named like the extension's.  Then
# the superuser installs each version and updates step by step to 1.4, over
# a guarded table, a guarded partitioned one, marks, and key prefixes set
# per role and per database, so that the data migration of 1.1 -> 1.2 works
# on rows; and uses the fence functions and the event trigger once in that
# session.  Nothing planted may run, and nothing of the extension may depend
# on anything outside pg_catalog and the extension.

PLANTER = "rl_planter"
PLANT_TEMPLATE = "rl_planted"
SQL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sql")

# every type the scripts compare, compute with or pass to a function
PLANT_TYPES = ["oid", "regclass", "regproc", "regprocedure", "regtype", "text", "name",
               "bytea", "int2", "int4", "int8", "bool", "timestamptz", "jsonb", '"char"']
# every operator the scripts use (LIKE is ~~), and the comparisons beside them
PLANT_OPERATORS = ["=", "<>", "<", "<=", ">", ">=", "+", "-", "~~", "?", "->>", "||"]
# what the update reads from pg_catalog: a temporary view of each name
READ_CATALOGS = ["pg_trigger", "pg_db_role_setting", "pg_database", "pg_class",
                 "pg_proc", "pg_namespace", "pg_extension", "pg_depend"]
UPDATE_STEPS = ["1.0", "1.1", "1.2", "1.3", "1.4"]


def script_text():
    return "\n".join(open(os.path.join(SQL_DIR, f)).read()
                     for f in sorted(os.listdir(SQL_DIR)) if f.endswith(".sql"))


def script_code():
    """The scripts without comments, string literals and @extschema@."""
    s = re.sub(r"--[^\n]*|/\*.*?\*/", " ", script_text(), flags=re.S)
    s = re.sub(r"'(?:[^']|'')*'", "''", s)
    return s.replace("@extschema@.", "").replace("::", " ")


def test_the_planted_operators_cover_every_operator_the_scripts_use():
    used = set(re.findall(r"[=<>!~+\-*/%^&|#?]+", script_code()))
    assert "=" in used
    assert used <= set(PLANT_OPERATORS), used - set(PLANT_OPERATORS)


SPY = """
CREATE TABLE public.rl_spied (what pg_catalog.text, by_role pg_catalog.name DEFAULT current_user);
CREATE FUNCTION public.rl_spy(what pg_catalog.text) RETURNS pg_catalog.bool
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.rl_spied (what) VALUES (what);
  RAISE WARNING 'rl_spy: % ran as %', what, current_user;
  BEGIN
    EXECUTE 'ALTER ROLE {role} SUPERUSER';
  EXCEPTION WHEN insufficient_privilege THEN NULL;
  END;
  RETURN true;
END $$;
CREATE FUNCTION public.rl_spy_trigger() RETURNS pg_catalog.trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM public.rl_spy('trigger on pg_temp.' || TG_TABLE_NAME);
  RETURN NULL;
END $$;
-- runs each statement, skips those PostgreSQL refuses; returns how many ran
CREATE FUNCTION public.rl_plant(stmts pg_catalog.text[]) RETURNS pg_catalog.int4
LANGUAGE plpgsql AS $$
DECLARE
  s pg_catalog.text;
  n pg_catalog.int4 := 0;
BEGIN
  FOREACH s IN ARRAY stmts LOOP
    BEGIN
      EXECUTE s;
      n := n + 1;
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
  END LOOP;
  RETURN n;
END $$;
""".format(role=PLANTER)


def plpgsql_spy(name, args, ret, label):
    """A function name(args) returning ret that records label when it runs."""
    result = "" if ret.startswith("SETOF") or ret == "pg_catalog.void" else " NULL"
    return ("CREATE FUNCTION %s(%s) RETURNS %s LANGUAGE plpgsql AS "
            "$p$BEGIN PERFORM public.rl_spy(%s); RETURN%s; END$p$"
            % (name, ", ".join(args), ret, "'" + label.replace("'", "''") + "'", result))


def operator_plants(existing):
    """An operator public.op(l, r) for every name and pair of types that
    pg_catalog has no exact operator for."""
    stmts, n = [], 0
    for op in PLANT_OPERATORS:
        for left in PLANT_TYPES:
            for right in PLANT_TYPES:
                if (op, left.strip('"'), right.strip('"')) in existing:
                    continue
                n += 1
                ret = ("pg_catalog." + left if op in "+-" else
                       "pg_catalog.text" if op in ("->>", "||") else "pg_catalog.bool")
                fn = "public.rl_op_%d" % n
                stmts.append(plpgsql_spy(fn, ["pg_catalog." + left, "pg_catalog." + right], ret,
                                         "operator %s(%s, %s)" % (op, left, right)))
                stmts.append("CREATE OPERATOR public.%s (LEFTARG = pg_catalog.%s, "
                             "RIGHTARG = pg_catalog.%s, FUNCTION = %s)" % (op, left, right, fn))
    return stmts


POLYMORPHIC = {"anyelement", "anyarray", "anynonarray", "anyenum", "anyrange",
               "anycompatible", "anycompatiblearray", "anycompatiblenonarray",
               "anycompatiblerange"}


def function_plants(signatures):
    """For each (name, [argument types], result type, returns a set) the
    scripts call, public.name with one argument of another type, for every
    type and position, and VARIADIC ones; none with the exact signature of a
    function of pg_catalog or of the extension."""
    taken = {(name, tuple(args)) for name, args, _, _ in signatures}
    stmts, made = [], set()

    def add(name, args, ret, setof, variadic=None):
        key = (name, tuple(args + [variadic] if variadic else args))
        if key in taken or key in made:
            return
        made.add(key)
        if ret.strip('"') in POLYMORPHIC | {"record", "trigger", "event_trigger", "any"} and not (
                variadic or POLYMORPHIC & set(args)):
            ret = "text"
        decl = ["pg_catalog." + a for a in args]
        if variadic:
            decl.append("VARIADIC pg_catalog." + variadic)
        stmts.append(plpgsql_spy("public." + name, decl,
                                 ("SETOF " if setof else "") + "pg_catalog." + ret,
                                 "function %s(%s)" % (name, ", ".join(decl))))

    for name, args, ret, setof in signatures:
        args = ["text" if a in ('"any"', "cstring", "internal") else a for a in args]
        for i in range(len(args)):
            for t in PLANT_TYPES:
                add(name, args[:i] + [t] + args[i + 1:], ret, setof)
        add(name, [], "anycompatible", setof, "anycompatiblearray")
        add(name, [], ret, setof, "_text")
        if args:
            add(name, args[:1], "anycompatible", setof, "anycompatiblearray")
    return stmts


SIGNATURES = """
SELECT p.proname,
       ARRAY(SELECT pg_catalog.quote_ident(t.typname)
             FROM pg_catalog.unnest(p.proargtypes) WITH ORDINALITY a(typ, i)
             JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.typ ORDER BY a.i),
       (SELECT pg_catalog.quote_ident(t.typname) FROM pg_catalog.pg_type t
        WHERE t.oid OPERATOR(pg_catalog.=) p.prorettype),
       p.proretset
FROM pg_catalog.pg_proc p
WHERE p.proname OPERATOR(pg_catalog.=) ANY (%s) AND p.prokind OPERATOR(pg_catalog.=) 'f'
  AND p.pronargs OPERATOR(pg_catalog.<=) 4
  AND p.pronamespace OPERATOR(pg_catalog.=) ANY (ARRAY['pg_catalog'::pg_catalog.regnamespace,
                                                       'public'::pg_catalog.regnamespace])
"""


def temp_plants(ext_signatures):
    """What the role leaves in the pg_temp of a session that will then run
    CREATE or ALTER EXTENSION: statements to run there after SET ROLE."""
    stmts = []
    for t in PLANT_TYPES:
        stmts.append("CREATE DOMAIN pg_temp.%s AS pg_catalog.%s CHECK (public.rl_spy('domain pg_temp.%s'))"
                     % (t, t, t.strip('"')))
        for src in ("int4", "text"):
            fn = "pg_temp.rl_cast_%s_%s" % (src, t.strip('"'))
            stmts.append(plpgsql_spy(fn, ["pg_catalog." + src], "pg_temp." + t,
                                     "cast %s -> pg_temp.%s" % (src, t)))
            stmts.append("CREATE CAST (pg_catalog.%s AS pg_temp.%s) WITH FUNCTION %s(pg_catalog.%s) "
                         "AS IMPLICIT" % (src, t, fn, src))
    for pseudo in ("record", "trigger", "event_trigger"):
        stmts.append('CREATE TEMP TABLE "%s" (spied pg_catalog.bool DEFAULT public.rl_spy(\'%s\'))'
                     % (pseudo, "temp composite type " + pseudo))
    # the extension's own tables and views, with a row and triggers
    stmts += [
        "CREATE TEMP TABLE redis_lock_fence_marks (lock_name pg_catalog.text, fence pg_catalog.int8 "
        "NOT NULL, updated_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(), "
        "CONSTRAINT redis_lock_fence_marks_pkey PRIMARY KEY (lock_name))",
        "INSERT INTO pg_temp.redis_lock_fence_marks (lock_name, fence) VALUES ('orders', 1)",
        "CREATE TRIGGER spy_row AFTER INSERT OR UPDATE OR DELETE ON pg_temp.redis_lock_fence_marks "
        "FOR EACH ROW EXECUTE FUNCTION public.rl_spy_trigger()",
        "CREATE TRIGGER spy_stmt AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE "
        "ON pg_temp.redis_lock_fence_marks FOR EACH STATEMENT EXECUTE FUNCTION public.rl_spy_trigger()",
        "CREATE TEMP VIEW redis_lock_locks AS SELECT public.rl_spy('temp view redis_lock_locks') AS spied",
    ]
    for cat in READ_CATALOGS:
        stmts.append("CREATE TEMP VIEW %s AS SELECT * FROM pg_catalog.%s WHERE public.rl_spy('temp view %s')"
                     % (cat, cat, cat))
    for name, args, ret, setof in ext_signatures:
        if ret not in ("trigger", "event_trigger") and "record" not in ret:
            stmts.append(plpgsql_spy("pg_temp." + name, ["pg_catalog." + a for a in args],
                                     ("SETOF " if setof else "") + "pg_catalog." + ret,
                                     "temp function %s(%s)" % (name, ", ".join(args))))
    return stmts


@pytest.fixture(scope="module")
def planted(pg):
    """A template database whose public schema holds the role's look-alikes;
    returns what the role plants in a session's pg_temp."""
    admin = pg.connect()
    with admin.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS " + PLANT_TEMPLATE)
        cur.execute("CREATE DATABASE " + PLANT_TEMPLATE)
        cur.execute("CREATE ROLE %s LOGIN" % PLANTER)
        cur.execute("ALTER ROLE %s SET redis_lock.key_prefix = 'tenantP:'" % PLANTER)
    db = pg.connect(dbname=PLANT_TEMPLATE)
    called = set(re.findall(r"([a-z_][a-z_0-9]*)\s*\(", script_code()))
    with db.cursor() as cur:
        # PUBLIC's CREATE on public, the default before PostgreSQL 15
        cur.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        cur.execute("SELECT oprname, oprleft::pg_catalog.regtype::pg_catalog.text, "
                    "oprright::pg_catalog.regtype::pg_catalog.text FROM pg_catalog.pg_operator")
        alias = {"oid": "oid", "regclass": "regclass", "regproc": "regproc",
                 "regprocedure": "regprocedure", "regtype": "regtype", "text": "text",
                 "name": "name", "bytea": "bytea", "smallint": "int2", "integer": "int4",
                 "bigint": "int8", "boolean": "bool", "timestamp with time zone": "timestamptz",
                 "jsonb": "jsonb", '"char"': "char"}
        existing = {(o, alias.get(left, left), alias.get(right, right))
                    for o, left, right in cur.fetchall()}
        cur.execute("CREATE EXTENSION redis_lock")
        cur.execute(SIGNATURES, (sorted(called),))
        signatures = cur.fetchall()
        cur.execute(SIGNATURES.replace("ANY (%s)", "ANY (ARRAY(SELECT p.proname FROM "
                                       "pg_catalog.pg_proc p WHERE p.proname "
                                       "OPERATOR(pg_catalog.~~) 'redis\\_%%'))"))
        ext_signatures = cur.fetchall()
        cur.execute("DROP EXTENSION redis_lock")
    db.close()
    assert {"redis_lock_fence_advance", "redis_lock_all_locks"} <= {s[0] for s in ext_signatures}
    assert {"pg_partition_root", "convert_from", "substring", "now",
            "pg_extension_config_dump"} <= {s[0] for s in signatures}
    plants = operator_plants(existing) + function_plants(signatures + ext_signatures)
    c = pg.connect(dbname=PLANT_TEMPLATE, user=PLANTER)
    try:
        with c.cursor() as cur:
            cur.execute(SPY)
            cur.execute("SELECT public.rl_plant(%s)", (plants,))
            made = cur.fetchone()[0]
    finally:
        c.close()
    assert made > 0.9 * len(plants) and made > 3000, (made, len(plants))
    admin.close()
    yield temp_plants(ext_signatures)
    admin = pg.connect()
    with admin.cursor() as cur:
        cur.execute("SELECT datname FROM pg_database WHERE datname LIKE 'planted%%' OR datname = %s",
                    (PLANT_TEMPLATE,))
        for (name,) in cur.fetchall():
            cur.execute("DROP DATABASE " + name)
        cur.execute("DROP ROLE " + PLANTER)
    admin.close()


def clean_session(pg, db):
    """A superuser session that resolves nothing through public."""
    return pg.connect(dbname=db, options="-c search_path=pg_catalog")


SEED_11 = """
INSERT INTO public.redis_lock_fence_marks (lock_name, fence)
VALUES ('orders', 42), ('parts', 7), ('unguarded', 3)
"""
SEED_12 = """
INSERT INTO public.redis_lock_fence_marks (lock_name, fence, protected_table, key_prefix)
VALUES ('orders', 42, 'app.orders', ''), ('parts', 7, 'app.parts', '')
"""


def seed(clean, db, version):
    """Guarded tables (one partitioned), marks, and a key prefix per role and
    per database: what 1.1 -> 1.2 migrates."""
    with clean.cursor() as cur:
        cur.execute("CREATE SCHEMA app")
        cur.execute("CREATE TABLE app.orders (id int, fence bigint)")
        cur.execute("CREATE TRIGGER guard BEFORE INSERT OR UPDATE ON app.orders FOR EACH ROW "
                    "EXECUTE FUNCTION public.redis_lock_fence_guard('orders')")
        cur.execute("CREATE TABLE app.parts (id int, fence bigint) PARTITION BY RANGE (id)")
        cur.execute("CREATE TABLE app.parts_1 PARTITION OF app.parts FOR VALUES FROM (0) TO (100)")
        cur.execute("CREATE TRIGGER guard BEFORE INSERT OR UPDATE ON app.parts FOR EACH ROW "
                    "EXECUTE FUNCTION public.redis_lock_fence_guard('parts')")
        cur.execute(SEED_11 if version == "1.1" else SEED_12)
        cur.execute("ALTER DATABASE %s SET redis_lock.key_prefix = 'dbP:'" % db)


# what an object of the extension depends on, where that is neither in
# pg_catalog nor of the extension: "owned" are its members and what hangs on
# them (columns' defaults, constraints, a view's rule, row and array types)
FOREIGN_DEPENDENCIES = """
WITH RECURSIVE ext AS (
  SELECT oid, extnamespace FROM pg_extension WHERE extname = 'redis_lock'
), owned(classid, objid) AS (
  SELECT d.classid, d.objid FROM pg_depend d, ext
  WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
  UNION
  SELECT d.classid, d.objid FROM pg_depend d JOIN owned o
    ON d.refclassid = o.classid AND d.refobjid = o.objid
  WHERE d.deptype IN ('a', 'i')
)
SELECT DISTINCT pg_describe_object(d.classid, d.objid, d.objsubid) || ' -> '
       || pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid)
FROM pg_depend d JOIN owned o ON d.classid = o.classid AND d.objid = o.objid, ext
WHERE d.deptype <> 'e'
  AND (d.refclassid, d.refobjid) NOT IN (SELECT classid, objid FROM owned)
  AND NOT (d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid)
  AND NOT (d.refclassid = 'pg_namespace'::regclass
           AND d.refobjid IN (ext.extnamespace, 'pg_catalog'::regnamespace))
  AND d.refclassid <> 'pg_language'::regclass
  AND (pg_identify_object(d.refclassid, d.refobjid, 0)).schema IS DISTINCT FROM 'pg_catalog'
ORDER BY 1
"""


def marks(clean, table, lock_name):
    """A table's marks of a lock name, as "prefix/name=fence", in order."""
    return testbed.sql_one(clean, """
        SELECT coalesce(array_agg(key_prefix || '/' || lock_name || '=' || fence
                                  ORDER BY key_prefix), '{}')
        FROM public.redis_lock_fence_marks
        WHERE protected_table::oid = %s::regclass::oid AND lock_name = %s""", (table, lock_name))


def migrated(start, lock_name, fence):
    """The marks 1.1 -> 1.2 makes of a 1.1 mark: one for each key prefix set
    per role or database (other tests' roles may add more)."""
    if start not in ("1.0", "1.1"):
        return set()
    return {"%s/%s=%d" % (p, lock_name, fence) for p in ("dbP:", "tenantP:")}


def spied(clean):
    return testbed.sql_one(clean, "SELECT coalesce(array_agg(what || ' as ' || by_role::text), '{}') "
                                  "FROM public.rl_spied")


def install_and_update(s, clean, db, start):
    """CREATE EXTENSION at start, then each ALTER EXTENSION UPDATE to 1.4,
    in session s; what 1.1 -> 1.2 migrates is there when it runs."""
    try:
        with s.cursor() as cur:
            cur.execute("CREATE EXTENSION redis_lock VERSION %s", (start,))
            if start != "1.0":
                seed(clean, db, start)
            for version in UPDATE_STEPS[UPDATE_STEPS.index(start) + 1:]:
                cur.execute("ALTER EXTENSION redis_lock UPDATE TO %s", (version,))
                if version == "1.1":
                    seed(clean, db, version)
    except psycopg2.Error as e:
        # what ran before the error was rolled back with it, but for its WARNING
        pytest.fail("%s\nplanted code that ran: %s" % (e, ran(s)))


def ran(s):
    return [n.strip() for n in s.notices if "rl_spy" in n]


def assert_nothing_ran(s, clean):
    assert ran(s) == [], "\n".join(ran(s))
    assert spied(clean) == []
    assert not testbed.sql_one(clean, "SELECT rolsuper FROM pg_roles WHERE rolname = %s",
                               (PLANTER,)), "the role made itself superuser"


@pytest.mark.parametrize("start", UPDATE_STEPS)
def test_no_install_or_update_path_runs_a_roles_code(pg, planted, start):
    db = "planted" + start.replace(".", "")
    admin = pg.connect()
    with admin.cursor() as cur:
        cur.execute("ALTER ROLE %s NOSUPERUSER" % PLANTER)   # as a failed run left it
        cur.execute("DROP DATABASE IF EXISTS " + db)
        cur.execute("CREATE DATABASE %s TEMPLATE %s" % (db, PLANT_TEMPLATE))
    admin.close()
    clean = clean_session(pg, db)
    # the session that installs and updates, with the role's temporary objects
    s = pg.connect(dbname=db)
    try:
        with s.cursor() as cur:
            cur.execute("SET ROLE " + PLANTER)
            cur.execute("SELECT public.rl_plant(%s)", (planted,))
            made = cur.fetchone()[0]
            cur.execute("RESET ROLE")
        assert made > 0.9 * len(planted), (made, len(planted))
        # the plants answer a name resolved by search path: a control
        with clean.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("SET LOCAL search_path = public")
            cur.execute("SELECT 0::pg_catalog.oid = 'pg_catalog.now()'::pg_catalog.regprocedure")
            cur.execute("SET LOCAL search_path = pg_catalog")
            assert spied(clean) == ["operator =(oid, regprocedure) as postgres"]
            cur.execute("ROLLBACK")
        del s.notices[:]

        install_and_update(s, clean, db, start)
        assert_nothing_ran(s, clean)
        assert testbed.sql_one(clean, "SELECT extversion FROM pg_extension "
                                      "WHERE extname = 'redis_lock'") == "1.4"
        # nothing of the extension depends on the role's objects (this
        # session's temporary ones would drop it with them at its end)
        with clean.cursor() as cur:
            cur.execute(FOREIGN_DEPENDENCIES)
            assert cur.fetchall() == []
        # 1.1's marks became one per guarded table (a partition's is its
        # root's) and key prefix
        parts_oid = str(testbed.sql_one(clean, "SELECT 'app.parts'::regclass::oid"))
        parts = marks(clean, parts_oid, "parts")
        assert "/parts=7" in parts and migrated(start, "parts", 7) <= set(parts), parts
        assert all(m.endswith("=7") for m in parts), parts
        # the functions with bodies, in the same session: a mark without a
        # table, one the guard advances, a dropped table's marks forgotten
        with s.cursor() as cur:
            cur.execute("SELECT public.redis_lock_fence_check('direct'::pg_catalog.text, "
                        "5::pg_catalog.int8)")
            cur.execute("INSERT INTO app.orders (id, fence) VALUES (1, 50)")
            cur.execute("DROP TABLE app.parts")
        assert_nothing_ran(s, clean)
        assert marks(clean, "-", "direct") == ["/direct=5"]
        orders = marks(clean, "app.orders", "orders")
        assert "/orders=50" in orders and migrated(start, "orders", 42) <= set(orders), orders
        assert marks(clean, parts_oid, "parts") == []
    finally:
        s.close()
        clean.close()
        admin = pg.connect()
        admin.cursor().execute("DROP DATABASE " + db)
        admin.close()


# Issue 43 item 4: the worker's cancel for a lost lock is raised as the loss
# (40001) where PostgreSQL raises the cancel, and only when the worker had
# recorded it: a user's cancel in the window between the finding and the
# signal (the loss recorded, the signal not yet) is the user's, 57014; the
# worker's signal that follows, served while the session idles, makes no
# later cancel a loss either; the loss is then warned about at the next call.

def test_a_users_cancel_before_the_worker_signals_stays_a_cancel(pg_stop_before_signal,
                                                                  redis_srv):
    pg = pg_stop_before_signal
    admin = Session(pg)
    a = Session(pg)
    workers = watchdog_pids(pg.postmaster_pid())
    name = "sig-users-cancel"
    try:
        if admin.run("SHOW debug_assertions") != "on":
            pytest.skip("the worker is stopped in the window only by assert-enabled builds")
        assert a.run("SELECT redis_lock_acquire(%s) > 0", (name,))
        a.start("SELECT pg_sleep(60)")
        testbed.wait_until(lambda: admin.run("SELECT state = 'active' FROM pg_stat_activity "
                                             "WHERE pid = %s", (a.pid,)), 5,
                           what="statement running")
        log_start = len(pg.log_text())
        redis_srv.client().delete(name)
        stopped = testbed.wait_until(
            lambda: [w for w in workers if process_stopped(w)], 10,
            what="the worker to find the loss and stop before signalling")
        assert admin.run("SELECT lost FROM redis_lock_locks WHERE lock_name = %s", (name,))
        assert admin.run("SELECT pg_cancel_backend(%s)", (a.pid,))
        a.join(10)
        assert a.error is not None and a.error.pgcode == "57014", a.error
        for w in stopped:
            os.kill(w, signal.SIGCONT)
        line = 'Redis lock "%s" of process %d was lost' % (name, a.pid)
        testbed.wait_until(lambda: line in pg.log_text()[log_start:], 10,
                           what="the worker's LOG line about the loss")
        assert re.search(re.escape(line) + r".*; cancelling its statement",
                         pg.log_text()[log_start:])
        # its signal came while the session idled: a later cancel is the user's
        a.start("SELECT pg_sleep(60)")
        testbed.wait_until(lambda: admin.run("SELECT state = 'active' FROM pg_stat_activity "
                                             "WHERE pid = %s", (a.pid,)), 5,
                           what="statement running")
        assert admin.run("SELECT pg_cancel_backend(%s)", (a.pid,))
        a.join(10)
        assert a.error is not None and a.error.pgcode == "57014", a.error
        del a.conn.notices[:]
        a.run("SELECT redis_lock_held()")
        assert [n for n in a.conn.notices if 'Redis lock "%s" was lost' % name in n], \
            a.conn.notices
    finally:
        for w in workers:
            os.kill(w, signal.SIGCONT)
        a.close()
        admin.close()


# ============================================================================
# Issue 42, item 2: one Redis reply crashed the whole server
# ============================================================================
# A semaphore's status and set-up scripts were read through one decoder that
# took the set-up's reply shape, an integer, for either: a status answered
# ":1" was then read as the array {exists, free, taken}, a SIGSEGV, and the
# postmaster restarted every backend.  Each operation now declares the reply
# shapes it accepts and nothing is read of a reply that does not fit
# (rl_reply_fits, src/net/connection.c); t/test_reply_fuzz.py sends every
# operation every malformed shape.
SCRIPT_KINDS = ("acquire", "release", "extend", "inspect", "force")


@pytest.mark.parametrize("layout", ["redisson", "redis_semaphore"])
def test_a_semaphore_status_answered_with_an_integer_is_an_error_not_a_crash(
        pg_fake, fake, layout):
    fake.reset()
    log_start = len(pg_fake.log_text())
    bystander = pg_fake.connect()
    conn = pg_fake.connect()     # a superuser: the status is not PUBLIC's
    try:
        one(bystander, "BEGIN")
        bystander_pid = one(bystander, "SELECT pg_backend_pid()")
        one(conn, "SET redis_lock.semaphore_protocol = %s", (layout,))
        armed = {kind: Armed("raw", b":1\r\n") for kind in SCRIPT_KINDS}
        for kind, a in armed.items():   # whatever the fake takes the script for
            fake.arm(kind, a)
        with pytest.raises(psycopg2.Error) as err:
            one(conn, "SELECT taken FROM redis_semaphore_status('sem', 5)")
        fake.disarm()
        assert sum(a.hits for a in armed.values()) > 0, "the script never reached the fake"
        assert err.value.pgcode is not None and err.value.pgcode[:2] != "XX", \
            "%s: %s" % (err.value.pgcode, err.value.pgerror)
        # the session, and the bystander's open transaction, carry on
        assert one(conn, "SELECT 1") == 1
        assert one(bystander, "SELECT pg_backend_pid()") == bystander_pid
        one(bystander, "COMMIT")
        assert_alive(pg_fake, log_start)
    finally:
        fake.disarm()
        bystander.close()
        conn.close()
