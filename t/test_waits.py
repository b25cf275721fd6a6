"""Who waits for whom (issue 45): the view redis_lock_waits and
redis_lock_blocking_pids(pid), src/wait/waiters.c and src/interface/waits.c.

A backend waiting for a Redis lock publishes its wait from the start; the
view joins each wait with the holders Redis reports now, and names the
backend of this server behind a holder's owner value.  Holders are real:
SQL sessions, the real Redisson (4.x, peers.JavaPeer), redis-py, and npm
redis-semaphore (peers.SemaphorePeer).  What each test would catch: a wait
not shown or shown after it ended, a holder not found or attributed to the
wrong backend (SQL, Redisson, redis-py, several readers), a holder
whose lease ends while the view is read taken for an error, a chain through
a PostgreSQL row lock shown on one side only, a LOGIN-only role seeing
other sessions' waits, Redis down hanging the view, and one round trip per
row instead of one per node.  Every test fails on main before issue 45 (the
objects do not exist)."""
import time

import psycopg2
import pytest
import redis
from redis.lock import Lock

from conftest import Session, terminating_sessions
import testbed
from testbed import TIME_SCALE as S
from test_hostile import Armed, FakeRedis, array, bulk, integer
from test_round_trips import CountingProxy, Counter, D

ROWS = ("SELECT lock_name, mode, redis_key, holder_kind, holder_pid, holder, "
        "holder_ttl > '0' AS ttl_left, waiting_since IS NOT NULL "
        "FROM redis_lock_waits WHERE pid = %s ORDER BY holder_pid, holder")


@pytest.fixture
def sessions(pg):
    """Sessions whose backends are terminated at the end of the test: one
    left waiting by a failed assertion cannot hang the teardown."""
    yield from terminating_sessions(pg)


def rows(admin, pid):
    with admin.cursor() as cur:
        cur.execute(ROWS, (pid,))
        return cur.fetchall()


def wait_for_rows(admin, pid, n=1, timeout=10):
    """Poll the view until backend pid shows n rows, then return them."""
    got = []

    def enough():
        got[:] = rows(admin, pid)
        return len(got) >= n
    testbed.wait_until(enough, timeout, what="%d row(s) of backend %d" % (n, pid))
    return got


def blocking(admin, pid):
    return testbed.sql_one(admin, "SELECT redis_lock_blocking_pids(%s)", (pid,))


def token(rc, key):
    return rc.get(key).decode()


# ---------------------------------------------------------------- SQL holders

def test_a_sql_waiter_behind_a_sql_holder(pg, sessions, rc):
    admin = pg.connect()
    a, b = sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('w-job', ttl => '30s') > 0")
    assert rows(admin, b.pid) == []
    assert blocking(admin, b.pid) == []
    b.start("SELECT redis_lock_acquire('w-job', wait => '30s')")
    got = wait_for_rows(admin, b.pid)
    assert got == [("w-job", "exclusive", "w-job", "sql", a.pid, token(rc, "w-job"), True, True)]
    assert blocking(admin, b.pid) == [a.pid]
    assert blocking(admin, a.pid) == []     # the holder waits for nothing
    a.run("SELECT redis_lock_release('w-job')")
    b.join()
    assert b.error is None
    assert rows(admin, b.pid) == []         # granted: its wait is gone
    assert blocking(admin, b.pid) == []
    admin.close()


def test_a_wait_that_ends_in_an_error_or_a_cancel_leaves_no_row(pg, sessions, rc):
    admin = pg.connect()
    a, b = sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('w-cancel', ttl => '30s') > 0")
    b.start("SELECT redis_lock_acquire('w-cancel', wait => '30s')")
    wait_for_rows(admin, b.pid)
    admin.cursor().execute("SELECT pg_cancel_backend(%s)", (b.pid,))
    b.join()
    assert isinstance(b.error, psycopg2.errors.QueryCanceled)
    assert rows(admin, b.pid) == []
    # a wait that runs out: 55P03, and no row after it
    with pytest.raises(psycopg2.errors.LockNotAvailable):
        b.run("SELECT redis_lock_acquire('w-cancel', wait => '300ms')")
    assert rows(admin, b.pid) == []
    a.run("SELECT redis_lock_release('w-cancel')")
    admin.close()


def test_read_holds_of_several_sessions_are_several_rows(pg, sessions, rc):
    admin = pg.connect()
    r1, r2, w = sessions(), sessions(), sessions()
    assert r1.run("SELECT redis_lock_acquire_read('w-rw', ttl => '30s')")
    assert r2.run("SELECT redis_lock_acquire_read('w-rw', ttl => '30s')")
    w.start("SELECT redis_lock_acquire_write('w-rw', wait => '30s')")
    got = wait_for_rows(admin, w.pid, 2)
    fields = sorted(f.decode() for f in rc.hkeys("w-rw") if f != b"mode")
    assert len(got) == 2
    assert [(g[0], g[1], g[2], g[3], g[6], g[7]) for g in got] == \
        [("w-rw", "write", "w-rw", "sql", True, True)] * 2
    assert [g[4] for g in got] == sorted([r1.pid, r2.pid])
    assert sorted(g[5] for g in got) == fields
    assert blocking(admin, w.pid) == sorted([r1.pid, r2.pid])
    r1.run("SELECT redis_lock_release_read('w-rw')")
    testbed.wait_until(lambda: blocking(admin, w.pid) == [r2.pid], 10,
                       what="the released reader gone from the blockers")
    r2.run("SELECT redis_lock_release_read('w-rw')")
    w.join()
    assert w.error is None
    admin.close()


def test_a_set_waits_for_each_of_its_busy_locks(pg, sessions, rc):
    admin = pg.connect()
    a, b, c = sessions(), sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('w-set-1', ttl => '30s') > 0")
    assert b.run("SELECT redis_lock_acquire('w-set-3', ttl => '30s') > 0")
    c.start("SELECT redis_lock_acquire_many(ARRAY['w-set-1', 'w-set-2', 'w-set-3'], wait => '30s')")
    got = wait_for_rows(admin, c.pid, 3)
    by_name = {g[0]: g for g in got}
    assert sorted(by_name) == ["w-set-1", "w-set-2", "w-set-3"]
    assert by_name["w-set-1"][3:5] == ("sql", a.pid)
    assert by_name["w-set-2"][3:6] == (None, None, None)     # free: no holder
    assert by_name["w-set-3"][3:5] == ("sql", b.pid)
    assert blocking(admin, c.pid) == sorted([a.pid, b.pid])
    a.run("SELECT redis_lock_release('w-set-1')")
    b.run("SELECT redis_lock_release('w-set-3')")
    c.join()
    assert c.error is None
    assert rows(admin, c.pid) == []
    admin.close()


# ---------------------------------------------------------------- foreign holders

def test_a_sql_waiter_behind_a_redis_py_lock(pg, sessions, rc):
    admin = pg.connect()
    b = sessions()
    lk = Lock(rc, "w-py", timeout=30)
    assert lk.acquire(blocking=False)
    b.start("SELECT redis_lock_acquire('w-py', wait => '30s')")
    got = wait_for_rows(admin, b.pid)
    assert got == [("w-py", "exclusive", "w-py", "simple", None, lk.local.token.decode(),
                    True, True)]
    assert blocking(admin, b.pid) == []     # no backend of this server holds it
    lk.release()
    b.join()
    assert b.error is None
    admin.close()


def test_a_holder_whose_lease_ends_while_the_view_is_read(pg, sessions, rc):
    """A redis-py lock of 1 s: the view, read over and over while its lease
    runs out and the SQL waiter takes the lock, never fails; each read shows
    the holder, a row without one, or no row."""
    admin = pg.connect()
    b = sessions()
    lk = Lock(rc, "w-lapse", timeout=1)
    assert lk.acquire(blocking=False)
    held = lk.local.token.decode()
    b.start("SELECT redis_lock_acquire('w-lapse', wait => '30s')")
    wait_for_rows(admin, b.pid)
    seen = set()
    deadline = time.monotonic() + 20 * S
    while b.thread.is_alive() and time.monotonic() < deadline:
        for g in rows(admin, b.pid):
            assert g[5] in (held, None), g
            seen.add("holder" if g[5] == held else "none")
    b.join()
    assert b.error is None
    assert "holder" in seen
    assert rows(admin, b.pid) == []
    admin.close()


@pytest.fixture(scope="module")
def java(redis_srv):
    """The real Redisson (its 4.x line) in a JVM of its own."""
    from peers import JavaPeer
    peer = JavaPeer([redis_srv.port], line="4", watchdog_ms=30000)
    yield peer
    peer.close()


def test_a_sql_waiter_behind_the_real_redisson(pg, sessions, rc, java):
    admin = pg.connect()
    b = sessions()
    b.run("SET redis_lock.protocol = 'redisson'")
    field = java.call("w1", "hello")
    assert java.call("w1", "lock", "w-java") is True
    b.start("SELECT redis_lock_acquire('w-java', wait => '30s')")
    got = wait_for_rows(admin, b.pid)
    assert got == [("w-java", "exclusive", "w-java", "redisson", None, field, True, True)]
    assert blocking(admin, b.pid) == []
    assert java.call("w1", "unlock", "w-java") is True
    b.join()
    assert b.error is None
    admin.close()


def test_a_sql_waiter_behind_a_redis_semaphore_holder(pg, sessions, rc, redis_srv):
    """A semaphore's permits are waited for without a holder in particular:
    the wait shows (mode permit, its key), its holder columns are NULL and
    Redis is not asked; redis-semaphore's holder taking the last permit."""
    from peers import SemaphorePeer
    admin = pg.connect()
    b = sessions()
    b.run("SET redis_lock.semaphore_protocol = 'redis_semaphore'")
    b.run("SET redis_lock.lease_time = '10s'")
    node = SemaphorePeer(redis_srv.port)
    try:
        assert node.acquire("w-exports", 1, name="n1", acquireAttemptsLimit=1)["acquired"] is True
        b.start("SELECT redis_semaphore_acquire('semaphore:w-exports', max_permits => 1, wait => '30s')")
        got = wait_for_rows(admin, b.pid)
        assert got == [("semaphore:w-exports", "permit", "semaphore:w-exports", None, None, None,
                        None, True)]
        assert blocking(admin, b.pid) == []
        node.op("release", "n1")
        b.join()
        assert b.error is None
        assert rows(admin, b.pid) == []
    finally:
        node.close()
    admin.close()


def test_a_set_shows_at_most_eight_of_its_locks(pg, sessions, rc):
    admin = pg.connect()
    a, c = sessions(), sessions()
    names = ["w-many-%02d" % i for i in range(10)]
    assert a.run("SELECT redis_lock_acquire_many(%s, ttl => '30s') IS NOT NULL", (names,))
    c.start("SELECT redis_lock_acquire_many(%s, wait => '30s')", (names,))
    got = wait_for_rows(admin, c.pid, 8)
    assert len(got) == 8
    assert {g[0] for g in got} <= set(names)
    assert {g[4] for g in got} == {a.pid}
    a.run("SELECT redis_lock_release_many(%s)", (names,))
    c.join()
    assert c.error is None
    admin.close()


# ---------------------------------------------------------------- a chain through PostgreSQL

def test_a_chain_through_a_row_lock_shows_both_waits(pg, sessions, rc):
    """C waits for a row lock of B, which waits for the Redis lock A holds:
    pg_blocking_pids() shows the first wait, redis_lock_waits the second."""
    admin = pg.connect()
    admin.cursor().execute("CREATE TABLE IF NOT EXISTS w_rows (id int PRIMARY KEY, v int);"
                           "INSERT INTO w_rows VALUES (1, 0) ON CONFLICT DO NOTHING")
    a, b, c = sessions(), sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('w-chain', ttl => '30s') > 0")
    b.run("BEGIN")
    b.run("UPDATE w_rows SET v = v + 1 WHERE id = 1")
    b.start("SELECT redis_lock_acquire('w-chain', wait => '30s', xact => true)")
    wait_for_rows(admin, b.pid)
    c.start("UPDATE w_rows SET v = v + 1 WHERE id = 1")
    testbed.wait_until(lambda: testbed.sql_one(admin, "SELECT pg_blocking_pids(%s)",
                                               (c.pid,)) == [b.pid],
                       10, what="C to wait for B's row lock")
    assert blocking(admin, b.pid) == [a.pid]
    assert blocking(admin, c.pid) == []     # C waits for no Redis lock
    chain = testbed.sql_one(admin, """
        SELECT array_agg(x ORDER BY depth) FROM (
          SELECT 1 AS depth, unnest(pg_blocking_pids(%s)) AS x
          UNION ALL
          SELECT 2, unnest(redis_lock_blocking_pids(b)) FROM unnest(pg_blocking_pids(%s)) b) s
        """, (c.pid, c.pid))
    assert chain == [b.pid, a.pid]
    a.run("SELECT redis_lock_release('w-chain')")
    b.join()
    assert b.error is None
    b.run("COMMIT")
    c.join()
    assert c.error is None
    admin.close()


# ---------------------------------------------------------------- who may look

def test_a_login_only_role_is_refused_and_pg_monitor_is_not(pg, sessions, rc):
    admin = pg.connect()
    with admin.cursor() as cur:
        cur.execute("DROP ROLE IF EXISTS w_login; DROP ROLE IF EXISTS w_monitor;"
                    "CREATE ROLE w_login LOGIN; CREATE ROLE w_monitor LOGIN IN ROLE pg_monitor")
    a, b = sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('w-priv', ttl => '30s') > 0")
    b.start("SELECT redis_lock_acquire('w-priv', wait => '30s')")
    wait_for_rows(admin, b.pid)
    login = pg.connect(user="w_login")
    for q in ["SELECT * FROM redis_lock_waits",
              "SELECT * FROM redis_lock_all_waits()",
              "SELECT redis_lock_blocking_pids(%d)" % b.pid]:
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            login.cursor().execute(q)
    login.close()
    monitor = pg.connect(user="w_monitor")
    assert rows(monitor, b.pid)[0][4] == a.pid
    assert blocking(monitor, b.pid) == [a.pid]
    monitor.close()
    a.run("SELECT redis_lock_release('w-priv')")
    b.join()
    admin.close()


# ---------------------------------------------------------------- a hostile node

HOLDER_FIELD = "0123abcd-0000-4000-8000-0123456789ab:7"


@pytest.fixture
def three_fakes():
    """A preloaded server whose locks are Redlock's on three hostile-test
    fakes (t/test_hostile.py's FakeRedis)."""
    fakes = [FakeRedis() for _ in range(3)]
    pg = testbed.Postgres(conf={
        "redis_lock.nodes": ",".join(f.url for f in fakes),
        "redis_lock.command_timeout": "2s"}).init().start().with_extension()
    yield fakes, pg
    pg.cleanup()
    for f in fakes:
        f.stop()


def test_one_node_naming_a_holder_twice_is_not_a_majority(three_fakes):
    """Redlock on three masters (a majority is two): two hold 'w-dup' for
    another client; the third answers the view's inspect with a Redisson
    hash that lists one holder field twice, which no Redis sends (a hash's
    fields are distinct).  That one node shows the field: it is not a
    holder a majority reports, so the view shows only the real one, as
    redis_lock_status counts each node once."""
    fakes, pg = three_fakes
    fakes[0].hold_foreign("w-dup")
    fakes[1].hold_foreign("w-dup")
    fakes[2].arm("inspect", Armed("raw", array(
        bulk("hash"), integer(30000), array(bulk(HOLDER_FIELD), bulk(HOLDER_FIELD)))))
    admin = pg.connect()
    b = Session(pg)
    try:
        b.start("SELECT redis_lock_acquire('w-dup', wait => '60s')")
        got = wait_for_rows(admin, b.pid)
        assert [g[5] for g in got] == ["someone-else"], got
    finally:
        admin.cursor().execute("SELECT pg_terminate_backend(%s)", (b.pid,))
        b.thread.join(10 * S)
        b.close()
        admin.close()


# ---------------------------------------------------------------- Redis down

def test_redis_down_is_an_error_with_an_errcode_not_a_hang(env):
    """Redis frozen (SIGSTOP) while B waits: reading the view fails within
    about its command_timeout, with a SQLSTATE that is not an internal
    error, and says nothing for rows it could not check."""
    r, pg, session = env
    a, b = session(), session()
    admin = session()
    assert a.run("SELECT redis_lock_acquire('w-down', ttl => '60s') > 0")
    b.run("SET redis_lock.command_timeout = '60s'")
    b.start("SELECT redis_lock_acquire('w-down', wait => '60s')")
    testbed.wait_until(lambda: testbed.sql_one(
        admin.conn, "SELECT count(*) FROM redis_lock_waits WHERE pid = %s", (b.pid,)) == 1,
        10, what="B's row")
    admin.run("SET redis_lock.command_timeout = '1s'")
    r.pause()
    try:
        for q in ["SELECT * FROM redis_lock_waits",
                  "SELECT redis_lock_blocking_pids(%d)" % b.pid]:
            t0 = time.monotonic()
            with pytest.raises(psycopg2.Error) as e:
                admin.run(q)
            took = time.monotonic() - t0
            assert e.value.pgcode is not None and not e.value.pgcode.startswith("XX"), e.value
            assert e.value.pgcode == "08006", e.value
            assert took < 5 * S, "the view took %.1f s" % took
    finally:
        r.resume()
    # Redis back: the view answers again
    assert testbed.sql_one(admin.conn, "SELECT redis_lock_blocking_pids(%s)", (b.pid,)) == [a.pid]
    a.run("SELECT redis_lock_release('w-down')")
    b.join(70)


# ---------------------------------------------------------------- one round trip

@pytest.fixture
def proxied():
    """A Redis behind a counting proxy (D each way) that the server uses."""
    record = []
    r = testbed.Redis().start()
    proxy = CountingProxy(r.port, D, record).start()
    pg = testbed.Postgres(conf={"redis_lock.url": proxy.url,
                                "redis_lock.command_timeout": "10s"}).init().start().with_extension()
    yield r, pg, record
    pg.cleanup()
    proxy.stop()
    r.stop()


def test_the_view_costs_one_round_trip_for_every_waiter(proxied):
    """Six waiters on three locks held by three sessions, one node: reading
    the view (and redis_lock_blocking_pids) waits for one round trip."""
    r, pg, record = proxied
    made = []
    try:
        holders = [Session(pg) for _ in range(3)]
        made += holders
        for i, h in enumerate(holders):
            assert h.run("SELECT redis_lock_acquire('w-rt-%d', ttl => '60s') > 0" % i)
        waiters = [Session(pg) for _ in range(6)]
        made += waiters
        for i, w in enumerate(waiters):
            w.start("SELECT redis_lock_acquire('w-rt-%d', wait => '60s')" % (i % 3))
        c = Counter(pg, record)
        made.append(c.s)
        # warm: connected, handshaken, the inspect script loaded
        testbed.wait_until(lambda: c.s.run("SELECT count(*) FROM redis_lock_waits") == 6,
                           20, what="six waits shown")
        n, out = c.count("SELECT count(DISTINCT holder_pid) FROM redis_lock_waits")
        assert out == 3
        assert n == 1, "reading the view waited for %d round trips" % n
        n, out = c.count("SELECT redis_lock_blocking_pids(%d)" % waiters[0].pid)
        assert out == [holders[0].pid]
        assert n == 1
    finally:
        for s in made:
            s.close()


# ---------------------------------------------------------------- doc/stuck.md

def stuck_page_blocks():
    """The ```sql blocks of doc/stuck.md, in order (test_docs.sql_blocks)."""
    from test_docs import sql_blocks
    return [code for _, code, _ in sql_blocks("doc/stuck.md")]


def run_all(conn, q):
    with conn.cursor() as cur:
        cur.execute(q)
        return [list(r) for r in cur.fetchall()] if cur.description else []


def test_the_stuck_page_leads_from_the_wait_to_its_holders(pg, sessions, rc):
    """Every query of doc/stuck.md, in order, while B waits for
    'nightly-import' held by SQL session A and C waits for 'report-export'
    held by redis-py: each finds what the page says it finds, the
    terminate hands the lock to B, and the force release hands C the lock
    while the redis-py holder learns it only at its release."""
    admin = pg.connect()
    a, b, c = sessions(), sessions(), sessions()
    assert a.run("SELECT redis_lock_acquire('nightly-import') > 0")
    lk = Lock(rc, "report-export", timeout=60)
    assert lk.acquire(blocking=False)
    b.start("SELECT redis_lock_acquire('nightly-import', wait => '60s')")
    c.start("SELECT redis_lock_acquire('report-export', wait => '60s')")
    wait_for_rows(admin, b.pid)
    wait_for_rows(admin, c.pid)
    (activity, waits, sql_holder, side_by_side, terminate, foreign,
     force) = stuck_page_blocks()

    assert {r[0] for r in run_all(admin, activity)} >= {b.pid, c.pid}
    got = {r[0]: r for r in run_all(admin, waits)}
    assert got[b.pid][1:3] + got[b.pid][4:6] == ["nightly-import", "exclusive", "sql", a.pid]
    assert got[c.pid][1:3] + got[c.pid][4:7] == ["report-export", "exclusive", "simple", None,
                                                 lk.local.token.decode()]
    assert [(r[0], r[2]) for r in run_all(admin, sql_holder)] == [(b.pid, a.pid)]
    chain = {r[0]: r for r in run_all(admin, side_by_side)}
    assert chain[b.pid][1:3] == [[], [a.pid]]
    assert chain[c.pid][1:3] == [[], []]
    assert [r[:3] for r in run_all(admin, foreign)] == [[c.pid, "report-export", "simple"]]

    assert run_all(admin, terminate) == [[True]]
    b.join()
    assert b.error is None

    assert run_all(admin, force) == [[True]]
    c.join()
    assert c.error is None
    with pytest.raises(redis.exceptions.LockNotOwnedError):
        lk.release()
    admin.close()
