"""Issue 32, items 3 and 6, and the key patterns an operator confines a
tenant with (doc/operations.md, "Key patterns and Redis ACLs").

Item 3: under redis_lock.protocol = 'redisson' or 'redisson_fair' (a user
setting) every distinct lock name used to leave Redisson's RFencedLock
counter redisson_lock_token:{name}, a key without expiry.  Tokens now come
from the per-slot fence counters the simple layout uses (at most 16384 per
key prefix); redis_lock.redisson_token_counter (superuser only) opts into
the per-name counter, and tokens never go down across any change
(doc/clients.md, "Fencing tokens and what stays in Redis").

Item 6: a lock name could be an extension key (prefix ||
'redis_lock:fence:{T}'), so taking it as a hash broke every simple acquire
in that slot with WRONGTYPE.  A name whose key contains a reserved mark is
now refused (22023) by every function that takes a lock name.

Key patterns: a Redis ACL user confined to the documented patterns of its
prefix runs every operation of every layout (the watchdog's renewals, the
wake-ups on its channels and keyspace notifications included: ACL LOG stays
empty), and cannot reach another prefix's keys or channels.

The attacks run as a role with LOGIN only (nothing granted)."""
import fnmatch
import os
import subprocess
import time

import psycopg2
import psycopg2.errors
import pytest
import redis
from redis.crc import key_slot

from conftest import Session, wait_for_wait_event
import testbed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAIN = "rl_names_plain"

# Every mark a lock's Redis key must not contain (src/protocol.c,
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
def plain(sessions, roles):
    """Sessions of the LOGIN-only role."""
    return lambda: sessions(user=roles)


def permanent_keys(rc):
    return {k for k in rc.scan_iter(count=1000) if rc.ttl(k) == -1}


def sqlstate(excinfo):
    return excinfo.value.pgcode


# ================================================================ item 3

@pytest.mark.parametrize("protocol", ["redisson", "redisson_fair"])
def test_redisson_layouts_leave_no_key_per_name(plain, rc, protocol):
    s = plain()
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


def test_tokens_increase_across_the_layouts_sharing_a_counter(plain, rc):
    s = plain()
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


def test_the_per_name_counter_is_a_superusers_choice(plain, sessions, rc):
    s = plain()
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
def test_reserved_names_are_refused_everywhere(plain, sessions, rc, protocol):
    s = plain()
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
def test_no_name_can_take_another_locks_fence_counter(plain, sessions, rc, pg, attack):
    """The audit's attack: the lock named like the counter of a victim's
    slot, taken while that counter is not there (a slot not used yet, or a
    counter lost with a Redis restart), then the victim's simple acquire in
    that slot."""
    victim = sessions()
    first = victim.run("SELECT redis_lock_acquire('acct:7', ttl => '10s')")
    assert victim.run("SELECT redis_lock_release('acct:7')") is True
    counter = counter_of(rc, b"acct:7")
    rc.delete(counter)
    attacker = plain()
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


def test_no_name_reaches_another_prefixes_counter(plain, sessions, rc, pg):
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
    attacker = plain()          # empty prefix, same Redis user
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


def valkey_91():
    """scripts/get-server valkey-9.1's build (cached by scripts/install-deps);
    fails, never skips, when it cannot be had."""
    out = subprocess.run([os.path.join(ROOT, "scripts", "get-server"), "valkey-9.1"],
                         check=True, timeout=1800, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True).stdout
    path = out.strip().splitlines()[-1]
    assert os.access(path, os.X_OK), path
    return path


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
