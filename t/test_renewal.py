"""The watchdog's renewals never shorten a lease, and notice when another
client cut one short (src/watchdog.c note_cut_lease, the extend scripts of
src/scripts.c).  What each test would catch:
- a renewal that sets the lease it was sent with, undoing a longer one set
  meanwhile (redis_lock_extend racing a renewal under way, issue 22 item
  3), for every layout;
- a SQL read hold lost while the session believes it holds it, because a
  Redisson reader's renewal set every reader's timeout key (3.52) or the
  hash (4.7) to Redisson's shorter lockWatchdogTimeout, letting a Redisson
  writer in — with the real Redisson 3.52.0 and 4.7.0.
"""
import time

import pytest

from peers import JavaPeer, REDISSON_LINES
import testbed
from testbed import TIME_SCALE as S

LAYOUTS = {
    # layout: (SQL to take it, keys whose TTL a renewal restarts)
    "simple": ("SELECT redis_lock_acquire('rn') > 0", ["rn"]),
    "redisson": ("SELECT redis_lock_acquire('rn') > 0", ["rn"]),
    "redisson_fair": ("SELECT redis_lock_acquire('rn') > 0", ["rn"]),
    "read": ("SELECT redis_lock_acquire_read('rn') IS NOT NULL", ["rn", "timeout"]),
    "write": ("SELECT redis_lock_acquire_write('rn') IS NOT NULL", ["rn"]),
}


def timeout_keys(rc, name):
    return sorted(k.decode() for k in rc.scan_iter("{%s}:*:rwlock_timeout:*" % name))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_renewal_never_shortens_a_longer_lease(sessions, rc, layout):
    """A watchdog lock with a 600 ms lease is renewed every 200 ms.  Its
    keys are given 60 s (as a longer extend does) between two renewals: the
    renewals that follow must leave them at about 60 s, not put 600 ms back."""
    s = sessions()
    if layout in ("simple", "redisson", "redisson_fair"):
        s.run("SET redis_lock.protocol = %s", (layout,))
    s.run("SET redis_lock.lease_time = '600ms'")
    take, keys = LAYOUTS[layout]
    assert s.run(take)
    keys = [k for k in keys if k != "timeout"] + (timeout_keys(rc, "rn") if "timeout" in keys else [])
    assert keys and all(rc.exists(k) for k in keys), keys
    for k in keys:
        rc.pexpire(k, 60000)
    time.sleep(1.0)          # five renewal periods
    for k in keys:
        assert rc.pttl(k) > 55000, "%s: a renewal cut %s back to %d ms" % (layout, k, rc.pttl(k))
    assert s.run("SELECT count(*) FROM redis_lock_held() WHERE NOT lost") == 1


def test_a_read_hold_cut_short_by_another_reader_is_renewed_sooner(sessions, rc, pg):
    """Another reader's renewal keeps cutting our read hold's timeout key
    and the hash to 1 s, every 300 ms for 2.5 s, then stops (as a Redisson
    reader that unlocks or dies does).  Our lease is 6 s, renewed every 2 s:
    without noticing the cut, the hold would run out 1 s after the last cut.
    The worker notices it at its next renewal and renews every third of
    what it found: the hold survives, in Redis and in the session's view."""
    s = sessions()
    s.run("SET redis_lock.lease_time = '6s'")
    assert s.run("SELECT redis_lock_acquire_read('cut') IS NOT NULL")
    mine, = timeout_keys(rc, "cut")
    since = len(pg.log_text())
    t_end = time.monotonic() + 2.5
    while time.monotonic() < t_end:
        rc.pexpire(mine, 1000)
        rc.pexpire("cut", 1000)
        time.sleep(0.3)
    # 3 s after the last cut: 1 s would have been its end
    time.sleep(3.0)
    assert rc.exists(mine) and rc.exists("cut"), "the read hold ran out after the cut"
    assert rc.pttl(mine) > 1000
    assert s.run("SELECT count(*) FROM redis_lock_held() WHERE NOT lost") == 1
    assert "cut to" in pg.log_text()[since:], "the worker did not report the cut lease"


@pytest.fixture(params=REDISSON_LINES, ids=lambda line: "redisson-" + line)
def short_watchdog_reader(request, redis_srv):
    """A Redisson client whose lockWatchdogTimeout is 1.5 s."""
    peer = JavaPeer([redis_srv.port], line=request.param, watchdog_ms=1500)
    yield peer
    try:
        peer.close()
    except Exception:  # noqa: BLE001 - a killed JVM
        pass


def test_a_sql_read_hold_survives_a_redisson_reader_with_a_shorter_watchdog(
        short_watchdog_reader, sessions, rc):
    """SQL takes a read hold with a 9 s lease (renewed every 3 s); a
    Redisson reader with a 1.5 s lockWatchdogTimeout joins and renews,
    cutting what it renews to 1.5 s, then goes away just after one of our
    renewals: on Redisson 3.x it unlocks, on 4.x its JVM is killed.  The SQL hold must survive, and a
    Redisson writer must stay out while SQL holds it."""
    peer = short_watchdog_reader
    s = sessions()
    s.run("SET redis_lock.lease_time = '9s'")
    assert s.run("SELECT redis_lock_acquire_read('jrw') IS NOT NULL")
    assert peer.call("reader", "rwlock", "read", "jrw") is True
    # Redisson renews every 0.5 s, cutting the hash (and on 3.x our timeout
    # key) to 1.5 s; we renew every 3 s.  Go away just after one of our
    # renewals, so that our next one by the lease alone would come only
    # after the cut has run out.
    testbed.wait_until(lambda: 0 < rc.pttl("jrw") < 2000, 10, 0.01, what="Redisson's cut")
    testbed.wait_until(lambda: rc.pttl("jrw") > 5000, 10, 0.01, what="our renewal")
    time.sleep(0.7)      # Redisson cuts once more
    if peer.line.startswith("3"):
        assert peer.call("reader", "rwunlock", "read", "jrw") is True
    else:
        peer.proc.kill()
        peer.proc.wait(10)
        peer = JavaPeer([peer_port(rc)], line=peer.line, watchdog_ms=1500)
    try:
        time.sleep(3.0)  # 1.5 s would have ended a hold cut to 1.5 s
        assert s.run("SELECT count(*) FROM redis_lock_held() WHERE NOT lost") == 1
        assert rc.exists("jrw")
        # a Redisson writer stays out while SQL holds the read lock
        assert peer.call("writer", "rwtrylock", "write", "jrw", 0, 5000) is False
        assert s.run("SELECT redis_lock_release_read('jrw')") is True
        assert peer.call("writer", "rwtrylock", "write", "jrw", 2000, 5000) is True
        assert peer.call("writer", "rwunlock", "write", "jrw") is True
    finally:
        if peer is not short_watchdog_reader:
            peer.close()


def peer_port(rc):
    return rc.connection_pool.connection_kwargs["port"]
