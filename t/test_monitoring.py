"""monitoring/queries.yaml, the postgres_exporter custom queries: the file's
shape, and every query of it run against a server holding exclusive, read,
write and lost locks with a backend waiting, checked value by value.

postgres_exporter itself is not run (it is not packaged here): what is tested
is the file as the exporter reads it and the SQL it would run.  Also what
pg_shmem_allocations shows of the extension (doc/operations.md)."""
import decimal
import os
import re
import time

import psycopg2
import pytest

from conftest import wait_for_wait_event
import testbed

try:
    import yaml
except ImportError:  # Debian: python3-yaml (scripts/install-deps)
    yaml = None

QUERIES = os.path.join(os.path.dirname(__file__), "..", "monitoring", "queries.yaml")
USAGES = {"LABEL", "COUNTER", "GAUGE"}
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
MODES = ("exclusive", "read", "write")
LEASE_S = 1.5


def load_queries():
    assert yaml is not None, "python3-yaml is needed to read monitoring/queries.yaml"
    with open(QUERIES) as f:
        return yaml.safe_load(f)


def declared(spec):
    """[(column, usage, description)] of one namespace, in file order."""
    out = []
    for item in spec["metrics"]:
        assert isinstance(item, dict) and len(item) == 1, item
        (column, attrs), = item.items()
        out.append((column, attrs["usage"], attrs["description"]))
    return out


def scrape(conn):
    """Run every query of the file, as the exporter would, one transaction
    each; check each result against what the file declares; return
    {namespace: [row as dict]}."""
    result = {}
    for ns, spec in load_queries().items():
        cols = declared(spec)
        with conn.cursor() as cur:
            cur.execute(spec["query"])          # no parameters: % is literal
            names = [d.name for d in cur.description]
            rows = [dict(zip(names, r)) for r in cur.fetchall()]
        assert sorted(names) == sorted(c for c, _, _ in cols), \
            "%s: query returns %s, file declares %s" % (ns, names, [c for c, _, _ in cols])
        for row in rows:
            for column, usage, _ in cols:
                v = row[column]
                if usage == "LABEL":
                    assert isinstance(v, str), (ns, column, v)
                else:
                    assert isinstance(v, (int, float, decimal.Decimal)) \
                        and not isinstance(v, bool), (ns, column, v)
                    assert v >= 0, (ns, column, v)
        labels = [c for c, u, _ in cols if u == "LABEL"]
        keys = [tuple(r[c] for c in labels) for r in rows]
        assert len(keys) == len(set(keys)), "%s: two rows with labels %s" % (ns, keys)
        result[ns] = rows
    return result


def by_labels(rows, *labels):
    return {tuple(r[c] for c in labels) if len(labels) > 1 else r[labels[0]]: r
            for r in rows}


COUNTERS = ("acquired_total", "failed_total", "timed_out_total", "waits_total",
            "wait_seconds_total", "renewals_total", "lost_total",
            "reconnects_total", "released_total")


def counters(snapshot):
    rows = snapshot["redis_lock_stats"]
    assert len(rows) == 1
    return {k: float(rows[0][k]) for k in COUNTERS}


@pytest.fixture(scope="module")
def monitor_user(pg):
    """A non-superuser with pg_monitor, set up as doc/operations.md says."""
    c = pg.connect()
    try:
        c.cursor().execute("CREATE ROLE rl_monitor LOGIN IN ROLE pg_monitor")
    finally:
        c.close()
    return "rl_monitor"


def test_the_file_is_what_postgres_exporter_reads(pg, sessions, rc, monitor_user):
    doc = load_queries()
    assert set(doc) == {"redis_lock_stats", "redis_lock_locks", "redis_lock_waiters"}
    seen = set()
    for ns, spec in doc.items():
        assert set(spec) <= {"query", "master", "metrics", "cache_seconds"}, spec.keys()
        assert spec["master"] is True, ns        # server-wide: one database only
        assert isinstance(spec["query"], str) and spec["query"].strip()
        for column, usage, description in declared(spec):
            assert usage in USAGES, (ns, column, usage)
            assert isinstance(description, str) and description.strip(), (ns, column)
            if usage == "LABEL":
                continue
            name = "%s_%s" % (ns, column)
            assert METRIC_NAME.match(name) and name not in seen, name
            seen.add(name)
            # Prometheus naming: counters end in _total, units are seconds
            assert name.endswith("_total") == (usage == "COUNTER"), name
            assert "_ms" not in name, name
    # the documentation's table (doc/operations.md) lists exactly these
    # metrics, with these types
    readme = os.path.join(os.path.dirname(__file__), "..", "doc", "operations.md")
    with open(readme) as f:
        rows = re.findall(r"^\| `(redis_lock_\w+)` \| (counter|gauge) \|", f.read(), re.M)
    assert len(rows) == len(dict(rows)), rows
    assert dict(rows) == {"%s_%s" % (ns, c): u.lower()
                          for ns, spec in doc.items()
                          for c, u, _ in declared(spec) if u != "LABEL"}
    # nothing held: a full set of zero series, every query valid as a
    # superuser and as a pg_monitor role
    for s in (sessions(), sessions(user=monitor_user)):
        snap = scrape(s.conn)
        assert snap["redis_lock_stats"][0]["shared"] == 1
        locks = by_labels(snap["redis_lock_locks"], "datname", "mode")
        assert {("postgres", m) for m in MODES} <= set(locks)
        for row in locks.values():
            assert all(row[c] == 0 for c in row if c not in ("datname", "mode")), row
        waiters = by_labels(snap["redis_lock_waiters"], "datname")
        assert waiters["postgres"]["backends"] == 0
        assert waiters["postgres"]["oldest_statement_seconds"] == 0


def test_every_query_reports_held_lost_and_waiting_locks(pg, sessions, rc, monitor_user):
    admin = sessions()
    first = scrape(admin.conn)
    admin.run("CREATE DATABASE mon_other")
    other = sessions(dbname="mon_other")
    other.run("CREATE EXTENSION redis_lock")

    ex, gone, r1, r2, w, waiter, sleeper = (sessions() for _ in range(7))
    holders = (ex, gone, r1, r2, w, other)
    for s in holders + (waiter,):
        s.run("SET redis_lock.lease_time = '%dms'" % (LEASE_S * 1000))
    t0 = time.monotonic()
    assert ex.run("SELECT redis_lock_acquire('mon_ex') > 0")
    assert gone.run("SELECT redis_lock_acquire('mon_gone') > 0")
    assert r1.run("SELECT redis_lock_acquire_read('mon_doc')") is True
    assert r2.run("SELECT redis_lock_acquire_read('mon_doc')") is True
    assert w.run("SELECT redis_lock_acquire_write('mon_w', ttl => '60s')") is True
    assert other.run("SELECT redis_lock_acquire('mon_there') > 0")
    # one acquire that gives up on a busy lock
    with pytest.raises(psycopg2.errors.LockNotAvailable):
        waiter.run("SELECT redis_lock_acquire('mon_ex', wait => '50ms')")

    # one lock lost behind its holder's back; the watchdog finds out
    assert rc.delete("mon_gone") == 1
    testbed.wait_until(lambda: admin.run(
        "SELECT lost FROM redis_lock_locks WHERE lock_name = 'mon_gone'"), 5,
        what="the watchdog to mark mon_gone lost")

    # one backend waiting for a busy lock; one sleeping (another wait event)
    # in a statement that merely names an acquire function
    waiter.start("SELECT redis_lock_acquire('mon_ex', wait => '20s')")
    sleeper.start("SELECT pg_sleep(15), 'redis_lock_acquire(''x'')'")
    wait_for_wait_event(admin.conn, waiter.pid)
    waiting_seen = time.monotonic()

    # hold past a whole lease: the renewed locks must still look fresh
    time.sleep(max(0.0, t0 + 2 * LEASE_S - time.monotonic()))

    testbed.wait_until(lambda: testbed.sql_one(
        admin.conn, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
        (sleeper.pid,)) == "Timeout", 5, what="the sleeper to sleep")

    def snapshot(conn):
        """A scrape that saw the waiter (between two attempts it is briefly
        in no wait at all)"""
        def seen():
            snap = scrape(conn)
            w_ = by_labels(snap["redis_lock_waiters"], "datname")
            return snap if w_["postgres"]["backends"] == 1 else None
        return testbed.wait_until(seen, 5, what="the waiter to be counted")

    snaps = [snapshot(admin.conn), snapshot(sessions(user=monitor_user).conn)]
    elapsed = time.monotonic() - t0
    for snap in snaps:
        locks = by_labels(snap["redis_lock_locks"], "datname", "mode")
        assert set(locks) >= {(d, m) for d in ("postgres", "mon_other") for m in MODES}
        held = {k: (r["held"], r["lost"], r["watchdog"]) for k, r in locks.items()
                if r["held"]}
        assert held == {("postgres", "exclusive"): (2, 1, 2),
                        ("postgres", "read"): (2, 0, 2),
                        ("postgres", "write"): (1, 0, 0),
                        ("mon_other", "exclusive"): (1, 0, 1)}, held
        for k, r in locks.items():
            if not r["held"]:
                assert r["oldest_hold_seconds"] == 0 and r["stalest_renewal_seconds"] == 0, r
                continue
            assert 0 < r["oldest_hold_seconds"] <= elapsed + 0.5, r
        # held for longer than a lease, renewed well within one
        for k in (("postgres", "exclusive"), ("postgres", "read")):
            r = locks[k]
            assert r["oldest_hold_seconds"] > LEASE_S, r
            assert r["stalest_renewal_seconds"] < LEASE_S, r
            assert r["stalest_renewal_lease_ratio"] < 1, r
        # a fixed ttl is never renewed: nothing to be stale
        assert locks[("postgres", "write")]["stalest_renewal_seconds"] == 0
        assert locks[("postgres", "write")]["stalest_renewal_lease_ratio"] == 0

        waiters = by_labels(snap["redis_lock_waiters"], "datname")
        assert waiters["postgres"]["backends"] == 1
        assert waiters["postgres"]["oldest_statement_seconds"] > 0
        assert waiters["mon_other"]["backends"] == 0

    # the waiter is the only one: never the sleeper, the idle holders or us
    for _ in range(20):
        w_ = by_labels(scrape(admin.conn)["redis_lock_waiters"], "datname")
        assert w_["postgres"]["backends"] <= 1
        time.sleep(0.01)

    before, during = counters(first), counters(snaps[0])
    assert snaps[0]["redis_lock_stats"][0]["shared"] == 1
    assert during["acquired_total"] - before["acquired_total"] >= 6
    assert during["timed_out_total"] - before["timed_out_total"] >= 1
    assert during["waits_total"] - before["waits_total"] >= 2   # counted as it starts
    assert during["lost_total"] - before["lost_total"] == 1
    assert during["renewals_total"] - before["renewals_total"] >= 3

    # the waiter gets the lock when it is released
    assert ex.run("SELECT redis_lock_release('mon_ex')") is True
    released = time.monotonic()
    waiter.join()
    assert waiter.error is None and waiter.result > 0
    assert waiter.run("SELECT redis_lock_release('mon_ex')") is True
    assert gone.run("SELECT redis_lock_release('mon_gone')") is False  # lost
    assert r1.run("SELECT redis_lock_release_read('mon_doc')") is True
    assert r2.run("SELECT redis_lock_release_read('mon_doc')") is True
    assert w.run("SELECT redis_lock_release_write('mon_w')") is True
    assert other.run("SELECT redis_lock_release('mon_there')") is True

    last = scrape(admin.conn)
    after = counters(last)
    for k in COUNTERS:
        assert before[k] <= during[k] <= after[k], k
    assert after["acquired_total"] - before["acquired_total"] >= 7
    assert after["released_total"] - during["released_total"] >= 6
    assert after["failed_total"] == before["failed_total"]
    assert after["reconnects_total"] == before["reconnects_total"]
    # at least the time the waiter surely spent waiting
    assert after["wait_seconds_total"] - before["wait_seconds_total"] >= released - waiting_seen
    assert after["wait_seconds_total"] - before["wait_seconds_total"] <= time.monotonic() - t0
    for r in last["redis_lock_locks"]:
        assert (r["held"], r["lost"], r["watchdog"]) == (0, 0, 0), r
    admin.run("SELECT pg_cancel_backend(%s)", (sleeper.pid,))
    sleeper.join()
    assert isinstance(sleeper.error, psycopg2.errors.QueryCanceled)


def shmem_allocations(max_locks):
    """{name: size} of the redis_lock% rows of pg_shmem_allocations of a
    preloaded server started with redis_lock.max_locks = max_locks."""
    pg = testbed.Postgres(conf={"redis_lock.max_locks": str(max_locks)}).init().start()
    try:
        c = pg.connect()
        try:
            with c.cursor() as cur:
                cur.execute("SELECT name, size FROM pg_shmem_allocations "
                            "WHERE name LIKE 'redis_lock%'")
                return dict(cur.fetchall())
        finally:
            c.close()
    finally:
        pg.cleanup()


def test_shared_memory_is_one_area_of_1236_bytes_a_slot():
    """doc/operations.md, Observability: the extension's shared memory is one
    area, `redis_lock` in pg_shmem_allocations, with the registry's hash of
    slots per role beside it; each slot of redis_lock.max_locks costs 1236
    bytes of the area.  (Before issue 44 there were four areas: the
    registry, the counters, the wait queues and the deadlock records.)"""
    small = shmem_allocations(16)
    large = shmem_allocations(16 + 1024)
    assert set(small) == set(large) == {"redis_lock", "redis_lock slots per role"}
    assert large["redis_lock"] - small["redis_lock"] == 1236 * 1024
