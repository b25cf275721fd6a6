"""The watchdog at scale: 20 000 watchdog-renewed locks over 4 backends,
renewed by the one worker in bounded pipelined rounds, none ever expiring
nor going longer than lease/3 without a renewal, as Redis sees it
(t/renewals.py), but for the time the worker and Redis waited for a CPU.
bench/run (section watchdog_scale) runs the same at 100 000 locks."""
import re
import threading
import time

import pytest

import testbed
import renewals

# serial (t/conftest.py): 20 000 locks keep the worker, Redis and four
# backends busy, and its bound (lease/3 between renewals, less only the CPU
# wait it can measure) is about one worker's timing: alone, as it was meant
pytestmark = pytest.mark.serial

N = 20000
BACKENDS = 4
LEASE_MS = 3000
BATCH = 1000            # RL_WATCHDOG_BATCH in src/worker/watchdog.c
CYCLE_JOBS = 10 * BATCH  # RL_WATCHDOG_CYCLE_JOBS

TITLE = re.compile(r"last pass: (\d+) renewed, (\d+) released, (\d+) failed in (\d+) rounds")


def test_20000_locks_each_renewed_within_a_third_of_the_lease_but_for_cpu_wait():
    r = testbed.Redis().start()
    pg = testbed.Postgres(conf={"redis_lock.url": r.url,
                                "redis_lock.max_locks": str(N + 64),
                                "redis_lock.max_locks_per_session": str(N + 64)}).init().start()
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

        # chunks of 1000 keys: each chunk's script holds Redis up (a
        # renewal sent meanwhile waits, Redis running, the worker not
        # waiting for a CPU), for a millisecond or two at this size
        watch = renewals.RenewalWatch(r.client(), "wd-", N, LEASE_MS, chunk=1000)
        waited = renewals.CpuWait([wpid, r.proc.pid])
        watch.sample()
        waited.mark(watch.last_read_ms)
        start_ms = watch.redis_now_ms()
        steady_at = None
        titles = set()
        deadline = time.monotonic() + 60 * testbed.TIME_SCALE
        # every lock renewed once since all were taken, then two more periods
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            watch.sample()
            waited.mark(watch.last_read_ms)
            titles.add(renewals.process_title(wpid))
            if steady_at is None and watch.all_renewed_since(start_ms):
                steady_at = time.monotonic()
            if steady_at is not None and time.monotonic() - steady_at > 2 * LEASE_MS / 3000.0:
                break
            time.sleep(max(0.0, LEASE_MS / 12000.0 - (time.monotonic() - t0)))
        print("\n%d watchdog locks, lease %d ms: %s" % (N, LEASE_MS, watch.summary()))
        assert steady_at is not None, "not every lock was renewed within 60 s"
        # What the bounds protect: no lock ever expires, and each is renewed
        # lease/3 after the last time, so that a renewal round that fails
        # outright still leaves two thirds of the lease for its retries.  The worker
        # meets lease/3 on an idle machine; on a loaded one the worker and
        # Redis wait for a CPU, and a renewal is later by up to that much
        # (late renewals are what the log reports).  So a renewal later than
        # lease/3 fails the test unless the time the worker and Redis spent
        # waiting for a CPU meanwhile (the kernel's count, plus the
        # hypervisor's steal) covers what it is over: lateness the worker
        # causes itself fails on any machine; load fails it only by letting
        # a lock expire (it did beside 20 CPU-bound jobs on 2 cores); what
        # load did is printed.  The worker stopped (SIGSTOP) for 1.3 s fails
        # it (1004 ms over lease/3, 23 ms of CPU waited; 2026-11-27).
        assert watch.missing == 0, "some lock expired"
        # the sampler's own script may have held a renewal up by as long as
        # the longest one ran (CI29: 76 renewals 10 ms late, no CPU waited,
        # with 5000-key chunks on a machine loaded beyond CI's own load)
        aim = LEASE_MS / 3 + renewals.JITTER_MS + watch.max_chunk_ms
        exact_late = [(key, ms, a, b) for key, ms, a, b, exact in watch.late if exact]
        over = [(key, ms, ms - aim, waited.during(a, b))
                for key, ms, a, b in exact_late + watch.open_late if ms > aim]
        unexplained = [o for o in over if o[2] > o[3]]
        print("later than lease/3: %d readings, the most by %.0f ms; the least CPU "
              "wait of the worker and Redis meanwhile: %.0f ms; the longest sampling "
              "script: %.1f ms"
              % (len(over), max([o[2] for o in over] or [0]), min([o[3] for o in over] or [0]),
                 watch.max_chunk_ms))
        assert not unexplained, (unexplained[:5], watch.summary())
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
        # a late renewal, when there is one, is reported in the log (not
        # one the sampler's own script held up in Redis: the worker sent it
        # in time, and has nothing to report; CI34)
        assert not [x for x in exact_late if x[1] > aim] or \
            "more than a third of their lease" in pg.log_text()
    finally:
        for c in conns:
            c.close()
        pg.cleanup()
        r.stop()
