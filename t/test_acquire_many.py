"""Several locks at once: redis_lock_acquire_many / redis_lock_release_many
(doc/reference.md, "Several locks at once")."""
import threading
import time

import psycopg2
import pytest

from conftest import Session, wait_for_wait_event
from peers import REDISSON_LINES, JavaPeer
import testbed
from testbed import TIME_SCALE as S


def keys(rc, pattern="*"):
    return sorted(k.decode() for k in rc.keys(pattern) if not k.startswith(b"redis_lock:fence"))


def held(s):
    with s.conn.cursor() as cur:
        cur.execute("SELECT lock_name, scope, hold_count FROM redis_lock_held() ORDER BY 1, 2")
        return cur.fetchall()


def wait_for_subscriber(rc, channel):
    testbed.wait_until(lambda: int(rc.execute_command("PUBSUB", "NUMSUB", channel)[1]) > 0,
                       10, what="a subscriber on " + channel)


def evalsha_calls(rc):
    return rc.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def test_takes_every_lock_tokens_in_order_and_one_evalsha(sessions, rc):
    a = sessions()
    a.run("SELECT redis_lock_acquire('warm'), redis_lock_release('warm')")
    rc.config_resetstat()
    tokens = a.run("SELECT redis_lock_acquire_many(ARRAY['m3', 'm1', 'm2'])")
    assert evalsha_calls(rc) == 1
    assert len(tokens) == 3 and all(t is not None for t in tokens)
    assert tokens == sorted(tokens) and len(set(tokens)) == 3, tokens
    assert keys(rc) == ["m1", "m2", "m3"]
    for name, tok in zip(["m3", "m1", "m2"], tokens):
        assert a.run("SELECT redis_lock_fence(%s)", (name,)) == tok
        assert rc.pttl(name) > 25000
    assert held(a) == [("m1", "session", 1), ("m2", "session", 1), ("m3", "session", 1)]
    rc.config_resetstat()
    assert a.run("SELECT redis_lock_release_many(ARRAY['m1', 'm2', 'm3'])") == 3
    assert evalsha_calls(rc) == 3  # three release scripts, one pipelined round trip
    assert keys(rc) == [] and held(a) == []


def test_tokens_increase_in_the_order_given_across_counters(sessions, rc):
    a = sessions()
    # the counter of the first name's slot far ahead of every other one
    a.run("SELECT redis_lock_acquire('hi'), redis_lock_release('hi')")
    counter, = rc.keys("redis_lock:fence:*")
    rc.set(counter, 9 * 10**15)
    tokens = a.run("SELECT redis_lock_acquire_many(ARRAY['hi', 'lo1', 'lo2', 'lo3'])")
    assert tokens[0] > 9 * 10**15
    assert all(x < y for x, y in zip(tokens, tokens[1:])), tokens
    # each counter stays ahead of the token its lock got: later single acquires go on rising
    for name, tok in zip(["hi", "lo1", "lo2", "lo3"], tokens):
        assert a.run("SELECT redis_lock_release(%s)", (name,))
        assert a.run("SELECT redis_lock_acquire(%s)", (name,)) > tok
        assert a.run("SELECT redis_lock_release(%s)", (name,))


def test_all_or_nothing_against_a_redis_py_holder(sessions, rc):
    a = sessions()
    lock = rc.lock("b2", timeout=30)
    assert lock.acquire(blocking=False)
    with pytest.raises(psycopg2.errors.LockNotAvailable) as ei:
        a.run("SELECT redis_lock_acquire_many(ARRAY['b1', 'b2', 'b3'], wait => '0')")
    assert 'could not obtain Redis locks "b1", "b2" and "b3"' in str(ei.value)
    assert ei.value.diag.message_detail.startswith('Another client holds Redis lock "b2"')
    assert keys(rc) == ["b2"] and held(a) == []
    t0 = time.monotonic()
    with pytest.raises(psycopg2.errors.LockNotAvailable) as ei:
        a.run("SELECT redis_lock_acquire_many(ARRAY['b1', 'b2', 'b3'], wait => '300ms')")
    assert time.monotonic() - t0 >= 0.3
    assert "within 300ms" in str(ei.value)
    assert keys(rc) == ["b2"] and held(a) == []
    assert rc.get("b2") == lock.local.token
    lock.release()
    assert len(a.run("SELECT redis_lock_acquire_many(ARRAY['b1', 'b2', 'b3'], wait => '0')")) == 3
    assert keys(rc) == ["b1", "b2", "b3"]
    assert a.run("SELECT redis_lock_release_many(ARRAY['b3', 'b1', 'b2'])") == 3


def test_ttl_null_is_renewed_by_the_watchdog_and_a_ttl_is_not(sessions, rc):
    a = sessions()
    a.run("SET redis_lock.lease_time = '1500ms'")
    a.run("SELECT redis_lock_acquire_many(ARRAY['w1', 'w2'])")
    a.run("SELECT redis_lock_acquire_many(ARRAY['f1', 'f2'], ttl => '1500ms')")
    assert a.run("SELECT bool_and(watchdog) FROM redis_lock_held() WHERE lock_name LIKE 'w%'")
    assert not a.run("SELECT bool_or(watchdog) FROM redis_lock_held() WHERE lock_name LIKE 'f%'")
    # three leases later the renewed ones are still there, the fixed ones gone
    t_end = time.monotonic() + 4.5
    while time.monotonic() < t_end:
        assert rc.exists("w1", "w2") == 2, "a renewed lease ran out"
        time.sleep(0.05)
    assert rc.exists("f1", "f2") == 0
    assert a.run("SELECT redis_lock_release_many(ARRAY['w1', 'w2'])") == 2


def test_wrong_type_changes_nothing(sessions, rc):
    a = sessions()
    rc.hset("wt2", "f", "1")
    with pytest.raises(psycopg2.errors.WrongObjectType) as ei:
        a.run("SELECT redis_lock_acquire_many(ARRAY['wt1', 'wt2', 'wt3'])")
    assert 'Redis key "wt2" holds a hash' in str(ei.value)
    assert keys(rc) == ["wt2"] and rc.hgetall("wt2") == {b"f": b"1"}
    assert held(a) == []


def test_reentrancy_with_a_name_already_held(sessions, rc):
    a = sessions()
    t1 = a.run("SELECT redis_lock_acquire('r1')")
    rc.pexpire("r1", 5000)
    rc.config_resetstat()
    tokens = a.run("SELECT redis_lock_acquire_many(ARRAY['r2', 'r1'])")
    assert evalsha_calls(rc) == 1
    assert tokens[1] == t1 and tokens[0] > t1
    assert rc.pttl("r1") > 25000                     # its lease restarted
    assert held(a) == [("r1", "session", 2), ("r2", "session", 1)]
    assert a.run("SELECT redis_lock_release_many(ARRAY['r1', 'r2'])") == 2
    assert keys(rc) == ["r1"] and held(a) == [("r1", "session", 1)]
    # a name held at transaction scope too: both scopes counted, as a single acquire
    a.run("BEGIN")
    assert a.run("SELECT redis_lock_acquire_many(ARRAY['r1'], xact => true)") == [t1]
    assert held(a) == [("r1", "session", 1), ("r1", "transaction", 1)]
    a.run("COMMIT")
    assert keys(rc) == ["r1"] and held(a) == [("r1", "session", 1)]
    assert a.run("SELECT redis_lock_release('r1')")
    assert keys(rc) == []


@pytest.mark.parametrize("order", [["ml_a", "ml_b"], ["ml_b", "ml_a"]])
def test_a_set_mixing_a_held_layout_with_the_settings_is_refused_in_any_order(sessions, rc, order):
    """Issue 33, item 9: a name held under redisson, the others to be taken
    under simple.  One script takes a set in one layout: before, the set
    took ml_b as a Redisson hash that redis_lock_held() called simple and no
    release could delete (names in one order), or failed 42809 (the other)."""
    a = sessions()
    a.run("SET redis_lock.protocol = 'redisson'")
    a.run("SELECT redis_lock_acquire('ml_a')")
    a.run("SET redis_lock.protocol = 'simple'")
    with pytest.raises(psycopg2.errors.FeatureNotSupported) as ei:
        a.run("SELECT redis_lock_acquire_many(%s)", (order,))
    assert "must share a layout" in str(ei.value)
    assert keys(rc, "ml_*") == ["ml_a"] and rc.type("ml_a") == b"hash"
    assert a.run("SELECT array_agg(lock_name || ':' || protocol || ':' || hold_count) "
                 "FROM redis_lock_held()") == ["ml_a:redisson:1"]
    # in the held lock's layout the set is taken, and released
    a.run("SET redis_lock.protocol = 'redisson'")
    assert len(a.run("SELECT redis_lock_acquire_many(%s)", (order,))) == 2
    assert rc.type("ml_b") == b"hash"
    assert a.run("SELECT redis_lock_release_many(%s)", (order,)) == 2
    assert a.run("SELECT redis_lock_release('ml_a')")
    assert keys(rc, "ml_*") == []


def test_a_held_name_found_lost_is_taken_anew(sessions, rc):
    a = sessions()
    t1 = a.run("SELECT redis_lock_acquire('l1')")
    rc.delete("l1")
    a.conn.notices.clear()
    tokens = a.run("SELECT redis_lock_acquire_many(ARRAY['l1', 'l2'])")
    assert any('Redis lock "l1" was lost; acquiring it anew' in n for n in a.conn.notices)
    assert tokens[0] > t1 and tokens[1] > tokens[0]
    assert held(a) == [("l1", "session", 1), ("l2", "session", 1)]
    assert a.run("SELECT redis_lock_release_many(ARRAY['l1', 'l2'])") == 2
    assert keys(rc) == []


def test_xact_scope_released_at_commit_and_rollback(sessions, rc):
    a = sessions()
    for end in ("COMMIT", "ROLLBACK"):
        a.run("BEGIN")
        a.run("SELECT redis_lock_acquire_many(ARRAY['x1', 'x2'], xact => true)")
        assert keys(rc) == ["x1", "x2"]
        assert held(a) == [("x1", "transaction", 1), ("x2", "transaction", 1)]
        a.conn.notices.clear()
        assert a.run("SELECT redis_lock_release_many(ARRAY['x1'])") == 0
        assert any("held only at transaction scope" in n for n in a.conn.notices)
        a.run(end)
        assert keys(rc) == [] and held(a) == []


def test_release_many_warns_for_each_name_not_held(sessions, rc):
    a = sessions()
    a.run("SELECT redis_lock_acquire('h1')")
    a.conn.notices.clear()
    assert a.run("SELECT redis_lock_release_many(ARRAY['n1', 'h1', 'n2'])") == 1
    warned = [n for n in a.conn.notices if "you do not hold" in n]
    assert len(warned) == 2 and '"n1"' in warned[0] and '"n2"' in warned[1]
    assert keys(rc) == []


def test_a_sql_holders_release_wakes_the_waiter(sessions, rc):
    a, b, admin = sessions(), sessions(), sessions()
    for _ in range(3):
        a.run("SELECT redis_lock_acquire('p2')")
        b.start("SELECT redis_lock_acquire_many(ARRAY['p1', 'p2', 'p3'], wait => '20s')")
        wait_for_wait_event(admin.conn, b.pid)
        # our holders publish: without the wake-up the waiter would sleep 1 s
        t0 = time.monotonic()
        assert a.run("SELECT redis_lock_release('p2')")
        b.join()
        assert b.error is None and len(b.result) == 3
        assert b.finished_at - t0 < 0.3 * S
        assert b.run("SELECT redis_lock_release_many(ARRAY['p1', 'p2', 'p3'])") == 3


def test_the_wait_follows_the_next_busy_lock_of_the_set(sessions, rc):
    """Two locks of the set are busy: the release of the one that stopped
    the attempt wakes the waiter, whose next attempt is stopped by the
    other; the wait follows that one, and its release wakes it too."""
    a, b, w, admin = sessions(), sessions(), sessions(), sessions()
    a.run("SELECT redis_lock_acquire('q1')")
    b.run("SELECT redis_lock_acquire('q3')")
    w.start("SELECT redis_lock_acquire_many(ARRAY['q1', 'q2', 'q3'], wait => '20s')")
    wait_for_wait_event(admin.conn, w.pid)
    for holder, name in ((a, "q1"), (b, "q3")):
        # without the wake-up the waiter would sleep 1 s between attempts
        channel = "redis_lock:release:{%s}" % name
        testbed.wait_until(lambda: dict(rc.pubsub_numsub(channel)).get(channel.encode()) == 1,
                           10, 0.01, what="the waiter to listen for " + name)
        assert w.thread.is_alive()
        t0 = time.monotonic()
        assert holder.run("SELECT redis_lock_release(%s)", (name,))
    w.join()
    assert w.error is None and len(w.result) == 3
    assert w.finished_at - t0 < 0.3 * S
    assert w.run("SELECT redis_lock_release_many(ARRAY['q1', 'q2', 'q3'])") == 3


def test_a_foreign_clients_delete_wakes_the_waiter_by_keyspace_event(sessions, rc):
    a, admin = sessions(), sessions()
    rc.config_set("notify-keyspace-events", "Kgx")
    try:
        for _ in range(3):
            # a token that looks like ours says "I publish": the waiter polls only
            # every second, so a prompt wake-up is the keyspace notification
            rc.set("k2", "pgrl:foreign", px=30000)
            a.start("SELECT redis_lock_acquire_many(ARRAY['k1', 'k2', 'k3'], wait => '20s')")
            wait_for_wait_event(admin.conn, a.pid)
            t0 = time.monotonic()
            rc.delete("k2")
            a.join()
            assert a.error is None and len(a.result) == 3
            assert a.finished_at - t0 < 0.3 * S
            assert a.run("SELECT redis_lock_release_many(ARRAY['k1', 'k2', 'k3'])") == 3
    finally:
        rc.config_set("notify-keyspace-events", "")


def test_a_redis_py_holders_release_is_found_and_no_busy_polling(sessions, rc):
    a, admin = sessions(), sessions()
    lock = rc.lock("q2", timeout=30)
    assert lock.acquire(blocking=False)
    a.start("SELECT redis_lock_acquire_many(ARRAY['q1', 'q2'], wait => '20s')")
    wait_for_wait_event(admin.conn, a.pid)
    before = evalsha_calls(rc)
    t0 = time.monotonic()
    testbed.wait_until(lambda: time.monotonic() - t0 > 1.0, 5)
    tries = evalsha_calls(rc) - before
    # backoff 8 ms doubling to 100 ms: about 14 attempts in a second, not thousands
    assert tries <= 20, tries
    lock.release()
    a.join()
    assert a.error is None
    assert a.run("SELECT redis_lock_release_many(ARRAY['q1', 'q2'])") == 2


@pytest.mark.parametrize("how", ["cancel", "statement_timeout"])
def test_cancel_during_the_wait_leaves_nothing(sessions, rc, how):
    a, admin = sessions(), sessions()
    lock = rc.lock("c2", timeout=30)
    assert lock.acquire(blocking=False)
    if how == "statement_timeout":
        a.run("SET statement_timeout = '500ms'")
    a.start("SELECT redis_lock_acquire_many(ARRAY['c1', 'c2', 'c3'], wait => '30s')")
    wait_for_wait_event(admin.conn, a.pid)
    t0 = time.monotonic()
    if how == "cancel":
        admin.run("SELECT pg_cancel_backend(%s)", (a.pid,))
    a.join()
    assert isinstance(a.error, psycopg2.errors.QueryCanceled)
    assert a.finished_at - t0 < 1.0 * S + (0.5 if how == "statement_timeout" else 0)
    a.run("RESET statement_timeout")
    assert keys(rc) == ["c2"] and held(a) == []
    lock.release()
    assert len(a.run("SELECT redis_lock_acquire_many(ARRAY['c1', 'c2', 'c3'], wait => '0')")) == 3
    assert a.run("SELECT redis_lock_release_many(ARRAY['c1', 'c2', 'c3'])") == 3
    assert keys(rc) == []


def opposite_orders(sessions, names, rounds):
    """Two sessions take the same set in opposite orders, rounds times each,
    in parallel; each writes inside its hold to prove the exclusion."""
    setup = sessions()
    setup.run("DROP TABLE IF EXISTS many_log; CREATE TABLE many_log(who int, phase int, at serial)")
    errors = []

    def worker(who, order):
        s = sessions()
        try:
            arr = "ARRAY[%s]" % ", ".join("'%s'" % n for n in order)
            for _ in range(rounds):
                s.run("SELECT redis_lock_acquire_many(%s, wait => '60s')" % arr)
                s.run("INSERT INTO many_log(who, phase) VALUES (%s, 0)", (who,))
                s.run("INSERT INTO many_log(who, phase) VALUES (%s, 1)", (who,))
                assert s.run("SELECT redis_lock_release_many(%s)" % arr) == len(order)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    ts = [threading.Thread(target=worker, args=(0, names)),
          threading.Thread(target=worker, args=(1, list(reversed(names))))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120 * S)
    assert not any(t.is_alive() for t in ts), "a session did not finish: deadlock?"
    assert errors == []
    with setup.conn.cursor() as cur:
        cur.execute("SELECT who, phase FROM many_log ORDER BY at")
        rows = cur.fetchall()
    assert len(rows) == 4 * rounds
    # every hold's two writes are adjacent: no other session wrote in between
    for i in range(0, len(rows), 2):
        assert rows[i][0] == rows[i + 1][0] and (rows[i][1], rows[i + 1][1]) == (0, 1), rows[i:i + 2]


def test_opposite_orders_in_parallel_never_deadlock(sessions, rc):
    opposite_orders(sessions, ["o1", "o2", "o3"], 200)


# ================================================================ Redisson layout

def test_redisson_layout_takes_rlock_hashes(rsql, rc):
    a = rsql()
    tokens = a.run("SELECT redis_lock_acquire_many(ARRAY['rb', 'ra'], ttl => '20s')")
    assert tokens[0] < tokens[1]
    for k in ("ra", "rb"):
        h = rc.hgetall(k)
        assert len(h) == 1 and list(h.values()) == [b"1"]
        assert 15000 < rc.pttl(k) <= 20000
    # each grant has a field of its own (doc/failures.md, "Owner values")
    field, = rc.hkeys("ra")
    other, = rc.hkeys("rb")
    assert other != field
    assert a.run("SELECT redis_lock_release_many(ARRAY['ra', 'rb'])") == 2
    assert rc.exists("ra", "rb") == 0


@pytest.fixture(scope="module", params=REDISSON_LINES, ids=lambda l: "redisson" + l)
def java(request, redis_srv):
    peer = JavaPeer([redis_srv.port], line=request.param, watchdog_ms=1500)
    yield peer
    peer.close()


def test_redisson_multilock_and_sql_exclude_each_other_both_ways(java, rsql, sessions, rc):
    a, admin = rsql(), sessions()
    # Java holds {j1, j2}: SQL cannot have {j2, j3}, and leaves nothing behind
    assert java.call("t1", "multilock", "j1,j2") is True
    field = java.call("t1", "hello")
    with pytest.raises(psycopg2.errors.LockNotAvailable) as ei:
        a.run("SELECT redis_lock_acquire_many(ARRAY['j3', 'j2'], wait => '0')")
    assert '"j2"' in ei.value.diag.message_detail
    assert rc.exists("j3") == 0 and rc.hkeys("j2") == [field.encode()]
    # a SQL waiter for {j2, j3} is woken by Redisson's unlock of the multilock
    a.start("SELECT redis_lock_acquire_many(ARRAY['j2', 'j3'], wait => '20s')")
    wait_for_wait_event(admin.conn, a.pid)
    t0 = time.monotonic()
    assert java.call("t1", "multiunlock", "j1,j2") is True
    a.join()
    assert a.error is None and len(a.result) == 2
    assert a.finished_at - t0 < 0.5 * S
    # SQL holds {j2, j3}: Redisson's multilock of {j1, j2} cannot, and then can
    assert java.call("t2", "multitrylock", "j1,j2", 0, -1) is False
    assert rc.exists("j1") == 0
    waiting = java.send("t2", "multitrylock", "j1,j2", 20000, -1)
    # Redisson's waiter subscribes to the channel of the lock it found busy
    wait_for_subscriber(rc, "redisson_lock__channel:{j2}")
    assert not java.done(waiting)
    t0 = time.time()
    assert a.run("SELECT redis_lock_release_many(ARRAY['j2', 'j3'])") == 2
    got, at = java.result(waiting)
    assert got is True
    # woken by our release's message, not by Redisson's own wait running out
    assert at - t0 < 0.5 * S
    assert java.call("t2", "multiunlock", "j1,j2") is True
    assert rc.exists("j1", "j2", "j3") == 0


# ================================================================ Cluster

@pytest.fixture(scope="module")
def cluster():
    nodes = [testbed.cluster_node().start() for _ in range(3)]
    testbed.create_cluster(nodes)
    pg = testbed.Postgres(conf={"redis_lock.url": nodes[0].url, "redis_lock.cluster": "on"}
                          ).init().start().with_extension()
    yield nodes, pg
    pg.cleanup()
    for n in nodes:
        n.stop()


def spread_names(nodes, n=3):
    """n names on n different masters, by ascending slot."""
    found = {}
    for i in range(1000):
        name = "cl%d" % i
        node, slot = testbed.slot_owner(nodes, name)
        if node.port not in {nd.port for nd, _ in found.values()}:
            found[name] = (node, slot)
        if len(found) == n:
            break
    return sorted(found, key=lambda k: found[k][1]), found


def test_cluster_keys_in_one_slot_one_evalsha(cluster):
    nodes, pg = cluster
    for n in nodes:
        n.client().flushall()
    s = Session(pg)
    try:
        s.run("SELECT redis_lock_acquire('{t}warm'), redis_lock_release('{t}warm')")
        node, _ = testbed.slot_owner(nodes, "{t}a")
        node.client().config_resetstat()
        tokens = s.run("SELECT redis_lock_acquire_many(ARRAY['{t}c', '{t}a', '{t}b'])")
        assert evalsha_calls(node.client()) == 1
        assert tokens == sorted(tokens) and len(set(tokens)) == 3
        assert s.run("SELECT redis_lock_release_many(ARRAY['{t}a', '{t}b', '{t}c'])") == 3
    finally:
        s.close()


def test_cluster_slots_in_order_and_given_back_when_one_is_busy(cluster):
    nodes, pg = cluster
    for n in nodes:
        n.client().flushall()
    names, where = spread_names(nodes)
    s = Session(pg)
    try:
        tokens = s.run("SELECT redis_lock_acquire_many(%s)", (list(reversed(names)),))
        assert len(tokens) == 3 and all(tokens)
        for name in names:
            assert where[name][0].client().get(name).startswith(b"pgrl:")
        assert s.run("SELECT redis_lock_release_many(%s)", (names,)) == 3
        # the last slot busy: the earlier two were taken, then given back
        last = where[names[2]][0].client()
        last.set(names[2], "foreign", px=30000)
        for n in nodes:
            n.client().config_resetstat()
        with pytest.raises(psycopg2.errors.LockNotAvailable) as ei:
            s.run("SELECT redis_lock_acquire_many(%s, wait => '0')", (list(reversed(names)),))
        assert '"%s"' % names[2] in ei.value.diag.message_detail
        for name in names[:2]:
            c = where[name][0].client()
            assert c.exists(name) == 0
            assert evalsha_calls(c) == 2        # acquire, then give back
        assert last.get(names[2]) == b"foreign"
        assert s.run("SELECT count(*) FROM redis_lock_held()") == 0
        # and the first slot busy: nothing after it is asked
        first = where[names[0]][0].client()
        last.delete(names[2])
        first.set(names[0], "foreign", px=30000)
        for n in nodes:
            n.client().config_resetstat()
        with pytest.raises(psycopg2.errors.LockNotAvailable):
            s.run("SELECT redis_lock_acquire_many(%s, wait => '0')", (list(reversed(names)),))
        for name in names[1:]:
            assert evalsha_calls(where[name][0].client()) == 0
        first.delete(names[0])
    finally:
        s.close()


def test_cluster_opposite_orders_in_parallel_never_deadlock(cluster):
    nodes, pg = cluster
    for n in nodes:
        n.client().flushall()
    names, _ = spread_names(nodes)
    made = []

    def sessions():
        made.append(Session(pg))
        return made[-1]
    try:
        opposite_orders(sessions, names, 100)
    finally:
        for s in made:
            s.close()


# ================================================================ Redlock

@pytest.fixture(scope="module")
def redlock():
    masters = [testbed.Redis().start() for _ in range(3)]
    pg = testbed.Postgres(conf={"redis_lock.nodes": ",".join(m.url for m in masters)}
                          ).init().start().with_extension()
    yield masters, pg
    pg.cleanup()
    for m in masters:
        m.stop()


def test_redlock_opposite_orders_in_parallel_never_deadlock(redlock):
    """On three masters two sessions may split a set's votes (each a
    majority of none): each gives its grants back and waits, so they
    neither deadlock nor livelock, and every hold still excludes the other."""
    masters, pg = redlock
    for m in masters:
        m.client().flushall()
    made = []

    def sessions():
        made.append(Session(pg))
        return made[-1]
    try:
        opposite_orders(sessions, ["ro1", "ro2", "ro3"], 50)
    finally:
        for s in made:
            s.close()


def test_redlock_majority_and_give_back_below_quorum(redlock):
    masters, pg = redlock
    clients = [m.client() for m in masters]
    for c in clients:
        c.flushall()
    s = Session(pg)
    try:
        # no fencing on independent masters: NULL tokens
        assert s.run("SELECT redis_lock_acquire_many(ARRAY['g1', 'g2'])") == [None, None]
        assert all(c.exists("g1", "g2") == 2 for c in clients)
        assert s.run("SELECT redis_lock_release_many(ARRAY['g1', 'g2'])") == 2
        # busy on two of three masters: the third's grant is given back
        for c in clients[1:]:
            c.set("g2", "foreign", px=30000)
        clients[0].config_resetstat()
        with pytest.raises(psycopg2.errors.LockNotAvailable):
            s.run("SELECT redis_lock_acquire_many(ARRAY['g1', 'g2'], wait => '0')")
        assert evalsha_calls(clients[0]) == 3   # granted both, then two releases
        assert clients[0].exists("g1", "g2") == 0
        assert all(c.exists("g1") == 0 for c in clients)
        # busy on one master only: a majority grants, and that master stays foreign's
        clients[1].delete("g2")
        assert s.run("SELECT redis_lock_acquire_many(ARRAY['g1', 'g2'], wait => '0')") == [None, None]
        assert clients[2].get("g2") == b"foreign"
        assert clients[0].exists("g1", "g2") == 2 and clients[1].exists("g1", "g2") == 2
        assert s.run("SELECT redis_lock_release_many(ARRAY['g1', 'g2'])") == 2
        assert clients[2].get("g2") == b"foreign"
    finally:
        s.close()


def test_a_late_grant_of_a_timed_out_attempt_is_a_doubt_per_key(env):
    """Redis frozen while the script is in flight: the call fails after
    command_timeout holding nothing; when Redis thaws it runs the script and
    grants every key, and the watchdog worker deletes each of them (one
    doubt per key, the single acquire's machinery), whether or not the
    session calls again."""
    r, pg, session = env
    rc = r.client()
    a = session()
    a.run("SELECT redis_lock_acquire('warm'), redis_lock_release('warm')")
    a.run("SET redis_lock.command_timeout = '300ms'")
    rc.config_resetstat()
    r.pause()
    try:
        with pytest.raises(psycopg2.Error) as ei:
            a.run("SELECT redis_lock_acquire_many(ARRAY['d1', 'd2', 'd3'], ttl => '60s')")
        assert ei.value.pgcode == "08006"
        assert held(a) == []
    finally:
        r.resume()

    def landed_and_gone():
        # Redis ran the queued script (granting all three) and one release
        # per key (the keys are also absent before the thawed Redis has run
        # the script: the count tells the two apart)
        return evalsha_calls(rc) >= 4 and rc.exists("d1", "d2", "d3") == 0
    # the late grant lands, then goes: nothing keeps a 60 s lease alive
    testbed.wait_until(landed_and_gone, 10 * S, 0.001,
                       what="the late grants to land and the worker to delete them")
    assert held(a) == []
    assert len(a.run("SELECT redis_lock_acquire_many(ARRAY['d1', 'd2', 'd3'], wait => '0')")) == 3
    assert a.run("SELECT redis_lock_release_many(ARRAY['d1', 'd2', 'd3'])") == 3
