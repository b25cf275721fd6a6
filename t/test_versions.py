"""What differs between PostgreSQL majors, checked on whichever major the
test bed runs (scripts/matrix runs this file on every major):

- on 18 and later the module reports its name and version
  (PG_MODULE_MAGIC_EXT) through pg_get_loaded_modules(); before 18 that
  function does not exist;
- on 17 and later a backend waiting for a lock another session holds shows
  our RedisLockRelease wait event in pg_stat_activity, before 17 the
  generic Extension one (the other wait events of ours, RedisLockQueue
  among them, are not asserted here);
- on 15 and later the hidden settings (the passwords) are kept out of
  postgresql.conf.sample as well as SHOW ALL (pg_settings_get_flags());
  skipped before 15.

Each test asserts what its major must show, so none of them passes on a
server that shows something else."""
import re

import pytest

from conftest import Session
import testbed


def server_version(pg):
    c = pg.connect()
    try:
        return int(testbed.sql_one(c, "SHOW server_version_num"))
    finally:
        c.close()


def test_loaded_module_reports_its_name_and_version(pg):
    control = open(__file__.rsplit("/t/", 1)[0] + "/redis_lock.control").read()
    version = re.search(r"default_version = '([\d.]+)'", control).group(1)
    s = Session(pg)
    try:
        s.run("SELECT count(*) FROM redis_lock_held()")   # the module is loaded here
        if server_version(pg) < 180000:
            assert s.run("SELECT count(*) FROM pg_proc "
                         "WHERE proname = 'pg_get_loaded_modules'") == 0
            return
        row = s.run("SELECT module_name, version FROM pg_get_loaded_modules() "
                    "WHERE file_name = 'redis_lock.so'")
        assert row == ("redis_lock", version)
    finally:
        s.close()


def test_a_waiter_shows_the_wait_event_of_its_major(pg, rc, sessions):
    holder, waiter, admin = sessions(), sessions(), sessions()
    assert holder.run("SELECT redis_lock_acquire('we') > 0")
    waiter.start("SELECT redis_lock_acquire('we', wait => '10s')")

    # the waiter passes through other waits of ours (RedisLockReply while its
    # first attempt is answered) before it settles in the wait for a release
    want = ("Extension/RedisLockRelease" if server_version(pg) >= 170000
            else "Extension/Extension")
    seen = []

    def settled():
        seen.append(admin.run("SELECT wait_event_type || '/' || wait_event "
                              "FROM pg_stat_activity WHERE pid = %s", (waiter.pid,)))
        return seen[-1] == want
    try:
        testbed.wait_until(settled, 10, what="the waiter to show " + want)
    except TimeoutError:
        raise AssertionError("waiter showed %s, never %s" % (sorted(set(map(str, seen))), want))
    assert holder.run("SELECT redis_lock_release('we')") is True
    waiter.join(10)
    assert waiter.error is None


def test_hidden_settings_are_not_in_the_sample_file(pg):
    """A setting hidden from SHOW ALL must also be kept out of
    postgresql.conf.sample: PostgreSQL 16 and later check that at startup
    in builds with assertions (check_GUC_init), which then refuse to load
    the module.  pg_settings_get_flags() shows the flags on 15 and later."""
    s = Session(pg)
    try:
        s.run("SELECT count(*) FROM redis_lock_held()")   # the settings are defined
        if server_version(pg) < 150000:
            pytest.skip("pg_settings_get_flags() is new in PostgreSQL 15")
        # pg_settings leaves the hidden ones out: name them
        for name in ("redis_lock.password", "redis_lock.sentinel_password"):
            flags = s.run("SELECT pg_settings_get_flags(%s)", (name,))
            assert "NO_SHOW_ALL" in flags and "NOT_IN_SAMPLE" in flags, (name, flags)
    finally:
        s.close()
