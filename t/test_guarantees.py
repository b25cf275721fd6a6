"""Regression tests for guarantees an independent review found broken
(issue 11): each failed on the code before its fix.

1. a release whose outcome is unknown must stop the watchdog at once;
2. soft paths must not swallow errors (cancel) nor corrupt the interrupt
   hold-off count;
3. the watchdog backs off while Redis is down, and one failing target does
   not stop renewals on healthy ones;
4. a Cluster master that died is replaced in the slot map (backends and
   worker);
5. redis_lock.wait_replicas holds after NOSCRIPT;
6. fence marks cannot be poisoned (sql_tests/lease.sql) and survive the
   upgrade from 1.1;
7. limits: > 16 Redlock masters refused, passwords set in a session reach
   the worker, > 64 nodes in one round, target slots reused.
"""
import os
import random
import subprocess
import threading
import time

import psycopg2
import pytest

from checks import assert_interruptible, assert_not_renewed, count_renewals
from conftest import Session, wait_for_wait_event
from renewals import watchdog_pid, watchdog_pids
import testbed
from testbed import TIME_SCALE as S


def fresh_pg(preload=True, **conf):
    return testbed.Postgres(preload=preload, conf=conf).init().start().with_extension()




def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ====================================================== 1. unknown release

def test_release_with_unknown_outcome_is_never_renewed(env):
    """The release fails (NOPERM): the session no longer counts the lock, so
    the worker must not renew it; it runs out with its lease."""
    r, pg, session = env
    rc = r.client()
    a = session()
    a.run("SET redis_lock.lease_time = '3s'")
    assert a.run("SELECT redis_lock_acquire('job') > 0")
    rc.execute_command("ACL", "SETUSER", "default", "-evalsha")
    try:
        with pytest.raises(psycopg2.Error) as ei:
            a.run("SELECT redis_lock_release('job')")
        assert ei.value.pgcode == "42501"
    finally:
        rc.execute_command("ACL", "SETUSER", "default", "+@all")
    # (no redis_lock call in session a from here: the next one would settle
    # the doubt by deleting the key)
    with pg.connect() as admin:
        assert testbed.sql_one(admin, "SELECT count(*) FROM redis_lock_locks") == 0
    # the session sits idle: without renewal the 3 s lease runs out
    assert_not_renewed(rc, "job", 4 * S)
    assert rc.exists("job") == 0


def test_rollback_with_unknown_release_is_never_renewed(env):
    r, pg, session = env
    rc = r.client()
    a = session(autocommit=False)
    a.run("SET redis_lock.lease_time = '3s'")
    assert a.run("SELECT redis_lock_acquire('xjob', xact => true) > 0")
    rc.execute_command("ACL", "SETUSER", "default", "-evalsha")
    try:
        a.conn.rollback()           # the release is sent; its reply is read later

        def reported():
            # the next call reads the refusal: a WARNING, not an error
            a.run("SELECT count(*) FROM redis_lock_held()")
            return any("could not release" in n for n in a.conn.notices)
        testbed.wait_until(reported, 5, 0.05, what="the refused release to be reported")
    finally:
        rc.execute_command("ACL", "SETUSER", "default", "+@all")
    assert_not_renewed(rc, "xjob", 4 * S)
    assert rc.exists("xjob") == 0


# ====================================================== 2. soft paths

@pytest.fixture
def sentinel_env():
    master = testbed.Redis(args=["--repl-diskless-sync-delay", "0"]).start()
    sentinels = [testbed.Sentinel(master.port, quorum=1).start() for _ in range(2)]
    pg = fresh_pg(**{"redis_lock.sentinels": ",".join(s.url for s in sentinels),
                     "redis_lock.sentinel_master": "mymaster",
                     "redis_lock.command_timeout": "500ms",
                     "redis_lock.connect_timeout": "500ms"})
    yield master, sentinels, pg
    pg.cleanup()
    for x in sentinels + [master]:
        x.stop()


def test_abort_with_sentinel_and_master_gone_keeps_backend_interruptible(sentinel_env):
    """ROLLBACK releases with interrupts held; the Sentinel re-discovery in
    it fails.  Afterwards cancel, statement_timeout and terminate still work
    in that backend (the hold-off count was driven negative before)."""
    master, sentinels, pg = sentinel_env
    a = Session(pg, autocommit=False)
    assert a.run("SELECT redis_lock_acquire('s-lock', xact => true) > 0")
    for x in sentinels + [master]:
        x.kill()
    t0 = time.monotonic()
    a.conn.rollback()
    assert time.monotonic() - t0 < 3 * S
    a.conn.autocommit = True
    assert_interruptible(pg, a.conn, a.pid, terminate=True)


def test_unreachable_topology_is_asked_once_per_round_trip(sentinel_env):
    """Sentinels and master frozen, the master forgotten after a failed
    discovery: ROLLBACK releasing 10 locks asks the Sentinels once, not once
    per lock (interrupts are held there: each ask would cost a timeout)."""
    master, sentinels, pg = sentinel_env
    a = Session(pg, autocommit=False)
    assert a.run("SELECT count(redis_lock_acquire('r' || g, xact => true)) "
                 "FROM generate_series(1, 10) g") == 10
    for x in sentinels + [master]:
        x.pause()
    try:
        b = Session(pg)
        with pytest.raises(psycopg2.Error):
            b.run("SELECT redis_lock_acquire('other', wait => '0')")   # forgets the master
        t0 = time.monotonic()
        a.conn.rollback()
        elapsed = time.monotonic() - t0
        print("\nROLLBACK of 10 locks, Sentinels and master frozen: %.2f s" % elapsed)
        assert elapsed < 2.5 * S
        b.close()
    finally:
        for x in sentinels + [master]:
            x.resume()
    a.close()


@pytest.fixture
def delayed_masters():
    """3 Redlock masters, each behind a proxy adding 60 ms per hop."""
    ms = [testbed.Redis().start() for _ in range(3)]
    proxies = [testbed.DelayProxy(m.port, 0.06).start() for m in ms]
    pg = fresh_pg(**{"redis_lock.nodes": ",".join(p.url for p in proxies),
                     "redis_lock.node_timeout": "2s"})
    yield ms, pg
    pg.cleanup()
    for p in proxies:
        p.stop()
    for m in ms:
        m.stop()


def test_cancel_during_redlock_give_back_is_not_lost(delayed_masters):
    """Two of three masters hold the key for someone else: every attempt
    wins one master and gives it back.  Cancels sent at random moments (many
    land in the give-back) must each end the wait within 1 s."""
    ms, pg = delayed_masters
    for m in ms[:2]:
        m.client().set("contended", "someone-else", px=120000)
    a = Session(pg)
    admin = pg.connect()
    rnd = random.Random(11)
    for _ in range(8):
        a.start("SELECT redis_lock_acquire('contended', wait => '20s')")
        wait_for_wait_event(admin, a.pid)
        time.sleep(rnd.uniform(0.0, 0.5))      # a random phase of the retry loop
        sent = time.monotonic()
        testbed.sql_one(admin, "SELECT pg_cancel_backend(%s)", (a.pid,))
        a.join(20)
        assert a.error is not None and a.error.pgcode == "57014", "cancel was lost"
        assert a.finished_at - sent < 1.0 * S, "cancel took %.2fs" % (a.finished_at - sent)
    # the partial grants given back or settled: nothing of ours stays.  A
    # cancel that lands while a give-back is on the wire leaves its outcome
    # unknown, and the watchdog worker deletes it (test_doubts.py): poll
    assert a.run("SELECT count(*) FROM redis_lock_held()") == 0
    testbed.wait_until(lambda: ms[2].client().exists("contended") == 0, 10,
                       what="the last give-back to be settled")
    admin.close()
    a.close()


# ====================================================== 3. watchdog back-off

def test_watchdog_backs_off_while_redis_is_down(env):
    r, pg, session = env
    a = session()
    a.run("SET redis_lock.lease_time = '3s'")
    assert a.run("SELECT count(redis_lock_acquire('w' || g)) FROM generate_series(1, 3) g") == 3
    # both lanes: the target moves to the slow lane's worker once it fails
    wpids = watchdog_pids(pg.postmaster_pid())
    assert len(wpids) == 2, wpids
    before_lines = pg.log_text().count("could not renew")
    cpu0 = sum(cpu_seconds(p) for p in wpids)
    r.stop()
    time.sleep(5)
    lines = pg.log_text().count("could not renew") - before_lines
    cpu = sum(cpu_seconds(p) for p in wpids) - cpu0
    r.start()
    print("\nwatchdog with Redis down 5 s: %d log lines, %.3f s CPU" % (lines, cpu))
    assert 1 <= lines <= 2
    assert cpu < 0.5
    # Redis restarted empty: the locks are reported lost, never re-created
    testbed.wait_until(lambda: a.run("SELECT count(*) FROM redis_lock_held() WHERE lost") == 3,
                       10, 0.1, what="locks reported lost")
    assert r.client().dbsize() == 0


@pytest.fixture
def two_targets():
    healthy = testbed.Redis().start()
    master = testbed.Redis().start()
    sentinel = testbed.Sentinel(master.port, quorum=1).start()
    pg = fresh_pg(**{"redis_lock.url": healthy.url,
                     "redis_lock.command_timeout": "500ms",
                     "redis_lock.connect_timeout": "500ms"})
    yield healthy, master, sentinel, pg
    pg.cleanup()
    for x in (sentinel, master, healthy):
        x.stop()


def test_a_dead_sentinel_target_does_not_stop_renewals_elsewhere(two_targets):
    healthy, master, sentinel, pg = two_targets
    a, b = Session(pg), Session(pg)
    for s in (a, b):
        s.run("SET redis_lock.lease_time = '3s'")
    b.run("SET redis_lock.sentinels = %s", (sentinel.url,))
    b.run("SET redis_lock.sentinel_master = 'mymaster'")
    assert b.run("SELECT redis_lock_acquire('behind-sentinel') > 0")
    assert a.run("SELECT redis_lock_acquire('healthy') > 0")
    sentinel.kill()
    master.kill()
    # 4 leases' worth: the healthy lock is renewed all along
    rc = healthy.client()
    renewals = count_renewals(rc, "healthy", 12,
                              "healthy lock expired while another target was down", 300)
    assert renewals >= 8
    assert a.run("SELECT redis_lock_release('healthy')") is True
    a.close()
    b.close()


@pytest.fixture
def silent_and_healthy():
    healthy, silent = testbed.Redis().start(), testbed.Redis().start()
    # the worker's timeouts are the server's settings, not a session's
    pg = fresh_pg(**{"redis_lock.url": healthy.url,
                     "redis_lock.command_timeout": "5s",
                     "redis_lock.connect_timeout": "5s"})
    yield healthy, silent, pg
    pg.cleanup()
    silent.resume()
    for x in (silent, healthy):
        x.stop()


def test_a_silent_target_holds_up_renewals_elsewhere_once_and_briefly(silent_and_healthy):
    """A Redis that accepts connections but never answers (SIGSTOP), with
    long timeouts: the worker serving the healthy target waits for it at
    most once, for at most 1 s per connect and round trip, and then leaves
    it to the slow lane's worker, which waits the full timeouts.  With one
    worker, every attempt on the silent Redis (5 s) outlasted the healthy
    lock's 3 s lease."""
    healthy, frozen, pg = silent_and_healthy
    a, b = Session(pg), Session(pg)
    for s in (a, b):
        s.run("SET redis_lock.lease_time = '3s'")
    b.run("SET redis_lock.url = %s", (frozen.url,))
    assert b.run("SELECT redis_lock_acquire('on-the-silent-one') > 0")
    assert a.run("SELECT redis_lock_acquire('healthy') > 0")
    log0 = len(pg.log_text())
    frozen.pause()
    try:
        rc = healthy.client()
        lowest, renewals, last = None, 0, None
        end = time.monotonic() + 12 * S
        while time.monotonic() < end:
            pttl = rc.pttl("healthy")
            assert pttl > 0, "the healthy lock expired while another target was silent"
            lowest = pttl if lowest is None else min(lowest, pttl)
            if last is not None and pttl > last + 200:
                renewals += 1
            last = pttl
            time.sleep(0.02)
        print("\nhealthy lock beside a silent target: %d renewals in %.0f s, "
              "lowest PTTL %d ms" % (renewals, 12 * S, lowest))
        assert renewals >= 8
        assert "could not renew or release" in pg.log_text()[log0:]
    finally:
        frozen.resume()
    # the silent target's lock outlived its lease unanswered: presumed lost
    # (issue 34), so nothing of it is renewed any more; a new lock there
    # brings the slow lane's worker back to it, and it sends the target back
    assert b.run("SELECT lost FROM redis_lock_held() WHERE lock_name = 'on-the-silent-one'") is True
    assert b.run("SELECT redis_lock_acquire('again-on-the-thawed-one') > 0")
    testbed.wait_until(lambda: "reaches Redis at" in pg.log_text()[log0:], 20, 0.05,
                       what="the slow lane to reach the thawed Redis")
    assert a.run("SELECT redis_lock_release('healthy')") is True
    a.close()
    b.close()


def test_without_a_slow_lane_worker_the_prompt_one_serves_every_target():
    """max_worker_processes = 1 leaves no background worker slot for the
    slow lane's worker.  A target that failed (Redis frozen for 1.5 s, so
    its renewals time out) must then still be renewed, by the prompt lane's
    worker with the full timeouts; sent to a lane nobody served, the lock
    expired while its session still held it (lost = f)."""
    r = testbed.Redis().start()
    # one slot, for the prompt lane (registered first); no logical
    # replication launcher to take it, whatever the server version's order
    pg = fresh_pg(**{"redis_lock.url": r.url, "max_worker_processes": "1",
                     "max_logical_replication_workers": "0"})
    try:
        testbed.wait_until(lambda: len(watchdog_pids(pg.postmaster_pid())) == 1, 10, 0.05,
                           what="the prompt lane's worker")
        assert watchdog_pid(pg.postmaster_pid()) is not None
        assert "too many background workers" in pg.log_text(), pg.log_text()[-2000:]
        a = Session(pg)
        # 6 s: Redis is frozen until a renewal (due at 2 s) has failed, and
        # on a loaded machine a 3 s lease had too little left at the resume
        a.run("SET redis_lock.lease_time = '6s'")
        assert a.run("SELECT redis_lock_acquire('alone') > 0")
        log0 = len(pg.log_text())
        r.pause()
        try:
            testbed.wait_until(lambda: "could not renew" in pg.log_text()[log0:], 10, 0.05,
                               what="a renewal to fail")
        finally:
            r.resume()
        renewals = count_renewals(r.client(), "alone", 6 * S,
                                  "the lock expired: its failed target was left to no worker")
        assert renewals >= 2
        assert a.run("SELECT lost FROM redis_lock_held() WHERE lock_name = 'alone'") is False
        assert a.run("SELECT redis_lock_release('alone')") is True
        a.close()
    finally:
        pg.cleanup()
        r.stop()


# ====================================================== 4. cluster failover

@pytest.fixture
def cluster_with_replicas():
    nodes = [testbed.cluster_node().start() for _ in range(6)]
    cmd = ["redis-cli", "--cluster", "create"] + ["127.0.0.1:%d" % n.port for n in nodes] + [
        "--cluster-replicas", "1", "--cluster-yes"]
    subprocess.run(cmd, check=True, timeout=60, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)

    def ok():
        for n in nodes:
            info = n.client().execute_command("CLUSTER", "INFO")
            info = info.decode() if isinstance(info, bytes) else info
            if "cluster_state:ok" not in info:
                return False
        if not all(n.client().info("replication")["role"] == "master" or
                   n.client().info("replication").get("master_link_status") == "up"
                   for n in nodes):
            return False
        # every slot range lists its replica, as seen from the seed
        return all(len(r) > 3 for r in nodes[0].client().execute_command("CLUSTER", "SLOTS"))
    testbed.wait_until(ok, 60, 0.1, what="cluster with replicas in sync")
    pg = fresh_pg(**{"redis_lock.url": nodes[0].url, "redis_lock.cluster": "on",
                     "redis_lock.command_timeout": "1s", "redis_lock.connect_timeout": "1s"})
    yield nodes, pg
    pg.cleanup()
    for n in nodes:
        n.stop()


def owner_and_replica(nodes, key):
    c = nodes[0].client()
    slot = c.execute_command("CLUSTER", "KEYSLOT", key)
    for start, end, master, *replicas in c.execute_command("CLUSTER", "SLOTS"):
        if start <= slot <= end:
            by_port = {n.port: n for n in nodes}
            return by_port[master[1]], by_port[replicas[0][1]]
    raise AssertionError("no owner")


def test_cluster_master_failover_is_followed_by_backend_and_worker(cluster_with_replicas):
    nodes, pg = cluster_with_replicas
    # a name whose slot is not served by the seed node, so the seed stays up
    name = next("{fo-%d}" % i for i in range(1000)
                if owner_and_replica(nodes, "{fo-%d}" % i)[0] is not nodes[0])
    master, replica = owner_and_replica(nodes, name)
    a = Session(pg)
    a.run("SET redis_lock.lease_time = '4s'")
    a.run("SET redis_lock.wait_replicas = 1")
    assert a.run("SELECT redis_lock_acquire(%s) > 0", (name,))
    a.run("SET redis_lock.wait_replicas = 0")
    master.kill()
    replica.client().execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
    testbed.wait_until(lambda: replica.client().info("replication")["role"] == "master",
                       20, 0.05, what="replica promoted")
    # the existing session finds the new master on its next call
    other = name + ":other"                     # the same slot (hash tag)
    assert a.run("SELECT redis_lock_acquire(%s, ttl => '30s') > 0", (other,))
    assert replica.client().get(other).startswith(b"pgrl:")
    # the worker keeps renewing the watchdog lock on the promoted replica
    rc = replica.client()
    renewals = count_renewals(rc, name, 6, "watchdog lock expired after the failover", 300)
    assert renewals >= 3
    assert a.run("SELECT redis_lock_release(%s)", (name,)) is True
    assert rc.exists(name) == 0
    a.close()


# ====================================================== 5. WAIT after NOSCRIPT

@pytest.fixture
def replicated():
    master = testbed.Redis().start()
    replica = testbed.Redis().start()
    pg = fresh_pg(**{"redis_lock.url": master.url})
    replica.client().execute_command("REPLICAOF", "127.0.0.1", master.port)
    testbed.wait_until(lambda: replica.client().info("replication").get(
        "master_link_status") == "up", 15, 0.05, what="replica in sync")
    # and the master counts it: WAIT only counts replicas it sees online
    testbed.wait_until(lambda: master.client().info("replication").get(
        "slave0", {}).get("state") == "online", 15, 0.05, what="master to see its replica")
    yield master, replica, pg
    replica.resume()
    pg.cleanup()
    replica.stop()
    master.stop()


def test_wait_replicas_is_enforced_after_noscript(replicated):
    master, replica, pg = replicated
    a = Session(pg)
    a.run("SET redis_lock.wait_replicas = 1")
    a.run("SET redis_lock.wait_replicas_timeout = '2s'")   # a loaded machine can be slow
    assert a.run("SELECT redis_lock_acquire('warm', ttl => '60s') > 0")   # scripts cached
    a.run("RESET redis_lock.wait_replicas_timeout")
    replica.pause()
    master.client().script_flush()
    with pytest.raises(psycopg2.Error) as ei:
        a.run("SELECT redis_lock_acquire('after-flush', ttl => '60s')")
    assert "was not replicated to 1 replica(s)" in str(ei.value)
    assert master.client().exists("after-flush") == 0
    a.close()


def test_wait_is_sent_again_after_the_script_resent_for_noscript(replicated):
    """The command stream itself: after NOSCRIPT the acquire is re-sent as
    EVAL and a WAIT must follow it (before the fix, the only WAIT was the
    one paired with the failed EVALSHA, which ran before the grant)."""
    master, replica, pg = replicated
    a = Session(pg)
    a.run("SET redis_lock.wait_replicas = 1")
    a.run("SET redis_lock.wait_replicas_timeout = '2s'")   # a loaded machine can be slow
    assert a.run("SELECT redis_lock_acquire('warm', ttl => '60s') > 0")
    master.client().script_flush()
    seen = []
    mon_conn = master.client(socket_timeout=10)
    started = threading.Event()

    def monitor():
        with mon_conn.monitor() as m:
            started.set()
            for cmd in m.listen():
                seen.append(cmd["command"])
                if cmd["command"].startswith("SCRIPT LOAD"):
                    return
    t = threading.Thread(target=monitor, daemon=True)
    t.start()
    started.wait(5)
    probe = master.client()
    testbed.wait_until(lambda: probe.echo("rl-monitor-ready") and
                       any("rl-monitor-ready" in c for c in seen), 5, 0.02,
                       what="MONITOR to see commands")
    assert a.run("SELECT redis_lock_acquire('after-flush', ttl => '60s') > 0")
    t.join(10)
    # the script's own SET of the key is the grant; a WAIT must come after it
    words = [c.split()[0].upper() if c.split() else "" for c in seen]
    grant = next(i for i, c in enumerate(seen) if c.lower().startswith("set after-flush"))
    assert "WAIT" in words[grant:], "no WAIT after the grant: %r" % [c[:40] for c in seen]
    a.close()


# ====================================================== 6. fence marks, upgrade

def test_upgrade_from_1_1_keeps_marks_per_guarded_table(env):
    r, pg, session = env
    admin = pg.connect()
    admin.cursor().execute("CREATE DATABASE up")
    admin.close()
    a = Session(pg, dbname="up")
    a.run("CREATE EXTENSION redis_lock VERSION '1.1'")
    a.run("CREATE TABLE inv(id int PRIMARY KEY, fence bigint)")
    # two guard triggers naming one lock, as a table with separate INSERT
    # and UPDATE triggers has; and a name that is not ASCII
    a.run("CREATE TRIGGER g BEFORE INSERT ON inv "
          "FOR EACH ROW EXECUTE FUNCTION redis_lock_fence_guard('inv')")
    a.run("CREATE TRIGGER g2 BEFORE UPDATE ON inv "
          "FOR EACH ROW EXECUTE FUNCTION redis_lock_fence_guard('inv')")
    a.run("CREATE TABLE lager(id int, fence bigint)")
    a.run("CREATE TRIGGER g BEFORE INSERT ON lager "
          "FOR EACH ROW EXECUTE FUNCTION redis_lock_fence_guard('lagerbestand-ä\\x')")
    a.run("INSERT INTO inv VALUES (1, 60)")
    a.run("INSERT INTO lager VALUES (1, 9)")
    a.run("SELECT redis_lock_fence_check('other', 7)")
    a.run("CREATE ROLE tenant_role")
    a.run("ALTER ROLE tenant_role SET redis_lock.key_prefix = 'tenantA:'")
    a.run("ALTER EXTENSION redis_lock UPDATE")
    assert a.run("SELECT extversion FROM pg_extension WHERE extname = 'redis_lock'") == "1.4"
    marks = a.run("SELECT array_agg(m ORDER BY m) FROM (SELECT protected_table::text "
                  "|| '/' || key_prefix || lock_name || '/' || fence AS m "
                  "FROM redis_lock_fence_marks) s")
    assert marks == ["-/inv/60", "-/lagerbestand-ä\\x/9", "-/other/7", "inv/inv/60",
                     "inv/tenantA:inv/60", "lager/lagerbestand-ä\\x/9",
                     "lager/tenantA:lagerbestand-ä\\x/9"]
    # a writer of tenant A keeps the protection the mark gave before
    a.run("SET redis_lock.key_prefix = 'tenantA:'")
    with pytest.raises(psycopg2.Error) as ei:
        a.run("INSERT INTO inv VALUES (3, 59)")
    assert ei.value.pgcode == "40001"
    a.run("RESET redis_lock.key_prefix")
    # dropping a table drops its marks
    a.run("DROP TABLE lager")
    assert a.run("SELECT count(*) FROM redis_lock_fence_marks "
                 "WHERE lock_name LIKE 'lager%%' AND protected_table <> 0") == 0
    a.run("DROP ROLE tenant_role")
    with pytest.raises(psycopg2.Error) as ei:
        a.run("INSERT INTO inv VALUES (2, 59)")
    assert ei.value.pgcode == "40001"
    a.run("INSERT INTO inv VALUES (2, 61)")
    a.close()


# ====================================================== 7. limits

def test_more_than_16_redlock_masters_are_refused(env):
    r, pg, session = env
    a = session()
    urls = ",".join("redis://127.0.0.1:%d/0" % (20000 + i) for i in range(17))
    with pytest.raises(psycopg2.Error) as ei:
        a.run("SET redis_lock.nodes = %s", (urls,))
    assert ei.value.pgcode == "22023"
    assert "At most 16 Redlock masters" in str(ei.value)
    a.run("SET redis_lock.nodes = %s", (urls.rsplit(",", 1)[0],))   # 16 are fine


def test_password_set_in_a_session_reaches_the_watchdog():
    # not per role: ALTER ROLE ... SET of a password is refused (its value
    # would be readable in pg_db_role_setting, t/test_security.py)
    r = testbed.Redis(password="session-secret").start()
    pg = fresh_pg(**{"redis_lock.url": r.url})
    try:
        a = Session(pg)
        a.run("SET redis_lock.password = 'session-secret'")
        a.run("SET redis_lock.lease_time = '2s'")
        assert a.run("SELECT redis_lock_acquire('pw-lock') > 0")
        rc = r.client()
        # the lock outlives two of its 2 s leases only if the worker renews it
        # with the session's password; how many renewals that takes depends on load
        renewals = count_renewals(rc, "pw-lock", 4,
                                  "the worker could not renew with the session's password")
        assert renewals >= 2
        assert "session-secret" not in pg.log_text()
        assert a.run("SELECT redis_lock_release('pw-lock')") is True
        a.close()
    finally:
        pg.cleanup()
        r.stop()


@pytest.fixture(scope="module")
def many_redis():
    servers = [testbed.Redis().start() for _ in range(66)]
    yield servers
    for s in servers:
        s.stop()


def test_release_all_over_more_than_64_servers(many_redis):
    """One round trip can watch 64 sockets; a release over more goes in
    batches instead of failing."""
    pg = fresh_pg(preload=False, **{"redis_lock.url": many_redis[0].url})
    try:
        a = Session(pg)
        for i, s in enumerate(many_redis):
            a.run("SET redis_lock.url = %s", (s.url,))
            assert a.run("SELECT redis_lock_acquire(%s, ttl => '60s') > 0", ("m%d" % i,))
        assert a.run("SELECT redis_lock_release_all()") == len(many_redis)
        assert sum(s.client().exists("m%d" % i) for i, s in enumerate(many_redis)) == 0
        a.close()
    finally:
        pg.cleanup()


def test_watchdog_target_entries_are_reused(many_redis):
    """The worker's table of targets has 32 entries; an entry is free again
    once no lock uses it, so a server can see more than 32 over its life."""
    pg = fresh_pg(**{"redis_lock.url": many_redis[0].url})
    try:
        a = Session(pg)
        for i, s in enumerate(many_redis[:40]):
            a.run("SET redis_lock.url = %s", (s.url,))
            assert a.run("SELECT redis_lock_acquire('t%d') > 0" % i)
            assert a.run("SELECT redis_lock_release('t%d')" % i) is True
        a.close()
    finally:
        pg.cleanup()
