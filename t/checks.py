"""Checks every failure test ends with (t/test_guarantees.py, the fault matrix).

After any fault, three things must hold, whatever the fault did:

* the backend still answers interrupts: query cancel, statement_timeout and
  termination end a wait within 1 s (a soft path that swallowed an error
  could have corrupted the interrupt hold-off count and made it deaf);
* what the session believes it holds equals what Redis holds for it;
* no lease is renewed for a lock no session holds.
"""
import threading
import time

import psycopg2

import testbed
from testbed import TIME_SCALE as S


def timed_error(conn, query, timeout=30):
    """Run query; return (elapsed seconds, exception or None)."""
    t0 = time.monotonic()
    try:
        with conn.cursor() as cur:
            cur.execute(query)
        return time.monotonic() - t0, None
    except psycopg2.Error as e:
        return time.monotonic() - t0, e


def start_sleeping(admin, conn, pid, box):
    """Start a 30 s pg_sleep in conn (its outcome goes to box) and return
    its thread once the backend sleeps."""
    def sleeper():
        box["elapsed"], box["error"] = timed_error(conn, "SELECT pg_sleep(30)")
    t = threading.Thread(target=sleeper, daemon=True)
    t.start()
    testbed.wait_until(lambda: testbed.sql_one(
        admin, "SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = %s",
        (pid,)), 10, what="backend to sleep")
    return t


def assert_interruptible(pg, conn, pid, terminate=False):
    """Cancel and statement_timeout end a 30 s wait of this backend within
    1 s; with terminate, so does pg_terminate_backend (the backend is gone
    afterwards)."""
    admin = pg.connect()
    try:
        # query cancel
        box = {}
        t = start_sleeping(admin, conn, pid, box)
        sent = time.monotonic()
        assert testbed.sql_one(admin, "SELECT pg_cancel_backend(%s)", (pid,))
        t.join(30)
        assert not t.is_alive() and box["error"] is not None, "cancel was ignored"
        assert box["error"].pgcode == "57014"
        assert time.monotonic() - sent < 1.0 * S, "cancel took %.2fs" % (time.monotonic() - sent)

        # statement_timeout
        with conn.cursor() as cur:
            cur.execute("SET statement_timeout = '300ms'")
        elapsed, err = timed_error(conn, "SELECT pg_sleep(30)")
        with conn.cursor() as cur:
            cur.execute("RESET statement_timeout")
        assert err is not None and err.pgcode == "57014", "statement_timeout was ignored"
        assert elapsed < 1.3 * S, "statement_timeout took %.2fs" % elapsed

        if terminate:
            box.clear()
            t = start_sleeping(admin, conn, pid, box)
            sent = time.monotonic()
            assert testbed.sql_one(admin, "SELECT pg_terminate_backend(%s)", (pid,))
            testbed.wait_until(lambda: not testbed.sql_one(
                admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)),
                1.0, 0.01, what="terminated backend to exit")
            assert time.monotonic() - sent < 1.0 * S
            t.join(10)
    finally:
        admin.close()


def held_names(conn):
    with conn.cursor() as cur:
        cur.execute("SELECT coalesce(array_agg(lock_name ORDER BY lock_name), '{}') "
                    "FROM redis_lock_held() WHERE NOT lost")
        return set(cur.fetchone()[0])


def mine_in_redis(conn, names):
    """Of names, those whose key in Redis carries this session's token."""
    out = set()
    with conn.cursor() as cur:
        for n in names:
            cur.execute("SELECT held_by_me FROM redis_lock_status(%s)", (n,))
            if cur.fetchone()[0]:
                out.add(n)
    return out


def assert_belief_matches_redis(conn, names):
    """For every name in names: the session counts it as held exactly when
    Redis holds this session's token under its key.  Call it once Redis
    answers again (redis_lock_status asks Redis; the call also settles any
    doubt first, as every redis_lock call does)."""
    believed = held_names(conn) & set(names)
    in_redis = mine_in_redis(conn, names)
    assert believed == in_redis, "session believes %s, Redis holds %s" % (
        sorted(believed), sorted(in_redis))


def assert_not_renewed(rclient, key, seconds):
    """The key's TTL only goes down for `seconds` (or the key goes away):
    nobody renews it."""
    last = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pttl = rclient.pttl(key)
        if pttl < 0:
            return
        if last is not None:
            assert pttl <= last + 50, "lease of %s was renewed: %d ms -> %d ms" % (key, last, pttl)
        last = pttl
        time.sleep(0.02)


def count_renewals(rclient, key, seconds, why, jump_ms=200):
    """Watch key for `seconds`: it must exist all along (else fail with
    why); returns how often its TTL jumped up, i.e. how often it was renewed."""
    renewals, last = 0, None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pttl = rclient.pttl(key)
        assert pttl > 0, why
        if last is not None and pttl > last + jump_ms:
            renewals += 1
        last = pttl
        time.sleep(0.02)
    return renewals


def report_latency(client, what, seconds):
    """One hand-over measurement, printed for `pytest -s` (the hand-over times of doc/clients.md)."""
    print("\n[%s] %s: %.1f ms" % (client, what, seconds * 1000))
