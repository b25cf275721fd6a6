"""The watchdog at scale: 20 000 watchdog-renewed locks over 4 backends,
renewed by the one worker in bounded pipelined rounds, none ever expiring
nor going two thirds of its lease without a renewal, as Redis sees it
(t/renewals.py); lease/3, the period aimed at, is reported.  bench/run
(section watchdog_scale) runs the same at 100 000 locks."""
import re
import threading
import time

import testbed
import renewals

N = 20000
BACKENDS = 4
LEASE_MS = 3000
BATCH = 1000            # RL_WATCHDOG_BATCH in src/watchdog.c
CYCLE_JOBS = 10 * BATCH  # RL_WATCHDOG_CYCLE_JOBS

TITLE = re.compile(r"last pass: (\d+) renewed, (\d+) released, (\d+) failed in (\d+) rounds")


def test_20000_locks_each_renewed_within_two_thirds_of_the_lease():
    r = testbed.Redis().start()
    pg = testbed.Postgres(conf={"redis_lock.url": r.url,
                                "redis_lock.max_locks": str(N + 64)}).init().start()
    conns = []
    try:
        pg.with_extension()
        wpid = renewals.watchdog_pid(pg.postmaster_pid())
        assert wpid is not None
        conns = [pg.connect() for _ in range(BACKENDS)]
        per = N // BACKENDS
        errors = []

        def take(conn, lo, hi):
            try:
                cur = conn.cursor()
                cur.execute("SET redis_lock.lease_time = %s", ("%dms" % LEASE_MS,))
                cur.execute("SELECT count(redis_lock_acquire('wd-' || g)) "
                            "FROM generate_series(%s, %s) g", (lo, hi))
                assert cur.fetchone()[0] == hi - lo + 1
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=take, args=(c, 1 + i * per, (i + 1) * per))
                   for i, c in enumerate(conns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        admin = conns[0]
        assert testbed.sql_one(admin, "SELECT count(*) FROM redis_lock_locks WHERE watchdog") == N

        watch = renewals.RenewalWatch(r.client(), "wd-", N, LEASE_MS)
        watch.sample()
        start_ms = watch.redis_now_ms()
        steady_at = None
        titles = set()
        deadline = time.monotonic() + 60 * testbed.TIME_SCALE
        # every lock renewed once since all were taken, then two more periods
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            watch.sample()
            titles.add(renewals.process_title(wpid))
            if steady_at is None and watch.all_renewed_since(start_ms):
                steady_at = time.monotonic()
            if steady_at is not None and time.monotonic() - steady_at > 2 * LEASE_MS / 3000.0:
                break
            time.sleep(max(0.0, LEASE_MS / 12000.0 - (time.monotonic() - t0)))
        print("\n%d watchdog locks, lease %d ms: %s" % (N, LEASE_MS, watch.summary()))
        assert steady_at is not None, "not every lock was renewed within 60 s"
        # What the bound protects: no lock ever expires, and none comes
        # within one renewal period (lease/3) of expiring, so a renewal round
        # that fails outright still leaves time for the next.  The worker
        # aims at lease/3; on a loaded machine renewals come later (1184 ms
        # at load 5-10, 1717 ms at load 10 with 20 000 locks on 2 cores,
        # against 1000 ms): that is a measured figure, printed above, not the
        # safety bound.
        assert watch.missing == 0, "some lock expired"
        assert watch.max_gap_ms <= 2 * LEASE_MS / 3 + renewals.JITTER_MS, watch.summary()
        assert watch.max_open_ms <= 2 * LEASE_MS / 3 + renewals.JITTER_MS, watch.summary()
        print("renewed later than lease/3: %d of %d" % (len(watch.late), watch.renewals))
        assert testbed.sql_one(admin, "SELECT count(*) FROM redis_lock_locks WHERE lost") == 0

        # the worker's title tells what each cycle did: never more than
        # BATCH ops per round trip, nor CYCLE_JOBS per cycle, and renewals
        # did go many to a round
        passes = [tuple(int(x) for x in m.groups()) for m in map(TITLE.search, titles) if m]
        assert passes, titles
        for renewed, released, failed, rounds in passes:
            assert renewed + released + failed <= CYCLE_JOBS
            assert renewed + released + failed <= rounds * BATCH
        assert max(p[0] for p in passes) > 1, passes
        assert all(p[2] == 0 for p in passes), passes
        # a late renewal, when there is one, is reported in the log
        assert not watch.late or "more than a third of their lease" in pg.log_text()
    finally:
        for c in conns:
            c.close()
        pg.cleanup()
        r.stop()
