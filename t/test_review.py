"""Adversarial review of issues 33 and 34 (helper "review").  Each test
reproduces a suspected defect against main as it is; a test that fails
is a defect found (see the report), one that passes is a check that held."""
import os
import signal
import time

import psycopg2
import pytest

from conftest import Session
import testbed
from renewals import watchdog_pids

LEASE = 3.0
DETECT = LEASE / 3 + 0.2


@pytest.fixture(scope="module")
def lenv():
    r = testbed.Redis().start()
    pg = testbed.Postgres(conf={"redis_lock.url": r.url,
                                "redis_lock.lease_time": "3s",
                                "redis_lock.command_timeout": "1s",
                                "redis_lock.connect_timeout": "1s"}).init().start().with_extension()
    admin = pg.connect()
    yield r, pg, admin
    admin.close()
    pg.cleanup()
    r.stop()


@pytest.fixture
def env(lenv):
    r, pg, admin = lenv
    if r.proc.poll() is not None:
        r.start()
    rc = r.client()
    rc.flushall()
    made = []

    def session(**kw):
        s = Session(pg, **kw)
        made.append(s)
        return s
    yield r, rc, pg, admin, session
    r.resume()
    for s in made:
        s.close()


def running(admin, pid):
    return testbed.sql_one(admin, "SELECT state = 'active' FROM pg_stat_activity "
                           "WHERE pid = %s", (pid,))


def ended_with(s, timeout):
    s.join(timeout)
    return s.error


def test_a_caught_with_lock_loss_does_not_turn_a_later_timeout_into_a_loss(env):
    """locklost.c dropped_loss: set by rl_lost_note_before_drop on
    with_lock's error path, cleared only when an error is *emitted*.  If the
    cancel is caught (PL/pgSQL handler), it stays set, and the next
    unrelated 57014 of the session (statement_timeout, a user's cancel)
    is rewritten to 40001 'Redis lock "wl" was lost'."""
    r, rc, pg, admin, session = env
    a = session()
    a.start("DO $$ BEGIN PERFORM redis_lock_with_lock('wl', 'SELECT pg_sleep(60)'); "
            "EXCEPTION WHEN query_canceled THEN RAISE NOTICE 'caught %', SQLSTATE; END $$")
    testbed.wait_until(lambda: rc.exists("wl") and running(admin, a.pid), 5,
                       what="wrapped query running")
    rc.delete("wl")
    assert ended_with(a, DETECT + 2) is None
    assert [n for n in a.conn.notices if "caught 57014" in n]
    a.run("SELECT 1")
    assert a.run("SELECT count(*) FROM redis_lock_held()") == 0
    # minutes later, no lock held at all: a plain statement_timeout
    a.run("SET statement_timeout = '200ms'")
    with pytest.raises(psycopg2.Error) as ei:
        a.run("SELECT pg_sleep(2)")
    a.run("RESET statement_timeout")
    assert ei.value.pgcode == "57014", (ei.value.pgcode, str(ei.value))


def test_the_loss_is_40001_whatever_log_min_messages_says(env):
    """emit_log_hook is called only when the error goes to the server log
    (edata->output_to_server): with log_min_messages = log, fatal or panic
    an ERROR is not logged, the rewrite never runs and the holder gets
    'canceling statement due to user request' (57014)."""
    r, rc, pg, admin, session = env
    a = session()
    a.run("SET log_min_messages = log")
    assert a.run("SELECT redis_lock_acquire('quiet') > 0")
    a.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    rc.delete("quiet")
    err = ended_with(a, DETECT + 2)
    assert err is not None
    assert err.pgcode == "40001", (err.pgcode, str(err))


def test_a_downgrade_still_works_after_a_doubt_of_another_lock(env):
    """rl_new_owner_identity (protocol.c), called by rl_lt_renew_owner for
    any Redisson-layout doubt retried, replaces the backend's one
    "<uuid>:<pid>" field.  A write hold taken before keeps the old field;
    a read of the same name by the same session (a downgrade, supported:
    test_rwlock's test_renewing_a_write_hold_never_shortens_...) now goes
    with the new one, and Redisson's read script refuses it: the session
    waits on itself."""
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire_write('dg2', ttl => '60s')") is True
    before = set(rc.hgetall("dg2"))
    # a doubt of another read-write lock: Redis silent past command_timeout;
    # the worker stopped so that it stays a doubt until the retry
    workers = watchdog_pids(pg.postmaster_pid())
    r.pause()
    try:
        with pytest.raises(psycopg2.Error):
            a.run("SELECT redis_lock_acquire_read('other', ttl => '60s')")
        for w in workers:
            os.kill(w, signal.SIGSTOP)
        r.resume()
        assert a.run("SELECT redis_lock_acquire_read('other', ttl => '60s')") is True
    finally:
        r.resume()
        for w in workers:
            os.kill(w, signal.SIGCONT)
    print(before, rc.hgetall("other"))
    ok = a.run("SELECT redis_lock_acquire_read('dg2', wait => '1s')")
    assert ok is True, (ok, rc.hgetall("dg2"))
