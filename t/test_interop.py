"""SQL sessions and real foreign clients share the same Redis locks, both ways:
redis-py's Lock (Debian python3-redis 4.3.4; scripts/run-tests reruns these
with redis-py from PyPI), npm redlock 4.2.0 and npm redlock-universal 0.8.5; plus the Redisson layout as
SQL writes it.  The real Redisson and Jedis are in test_interop_java.py,
redsync in test_interop_go.py."""
import threading
import time

import psycopg2
import pytest
import redis
from redis.exceptions import LockNotOwnedError
from redis.lock import Lock

from checks import report_latency
from conftest import wait_for_wait_event
from peers import RedlockPeer, RedlockUniversalPeer
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


def redis_py_handovers(a, admin, rc, key, cycles):
    """Seconds from a redis-py release to the SQL waiter holding the lock,
    once per cycle; the release comes 300 ms into the wait, when a poll
    backoff would have grown to its 100 ms cap."""
    out = []
    for _ in range(cycles):
        lk = Lock(rc, key, timeout=30)
        assert lk.acquire(blocking=False)
        a.start("SELECT redis_lock_acquire(%s, wait => '10s') > 0", (key,))
        wait_for_wait_event(admin.conn, a.pid)
        time.sleep(0.3)
        released = time.monotonic()
        lk.release()
        a.join()
        assert a.error is None and a.result is True
        out.append(a.finished_at - released)
        assert a.run("SELECT redis_lock_release(%s)", (key,)) is True
    return sorted(out)


def test_keyspace_notifications_wake_a_sql_waiter_behind_redis_py(sessions, rc):
    """redis-py never publishes on release.  Where the server publishes
    keyspace notifications (notify-keyspace-events with K, g and x), the
    SQL waiter's subscription to the key's notifications wakes it on the
    DEL; with them off it finds the free lock by polling, as before."""
    a, admin = sessions(), sessions()
    rc.config_set("notify-keyspace-events", "Kgx")
    try:
        on = redis_py_handovers(a, admin, rc, "ks-notified", 15)
    finally:
        rc.config_set("notify-keyspace-events", "")
    off = redis_py_handovers(a, admin, rc, "ks-notified", 8)
    p50_on, p50_off = on[len(on) // 2], off[len(off) // 2]
    report_latency("redis-py " + redis.__version__,
                   "redis-py release -> SQL waiter, keyspace notifications on (p50)", p50_on)
    report_latency("redis-py " + redis.__version__,
                   "redis-py release -> SQL waiter, keyspace notifications off (p50)", p50_off)
    # the notification, not the poll, woke it: the poll (8 ms doubling to
    # 100 ms, after 0.3 s of waiting) is what the 'off' run measures
    assert p50_on < testbed.WAKE_BOUND, on
    assert p50_off > 2 * p50_on, (on, off)


# README: redis-py
def export_orders(r, export):
    with r.lock("orders:export", timeout=30, blocking_timeout=10):
        export()
# README: end


def test_redis_py_readme_code_hands_over_both_ways(sessions, rc):
    """The README's redis-py code behind a SQL holder, then in front of a
    SQL waiter.  Neither side publishes to the other: both poll."""
    a, admin = sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('orders:export', ttl => '30s') > 0")
    ran = []
    service = threading.Thread(target=export_orders,
                               args=(rc, lambda: ran.append(time.monotonic())))
    service.start()
    time.sleep(0.3)                          # it polls SET NX every 0.1 s meanwhile
    assert not ran
    released = time.monotonic()
    assert a.run("SELECT redis_lock_release('orders:export')") is True
    service.join(10)
    assert ran
    report_latency("redis-py " + redis.__version__, "SQL release -> redis-py waiter",
                   ran[0] - released)
    # its poll interval is 0.1 s: woken by a poll after the release's DEL,
    # not by the 30 s TTL the SQL holder had
    assert ran[0] - released < testbed.WAKE_BOUND
    inside, done = threading.Event(), threading.Event()

    def export():
        inside.set()
        done.wait(10)
    service = threading.Thread(target=export_orders, args=(rc, export))
    service.start()
    assert inside.wait(5)
    a.start("SELECT redis_lock_acquire('orders:export', wait => '10s') > 0")
    wait_for_wait_event(admin.conn, a.pid)
    released = time.monotonic()
    done.set()                               # leaves the with block: compare-and-DEL
    a.join()
    assert a.error is None and a.result is True
    report_latency("redis-py " + redis.__version__, "redis-py release -> SQL waiter",
                   a.finished_at - released)
    # our poll backoff is capped at 100 ms (redis-py publishes nothing), not
    # the holder's 30 s TTL
    assert a.finished_at - released < testbed.WAKE_BOUND
    assert a.run("SELECT redis_lock_release('orders:export')") is True


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
    released = time.monotonic()
    assert redlock.call(op="unlock")["ok"]
    a.join()
    assert a.error is None
    report_latency("node-redlock 4.2.0", "redlock unlock -> SQL waiter", a.finished_at - released)
    assert a.finished_at - released < testbed.WAKE_BOUND
    # and back: a redlock waiter retrying every 10 ms gets it once SQL releases
    redlock.send(op="lock", key="node-job2", ttl=5000, retryCount=1000, retryDelay=10)
    time.sleep(0.1)                          # let it fail a few tries first
    released = time.monotonic()
    assert a.run("SELECT redis_lock_release('node-job2')") is True
    got, at = redlock.receive()
    assert got["ok"], got
    report_latency("node-redlock 4.2.0", "SQL release -> redlock retrying every 10 ms",
                   at - released)
    assert at - released < testbed.WAKE_BOUND
    assert redlock.call(op="unlock")["ok"]


# ---------------------------------------------------------------- redlock-universal

@pytest.fixture
def ru(redis_srv):
    p = RedlockUniversalPeer([redis_srv.port])
    yield p
    p.close()


def test_redlock_universal_holder_excludes_sql_and_its_release_wakes_it(sessions, rc, ru):
    a, admin = sessions(), sessions()
    got = ru.call(op="lock", key="ru-job", ttl=30000)
    assert got["ok"], got
    assert rc.get("ru-job").decode() == got["value"]
    assert a.run("SELECT redis_lock_try_acquire('ru-job')") is False
    assert a.run("SELECT redis_lock_release('ru-job')") is False     # not ours
    assert rc.get("ru-job").decode() == got["value"]
    assert ru.call(op="extend", ttl=30000)["ok"]
    # a SQL waiter gets it when redlock-universal releases (no publish: SQL polls)
    a.start("SELECT redis_lock_acquire('ru-job', wait => '10s') > 0")
    wait_for_wait_event(admin.conn, a.pid)
    released = time.monotonic()
    assert ru.call(op="unlock")["ok"]
    a.join()
    assert a.error is None and a.result is True
    report_latency("redlock-universal 0.8.5", "its release -> SQL waiter", a.finished_at - released)
    assert a.finished_at - released < testbed.WAKE_BOUND
    # its stale handle cannot release SQL's lock now
    assert ru.call(op="unlock")["ok"] is False
    assert rc.get("ru-job").startswith(b"pgrl:")
    assert a.run("SELECT redis_lock_release('ru-job')") is True


def test_sql_holder_excludes_redlock_universal_and_its_release_wakes_it(sessions, rc, ru):
    a = sessions()
    assert a.run("SELECT redis_lock_acquire('ru-job2', ttl => '30s') > 0")
    got = ru.call(op="lock", key="ru-job2", ttl=5000, retryAttempts=2)
    assert not got["ok"] and "LockAcquisitionError" in got["error"], got
    assert rc.get("ru-job2").startswith(b"pgrl:")
    # a redlock-universal waiter retrying every 10 ms gets it once SQL releases
    ru.send(op="lock", key="ru-job2", ttl=5000, retryAttempts=1000, retryDelay=10)
    time.sleep(0.1)                          # let it fail a few tries first
    released = time.monotonic()
    assert a.run("SELECT redis_lock_release('ru-job2')") is True
    got, at = ru.receive()
    assert got["ok"], got
    report_latency("redlock-universal 0.8.5", "SQL release -> its waiter retrying every 10 ms",
                   at - released)
    assert at - released < testbed.WAKE_BOUND
    assert a.run("SELECT redis_lock_try_acquire('ru-job2')") is False
    assert ru.call(op="unlock")["ok"]


# ---------------------------------------------------------------- Redisson

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
    # the token comes from the slot's fence counter, as under 'simple'
    # (doc/clients.md, "Fencing tokens and what stays in Redis"); Redisson's
    # per-name counter is written only with redis_lock.redisson_token_counter
    counter, = rc.keys("redis_lock:fence:*")
    assert fence == int(rc.get(counter))
    assert not rc.exists("redisson_lock_token:{inventory}")
    a.run("SELECT redis_lock_release('inventory')")
    assert rc.exists("inventory") == 1
    a.run("SELECT redis_lock_release('inventory')")
    assert rc.exists("inventory") == 0


# ---------------------------------------------------------------- mixed layouts

def test_redisson_protocol_refuses_a_redis_py_string(rsql, rc):
    """The other half (simple on a real Redisson hash) is in test_interop_java."""
    redisson = rsql()
    lk = Lock(rc, "mixed", timeout=30)
    assert lk.acquire(blocking=False)
    with pytest.raises(psycopg2.errors.WrongObjectType) as ei:
        redisson.run("SELECT redis_lock_acquire('mixed')")
    assert 'holds a string, not a lock of protocol "redisson"' in str(ei.value)
    assert rc.get("mixed") == lk.local.token
    lk.release()
