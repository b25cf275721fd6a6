"""Redis failing under a session: unknown outcomes, dead connections, restarts."""
import time

import psycopg2
import pytest

from conftest import Session
import testbed


@pytest.fixture
def own_redis():
    r = testbed.Redis().start()
    yield r
    r.stop()


@pytest.fixture
def own_pg(own_redis):
    p = testbed.Postgres(conf={"redis_lock.url": own_redis.url}).init().start()
    with p.connect() as c:
        c.cursor().execute("CREATE EXTENSION redis_lock")
    yield p
    p.cleanup()


def test_acquire_with_unknown_outcome_is_not_believed_and_is_cleaned_up(own_redis, own_pg):
    """Redis frozen mid-acquire: the command timeout fires, the session does not
    count the lock as held, and the grant Redis makes after it thaws is deleted
    at the next call."""
    rc = own_redis.client()
    s = Session(own_pg)
    s.run("SET redis_lock.command_timeout = '300ms'")
    assert s.run("SELECT redis_lock_acquire('warmup') > 0")     # connection is open
    own_redis.pause()
    try:
        t0 = time.monotonic()
        with pytest.raises(psycopg2.OperationalError) as ei:
            s.run("SELECT redis_lock_acquire('frozen', ttl => '60s')")
        assert ei.value.pgcode == "08006"
        assert "did not reply within 300ms" in str(ei.value)
        assert time.monotonic() - t0 < 1.0
    finally:
        own_redis.resume()
    # once thawed, Redis executes the queued acquire: the key is ours...
    testbed.wait_until(lambda: rc.exists("frozen") == 1, 5, what="queued acquire to run")
    assert rc.get("frozen").startswith(b"pgrl:")
    # ... but the session never counted it, and its next call settles the doubt
    assert s.run("SELECT array_agg(lock_name) FROM redis_lock_held()") == ["warmup"]
    assert rc.exists("frozen") == 0
    s.close()


def test_redis_restart_reconnects_and_reports_vanished_locks(own_redis, own_pg):
    rc = own_redis.client()
    s = Session(own_pg)
    assert s.run("SELECT redis_lock_acquire('survivor', ttl => '60s') > 0")
    own_redis.restart()          # no persistence: the key is gone
    assert rc.exists("survivor") == 0
    # the next call reconnects transparently; the release reports the loss
    assert s.run("SELECT redis_lock_release('survivor')") is False
    assert s.run("SELECT redis_lock_acquire('after-restart') > 0")
    assert rc.exists("after-restart") == 1
    assert s.run("SELECT redis_lock_release('after-restart')") is True
    s.close()


def test_redis_down_gives_clear_errors_and_no_hang(own_redis, own_pg):
    s = Session(own_pg)
    assert s.run("SELECT redis_lock_acquire('held-when-down', ttl => '60s') > 0")
    own_redis.stop()
    t0 = time.monotonic()
    with pytest.raises(psycopg2.Error) as ei:
        s.run("SELECT redis_lock_acquire('while-down')")
    assert ei.value.pgcode in ("08001", "08006")
    assert "127.0.0.1:%d" % own_redis.port in str(ei.value)
    assert time.monotonic() - t0 < 3
    # release of a held lock while Redis is down: an error, and the session
    # no longer counts it (it expires with its lease)
    with pytest.raises(psycopg2.Error):
        s.run("SELECT redis_lock_release('held-when-down')")
    assert s.run("SELECT count(*) FROM redis_lock_held()") == 0
    own_redis.start()
    assert s.run("SELECT redis_lock_acquire('back') > 0")
    s.close()
