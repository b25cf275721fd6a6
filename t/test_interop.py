"""SQL sessions and real foreign clients share the same Redis locks, both ways:
redis-py's Lock (Debian python3-redis 4.3.4), npm redlock 4.2.0, and a
Redisson RLock/RFencedLock peer on the wire."""
import threading
import time

import psycopg2
import pytest
from redis.exceptions import LockNotOwnedError
from redis.lock import Lock

from conftest import wait_for_wait_event
from peers import RedissonPeer, RedlockPeer, Subscriber, redisson_name
import testbed


def warned(s, text):
    found = any(text in n for n in s.conn.notices)
    del s.conn.notices[:]
    return found


# ---------------------------------------------------------------- redis-py

def test_redis_py_holder_excludes_sql(sessions, rc):
    a = sessions()
    lk = Lock(rc, "shared-job", timeout=30)
    assert lk.acquire(blocking=False)
    assert a.run("SELECT redis_lock_try_acquire('shared-job')") is False
    with pytest.raises(psycopg2.errors.LockNotAvailable):
        a.run("SELECT redis_lock_acquire('shared-job', wait => '200ms')")
    # SQL cannot release it: not held, and nothing is deleted
    assert a.run("SELECT redis_lock_release('shared-job')") is False
    assert rc.get("shared-job") == lk.local.token
    status = a.run("SELECT locked, held_by_me, redis_type FROM redis_lock_status('shared-job')")
    assert status == (True, False, "string")
    lk.release()
    assert a.run("SELECT redis_lock_try_acquire('shared-job')") is True
    assert a.run("SELECT redis_lock_release('shared-job')") is True


def test_sql_holder_excludes_redis_py(sessions, rc):
    a = sessions()
    assert a.run("SELECT redis_lock_acquire('shared-job', ttl => '30s') > 0")
    lk = Lock(rc, "shared-job", timeout=30)
    assert not lk.acquire(blocking=False)
    # redis-py cannot release or extend the SQL session's lock
    lk.local.token = b"not-the-token"
    with pytest.raises(LockNotOwnedError):
        lk.extend(10, replace_ttl=True)
    with pytest.raises(LockNotOwnedError):
        lk.release()
    assert rc.get("shared-job").startswith(b"pgrl:")
    a.run("SELECT redis_lock_release('shared-job')")
    assert lk.acquire(blocking=False)
    lk.release()


def test_redis_py_waiter_gets_the_lock_after_sql_releases(sessions, rc):
    a = sessions()
    assert a.run("SELECT redis_lock_acquire('handover') > 0")
    lk = Lock(rc, "handover", timeout=10, sleep=0.05, blocking_timeout=5, thread_local=False)
    result = {}

    def wait():
        result["got"] = lk.acquire()
        result["at"] = time.monotonic()
    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.2)
    a.run("SELECT redis_lock_release('handover')")
    released = time.monotonic()
    t.join(5)
    assert result["got"]
    assert result["at"] - released < 0.15      # redis-py polls every 50 ms here
    lk.release()


def test_sql_waiter_gets_the_lock_after_redis_py_releases(sessions, rc):
    a, admin = sessions(), sessions()
    lk = Lock(rc, "handover2", timeout=30)
    assert lk.acquire(blocking=False)
    a.start("SELECT redis_lock_acquire('handover2', wait => '10s')")
    wait_for_wait_event(admin.conn, a.pid)
    lk.release()                         # plain compare-and-DEL, no PUBLISH
    released = time.monotonic()
    a.join()
    assert a.error is None
    assert a.finished_at - released < 0.15     # our poll backoff is capped at 100 ms
    a.run("SELECT redis_lock_release('handover2')")


# ---------------------------------------------------------------- node-redlock

@pytest.fixture
def redlock(redis_srv):
    p = RedlockPeer([redis_srv.port])
    yield p
    p.close()


def test_node_redlock_holder_excludes_sql(sessions, rc, redlock):
    a = sessions()
    got = redlock.call(op="lock", key="node-job", ttl=30000)
    assert got["ok"], got
    assert len(got["value"]) == 32
    assert a.run("SELECT redis_lock_try_acquire('node-job')") is False
    assert a.run("SELECT redis_lock_release('node-job')") is False
    assert rc.get("node-job").decode() == got["value"]
    assert redlock.call(op="extend", ttl=30000)["ok"]
    assert redlock.call(op="unlock")["ok"]
    assert a.run("SELECT redis_lock_try_acquire('node-job')") is True
    a.run("SELECT redis_lock_release('node-job')")


def test_sql_holder_excludes_node_redlock(sessions, rc, redlock):
    a, admin = sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('node-job2', ttl => '30s') > 0")
    got = redlock.call(op="lock", key="node-job2", ttl=5000, retryCount=2)
    assert not got["ok"] and "LockError" in got["error"]
    assert rc.get("node-job2").startswith(b"pgrl:")
    a.run("SELECT redis_lock_release('node-job2')")
    assert redlock.call(op="lock", key="node-job2", ttl=5000)["ok"]
    # and a SQL waiter gets it when node-redlock unlocks (no publish: poll)
    a.start("SELECT redis_lock_acquire('node-job2', wait => '10s')")
    wait_for_wait_event(admin.conn, a.pid)
    assert redlock.call(op="unlock")["ok"]
    released = time.monotonic()
    a.join()
    assert a.error is None and a.finished_at - released < 0.15
    a.run("SELECT redis_lock_release('node-job2')")


# ---------------------------------------------------------------- Redisson

@pytest.fixture
def rsql(sessions):
    """A SQL session speaking Redisson's layout."""
    def make():
        s = sessions()
        s.run("SET redis_lock.protocol = 'redisson'")
        return s
    return make


def test_redisson_layout_written_by_sql(rsql, rc):
    a = rsql()
    fence = a.run("SELECT redis_lock_acquire('inventory', ttl => '20s')")
    assert rc.type("inventory") == b"hash"
    fields = rc.hgetall("inventory")
    assert len(fields) == 1
    (field, count), = fields.items()
    uuid_part, pid = field.decode().rsplit(":", 1)
    assert len(uuid_part) == 36 and uuid_part.count("-") == 4
    assert int(pid) == a.pid and count == b"1"
    assert 19000 < rc.pttl("inventory") <= 20000
    # reentrancy is counted in the session; Redis keeps our count at 1
    assert a.run("SELECT redis_lock_acquire('inventory', ttl => '20s')") == fence
    assert rc.hget("inventory", field) == b"1"
    assert fence == int(rc.get("redisson_lock_token:{inventory}"))
    a.run("SELECT redis_lock_release('inventory')")
    assert rc.exists("inventory") == 1
    a.run("SELECT redis_lock_release('inventory')")
    assert rc.exists("inventory") == 0


def test_redisson_holder_excludes_sql_and_its_unlock_wakes_sql_within_50ms(rsql, sessions, rc):
    a, admin = rsql(), sessions()
    java = RedissonPeer(rc, thread_id=77)
    assert java.try_lock("orders") is None
    assert java.try_lock("orders") is None            # reentrant: count 2
    assert rc.hget("orders", java.field) == b"2"
    assert a.run("SELECT redis_lock_try_acquire('orders')") is False
    assert a.run("SELECT redis_lock_release('orders')") is False
    a.start("SELECT redis_lock_acquire('orders', wait => '20s')")
    wait_for_wait_event(admin.conn, a.pid)
    assert java.unlock("orders") == 0                 # still held once
    time.sleep(0.2)
    assert a.thread.is_alive()
    assert java.unlock("orders") == 1                 # DEL + PUBLISH "0"
    released = time.monotonic()
    a.join()
    assert a.error is None
    assert a.finished_at - released < 0.05, "woken %.1f ms after the Java unlock" % (
        (a.finished_at - released) * 1000)
    # the Java service cannot take it back or unlock the SQL session's lock
    assert java.try_lock("orders") > 0
    assert java.unlock("orders") is None
    assert rc.exists("orders") == 1
    a.run("SELECT redis_lock_release('orders')")


def test_sql_release_publishes_zero_to_redisson_waiters(rsql, redis_srv, rc):
    a = rsql()
    java = RedissonPeer(rc, thread_id=5)
    assert a.run("SELECT redis_lock_acquire('report') > 0")
    pttl = java.try_lock("report")
    assert pttl is not None and pttl > 0      # a Java waiter would sleep on this TTL ...
    sub = Subscriber(redis_srv.port, "redisson_lock__channel:{report}")
    try:
        a.run("SELECT redis_lock_release('report')")
        msg = sub.get(timeout=1)
        assert msg == ("message", "redisson_lock__channel:{report}", "0")   # ... or wake here
    finally:
        sub.close()
    assert java.try_lock("report") is None
    assert java.unlock("report") == 1


def test_redisson_watchdog_renewal_by_sql_and_by_java(rsql, sessions, rc):
    a, b = rsql(), rsql()
    a.run("SET redis_lock.lease_time = '1500ms'")
    a.start("SELECT redis_lock_acquire('batch') > 0, pg_sleep(3)")
    testbed.wait_until(lambda: rc.exists("batch"), 5, what="lock")
    t_end = time.monotonic() + 2.6
    while time.monotonic() < t_end:
        assert rc.pttl("batch") > 0
        time.sleep(0.02)
    a.join()
    assert a.run("SELECT redis_lock_release('batch')") is True
    # Java's watchdog check renews only its own field
    java = RedissonPeer(rc, lease_ms=1500)
    assert java.try_lock("batch") is None
    assert java.renew("batch") == 1
    assert b.run("SELECT redis_lock_try_acquire('batch')") is False
    assert java.unlock("batch") == 1


def test_fencing_tokens_shared_with_rfencedlock(rsql, rc):
    a = rsql()
    java = RedissonPeer(rc)
    tokens = []
    for turn in range(3):
        t, _ = java.try_lock_fenced("fenced")
        tokens.append(t)
        assert java.unlock("fenced") == 1
        tokens.append(a.run("SELECT redis_lock_acquire('fenced', ttl => '10s')"))
        a.run("SELECT redis_lock_release('fenced')")
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert tokens == list(range(tokens[0], tokens[0] + 6))
    assert rc.ttl(redisson_name("redisson_lock_token", "fenced")) == -1


def test_force_release_of_a_redisson_lock_wakes_java_waiters(rsql, sessions, redis_srv, rc):
    admin = sessions()
    admin.run("SET redis_lock.protocol = 'redisson'")
    java = RedissonPeer(rc)
    assert java.try_lock("stuck") is None
    sub = Subscriber(redis_srv.port, "redisson_lock__channel:{stuck}")
    try:
        assert admin.run("SELECT redis_lock_force_release('stuck')") is True
        assert sub.get(timeout=1) == ("message", "redisson_lock__channel:{stuck}", "0")
    finally:
        sub.close()
    assert rc.exists("stuck") == 0


def test_braced_key_follows_redissons_channel_rule(rsql, redis_srv, rc):
    a = rsql()
    sub = Subscriber(redis_srv.port, "redisson_lock__channel:{user:1}:cart")
    try:
        assert a.run("SELECT redis_lock_acquire('{user:1}:cart') > 0")
        assert rc.exists("redisson_lock_token:{user:1}:cart") == 1
        a.run("SELECT redis_lock_release('{user:1}:cart')")
        assert sub.get(timeout=1)[2] == "0"
    finally:
        sub.close()


def test_sharded_pubsub_both_ways(rsql, sessions, redis_srv, rc):
    a, admin = rsql(), sessions()
    a.run("SET redis_lock.sharded_pubsub = on")
    java = RedissonPeer(rc, sharded=True)
    assert java.try_lock("sharded") is None
    a.start("SELECT redis_lock_acquire('sharded', wait => '20s')")
    wait_for_wait_event(admin.conn, a.pid)
    assert java.unlock("sharded") == 1                 # SPUBLISH
    released = time.monotonic()
    a.join()
    assert a.error is None and a.finished_at - released < 0.05
    sub = Subscriber(redis_srv.port, "redisson_lock__channel:{sharded}", sharded=True)
    try:
        a.run("SELECT redis_lock_release('sharded')")
        assert sub.get(timeout=1) == ("smessage", "redisson_lock__channel:{sharded}", "0")
    finally:
        sub.close()


# ---------------------------------------------------------------- mixed layouts

def test_mixed_layouts_fail_safe(sessions, rsql, rc):
    simple, redisson = sessions(), rsql()
    java = RedissonPeer(rc)
    assert java.try_lock("mixed") is None
    with pytest.raises(psycopg2.errors.WrongObjectType) as ei:
        simple.run("SELECT redis_lock_acquire('mixed')")
    assert 'holds a hash, not a lock of protocol "simple"' in str(ei.value)
    with pytest.raises(psycopg2.errors.WrongObjectType):
        simple.run("SELECT redis_lock_force_release('mixed')")
    assert rc.hget("mixed", java.field) == b"1"
    java.unlock("mixed")

    lk = Lock(rc, "mixed", timeout=30)
    assert lk.acquire(blocking=False)
    with pytest.raises(psycopg2.errors.WrongObjectType) as ei:
        redisson.run("SELECT redis_lock_acquire('mixed')")
    assert 'holds a string, not a lock of protocol "redisson"' in str(ei.value)
    assert rc.get("mixed") == lk.local.token
    lk.release()
