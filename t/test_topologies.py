"""Beyond one Redis: Redlock over 5 independent masters, Sentinel failover,
Redis Cluster with a slot migrated mid-run.  Every server runs on loopback
and is stopped by the test."""
import statistics
import time

import psycopg2
import pytest

from checks import report_latency
from conftest import Session, wait_for_wait_event
from peers import RedlockPeer
import testbed
from testbed import TIME_SCALE as S


def fresh_pg(**conf):
    return testbed.Postgres(conf=conf).init().start().with_extension()


# ================================================================ Redlock

@pytest.fixture(scope="module")
def masters():
    ms = [testbed.Redis().start() for _ in range(5)]
    yield ms
    for m in ms:
        m.stop()


@pytest.fixture(scope="module")
def redlock_pg(masters):
    pg = fresh_pg(**{"redis_lock.nodes": ",".join(m.url for m in masters)})
    yield pg
    pg.cleanup()


@pytest.fixture
def rl_env(masters, redlock_pg):
    for m in masters:
        if m.proc.poll() is not None:
            m.start()
        m.client().flushall()
    made = []

    def session():
        s = Session(redlock_pg)
        made.append(s)
        return s
    yield masters, session
    for s in made:
        s.close()
    for m in masters:
        if m.proc.poll() is not None:
            m.start()


def holders(masters, key):
    out = []
    for m in masters:
        try:
            out.append(m.client(socket_timeout=1).get(key))
        except Exception:  # noqa: BLE001 - a stopped node
            out.append("down")
    return out


def test_redlock_lock_on_every_master_without_fencing(rl_env):
    masters, session = rl_env
    a = session()
    assert a.run("SELECT redis_lock_acquire('job', ttl => '20s')") is None   # no fence
    assert a.run("SELECT redis_lock_fence('job')") is None
    vals = holders(masters, "job")
    assert len(set(vals)) == 1 and vals[0].startswith(b"pgrl:")
    assert all(15000 < m.client().pttl("job") <= 20000 for m in masters)
    assert not any(m.client().keys("redis_lock:fence:*") for m in masters)
    st = a.run("SELECT locked, held_by_me FROM redis_lock_status('job')")
    assert st == (True, True)
    assert a.run("SELECT redis_lock_release('job')") is True
    assert holders(masters, "job") == [None] * 5


def test_redlock_tolerates_two_of_five_down(rl_env):
    masters, session = rl_env
    a, b = session(), session()
    masters[0].stop()
    masters[3].stop()
    assert a.run("SELECT redis_lock_try_acquire('job2', ttl => '20s')") is True
    assert sum(1 for v in holders(masters, "job2") if v not in (None, "down")) == 3
    assert b.run("SELECT redis_lock_try_acquire('job2')") is False
    assert a.run("SELECT redis_lock_release('job2')") is True
    assert [v for v in holders(masters, "job2") if v != "down"] == [None] * 3


def test_redlock_fails_cleanly_with_three_of_five_down(rl_env):
    masters, session = rl_env
    a = session()
    for i in (1, 2, 4):
        masters[i].stop()
    t0 = time.monotonic()
    with pytest.raises(psycopg2.OperationalError) as ei:
        a.run("SELECT redis_lock_acquire('job3', ttl => '20s', wait => '300ms')")
    assert ei.value.pgcode == "08006"
    assert ei.value.diag.message_primary == 'could not acquire Redis lock "job3"'
    assert "No majority of the 5 Redis masters answered" in ei.value.diag.message_detail
    assert time.monotonic() - t0 < 2
    # nothing left behind on the two that answered, nothing believed held
    assert [v for v in holders(masters, "job3") if v != "down"] == [None, None]
    assert a.run("SELECT count(*) FROM redis_lock_held()") == 0


def test_redlock_minority_grants_are_given_back(rl_env):
    masters, session = rl_env
    a = session()
    for m in masters[:3]:                      # someone else has a majority
        m.client().set("contested", "other", px=30000)
    assert a.run("SELECT redis_lock_try_acquire('contested', ttl => '20s')") is False
    assert holders(masters, "contested") == [b"other"] * 3 + [None, None]


@pytest.mark.parametrize("query,protocol", [
    ("SELECT redis_lock_acquire_read('rw', wait => '0')", "simple"),
    ("SELECT redis_lock_try_acquire_read('rw')", "simple"),
    ("SELECT redis_lock_acquire_write('rw', wait => '0')", "simple"),
    ("SELECT redis_lock_try_acquire_write('rw')", "simple"),
    ("SELECT redis_lock_acquire('fair', wait => '0')", "redisson_fair"),
    ("SELECT redis_lock_try_acquire('fair')", "redisson_fair"),
])
def test_redlock_refuses_read_write_and_fair_locks(rl_env, query, protocol):
    """Read-write and fair locks on several independent masters: 0A000
    (doc/reference.md), before anything is written on any master."""
    masters, session = rl_env
    a = session()
    a.run("SET redis_lock.protocol = %s", (protocol,))
    with pytest.raises(psycopg2.errors.FeatureNotSupported) as ei:
        a.run(query)
    assert "is not supported on several independent masters" in ei.value.diag.message_primary
    assert [m.client().dbsize() for m in masters] == [0] * 5
    assert a.run("SELECT count(*) FROM redis_lock_held()") == 0


def test_redlock_waiter_is_woken_by_release(rl_env):
    masters, session = rl_env
    a, b, admin = session(), session(), session()
    assert a.run("SELECT redis_lock_acquire('handover') IS NULL")
    b.start("SELECT redis_lock_acquire('handover', wait => '10s') IS NULL")
    wait_for_wait_event(admin.conn, b.pid)
    a.run("SELECT redis_lock_release('handover')")
    released = time.monotonic()
    b.join()
    assert b.error is None and b.result is True
    report_latency("Redlock", "SQL release -> SQL waiter, 5 masters", b.finished_at - released)
    # woken by the release's message, not the 1 s poll of a holder that
    # publishes (nor its lease)
    assert b.finished_at - released < testbed.WAKE_BOUND
    b.run("SELECT redis_lock_release('handover')")


def test_redlock_watchdog_renews_on_a_majority(rl_env):
    masters, session = rl_env
    a = session()
    a.run("SET redis_lock.lease_time = '1500ms'")
    a.start("SELECT redis_lock_acquire('long') IS NULL, pg_sleep(3)")
    testbed.wait_until(lambda: masters[0].client().exists("long"), 5, what="lock")
    t_end = time.monotonic() + 2.5
    while time.monotonic() < t_end:
        assert all(m.client().pttl("long") > 0 for m in masters)
        time.sleep(0.05)
    a.join()
    assert a.run("SELECT redis_lock_release('long')") is True


def test_node_redlock_and_sql_exclude_each_other_on_five_masters(rl_env):
    masters, session = rl_env
    a = session()
    peer = RedlockPeer([m.port for m in masters])
    try:
        got = peer.call(op="lock", key="shared", ttl=20000)
        assert got["ok"], got
        assert a.run("SELECT redis_lock_try_acquire('shared')") is False
        assert holders(masters, "shared") == [got["value"].encode()] * 5
        assert peer.call(op="unlock")["ok"]
        assert a.run("SELECT redis_lock_try_acquire('shared', ttl => '20s')") is True
        nope = peer.call(op="lock", key="shared", ttl=20000, retryCount=2)
        assert not nope["ok"] and "LockError" in nope["error"]
        assert a.run("SELECT redis_lock_release('shared')") is True
        assert peer.call(op="lock", key="shared", ttl=20000)["ok"]
        assert peer.call(op="unlock")["ok"]
    finally:
        peer.close()


def test_redlock_asks_all_masters_in_parallel(rl_env):
    """Each master behind a proxy adding 50 ms each way: in parallel an
    acquire costs one 100 ms round trip, in sequence it would cost 500 ms.
    Shown by when the masters' commands left: all at once, where in
    sequence each would leave a round trip (100 ms) after the one before
    (and by the time, loosely: a loaded machine adds to it)."""
    masters, session = rl_env
    proxies = [testbed.DelayProxy(m.port, 0.05).start() for m in masters]
    try:
        a = session()
        a.run("SET redis_lock.node_timeout = '1s'")
        a.run("SELECT set_config('redis_lock.nodes', %s, false)",
              (",".join(p.url for p in proxies),))
        a.run("SELECT redis_lock_acquire('warm', ttl => '10s')")   # connections, scripts
        a.run("SELECT redis_lock_release('warm')")
        t0 = time.monotonic()
        a.run("SELECT redis_lock_acquire('par', ttl => '10s')")
        took = time.monotonic() - t0
        sent = sorted(p.last_chunk_at for p in proxies)
        print("\nRedlock acquire on 5 masters, each 100 ms away: %.0f ms; the commands "
              "left within %.0f ms" % (took * 1000, (sent[-1] - sent[0]) * 1000))
        assert all(t is not None and t >= t0 for t in sent)
        assert sent[-1] - sent[0] < 0.1              # in sequence: >= 400 ms
        assert took < 0.45                           # in sequence: >= 500 ms
        # validity: a 150 ms lease cannot survive a 100 ms round trip plus drift
        # allowance on every try, so it is never granted and nothing stays
        assert a.run("SELECT redis_lock_try_acquire('short', ttl => '100ms')") is False
        assert holders(masters, "short") == [None] * 5
        a.run("SELECT redis_lock_release('par')")
    finally:
        for p in proxies:
            p.stop()


# ================================================================ Sentinel

@pytest.fixture
def sentinel_env():
    master = testbed.Redis(args=["--repl-diskless-sync-delay", "0"]).start()
    replica = testbed.Redis().start()
    replica.client().execute_command("REPLICAOF", "127.0.0.1", master.port)
    testbed.wait_until(lambda: replica.client().info("replication").get(
        "master_link_status") == "up", 15, 0.05, what="replica in sync")
    sentinels = [testbed.Sentinel(master.port).start() for _ in range(3)]

    def settled():
        for s in sentinels:
            c = s.client()
            if len(c.execute_command("SENTINEL", "REPLICAS", "mymaster")) < 1:
                return False
            if len(c.execute_command("SENTINEL", "SENTINELS", "mymaster")) < 2:
                return False
        return True
    testbed.wait_until(settled, 20, 0.1, what="sentinels to know each other")
    pg = fresh_pg(**{"redis_lock.sentinels": ",".join(s.url for s in sentinels),
                     "redis_lock.sentinel_master": "mymaster"})
    yield master, replica, sentinels, pg
    pg.cleanup()
    for r in sentinels + [replica, master]:
        r.stop()


def test_an_acquire_that_cannot_be_routed_leaves_the_worker_nothing():
    """A Sentinel that knows no master of the name set: the acquire fails
    before anything is sent, so it is no doubt for the watchdog worker to
    release.  (Before: the abort handed it over, and the worker tried to
    release it, failing, until its lease's horizon.)  The worker's first
    renewal of a lock taken after proves it has run since."""
    master = testbed.Redis().start()
    sentinel = testbed.Sentinel(master.port).start()
    pg = fresh_pg(**{"redis_lock.url": master.url, "redis_lock.lease_time": "900ms"})
    s = Session(pg)
    try:
        s.run("SET redis_lock.sentinels = %s", (sentinel.url,))
        s.run("SET redis_lock.sentinel_master = 'no-such-master'")
        for q in ("SELECT redis_lock_try_acquire('unrouted', ttl => '60s')",
                  "SELECT redis_lock_acquire_many(ARRAY['unrouted', 'u2'], ttl => '60s')"):
            with pytest.raises(psycopg2.Error) as ei:
                s.run(q)
            assert ei.value.pgcode == "08001", ei.value
        s.run("RESET redis_lock.sentinels")
        s.run("RESET redis_lock.sentinel_master")
        assert s.run("SELECT redis_lock_acquire('routed') > 0")
        testbed.wait_until(lambda: s.run("SELECT last_renewed_at > acquired_at FROM "
                                         "redis_lock_all_locks() WHERE lock_name = 'routed'"),
                           10, 0.01, what="the worker's first renewal")
        assert "could not renew or release" not in pg.log_text()
        assert s.run("SELECT redis_lock_release('routed')") is True
    finally:
        s.close()
        pg.cleanup()
        sentinel.stop()
        master.stop()


def test_without_preloading_an_unrouted_acquire_is_forgotten():
    """The same refusal without the worker: the entry never tried is
    dropped at the session's next call, not settled through the Sentinel at
    every call for the rest of the session (a release that could never be
    routed, so never done).  A proxy in front of the Sentinel counts what
    the session sends it."""
    master = testbed.Redis().start()
    sentinel = testbed.Sentinel(master.port).start()
    proxy = testbed.DelayProxy(sentinel.port, 0.0).start()
    pg = testbed.Postgres(preload=False,
                          conf={"redis_lock.url": master.url}).init().start().with_extension()
    s = Session(pg)
    try:
        s.run("SET redis_lock.sentinels = %s", ("redis://127.0.0.1:%d" % proxy.port,))
        s.run("SET redis_lock.sentinel_master = 'no-such-master'")
        with pytest.raises(psycopg2.Error) as ei:
            s.run("SELECT redis_lock_try_acquire('unrouted', ttl => '60s')")
        assert ei.value.pgcode == "08001", ei.value
        s.run("RESET redis_lock.sentinels")
        s.run("RESET redis_lock.sentinel_master")
        before = proxy.chunks_in
        assert before > 0
        for _ in range(3):
            assert s.run("SELECT redis_lock_acquire('routed', ttl => '30s') > 0")
            assert s.run("SELECT redis_lock_release('routed')") is True
        assert proxy.chunks_in == before
    finally:
        s.close()
        pg.cleanup()
        proxy.stop()
        sentinel.stop()
        master.stop()


def test_sentinel_failover_moves_the_next_acquire_to_the_promoted_replica(sentinel_env):
    master, replica, sentinels, pg = sentinel_env
    a = Session(pg)
    assert a.run("SELECT redis_lock_acquire('before', ttl => '60s') > 0")
    assert master.client().exists("before") == 1
    # with WAIT, the grant is confirmed on the replica before acquire returns
    a.run("SET redis_lock.wait_replicas = 1")
    assert a.run("SELECT redis_lock_acquire('replicated', ttl => '60s') > 0")
    assert replica.client().exists("replicated") == 1
    a.run("SET redis_lock.wait_replicas = 2")          # there is only one replica
    with pytest.raises(psycopg2.OperationalError) as ei:
        a.run("SELECT redis_lock_acquire('unreplicated', ttl => '60s')")
    assert "was not replicated to 2 replica(s)" in str(ei.value)
    assert master.client().exists("unreplicated") == 0
    a.run("SET redis_lock.wait_replicas = 0")

    master.kill()                                      # the master dies mid-run
    killed = time.monotonic()
    got = None
    while got is None and time.monotonic() - killed < 30:
        try:
            got = a.run("SELECT redis_lock_acquire('after', ttl => '60s')")
        except psycopg2.Error:
            time.sleep(0.2)
    assert got is not None, "no acquire succeeded after the failover"
    print("\nfirst acquire after killing the master succeeded %.1f s later" %
          (time.monotonic() - killed))
    role = replica.client().execute_command("ROLE")
    assert role[0] == b"master"
    assert replica.client().get("after").startswith(b"pgrl:")
    # the locks taken before the failover had reached the replica
    assert a.run("SELECT redis_lock_release('replicated')") is True
    assert a.run("SELECT redis_lock_release('after')") is True
    assert replica.client().exists("after", "replicated") == 0
    a.close()


# ================================================================ Cluster

@pytest.fixture
def cluster():
    nodes = [testbed.cluster_node().start() for _ in range(3)]
    testbed.create_cluster(nodes)
    pg = fresh_pg(**{"redis_lock.url": nodes[0].url, "redis_lock.cluster": "on"})
    yield nodes, pg
    pg.cleanup()
    for n in nodes:
        n.stop()


def test_cluster_locks_spread_over_slots(cluster):
    nodes, pg = cluster
    a = Session(pg)
    a.run("SET redis_lock.max_locks_per_session = 300")   # the default is 128
    assert a.run("SELECT count(redis_lock_acquire('c-' || g, ttl => '60s')) "
                 "FROM generate_series(1, 300) g") == 300
    per_node = [len(n.client().keys("c-*")) for n in nodes]
    assert sum(per_node) == 300 and min(per_node) > 50
    for name in ("c-1", "c-77", "c-300"):
        owner, _ = testbed.slot_owner(nodes, name)
        assert owner.client().get(name).startswith(b"pgrl:")
    fences = a.run("SELECT array_agg(fence ORDER BY lock_name) FROM redis_lock_held()")
    assert all(f > 0 for f in fences)
    assert a.run("SELECT redis_lock_release_all()") == 300
    assert sum(len(n.client().keys("c-*")) for n in nodes) == 0
    a.close()


def test_cluster_keyspace_notifications_wake_a_waiter_on_the_keys_node(cluster):
    """Keyspace notifications are node-local: the waiter subscribes on the
    node that owns the key, and a foreign holder's DEL there wakes it."""
    nodes, pg = cluster
    a, admin = Session(pg), Session(pg)
    try:
        for n in nodes:
            n.client().config_set("notify-keyspace-events", "Kgx")
        woke = []
        for key in ("ks-a", "ks-b", "ks-c", "ks-d", "ks-e", "ks-f", "ks-g", "ks-h"):
            owner, _ = testbed.slot_owner(nodes, key)
            oc = owner.client()
            assert oc.set(key, "foreign-token", nx=True, px=30000)
            a.start("SELECT redis_lock_acquire(%s, wait => '10s') > 0", (key,))
            wait_for_wait_event(admin.conn, a.pid)
            testbed.wait_until(lambda: oc.execute_command(
                "PUBSUB", "NUMSUB", "__keyspace@0__:" + key)[1] > 0, 5,
                what="the waiter subscribed on the key's node")
            time.sleep(0.3)                  # past the first poll intervals
            released = time.monotonic()
            oc.delete(key)
            a.join()
            assert a.error is None and a.result is True
            woke.append(a.finished_at - released)
            assert a.run("SELECT redis_lock_release(%s)", (key,)) is True
        # by the notification: a poll (every 100 ms by then) would wake the
        # waiter in 50 ms on average; the median of eight keys keeps a
        # waiter descheduled once on a loaded machine from deciding it
        print("\nwoken after the DEL: %s ms" % ", ".join("%.1f" % (w * 1000) for w in woke))
        assert statistics.median(woke) < 0.02 * S, woke
    finally:
        a.close()
        admin.close()


def exists_asking(node, *keys):
    """EXISTS, key by key, on a node importing the keys' slot (each needs
    ASKING first; several keys at once would get TRYAGAIN mid-migration)."""
    c = node.client(single_connection_client=True)
    n = 0
    for k in keys:
        c.execute_command("ASKING")
        n += c.exists(k)
    c.close()
    return n


def test_cluster_slot_migration_mid_run_moved_and_ask(cluster):
    nodes, pg = cluster
    a, b = Session(pg), Session(pg)
    # several held locks in one slot (hash tag), on a known source node
    names = ["{mig}:%d" % i for i in range(6)]
    for n in names:
        assert a.run("SELECT redis_lock_acquire(%s, ttl => '60s') > 0", (n,))
    src, slot = testbed.slot_owner(nodes, "{mig}:0")
    dst = next(n for n in nodes if n is not src)
    s_id = src.client().execute_command("CLUSTER", "MYID").decode()
    d_id = dst.client().execute_command("CLUSTER", "MYID").decode()
    dst.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", s_id)
    src.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", d_id)
    # move half of the lock keys: releasing them now needs ASK
    for n in names[:3]:
        src.client().execute_command("MIGRATE", "127.0.0.1", dst.port, n, 0, 5000)
    assert exists_asking(dst, *names[:3]) == 3
    for n in names[:3]:
        assert a.run("SELECT redis_lock_release(%s)", (n,)) is True
    assert exists_asking(dst, *names[:3]) == 0
    # a new lock in the migrating slot waits out TRYAGAIN ...
    b.start("SELECT redis_lock_acquire('{mig}:new', ttl => '60s', wait => '10s') > 0")
    time.sleep(0.3)
    # ... until the migration completes
    for k in src.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        src.client().execute_command("MIGRATE", "127.0.0.1", dst.port, k, 0, 5000)
    for n in nodes:
        n.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", d_id)
    b.join(20)
    assert b.error is None and b.result is True
    assert dst.client().get("{mig}:new").startswith(b"pgrl:")
    # the rest, held from before the move, are released through MOVED
    for n in names[3:]:
        assert a.run("SELECT redis_lock_release(%s)", (n,)) is True
    assert dst.client().exists(*names) == 0
    assert b.run("SELECT redis_lock_release('{mig}:new')") is True
    a.close()
    b.close()
