"""SQL sessions and the real Go redsync v4 (go-redis v9) share locks, both
ways: on one Redis, and as Redlock on 5 independent masters against
redis_lock.nodes, also with 2 of the 5 down.  The peer is
t/interop/go/main.go, driven line by line (peers.RedsyncPeer)."""
import time

import pytest

from checks import report_latency
from conftest import wait_for_wait_event
from peers import RedsyncPeer
import testbed
from testbed import TIME_SCALE as S


@pytest.fixture
def redsync(redis_srv, rc):
    peer = RedsyncPeer([redis_srv.port])
    yield peer
    peer.close()


def test_redsync_holder_excludes_sql_and_sql_cannot_release_it(sessions, rc, redsync):
    a = sessions()
    got = redsync.call(op="lock", key="go-job", ttl=20000)
    assert got["ok"], got
    assert rc.get("go-job") == got["value"].encode()      # SET NX PX, its own token
    assert a.run("SELECT redis_lock_try_acquire('go-job')") is False
    assert a.run("SELECT redis_lock_release('go-job')") is False
    assert rc.get("go-job") == got["value"].encode()
    assert redsync.call(op="extend")["ok"]
    assert 15000 < rc.pttl("go-job") <= 20000
    assert redsync.call(op="unlock")["ok"]
    assert a.run("SELECT redis_lock_try_acquire('go-job')") is True
    assert a.run("SELECT redis_lock_release('go-job')") is True


def test_sql_holder_excludes_redsync_and_redsync_cannot_release_it(sessions, rc, redsync):
    a = sessions()
    assert a.run("SELECT redis_lock_acquire('go-job', ttl => '20s') > 0")
    nope = redsync.call(op="lock", key="go-job", ttl=20000, tries=2, retryDelay=20)
    assert not nope["ok"] and "taken" in nope["error"], nope
    # redsync's unlock and extend compare its own value: the SQL lock stays
    assert not redsync.call(op="unlock")["ok"]
    assert not redsync.call(op="extend")["ok"]
    assert rc.get("go-job").startswith(b"pgrl:")
    assert a.run("SELECT redis_lock_release('go-job')") is True
    assert redsync.call(op="lock", key="go-job", ttl=20000)["ok"]
    assert redsync.call(op="unlock")["ok"]


def test_hand_over_both_ways(pg, sessions, rc, redsync):
    """A SQL waiter behind redsync (which never publishes) and a redsync
    waiter behind SQL both get the lock once it is released."""
    a = sessions()
    admin = pg.connect()
    assert redsync.call(op="lock", key="go-hand", ttl=20000)["ok"]
    a.start("SELECT redis_lock_acquire('go-hand', wait => '10s') > 0")
    wait_for_wait_event(admin, a.pid)
    released = time.monotonic()
    assert redsync.call(op="unlock")["ok"]
    a.join(10)
    assert a.error is None and a.result is True
    sql_latency = a.finished_at - released
    # and back: redsync retries every 10 ms while SQL holds it
    other = RedsyncPeer([rc.connection_pool.connection_kwargs["port"]])
    try:
        other.send(op="lock", key="go-hand", ttl=20000, tries=1000, retryDelay=10)
        time.sleep(0.1)              # let it fail a few tries first
        t0 = time.monotonic()
        assert a.run("SELECT redis_lock_release('go-hand')") is True
        got, at = other.receive()
        go_latency = at - t0
        assert got["ok"], got
        assert other.call(op="unlock")["ok"]
    finally:
        other.close()
        admin.close()
    report_latency("redsync v4.18.1", "redsync unlock -> SQL waiter", sql_latency)
    report_latency("redsync v4.18.1", "SQL release -> redsync retrying every 10 ms", go_latency)
    assert sql_latency < 0.5 * S
    assert go_latency < 0.5 * S


# ================================================================ Redlock, 5 masters

@pytest.fixture(scope="module")
def masters():
    ms = [testbed.Redis().start() for _ in range(5)]
    yield ms
    for m in ms:
        m.stop()


@pytest.fixture
def redlock_pg(masters):
    for m in masters:
        if m.proc.poll() is not None:
            m.start()
        m.client().flushall()
    pg = testbed.Postgres(conf={"redis_lock.nodes": ",".join(m.url for m in masters)}
                          ).init().start().with_extension()
    yield pg
    pg.cleanup()
    for m in masters:
        if m.proc.poll() is not None:
            m.start()


def values_on(masters, key):
    return [m.client().get(key) if m.proc.poll() is None else None for m in masters]


@pytest.mark.parametrize("down", [0, 2])
def test_redsync_and_sql_exclude_each_other_as_redlock(masters, redlock_pg, down):
    from conftest import Session
    for m in masters[:down]:
        m.kill()
    peer = RedsyncPeer([m.port for m in masters])
    a = Session(redlock_pg)
    try:
        got = peer.call(op="lock", key="rl-go", ttl=20000)
        assert got["ok"], got
        assert values_on(masters, "rl-go").count(got["value"].encode()) == 5 - down
        assert a.run("SELECT redis_lock_try_acquire('rl-go')") is False
        assert peer.call(op="unlock")["ok"]
        assert a.run("SELECT redis_lock_try_acquire('rl-go', ttl => '20s')") is True
        mine = [v for v in values_on(masters, "rl-go") if v is not None]
        assert len(mine) == 5 - down and all(v.startswith(b"pgrl:") for v in mine)
        nope = peer.call(op="lock", key="rl-go", ttl=20000, tries=2, retryDelay=20)
        assert not nope["ok"], nope
        assert a.run("SELECT redis_lock_release('rl-go')") is True
        assert peer.call(op="lock", key="rl-go", ttl=20000)["ok"]
        assert peer.call(op="unlock")["ok"]
    finally:
        a.close()
        peer.close()
