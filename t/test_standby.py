"""Hot standby (issue 35, item 6): reporting and batch jobs often run on a
streaming replica.  A preloaded standby made by pg_basebackup -R from a
preloaded primary, both on the same Redis: locks taken on either exclude
the other; the standby's watchdog renews; transaction scope and
redis_lock_with_lock work there; a fenced write cannot happen there (the
server is read-only: PostgreSQL refuses the write before any trigger); a
promotion leaves the locks held on the standby held and renewed."""
import os
import time

import psycopg2
import pytest

from conftest import Session
import testbed


class Standby(testbed.Postgres):
    """A streaming replica of primary, made with pg_basebackup -R."""

    def __init__(self, primary):
        super().__init__(preload=True)
        self.primary = primary

    def init(self):
        # (the base directory exists already, owned by the server's user)
        self._run([testbed.PGBIN + "/pg_basebackup", "-h", "127.0.0.1",
                   "-p", str(self.primary.port), "-U", "postgres", "-D", self.data,
                   "-R", "-X", "stream", "--no-sync"])
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write("port = %d\nunix_socket_directories = '%s'\nhot_standby = on\n"
                    % (self.port, self.base))
        return self

    def promote(self):
        self._run([testbed.PGBIN + "/pg_ctl", "-D", self.data, "-w", "promote"])


@pytest.fixture(scope="module")
def pair():
    r = testbed.Redis().start()
    primary = testbed.Postgres(conf={"redis_lock.url": r.url,
                                     "redis_lock.lease_time": "2s"}).init().start().with_extension()
    c = primary.connect()
    c.cursor().execute("CREATE TABLE fenced_rows (v text, token bigint)")
    c.cursor().execute("CREATE TRIGGER fenced BEFORE INSERT OR UPDATE ON fenced_rows "
                       "FOR EACH ROW EXECUTE FUNCTION redis_lock_fence_guard('rows', 'token')")
    c.close()
    standby = Standby(primary).init().start()
    sc = standby.connect()
    testbed.wait_until(lambda: testbed.sql_one(
        sc, "SELECT count(*) FROM pg_extension WHERE extname = 'redis_lock'") == 1
        and testbed.sql_one(sc, "SELECT pg_is_in_recovery()"), 30, 0.1,
        what="the standby to replay the extension")
    sc.close()
    yield r, primary, standby
    standby.cleanup()
    primary.cleanup()
    r.stop()


def test_locks_on_the_standby_and_the_primary_exclude_each_other(pair):
    r, primary, standby = pair
    p, s = Session(primary), Session(standby)
    assert s.run("SELECT pg_is_in_recovery()") is True
    assert p.run("SELECT redis_lock_acquire('shared-job') > 0")
    assert s.run("SELECT redis_lock_try_acquire('shared-job')") is False
    assert p.run("SELECT redis_lock_release('shared-job')") is True
    assert s.run("SELECT redis_lock_acquire('shared-job') > 0")
    assert p.run("SELECT redis_lock_try_acquire('shared-job')") is False
    assert s.run("SELECT redis_lock_release('shared-job')") is True
    p.close()
    s.close()


def test_the_standbys_watchdog_renews(pair):
    r, primary, standby = pair
    s = Session(standby)
    rc = r.client()
    assert s.run("SELECT redis_lock_acquire('standby-long') > 0")     # 2 s lease
    s.start("SELECT pg_sleep(4)")
    renewals, last, end = 0, None, time.monotonic() + 3.5
    while time.monotonic() < end:
        pttl = rc.pttl("standby-long")
        assert pttl > 0, "the standby's lock expired while held"
        if last is not None and pttl > last + 200:
            renewals += 1
        last = pttl
        time.sleep(0.02)
    s.join(10)
    assert s.error is None
    assert renewals >= 3
    assert s.run("SELECT lost FROM redis_lock_held()") is False
    assert s.run("SELECT redis_lock_release('standby-long')") is True
    s.close()


def test_transaction_scope_and_with_lock_on_the_standby(pair):
    r, primary, standby = pair
    s = Session(standby)
    rc = r.client()
    s.run("BEGIN")
    assert s.run("SELECT redis_lock_acquire('standby-x', xact => true) > 0")
    assert rc.exists("standby-x")
    s.run("COMMIT")                     # the verify runs; then the release
    testbed.wait_until(lambda: not rc.exists("standby-x"), 5, 0.01, what="release at COMMIT")
    assert s.run("SELECT redis_lock_with_lock('standby-w', 'SELECT 1')") == 1
    s.close()


def test_a_fenced_write_cannot_happen_on_the_standby(pair):
    r, primary, standby = pair
    s = Session(standby)
    token = s.run("SELECT redis_lock_acquire('rows')")
    with pytest.raises(psycopg2.Error) as ei:
        s.run("INSERT INTO fenced_rows VALUES ('x', %s)", (token,))
    assert ei.value.pgcode == "25006"       # read-only transaction
    # the marks are readable there, as on the primary
    assert s.run("SELECT count(*) FROM redis_lock_fence_marks") == 0
    assert s.run("SELECT redis_lock_release('rows')") is True
    s.close()


def test_a_promotion_keeps_the_standbys_locks_held_and_renewed(pair):
    """Last in this module: it promotes the standby."""
    r, primary, standby = pair
    s = Session(standby)
    rc = r.client()
    assert s.run("SELECT redis_lock_acquire('through-promotion') > 0")
    standby.promote()
    testbed.wait_until(lambda: s.run("SELECT pg_is_in_recovery()") is False, 30, 0.1,
                       what="the promotion")
    # renewed on after it: the 2 s lease is refreshed over 3 s
    renewals, last, end = 0, None, time.monotonic() + 3
    while time.monotonic() < end:
        pttl = rc.pttl("through-promotion")
        assert pttl > 0, "the lock expired across the promotion"
        if last is not None and pttl > last + 200:
            renewals += 1
        last = pttl
        time.sleep(0.02)
    assert renewals >= 2
    assert s.run("SELECT lost FROM redis_lock_held()") is False
    # the promoted server takes fenced writes now
    token = s.run("SELECT redis_lock_acquire('rows')")
    s.run("INSERT INTO fenced_rows VALUES ('y', %s)", (token,))
    assert s.run("SELECT redis_lock_release('rows')") is True
    assert s.run("SELECT redis_lock_release('through-promotion')") is True
    s.close()
