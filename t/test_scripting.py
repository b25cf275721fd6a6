"""Locks without Lua scripts: redis_lock.scripting = off (doc/topologies.md,
"Script-free locks").

On Valkey 9.1 and Redis 8.6 (scripts/get-server) whose ACL denies the
extension's user every scripting command (-@scripting: EVAL, EVALSHA, their
_RO forms, FUNCTION, FCALL, SCRIPT), so that any script use fails with
NOPERM and is recorded in ACL LOG, which every test here checks stays empty:
the simple layout excludes real redis-py both ways, releases only its own
lock, extends, is renewed by the watchdog past its lease, wakes waiters by
its release's PUBLISH and by keyspace notifications, counts strictly
increasing fencing tokens, refuses a key of another type untouched, releases
transaction-scoped locks at COMMIT and ROLLBACK, lets a cancel end a wait
within a second, and works over Redlock, Sentinel and a Cluster whose slot
migrates mid-run (MOVED and ASK inside MULTI ... EXEC).  Round trips per
operation are counted through a delay proxy.

On servers without DELIFEQ and DELEX (Redis 7.0, Redis 8.0; Valkey 8.1,
which has SET IFEQ only: skipped only where scripts/get-server cannot
provide it) every lock
function is refused with 0A000 naming the versions needed, and nothing is
left in Redis.

The same tests run on Redis 8.6.3 (experimental's source, scripts/get-server
redis-8.6), whose DELEX key IFEQ and SET ... IFEQ are the path Redis 8.4
added.  Redis84, a fake on test_hostile's FakeRedis that answers what Redis
8.4 documents and records every command it is sent, stays for what a real
server cannot show: the exact words of every command, and replies a real
server does not give on demand.
"""
import os
import random
import subprocess
import threading
import time

import psycopg2
import pytest
import redis
from redis.lock import Lock

from conftest import Session, wait_for_queue_lead, wait_for_wait_event
from test_hostile import FakeRedis, OK, array, bulk, integer
import testbed
from testbed import TIME_SCALE as S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER, PASSWORD = "rl", "rl-secret"
MARKER = b"pgrl:"


def server(name):
    """Path of a cached server build (scripts/get-server NAME); fails, never
    skips, when it cannot be had."""
    out = subprocess.run([os.path.join(ROOT, "scripts", "get-server"), name],
                         check=True, timeout=1800, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True).stdout
    path = out.strip().splitlines()[-1]
    assert os.access(path, os.X_OK), path
    return path


def server_or_skip(name):
    """Like server(), but skips when scripts/get-server cannot provide NAME
    (e.g. no cached build and no package source reachable)."""
    try:
        return server(name)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        pytest.skip("scripts/get-server %s: %s" % (name, e))


def deny_scripts(r):
    """The extension's user: everything but scripting (FUNCTION/FCALL too)."""
    r.client().execute_command("ACL", "SETUSER", USER, "reset", "on", ">" + PASSWORD,
                               "~*", "&*", "+@all", "-@scripting")
    r.client().execute_command("ACL", "LOG", "RESET")


def user_url(r):
    return "redis://%s@127.0.0.1:%d/0" % (USER, r.port)


def no_lua_pg(**conf):
    conf.setdefault("redis_lock.password", PASSWORD)
    conf.setdefault("redis_lock.scripting", "off")
    return testbed.Postgres(conf=conf).init().start().with_extension()


def acl_denials(*servers):
    out = []
    for r in servers:
        out += r.client().execute_command("ACL", "LOG")
    return out


def warned(s, text):
    found = any(text in n for n in s.conn.notices)
    del s.conn.notices[:]
    return found


# ================================================================ Valkey 9.1

# The servers with a compare-and-delete of their own that the tests below
# run on, each with scripts denied: Valkey 9.1 (DELIFEQ) and Redis 8.6
# (DELEX key IFEQ, SET ... IFEQ), built by scripts/get-server.
NO_LUA_SERVERS = ["valkey-9.1", "redis-8.6"]


@pytest.fixture(scope="module", params=NO_LUA_SERVERS)
def valkey(request):
    r = testbed.Redis(server=server(request.param)).start()
    r.name = request.param
    deny_scripts(r)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def vpg(valkey):
    pg = no_lua_pg(**{"redis_lock.url": user_url(valkey)})
    yield pg
    pg.cleanup()


@pytest.fixture
def vk(valkey, vpg):
    """(default-user client, session factory); no script may have been
    tried by the extension's user when the test ends."""
    c = valkey.client()
    c.flushall()
    c.config_set("notify-keyspace-events", "")
    c.execute_command("ACL", "LOG", "RESET")
    made = []

    def session():
        s = Session(vpg)
        made.append(s)
        return s
    yield c, session
    for s in made:
        s.close()
    assert acl_denials(valkey) == []


def test_the_acl_really_refuses_scripts(valkey, vk):
    """The premise: the extension's user cannot run any script."""
    u = valkey.client(username=USER, password=PASSWORD)
    for cmd in (("EVAL", "return 1", 0), ("FCALL", "f", 0), ("SCRIPT", "LOAD", "return 1"),
                ("FUNCTION", "LIST")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            u.execute_command(*cmd)
    vk[0].execute_command("ACL", "LOG", "RESET")


def test_sql_and_redis_py_exclude_each_other(vk):
    c, session = vk
    a = session()
    assert a.run("SELECT redis_lock_acquire('job', ttl => '30s') > 0")
    assert c.get("job").startswith(MARKER)
    lk = Lock(c, "job", timeout=30)
    assert not lk.acquire(blocking=False)
    assert a.run("SELECT redis_lock_release('job')") is True
    assert c.exists("job") == 0
    assert lk.acquire(blocking=False)
    assert a.run("SELECT redis_lock_try_acquire('job')") is False
    with pytest.raises(psycopg2.errors.LockNotAvailable):
        a.run("SELECT redis_lock_acquire('job', wait => '200ms')")
    # not ours: SQL cannot release it, nothing is deleted
    assert a.run("SELECT redis_lock_release('job')") is False
    assert c.get("job") == lk.local.token
    assert a.run("SELECT locked, held_by_me, owner = %s, redis_type "
                 "FROM redis_lock_status('job')", (lk.local.token.decode(),)) == \
        (True, False, True, "string")
    lk.release()
    assert a.run("SELECT redis_lock_try_acquire('job')") is True
    assert a.run("SELECT held_by_me FROM redis_lock_status('job')") is True
    assert a.run("SELECT redis_lock_release('job')") is True


def test_acquire_many_is_refused_without_scripts(vk):
    """Only a script grants every lock of a set or none: with scripting off
    redis_lock_acquire_many is refused (0A000) before anything is sent, and
    single locks still work."""
    c, session = vk
    a = session()
    c.config_resetstat()
    with pytest.raises(psycopg2.errors.FeatureNotSupported) as ei:
        a.run("SELECT redis_lock_acquire_many(ARRAY['m1', 'm2'])")
    assert "several Redis locks at once need Lua scripting" in str(ei.value)
    assert c.keys("*") == []
    stats = c.info("commandstats")
    assert not any(k in stats for k in ("cmdstat_multi", "cmdstat_set", "cmdstat_exec"))
    assert a.run("SELECT count(*) FROM redis_lock_held()") == 0
    assert a.run("SELECT redis_lock_acquire('m1', ttl => '30s') > 0")
    assert a.run("SELECT redis_lock_release('m1')") is True


def test_release_after_takeover_deletes_nothing(vk):
    c, session = vk
    a = session()
    assert a.run("SELECT redis_lock_acquire('taken', ttl => '200ms') > 0")
    testbed.wait_until(lambda: c.exists("taken") == 0, 5, what="the lease to run out")
    lk = Lock(c, "taken", timeout=30)
    assert lk.acquire(blocking=False)
    del a.conn.notices[:]
    assert a.run("SELECT redis_lock_release('taken')") is False
    assert warned(a, "was lost")
    assert c.get("taken") == lk.local.token
    # extend is owner-only too: the foreign lock keeps its own lease
    assert a.run("SELECT redis_lock_acquire('mine', ttl => '200ms') > 0")
    testbed.wait_until(lambda: c.exists("mine") == 0, 5, what="the lease to run out")
    c.set("mine", "someone-else", px=5000)
    assert a.run("SELECT redis_lock_extend('mine', '60s')") is False
    assert warned(a, "was lost")
    assert c.get("mine") == b"someone-else" and c.pttl("mine") <= 5000
    lk.release()


def test_extend_restarts_the_lease(vk):
    c, session = vk
    a = session()
    assert a.run("SELECT redis_lock_acquire('ext', ttl => '1s') > 0")
    assert c.pttl("ext") <= 1000
    assert a.run("SELECT redis_lock_extend('ext', '60s')") is True
    assert 55000 < c.pttl("ext") <= 60000
    # a reentrant acquire checks the lock is ours and restarts its lease
    assert a.run("SELECT redis_lock_acquire('ext', ttl => '30s') > 0")
    assert 25000 < c.pttl("ext") <= 30000
    assert a.run("SELECT hold_count FROM redis_lock_held() WHERE lock_name = 'ext'") == 2
    assert a.run("SELECT redis_lock_release('ext')") is True
    assert c.exists("ext") == 1
    assert a.run("SELECT redis_lock_release('ext')") is True
    assert c.exists("ext") == 0


def test_watchdog_keeps_a_lock_past_its_lease(vk):
    c, session = vk
    a = session()
    a.run("SET redis_lock.lease_time = '1s'")
    assert a.run("SELECT redis_lock_acquire('wd') > 0")
    token = c.get("wd")
    t0 = time.monotonic()
    # three leases later the key is still ours, its lease restarted each third
    while time.monotonic() - t0 < 3.0:
        assert c.get("wd") == token
        assert 0 < c.pttl("wd") <= 1000
        time.sleep(0.05)
    assert a.run("SELECT last_renewed_at > acquired_at FROM redis_lock_locks "
                 "WHERE lock_name = 'wd'") is True
    assert a.run("SELECT redis_lock_release('wd')") is True
    assert c.exists("wd") == 0


def test_renewal_restarts_the_lease_whatever_is_left(vk, vpg):
    """What the script-free renewal does not do: compare.  A foreign client
    lengthening our key's TTL is undone by the next renewal (the script
    would leave it); one cutting it short is noticed, as with scripts (the
    renewal's PTTL), and the lock renewed sooner."""
    c, session = vk
    a = session()
    a.run("SET redis_lock.lease_time = '600ms'")
    assert a.run("SELECT redis_lock_acquire('rs') > 0")
    c.pexpire("rs", 60000)
    testbed.wait_until(lambda: c.pttl("rs") <= 600, 2, what="a renewal to restart the lease")
    assert a.run("SELECT redis_lock_release('rs')") is True
    a.run("SET redis_lock.lease_time = '6s'")
    assert a.run("SELECT redis_lock_acquire('cut') > 0")
    since = len(vpg.log_text())
    t_end = time.monotonic() + 2.5
    while time.monotonic() < t_end:
        c.pexpire("cut", 1000)
        time.sleep(0.3)
    time.sleep(3.0)          # 1 s would have been its end
    assert c.get("cut").startswith(MARKER) and c.pttl("cut") > 1000
    assert a.run("SELECT count(*) FROM redis_lock_held() WHERE NOT lost") == 1
    assert "cut to" in vpg.log_text()[since:], "the worker did not report the cut lease"
    assert a.run("SELECT redis_lock_release('cut')") is True


# serial (t/conftest.py): a 150 ms lease renewed every 50 ms must not lapse
# between the acquire and the extend; a parallel neighbour's CPU use can keep
# the worker off a CPU that long (the extend then finds the lock expired)
@pytest.mark.serial
def test_extend_is_not_undone_by_a_renewal_under_way(vk):
    """No compare in Redis keeps a renewal from undoing a longer extend:
    the registry does (rl_extend gives it the new lease first and waits out
    a renewal under way).  A watchdog lock with a 150 ms lease is renewed
    every 50 ms; an extend to 60 s races those renewals; 100 ms later the
    key must still have about 60 s."""
    c, session = vk
    s = session()
    s.run("SET redis_lock.lease_time = '150ms'")
    for i in range(int(os.environ.get("RL_EXTEND_RACE_TRIES", "100"))):
        assert s.run("SELECT redis_lock_acquire('ext') > 0")
        time.sleep(random.uniform(0, 0.05))
        assert s.run("SELECT redis_lock_extend('ext', ttl => '60s')") is True
        time.sleep(0.1)
        pttl = c.pttl("ext")
        assert pttl > 50000, "try %d: extend undone, PTTL %d ms" % (i, pttl)
        assert s.run("SELECT redis_lock_release('ext')") is True


def test_release_publish_wakes_a_waiter(vk):
    c, session = vk
    a, b, admin = session(), session(), session()
    for _ in range(3):
        assert a.run("SELECT redis_lock_acquire('pub') > 0")
        b.start("SELECT redis_lock_acquire('pub', wait => '10s') > 0")
        wait_for_wait_event(admin.conn, b.pid)
        # the holder publishes (its token has our marker): the waiter polls
        # only once a second, so a quick hand-over is the PUBLISH's doing
        time.sleep(0.3)
        released = time.monotonic()
        assert a.run("SELECT redis_lock_release('pub')") is True
        b.join()
        assert b.error is None and b.result is True
        assert b.finished_at - released < 0.25 * S
        assert b.run("SELECT redis_lock_release('pub')") is True


def test_keyspace_notifications_wake_a_waiter_behind_redis_py(vk):
    c, session = vk
    a, admin = session(), session()
    c.config_set("notify-keyspace-events", "Kgx")
    # the holder deletes its key
    lk = Lock(c, "ks", timeout=30)
    assert lk.acquire(blocking=False)
    a.start("SELECT redis_lock_acquire('ks', wait => '10s') > 0")
    wait_for_wait_event(admin.conn, a.pid)
    testbed.wait_until(lambda: c.execute_command("PUBSUB", "NUMSUB", "__keyspace@0__:ks")[1] > 0,
                       5, what="the waiter to subscribe to the key's notifications")
    time.sleep(0.3)                 # past the first poll intervals
    released = time.monotonic()
    lk.release()
    a.join()
    assert a.error is None and a.result is True
    assert a.finished_at - released < 0.05 * S
    assert a.run("SELECT redis_lock_release('ks')") is True
    # the holder's key expires
    assert c.set("ks", "foreign", nx=True, px=800)
    a.start("SELECT redis_lock_acquire('ks', wait => '10s') > 0")
    a.join()
    assert a.error is None and a.result is True
    assert c.get("ks").startswith(MARKER)
    assert a.run("SELECT redis_lock_release('ks')") is True


def test_fencing_tokens_increase_strictly_across_grants(vk):
    c, session = vk
    a, b = session(), session()
    tokens = []
    for i in range(10):
        s, other = (a, b) if i % 2 == 0 else (b, a)
        tokens.append(s.run("SELECT redis_lock_acquire('fenced')"))
        # busy attempts in between count the counter up too: only gaps
        assert other.run("SELECT redis_lock_try_acquire('fenced')") is False
        assert s.run("SELECT redis_lock_fence('fenced')") == tokens[-1]
        assert s.run("SELECT redis_lock_release('fenced')") is True
    assert all(x < y for x, y in zip(tokens, tokens[1:]))
    assert tokens[1] - tokens[0] == 2          # one grant, one busy attempt
    # a counter lost (a Redis reset) starts again at the clock in microseconds
    fence_keys = c.keys("redis_lock:fence:*")
    assert len(fence_keys) == 1
    c.delete(*fence_keys)
    after = a.run("SELECT redis_lock_acquire('fenced')")
    assert after > tokens[-1]
    assert abs(after - time.time() * 1e6) < 60e6
    assert a.run("SELECT redis_lock_release('fenced')") is True


def test_wrong_type_is_refused_untouched(vk):
    c, session = vk
    a = session()
    # a read-write lock's hash (Redisson's layout): not deleted either
    c.hset("typed", mapping={"mode": "write", "other:write": "1"})
    c.pexpire("typed", 50000)
    with pytest.raises(psycopg2.errors.WrongObjectType) as ei:
        a.run("SELECT redis_lock_acquire('typed')")
    assert 'holds a hash, not a lock of protocol "simple"' in str(ei.value)
    with pytest.raises(psycopg2.errors.WrongObjectType):
        a.run("SELECT redis_lock_force_release('typed')")
    assert c.hgetall("typed") == {b"mode": b"write", b"other:write": b"1"}
    assert 45000 < c.pttl("typed") <= 50000
    assert a.run("SELECT redis_type FROM redis_lock_status('typed')") == "hash"
    assert a.run("SELECT count(*) FROM redis_lock_held()") == 0


def test_a_transaction_that_failed_after_its_set_is_cleaned_up(vk):
    """Redis runs every command of a MULTI ... EXEC and keeps what ran
    before one that failed: a corrupted fence counter fails the acquire's
    INCR after its SET took the lock.  That grant is a doubt, never counted
    as held, and the worker deletes it at once -- as a script that failed
    after its SET (test_faults.py::test_script_error_after_a_write_is_cleaned_up);
    not left for its 60 s lease."""
    c, session = vk
    a = session()
    assert a.run("SELECT redis_lock_acquire('tx-fail') > 0")
    assert a.run("SELECT redis_lock_release('tx-fail')") is True
    fence_key, = c.keys("redis_lock:fence:*")
    c.set(fence_key, "not-a-number")
    with pytest.raises(psycopg2.Error):
        a.run("SELECT redis_lock_acquire('tx-fail', ttl => '60s')")
    assert a.run("SELECT count(*) FROM redis_lock_held()") == 0
    testbed.wait_until(lambda: c.exists("tx-fail") == 0, 1.0 * S,
                       what="the worker to delete the grant of the failed transaction")
    c.delete(fence_key)
    assert a.run("SELECT redis_lock_acquire('tx-fail', ttl => '60s') > 0")
    assert a.run("SELECT redis_lock_release('tx-fail')") is True


def test_transaction_scoped_locks_go_at_commit_and_rollback(vk):
    c, session = vk
    a = session()
    a.conn.autocommit = False
    a.run("SELECT redis_lock_acquire('tx-c', xact => true)")
    assert c.exists("tx-c") == 1
    a.conn.commit()
    assert c.exists("tx-c") == 0
    a.run("SELECT redis_lock_acquire('tx-r', xact => true)")
    assert c.exists("tx-r") == 1
    a.conn.rollback()
    assert c.exists("tx-r") == 0
    # a lost one fails the COMMIT (its verify is a SET IFEQ)
    a.run("SELECT redis_lock_acquire('tx-l', xact => true)")
    c.set("tx-l", "someone-else")
    with pytest.raises(psycopg2.errors.SerializationFailure):
        a.conn.commit()
    a.conn.rollback()
    assert c.get("tx-l") == b"someone-else"
    a.conn.autocommit = True


def test_cancel_ends_a_wait_within_1s(vk):
    c, session = vk
    a, b, admin = session(), session(), session()
    assert a.run("SELECT redis_lock_acquire('cancel-me') > 0")
    b.start("SELECT redis_lock_acquire('cancel-me', wait => '30s')")
    wait_for_wait_event(admin.conn, b.pid)
    t0 = time.monotonic()
    assert admin.run("SELECT pg_cancel_backend(%s)", (b.pid,))
    b.join(5)
    assert isinstance(b.error, psycopg2.errors.QueryCanceled)
    assert b.finished_at - t0 < S * 1.0
    assert b.run("SELECT count(*) FROM redis_lock_held()") == 0
    assert a.run("SELECT redis_lock_release('cancel-me')") is True


def test_force_release_and_status_without_scripts(vk):
    c, session = vk
    a, b = session(), session()
    assert a.run("SELECT redis_lock_acquire('forced') > 0")
    st = b.run("SELECT locked, held_by_me, ttl > '0', owner LIKE 'pgrl:%%', redis_type "
               "FROM redis_lock_status('forced')")
    assert st == (True, False, True, True, "string")
    assert b.run("SELECT redis_lock_force_release('forced')") is True
    assert c.exists("forced") == 0
    assert b.run("SELECT redis_lock_force_release('forced')") is False
    # the holder finds out at its release
    assert a.run("SELECT redis_lock_release('forced')") is False
    assert warned(a, "was lost")
    # a foreign simple lock is force-released too
    c.set("forced", "foreign-token", px=30000)
    assert b.run("SELECT redis_lock_force_release('forced')") is True
    assert c.exists("forced") == 0
    assert b.run("SELECT locked, redis_type FROM redis_lock_status('forced')") == (False, "none")


def test_redisson_layouts_are_refused(vk):
    c, session = vk
    a = session()
    for q in ("SET redis_lock.protocol = 'redisson'",
              "SET redis_lock.protocol = 'redisson_fair'"):
        a.run(q)
        with pytest.raises(psycopg2.errors.FeatureNotSupported) as ei:
            a.run("SELECT redis_lock_acquire('rsn')")
        assert "needs Lua scripts" in str(ei.value)
    a.run("RESET redis_lock.protocol")
    for q in ("SELECT redis_lock_acquire_read('rsn')", "SELECT redis_lock_try_acquire_write('rsn')"):
        with pytest.raises(psycopg2.errors.FeatureNotSupported):
            a.run(q)
    assert c.keys("*") == []


def test_the_servers_own_compare_and_set_and_delete_are_used(valkey, vk):
    """On each server the release is its own compare-and-delete (Valkey's
    DELIFEQ, Redis 8.4+'s DELEX key IFEQ) and the extend its compare-and-set
    (SET ... IFEQ), counted in INFO commandstats; no script ran (vk checks
    the ACL log)."""
    c, session = vk
    c.config_resetstat()
    a = session()
    assert a.run("SELECT redis_lock_acquire('own-cad', ttl => '30s') > 0")
    assert a.run("SELECT redis_lock_extend('own-cad', '30s')") is True
    assert a.run("SELECT redis_lock_release('own-cad')") is True
    stats = c.info("commandstats")
    delete = "cmdstat_delifeq" if valkey.name.startswith("valkey") else "cmdstat_delex"
    assert stats.get(delete, {}).get("calls", 0) >= 1, sorted(stats)
    assert stats.get("cmdstat_set", {}).get("calls", 0) >= 2, sorted(stats)
    assert not any(k in stats for k in ("cmdstat_eval", "cmdstat_evalsha", "cmdstat_fcall"))


def test_round_trips_per_operation(valkey, vk):
    """Through a proxy adding 200 ms each way, k round trips take 400 k ms
    and less than 400 (k + 1) ms: the elapsed time counts them (doc/topologies.md's
    table), with 400 ms to spare for a loaded machine."""
    c, _ = vk
    rt = 0.4 * S
    proxy = testbed.DelayProxy(valkey.port, rt / 2).start()
    pg = no_lua_pg(**{"redis_lock.url": "redis://%s@127.0.0.1:%d/0" % (USER, proxy.port)})
    s = Session(pg)
    try:
        def trips(q, args=None):
            t0 = time.monotonic()
            r = s.run(q, args)
            return int((time.monotonic() - t0) / rt), r
        # first use: connect, handshake and COMMAND INFO, then the acquire
        assert trips("SELECT redis_lock_acquire('rt1', ttl => '30s') > 0") == (2, True)
        assert trips("SELECT redis_lock_acquire('rt2', ttl => '30s') > 0") == (1, True)
        assert trips("SELECT redis_lock_acquire('rt2', ttl => '30s') > 0") == (1, True)
        assert trips("SELECT redis_lock_extend('rt2', '30s')") == (1, True)
        assert trips("SELECT locked FROM redis_lock_status('rt2')") == (1, True)
        assert trips("SELECT redis_lock_release('rt2')") == (0, True)     # a hold of two
        assert trips("SELECT redis_lock_release('rt2')") == (1, True)
        assert trips("SELECT redis_lock_try_acquire('rt1')") == (1, True)  # reentrant
        assert trips("SELECT redis_lock_force_release('rt1')") == (2, True)
        assert trips("SELECT redis_lock_try_acquire('rt1', wait => '0')") == (1, True)
        assert trips("SELECT redis_lock_release_all()") == (1, 1)
        c.set("rt3", "foreign", px=30000)
        assert trips("SELECT redis_lock_try_acquire('rt3')") == (1, False)
        # COMMIT: one verify round trip for all of them; their releases are
        # sent after it and not waited for ...
        s.run("BEGIN")
        s.run("SELECT count(redis_lock_acquire('rt-x' || g, xact => true)) "
              "FROM generate_series(1, 5) g")
        assert trips("COMMIT") == (1, None)
        # ... their replies are read by the next command on the connection,
        # in its own round trip
        assert trips("SELECT redis_lock_try_acquire('rt4')") == (1, True)
        assert c.keys("rt-x*") == []
        assert trips("SELECT redis_lock_release('rt4')") == (1, True)
    finally:
        s.close()
        pg.cleanup()
        proxy.stop()


def test_the_worker_keeps_the_form_a_lock_was_taken_with(valkey, vk):
    """A superuser's session turns scripting off; the server's setting (and
    so the watchdog worker's) leaves it on: the worker still renews that
    lock, and releases it when its backend exits, without a script."""
    c, _ = vk
    pg = testbed.Postgres(conf={"redis_lock.url": user_url(valkey),
                                "redis_lock.password": PASSWORD}).init().start().with_extension()
    a = Session(pg)
    try:
        assert a.run("SHOW redis_lock.scripting") == "on"
        a.run("SET redis_lock.scripting = off")
        a.run("SET redis_lock.lease_time = '1s'")
        assert a.run("SELECT redis_lock_acquire('form') > 0")
        token = c.get("form")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.5:
            assert c.get("form") == token and 0 < c.pttl("form") <= 1000
            time.sleep(0.05)
        # the backend exits holding it: the worker releases it
        a.conn.close()
        testbed.wait_until(lambda: c.exists("form") == 0, 0.9, what="the worker's release")
    finally:
        a.close()
        pg.cleanup()


# ---------------------------------------------------------------- refusals (issue 33, item 6)

def refused_scripts(r):
    """How many script commands r has refused so far (INFO commandstats'
    rejected_calls: an ACL's NOPERM counts there, before anything ran)."""
    stats = r.client().info("commandstats")
    return sum(stats.get("cmdstat_" + cmd, {}).get("rejected_calls", 0)
               for cmd in ("evalsha", "eval", "evalsha_ro", "eval_ro"))


REFUSED_USER = "rl_refused"


def deny_scripts_nopass(r):
    """A user of its own, without a password (so that a server without
    preloading needs none in its configuration), refused every script."""
    r.client().execute_command("ACL", "SETUSER", REFUSED_USER, "reset", "on", "nopass",
                               "~*", "&*", "+@all", "-@scripting")


def scripted_pg(r, preload=True, **conf):
    """A server with scripting on (its default) whose Redis user is
    REFUSED_USER."""
    conf.setdefault("redis_lock.url", "redis://%s@127.0.0.1:%d/0" % (REFUSED_USER, r.port))
    return testbed.Postgres(preload=preload, conf=conf).init().start().with_extension()


@pytest.mark.parametrize("preload", [True, False], ids=["preloaded", "not-preloaded"])
def test_a_refused_acquire_leaves_nothing_to_settle(valkey, preload):
    """Scripting on against a server whose ACL denies scripts: the
    acquire's EVALSHA is refused with NOPERM before anything ran, so the
    acquire fails with 42501 and nothing is left to settle -- no doubt for
    the worker (which would send its release again and again) nor for the
    session's next calls (without preloading): the server refuses nothing
    more, for seconds."""
    c = valkey.client()
    c.flushall()
    deny_scripts_nopass(valkey)
    c.config_resetstat()
    pg = scripted_pg(valkey, preload=preload)
    a = Session(pg)
    try:
        assert a.run("SELECT count(*) FROM redis_lock_held()") == 0    # loads it
        assert a.run("SHOW redis_lock.scripting") == "on"
        with pytest.raises(psycopg2.errors.InsufficientPrivilege) as ei:
            a.run("SELECT redis_lock_acquire('refused', ttl => '5s')")
        assert "NOPERM" in str(ei.value)
        assert c.keys("*") == []
        refused = refused_scripts(valkey)
        assert refused >= 1
        # the worker retries a doubt at most 100 ms apart; the session
        # settles its own at each call
        t_end = time.monotonic() + 3.0 * S
        while time.monotonic() < t_end:
            assert a.run("SELECT count(*) FROM redis_lock_held()") == 0
            assert refused_scripts(valkey) == refused, "a refused acquire was settled as a doubt"
            time.sleep(0.2)
        assert a.run("SELECT count(*) FROM redis_lock_locks") == 0
        assert "could not renew or release" not in pg.log_text()
        # a try_acquire and a set are refused the same way, and leave
        # nothing either
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            a.run("SELECT redis_lock_try_acquire('refused2')")
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            a.run("SELECT redis_lock_acquire_many(ARRAY['m1', 'm2'], ttl => '5s')")
        refused = refused_scripts(valkey)
        time.sleep(1.0 * S)
        assert a.run("SELECT count(*) FROM redis_lock_held()") == 0
        assert refused_scripts(valkey) == refused
    finally:
        a.close()
        pg.cleanup()
        c.execute_command("ACL", "LOG", "RESET")


def test_a_release_refused_for_good_backs_off_and_ends_with_one_log_line(valkey):
    """A session takes a lock with scripts allowed; then the ACL denies
    scripts and the session exits.  Its release at exit is refused (NOPERM),
    and so is every release of the worker's after it: the lock cannot be
    deleted, only run out.  The worker backs off instead of asking ten
    times a second, drops the release once the lease has surely run out (the
    lease, plus twice command_timeout and connect_timeout), and says so in
    one LOG line naming the lock, the server and the refusal -- not a line
    every 10 s."""
    c = valkey.client()
    c.flushall()
    deny_scripts_nopass(valkey)
    c.execute_command("ACL", "SETUSER", REFUSED_USER, "+@scripting")
    pg = scripted_pg(valkey, **{"redis_lock.command_timeout": "500ms",
                                "redis_lock.connect_timeout": "500ms"})
    a = Session(pg)
    try:
        assert a.run("SELECT redis_lock_acquire('kept', ttl => '2s') > 0")
        assert c.get("kept").startswith(MARKER)
        c.execute_command("ACL", "SETUSER", REFUSED_USER, "-@scripting")
        c.config_resetstat()
        since = len(pg.log_text())
        a.conn.close()
        exited = time.monotonic()

        def gave_up():
            return 'Redis lock "kept"' in pg.log_text()[since:]
        testbed.wait_until(gave_up, 15 * S, what="the worker's line about the refused release")
        took = time.monotonic() - exited
        # the lease ran out; the line came at the horizon (3.5 s), not 10
        # minutes later
        assert c.exists("kept") == 0
        assert 2.0 <= took < 3.5 + 2.0 * S, took
        refused = refused_scripts(valkey)
        time.sleep(1.5)
        assert refused_scripts(valkey) == refused, "the worker went on after its last line"
        # backed off: 10 a second until the horizon would be about 35
        assert 2 <= refused <= 12, refused
        log = pg.log_text()[since:].splitlines()
        lines = [i for i, l in enumerate(log) if 'Redis lock "kept"' in l]
        assert len(lines) == 1, log
        line, detail = log[lines[0]], log[lines[0] + 1]
        assert "127.0.0.1:%d" % valkey.port in line
        assert "DETAIL" in detail and "NOPERM" in detail, detail
        assert "could not renew or release" not in "\n".join(log)
    finally:
        a.close()
        pg.cleanup()
        c.execute_command("ACL", "LOG", "RESET")


# ---------------------------------------------------------------- topologies

@pytest.fixture(scope="module")
def valkey_masters():
    ms = [testbed.Redis(server=server("valkey-9.1")).start() for _ in range(3)]
    for m in ms:
        deny_scripts(m)
    yield ms
    for m in ms:
        m.stop()


def test_redlock_on_three_valkey_masters(valkey_masters):
    ms = valkey_masters
    pg = no_lua_pg(**{"redis_lock.nodes": ",".join(user_url(m) for m in ms)})
    a, b = Session(pg), Session(pg)
    try:
        assert a.run("SELECT redis_lock_acquire('rl', ttl => '30s')") is None   # no fencing
        assert not any(m.client().keys("redis_lock:fence:*") for m in ms)
        # a grant is a majority: under load a master's answer can miss
        # command_timeout (CI23: 2 of 3 held it when read); none holds another
        held = [m.client().get("rl") for m in ms]
        tokens = {t for t in held if t is not None}
        assert len(tokens) == 1 and tokens.pop().startswith(MARKER), held
        assert sum(t is not None for t in held) >= 2, held
        assert b.run("SELECT redis_lock_try_acquire('rl')") is False
        assert a.run("SELECT redis_lock_release('rl')") is True
        testbed.wait_until(lambda: all(m.client().exists("rl") == 0 for m in ms), 10,
                           what="the release on every master")
        # a minority of them held by someone else: still a majority for us
        ms[0].client().set("rl", "foreign", px=30000)
        assert b.run("SELECT redis_lock_try_acquire('rl')") is True
        assert [m.client().get("rl") == b"foreign" for m in ms] == [True, False, False]
        assert b.run("SELECT redis_lock_extend('rl', '60s')") is True
        assert b.run("SELECT redis_lock_release('rl')") is True
        assert ms[0].client().get("rl") == b"foreign"
        # one master down
        ms[2].stop()
        assert a.run("SELECT redis_lock_try_acquire('rl2', ttl => '30s')") is True
        assert a.run("SELECT redis_lock_release('rl2')") is True
        assert acl_denials(*ms[:2]) == []
    finally:
        a.close()
        b.close()
        pg.cleanup()
        if ms[2].proc.poll() is not None:
            ms[2].start()
            deny_scripts(ms[2])


def test_sentinel_discovery_wait_replicas_and_failover():
    vs = server("valkey-9.1")
    master = testbed.Redis(server=vs, args=["--repl-diskless-sync-delay", "0"]).start()
    replica = testbed.Redis(server=vs).start()
    sentinels = []
    pg = None
    a = None
    try:
        for r in (master, replica):
            deny_scripts(r)
        replica.client().execute_command("REPLICAOF", "127.0.0.1", master.port)
        testbed.wait_until(lambda: replica.client().info("replication").get(
            "master_link_status") == "up", 15, 0.05, what="replica in sync")
        sentinels = [testbed.Sentinel(master.port, server=vs).start() for _ in range(3)]

        def settled():
            for s in sentinels:
                sc = s.client()
                if len(sc.execute_command("SENTINEL", "REPLICAS", "mymaster")) < 1:
                    return False
                if len(sc.execute_command("SENTINEL", "SENTINELS", "mymaster")) < 2:
                    return False
            return True
        testbed.wait_until(settled, 20, 0.1, what="sentinels to know each other")
        pg = no_lua_pg(**{"redis_lock.url": "redis://%s@127.0.0.1:1/0" % USER,
                          "redis_lock.sentinels": ",".join(s.url for s in sentinels)})
        a = Session(pg)
        assert a.run("SELECT redis_lock_acquire('before', ttl => '60s') > 0")
        # WAIT rides after the MULTI ... EXEC, in the same round trip
        a.run("SET redis_lock.wait_replicas = 1")
        assert a.run("SELECT redis_lock_acquire('replicated', ttl => '60s') > 0")
        assert replica.client().get("replicated").startswith(MARKER)
        a.run("SET redis_lock.wait_replicas = 2")
        with pytest.raises(psycopg2.OperationalError) as ei:
            a.run("SELECT redis_lock_acquire('unreplicated', ttl => '60s')")
        assert "was not replicated to 2 replica(s)" in str(ei.value)
        assert master.client().exists("unreplicated") == 0
        a.run("SET redis_lock.wait_replicas = 0")
        master.kill()
        killed = time.monotonic()
        got = last = None
        while got is None and time.monotonic() - killed < 30 * S:
            try:
                got = a.run("SELECT redis_lock_acquire('after', ttl => '60s')")
            except psycopg2.Error as e:
                last = e
                time.sleep(0.2)
        assert got is not None, "no acquire succeeded after the failover: %s" % last
        assert replica.client().execute_command("ROLE")[0] == b"master"
        assert a.run("SELECT redis_lock_release('replicated')") is True
        assert a.run("SELECT redis_lock_release('after')") is True
        assert replica.client().exists("after", "replicated") == 0
        assert acl_denials(replica) == []
    finally:
        if a is not None:
            a.close()
        if pg is not None:
            pg.cleanup()
        for r in sentinels + [replica, master]:
            r.stop()


@pytest.fixture
def valkey_cluster():
    vs = server("valkey-9.1")
    nodes = [testbed.cluster_node(server=vs).start() for _ in range(3)]
    testbed.create_cluster(nodes)
    for n in nodes:
        deny_scripts(n)
    pg = no_lua_pg(**{"redis_lock.url": user_url(nodes[0]), "redis_lock.cluster": "on"})
    yield nodes, pg
    pg.cleanup()
    for n in nodes:
        n.stop()


def exists_asking(node, *keys):
    c = node.client(single_connection_client=True)
    n = 0
    for k in keys:
        c.execute_command("ASKING")
        n += c.exists(k)
    c.close()
    return n


def test_cluster_slot_migration_moved_and_ask_inside_multi(valkey_cluster):
    """A transaction redirected by MOVED or ASK (on a queued command, its
    EXEC then aborted) or told TRYAGAIN is sent again whole, with ASKING
    before its MULTI."""
    nodes, pg = valkey_cluster
    a, b = Session(pg), Session(pg)
    try:
        assert a.run("SELECT count(redis_lock_acquire('c-' || g, ttl => '60s')) "
                     "FROM generate_series(1, 60) g") == 60
        assert min(len(n.client().keys("c-*")) for n in nodes) > 5
        assert a.run("SELECT redis_lock_release_all()") == 60
        names = ["{mig}:%d" % i for i in range(6)]
        for n in names + ["{mig}:x"]:
            assert a.run("SELECT redis_lock_acquire(%s, ttl => '60s') > 0", (n,))
        src, slot = testbed.slot_owner(nodes, "{mig}:0")
        dst = next(n for n in nodes if n is not src)
        s_id = src.client().execute_command("CLUSTER", "MYID").decode()
        d_id = dst.client().execute_command("CLUSTER", "MYID").decode()
        dst.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", s_id)
        src.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", d_id)
        for n in names[:3]:
            src.client().execute_command("MIGRATE", "127.0.0.1", dst.port, n, 0, 5000)
        # releases of moved keys: ASK
        for n in names[:3]:
            assert a.run("SELECT redis_lock_release(%s)", (n,)) is True
        assert exists_asking(dst, *names[:3]) == 0
        # extend of a moved key (ASK), status of one (ASK inside MULTI)
        src.client().execute_command("MIGRATE", "127.0.0.1", dst.port, "{mig}:x", 0, 5000)
        assert a.run("SELECT redis_lock_extend('{mig}:x', '50s')") is True
        assert a.run("SELECT held_by_me FROM redis_lock_status('{mig}:x')") is True
        # a new lock in the migrating slot: its transaction waits out TRYAGAIN
        b.start("SELECT redis_lock_acquire('{mig}:new', ttl => '60s', wait => '10s') > 0")
        time.sleep(0.3)
        for k in src.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.client().execute_command("MIGRATE", "127.0.0.1", dst.port, k, 0, 5000)
        for n in nodes:
            n.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", d_id)
        b.join(20)
        assert b.error is None and b.result is True
        assert dst.client().get("{mig}:new").startswith(MARKER)
        # the rest, and the new one's fence counter, through MOVED
        for n in names[3:] + ["{mig}:x"]:
            assert a.run("SELECT redis_lock_release(%s)", (n,)) is True
        assert dst.client().exists(*names) == 0
        assert b.run("SELECT redis_lock_release('{mig}:new')") is True
        assert acl_denials(*nodes) == []
    finally:
        a.close()
        b.close()


# ================================================================ no DELIFEQ, no DELEX

NEEDS = "Valkey 9.0 or later"


def assert_the_worker_had_nothing(a, pg):
    """Take a scripted lock with a 900 ms lease and wait for the worker's
    first renewal of it: the worker has run since, and had no release it
    could not make (a doubt it would have tried first, and logged)."""
    a.run("SET redis_lock.scripting = on")
    a.run("SET redis_lock.lease_time = '900ms'")
    assert a.run("SELECT redis_lock_acquire('scripted') > 0")
    testbed.wait_until(lambda: a.run("SELECT last_renewed_at IS NOT NULL FROM "
                                     "redis_lock_all_locks() WHERE lock_name = 'scripted'"),
                       10, 0.01, what="the worker's first renewal")
    assert a.run("SELECT redis_lock_release('scripted')") is True
    assert "could not renew or release" not in pg.log_text()


def refused_everywhere(r):
    """scripting = off against r: 0A000 naming the versions, nothing left."""
    r.client().flushall()
    r.client().config_resetstat()       # the caller's probes are not ours
    pg = no_lua_pg(**{"redis_lock.url": r.url, "redis_lock.password": ""})
    a = Session(pg)
    try:
        for q in ("SELECT redis_lock_acquire('nolua')",
                  "SELECT redis_lock_try_acquire('nolua')",
                  "SELECT redis_lock_with_lock('nolua', 'SELECT 1')",
                  "SELECT locked FROM redis_lock_status('nolua')",
                  "SELECT redis_lock_force_release('nolua')"):
            with pytest.raises(psycopg2.errors.FeatureNotSupported) as ei:
                a.run(q)
            msg = str(ei.value)
            assert "does not offer the commands of locks without Lua scripts" in msg
            assert "DELIFEQ (Valkey 9.0 or later) or DELEX (Redis 8.4 or later)" in msg
            assert a.run("SELECT count(*) FROM redis_lock_held()") == 0
        a.run("BEGIN")
        with pytest.raises(psycopg2.errors.FeatureNotSupported):
            a.run("SELECT redis_lock_acquire('nolua', xact => true)")
        a.run("ROLLBACK")
        assert r.client().keys("*") == []
        # nothing was ever sent but the question (no MULTI, no SET)
        stats = r.client().info("commandstats")
        assert not any(k in stats for k in ("cmdstat_multi", "cmdstat_set", "cmdstat_exec"))
        # the Redisson layouts are refused before the server is even asked
        a.run("SET redis_lock.protocol = 'redisson'")
        with pytest.raises(psycopg2.errors.FeatureNotSupported) as ei:
            a.run("SELECT redis_lock_acquire('nolua')")
        assert "needs Lua scripts" in str(ei.value)
        # and nothing for the watchdog worker either: a refused acquire was
        # never sent, so it is no doubt to release (before: the worker tried
        # to release each with the commands the server lacks, failing every
        # few ms until the lease's horizon, and watched no key meanwhile)
        a.run("SET redis_lock.protocol = 'simple'")
        assert_the_worker_had_nothing(a, pg)
    finally:
        a.close()
        pg.cleanup()


def test_a_refused_acquire_behind_local_waiters_leaves_nothing():
    """A script-free acquire that would queue behind another session
    waiting for the same lock is refused (0A000) at once, before it queues,
    and leaves the worker nothing to release.  (Before: it queued as a
    doubt, was refused at its turn, and the worker tried to release it.)"""
    r = testbed.Redis().start()
    pg = no_lua_pg(**{"redis_lock.url": r.url, "redis_lock.password": "",
                      "redis_lock.scripting": "on"})
    rc = r.client()
    head, late = Session(pg), Session(pg)
    try:
        rc.set("q", "someone-else", px=30000)
        head.start("SELECT redis_lock_acquire('q', wait => '20s', ttl => '30s') > 0")
        wait_for_queue_lead(rc, head)
        late.run("SET redis_lock.scripting = off")
        t0 = time.monotonic()
        with pytest.raises(psycopg2.errors.FeatureNotSupported):
            late.run("SELECT redis_lock_acquire('q', wait => '10s', ttl => '30s')")
        assert time.monotonic() - t0 < 5
        rc.delete("q")
        head.join(20)
        assert head.error is None and head.result is True
        assert_the_worker_had_nothing(late, pg)
    finally:
        head.close()
        late.close()
        pg.cleanup()
        r.stop()


def test_a_wrong_password_is_said_so_without_scripts():
    """scripting = off: the question of what the server offers is the first
    thing a new connection sends; a wrong password fails it with 28P01 and
    its hint, as with scripts, not as an unanswered question (08006), and
    leaves nothing for the worker."""
    r = testbed.Redis(password="right-pw").start()
    pg = no_lua_pg(**{"redis_lock.url": r.url, "redis_lock.password": "wrong-pw"})
    a = Session(pg)
    try:
        with pytest.raises(psycopg2.Error) as ei:
            a.run("SELECT redis_lock_try_acquire('pw', ttl => '60s')")
        assert ei.value.pgcode == "28P01", str(ei.value)
        a.run("SET redis_lock.password = 'right-pw'")
        assert_the_worker_had_nothing(a, pg)
    finally:
        a.close()
        pg.cleanup()
        r.stop()


def test_a_server_replaced_by_an_older_one_is_asked_again():
    """What a connection learnt goes with it: Valkey 9.1 stops, Redis 7.0
    starts on its port, and the next acquire is refused before anything is
    sent, instead of taking a lock it could not release."""
    v = testbed.Redis(server=server("valkey-9.1")).start()
    pg = no_lua_pg(**{"redis_lock.url": v.url, "redis_lock.password": ""})
    a = Session(pg)
    old = None
    try:
        assert a.run("SELECT redis_lock_acquire('swap', ttl => '30s') > 0")
        assert a.run("SELECT redis_lock_release('swap')") is True
        v.stop()
        old = testbed.Redis(port=v.port, server="/usr/bin/redis-server").start()
        with pytest.raises(psycopg2.errors.FeatureNotSupported):
            a.run("SELECT redis_lock_acquire('swap', ttl => '30s')")
        assert old.client().keys("*") == []
        assert "cmdstat_multi" not in old.client().info("commandstats")
    finally:
        a.close()
        pg.cleanup()
        v.stop()
        if old is not None:
            old.stop()


def test_redis_7_0_is_refused():
    r = testbed.Redis(server="/usr/bin/redis-server").start()
    try:
        assert r.client().info("server")["redis_version"].startswith("7.0")
        refused_everywhere(r)
    finally:
        r.stop()


def test_redis_8_0_is_refused():
    r = testbed.Redis(server=server("redis-8.0")).start()
    try:
        assert r.client().info("server")["redis_version"].startswith("8.0")
        refused_everywhere(r)
    finally:
        r.stop()


def test_valkey_8_1_is_refused():
    r = testbed.Redis(server=server_or_skip("valkey-8.1")).start()
    try:
        assert r.client().info("server")["valkey_version"].startswith("8.1")
        # it has SET IFEQ, which is not enough: no compare-and-delete
        r.client().set("probe", "v")
        assert r.client().execute_command("SET", "probe", "w", "IFEQ", "v") in (b"OK", "OK", True)
        refused_everywhere(r)
    finally:
        r.stop()


# ================================================================ Redis 8.4 (a fake)

class Redis84(FakeRedis):
    """Answers what redis_lock sends with scripting off as Redis 8.4 does
    (https://redis.io/docs/latest/commands/ for SET, DELEX, MULTI, EXEC,
    COMMAND INFO): DELEX exists, DELIFEQ (Valkey's) does not, and scripting
    is refused (NOPERM), as for a user whose ACL denies it.  Every command
    received is kept, word for word, in self.log."""

    def __init__(self):
        super().__init__()
        self.log = []
        self.txn = {}               # connection -> queued commands, or "abort"
        self.strings = {}           # key -> [value, expires_at or None]
        self.hashes = {}
        self.drop_next_txn = False
        self.silent = set()         # connections whose replies are lost
        self.after_exec = None      # called (lock held) after the next EXEC

    def reset(self):
        super().reset()
        with self.lock:
            self.log.clear()
            self.txn.clear()
            self.strings.clear()
            self.hashes.clear()
            self.drop_next_txn = False
            self.silent.clear()
            self.after_exec = None

    def _handle(self, c, argv):
        drop = False
        with self.lock:
            self.log.append([a for a in argv])
            name = argv[0].upper()
            if name == b"MULTI":
                self.txn[c] = []
                reply = OK
                if self.drop_next_txn:
                    self.drop_next_txn = False
                    self.silent.add(c)
            elif name == b"EXEC":
                q = self.txn.pop(c, None)
                if q is None:
                    reply = b"-ERR EXEC without MULTI\r\n"
                elif q == "abort":
                    reply = b"-EXECABORT Transaction discarded because of previous errors.\r\n"
                else:
                    reply = array(*[self._run(a) for a in q])
                    if self.after_exec is not None:
                        hook, self.after_exec = self.after_exec, None
                        hook()
                drop = c in self.silent
                self.silent.discard(c)
            elif c in self.txn:
                err = self._refusal(argv)
                if err is not None:
                    self.txn[c] = "abort"
                    reply = err
                else:
                    if self.txn[c] != "abort":
                        self.txn[c].append(argv)
                    reply = b"+QUEUED\r\n"
            else:
                reply = self._refusal(argv) or self._run(argv)
        if drop:
            # the transaction ran; every answer to it is lost with the connection
            self._close(c)
            return False
        if c not in self.silent:
            c.sendall(reply)
        return True

    @staticmethod
    def _refusal(argv):
        name = argv[0].upper()
        if name in (b"EVAL", b"EVALSHA", b"EVAL_RO", b"EVALSHA_RO", b"FCALL", b"FCALL_RO",
                    b"FUNCTION", b"SCRIPT"):
            return b"-NOPERM User rl has no permissions to run the '%s' command\r\n" % name.lower()
        if name == b"DELIFEQ":
            return b"-ERR unknown command 'DELIFEQ', with args beginning with: \r\n"
        return None

    def _string(self, key):
        v = self.strings.get(key)
        if v is not None and v[1] is not None and v[1] <= time.monotonic():
            del self.strings[key]
            v = None
        return v

    def _run(self, argv):
        name = argv[0].upper()
        now = time.monotonic()
        wrongtype = b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
        if name in (b"CLIENT", b"AUTH", b"SELECT"):
            return OK
        if name == b"COMMAND" and argv[1].upper() == b"INFO":
            known = {b"DELEX": array(bulk("delex"), integer(-2), array(bulk("write")))}
            return array(*[known.get(n.upper(), b"*-1\r\n") for n in argv[2:]])
        key = argv[1] if len(argv) > 1 else None
        cur = self._string(key) if key is not None else None
        if key is not None and key in self.hashes and name in (b"SET", b"GET", b"INCR", b"DELEX"):
            # SET with GET or IFEQ, and the rest, on a hash
            if name != b"SET" or any(a.upper() in (b"GET", b"IFEQ") for a in argv[3:]):
                return wrongtype
        if name == b"SET":
            value, opts = argv[2], [a for a in argv[3:]]
            nx = ifeq = get = False
            px = None
            cmp = None
            i = 0
            while i < len(opts):
                o = opts[i].upper()
                if o == b"NX":
                    nx = True
                elif o == b"GET":
                    get = True
                elif o == b"PX":
                    i += 1
                    px = int(opts[i])
                elif o == b"IFEQ":
                    i += 1
                    ifeq, cmp = True, opts[i]
                else:
                    return b"-ERR syntax error\r\n"
                i += 1
            old = cur[0] if cur is not None else None
            ok = not (nx and cur is not None) and not (ifeq and old != cmp)
            if ok:
                self.strings[key] = [value, now + px / 1000.0 if px is not None else None]
            if get:
                return bulk(old)
            return OK if ok else bulk(None)
        if name == b"GET":
            return bulk(cur[0] if cur else None)
        if name == b"INCR":
            n = int(cur[0]) + 1 if cur else 1
            self.strings[key] = [str(n).encode(), cur[1] if cur else None]
            return integer(n)
        if name == b"PTTL":
            if cur is None:
                return integer(-1 if key in self.hashes else -2)
            return integer(-1 if cur[1] is None else int((cur[1] - now) * 1000))
        if name == b"TYPE":
            return b"+%s\r\n" % (b"string" if cur else b"hash" if key in self.hashes else b"none")
        if name == b"GETRANGE":
            if key in self.hashes:
                return wrongtype
            v = cur[0] if cur else b""
            return bulk(v[int(argv[2]):int(argv[3]) + 1])
        if name == b"HRANDFIELD":
            if cur is not None:
                return wrongtype
            h = list(self.hashes.get(key, {}).items())[:int(argv[2])]
            return array(*[bulk(x) for kv in h for x in kv])
        if name == b"DELEX":
            if len(argv) != 4 or argv[2].upper() != b"IFEQ":
                return b"-ERR syntax error\r\n"
            if cur is not None and cur[0] == argv[3]:
                del self.strings[key]
                return integer(1)
            return integer(0)
        if name == b"DEL":
            n = sum(1 for k in argv[1:] if self.strings.pop(k, None) is not None or
                    self.hashes.pop(k, None) is not None)
            return integer(n)
        if name in (b"PUBLISH", b"SPUBLISH"):
            return integer(0)
        return self._normal(self._kind(argv), argv)

    def sent(self, since=0):
        """The commands received since log position since, as text lists,
        without connection set-up."""
        return [[a.decode() for a in cmd] for cmd in self.log[since:]
                if cmd[0].upper() not in (b"CLIENT", b"AUTH", b"SELECT")]


@pytest.fixture(scope="module")
def fake84():
    f = Redis84()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def fpg(fake84):
    pg = no_lua_pg(**{"redis_lock.url": fake84.url, "redis_lock.password": "",
                      "redis_lock.command_timeout": "1s"})
    yield pg
    pg.cleanup()


@pytest.fixture
def f84(fake84, fpg):
    fake84.reset()
    s = Session(fpg)
    yield fake84, s
    s.close()
    scripts = [c for c in fake84.log if c[0].upper().startswith((b"EVAL", b"FCALL", b"SCRIPT",
                                                                  b"FUNCTION"))]
    assert scripts == []


def fence_key(fake):
    return next(k for k in fake.strings if k.startswith(b"redis_lock:fence:"))


def test_redis84_delex_path_word_for_word(f84):
    fake, s = f84
    fence = s.run("SELECT redis_lock_acquire('k', ttl => '30s')")
    token = fake.strings[b"k"][0].decode()
    fk = fence_key(fake).decode()
    assert token.startswith("pgrl:")
    sent = fake.sent()
    # a new connection asks in its handshake which commands the server has
    assert sent[0] == ["COMMAND", "INFO", "DELIFEQ", "DELEX"]
    start = sent[3][2]
    assert sent[1:] == [
        ["MULTI"],
        ["SET", "k", token, "NX", "PX", "30000", "GET"],
        ["SET", fk, start, "NX"],
        ["INCR", fk],
        ["PTTL", "k"],
        ["TYPE", "k"],
        ["EXEC"]]
    assert fence == int(start) + 1 and abs(int(start) - time.time() * 1e6) < 60e6
    n = len(fake.log)
    assert s.run("SELECT redis_lock_extend('k', '20s')") is True
    assert fake.sent(n) == [["SET", "k", token, "IFEQ", token, "PX", "20000"]]
    n = len(fake.log)
    assert s.run("SELECT held_by_me FROM redis_lock_status('k')") is True
    assert fake.sent(n) == [["MULTI"], ["TYPE", "k"], ["PTTL", "k"], ["GETRANGE", "k", "0", "128"],
                            ["HRANDFIELD", "k", "65", "WITHVALUES"], ["EXEC"]]
    n = len(fake.log)
    assert s.run("SELECT redis_lock_release('k')") is True
    assert fake.sent(n) == [["DELEX", "k", "IFEQ", token],
                            ["PUBLISH", "redis_lock:release:{k}", "0"]]
    assert b"k" not in fake.strings
    # not ours: DELEX compares and deletes nothing
    assert s.run("SELECT redis_lock_acquire('k', ttl => '300ms') > 0")
    token = fake.strings[b"k"][0].decode()
    fake.strings[b"k"] = [b"other", time.monotonic() + 30]
    n = len(fake.log)
    assert s.run("SELECT redis_lock_release('k')") is False
    assert fake.sent(n) == [["DELEX", "k", "IFEQ", token],
                            ["PUBLISH", "redis_lock:release:{k}", "0"]]
    assert fake.strings[b"k"][0] == b"other"
    # force release: inspect as status does, then delete if it still holds
    # the owner value seen
    n = len(fake.log)
    assert s.run("SELECT redis_lock_force_release('k')") is True
    assert fake.sent(n) == [["MULTI"], ["TYPE", "k"], ["PTTL", "k"], ["GETRANGE", "k", "0", "128"],
                            ["HRANDFIELD", "k", "65", "WITHVALUES"], ["EXEC"],
                            ["DELEX", "k", "IFEQ", "other"],
                            ["PUBLISH", "redis_lock:release:{k}", "0"]]
    assert b"k" not in fake.strings


def test_redis84_force_release_leaves_a_lock_that_changed_hands(f84):
    """Force release reads the token, then deletes the key if it still
    holds it: a lock taken over between the two round trips stays."""
    fake, s = f84
    fake.strings[b"k"] = [b"first", time.monotonic() + 30]

    def hand_over():
        fake.strings[b"k"] = [b"second", time.monotonic() + 30]
    fake.after_exec = hand_over
    assert s.run("SELECT redis_lock_force_release('k')") is False
    assert fake.strings[b"k"][0] == b"second"
    assert s.run("SELECT redis_lock_force_release('k')") is True
    assert b"k" not in fake.strings


def test_redis84_watchdog_renewal_word_for_word(f84):
    fake, s = f84
    s.run("SET redis_lock.lease_time = '600ms'")
    assert s.run("SELECT redis_lock_acquire('wd') > 0")
    token = fake.strings[b"wd"][0].decode()
    testbed.wait_until(lambda: ["SET", "wd", token, "IFEQ", token, "PX", "600"] in fake.sent(),
                       5, what="a renewal")
    i = fake.sent().index(["SET", "wd", token, "IFEQ", token, "PX", "600"])
    # the renewal asks what is left of the lease just before (pipelined)
    assert fake.sent()[i - 1] == ["PTTL", "wd"]
    time.sleep(1.2)
    assert fake.strings[b"wd"][0].decode() == token
    assert s.run("SELECT redis_lock_release('wd')") is True


def test_redis84_retried_acquire_finds_its_own_token(f84):
    """The transaction ran but the connection died before any answer left:
    it is sent again on a new one (the cached connection had sat idle, so it
    may just have been dead), finds our token (SET's GET), and restarts its
    lease with SET IFEQ: granted, with the token the second INCR counted."""
    fake, s = f84
    assert s.run("SELECT redis_lock_try_acquire('warm')") is True      # the connection is idle now
    fake.drop_next_txn = True
    n = len(fake.log)
    fence = s.run("SELECT redis_lock_acquire('own', ttl => '30s')")
    token = fake.strings[b"own"][0].decode()
    sent = fake.sent(n)
    multis = [i for i, c in enumerate(sent) if c == ["MULTI"]]
    assert len(multis) == 2
    assert sent[multis[0] + 1] == sent[multis[1] + 1] == \
        ["SET", "own", token, "NX", "PX", "30000", "GET"]
    assert sent[-1] == ["SET", "own", token, "IFEQ", token, "PX", "30000"]
    incrs = [c[1] for c in sent if c[0] == "INCR"]
    assert len(incrs) == 2
    assert fence == int(fake.strings[incrs[1].encode()][0])
    assert s.run("SELECT redis_lock_fence('own')") == fence
    assert s.run("SELECT redis_lock_release('own')") is True


def test_redis84_wrong_type_left_alone(f84):
    fake, s = f84
    fake.hashes[b"h"] = {b"f": b"1"}
    with pytest.raises(psycopg2.errors.WrongObjectType) as ei:
        s.run("SELECT redis_lock_acquire('h')")
    assert "holds a hash" in str(ei.value)
    assert s.run("SELECT redis_lock_release_all()") == 0
    assert fake.hashes[b"h"] == {b"f": b"1"} and b"h" not in fake.strings
    assert not any(c[0] == "DELEX" and c[1] == "h" for c in fake.sent())
