"""SQL semaphores under redis_lock.semaphore_protocol = 'redis_semaphore'
share their permits with the real npm redis-semaphore 5.8.0 (Semaphore and
MultiSemaphore over ioredis, t/interop/semaphore_peer.js), both ways.

Node's `new Semaphore(client, 'exports', 3, ...)` is SQL's 'semaphore:exports'
with max_permits => 3: one sorted set whose members are holders, scored with
the time each was taken or last refreshed (Unix ms, the writer's clock).
Neither side publishes to the other: Node polls every retryInterval, a SQL
waiter polls with a backoff up to 100 ms (and wakes on keyspace
notifications of the key's deletion where the server sends them).

The lease.  redis-semaphore keeps no lease per member: whoever runs the next
acquire removes every member scored at or before its own now - its own
lockTimeout.  The lease of a member is therefore the smallest lease of any
client that touches the key, SQL's ttl (or redis_lock.lease_time) and
Node's lockTimeout alike: every client must use the same one, or the
shortest evicts holders that believe they still hold
(test_a_shorter_lease_evicts_holders_of_a_longer_one).  Likewise the limit
lives in no key: every client passes it, and SQL must be told it
(max_permits, test_max_permits_must_be_given)."""
import select
import statistics
import time

import psycopg2
import pytest

from checks import report_latency
from conftest import wait_for_wait_event
from peers import SemaphorePeer
import testbed

CLIENT = "redis-semaphore 5.8.0"


@pytest.fixture
def node(redis_srv):
    made = []

    def make():
        p = SemaphorePeer(redis_srv.port)
        made.append(p)
        return p
    yield make
    for p in made:
        p.close()


@pytest.fixture
def sql(sessions):
    """Sessions speaking redis-semaphore's layout, with lease_time (the
    watchdog's lease when ttl is NULL) equal to Node's default lockTimeout,
    10 s: one lease for every client."""
    def make(lease="10s"):
        s = sessions()
        s.run("SET redis_lock.semaphore_protocol = 'redis_semaphore'")
        s.run("SET redis_lock.lease_time = %s", (lease,))
        return s
    return make


def members(rc, key):
    return {m.decode(): s for m, s in rc.zrange(key, 0, -1, withscores=True)}


def on_monotonic(score):
    """A member's score (Unix ms, the writer's clock: this machine's) as a
    time.monotonic() value."""
    return time.monotonic() - (time.time() - score / 1000)


def try_take(s, name, limit, permits=1):
    """redis_semaphore_try_acquire: True or False."""
    return s.run("SELECT redis_semaphore_try_acquire(%s, %s, max_permits => %s)",
                 (name, permits, limit))


def sql_members(s, name):
    ids = s.run("SELECT permit_ids FROM redis_semaphores_held() WHERE semaphore_name = %s",
                (name,))
    return set(ids or ())


def evalsha_calls(rc):
    return rc.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def no_answer_yet(peer):
    return not select.select([peer.proc.stdout], [], [], 0)[0]


def wait_until_node_polls(rc, peer, since, attempts=3):
    """Until a Node waiter has run its acquire script `attempts` times more
    (it polls with EVALSHA every retryInterval), or has answered (the
    caller's checks then say whether it should have)."""
    testbed.wait_until(lambda: evalsha_calls(rc) >= since + attempts or not no_answer_yet(peer),
                       10, what="the Node waiter to poll")


# ------------------------------------------------------------ shared limit

def test_sql_holders_count_against_node_limit(sql, node, rc):
    a, b, c = sql(), sql(), sql()
    for s in (a, b):
        assert s.run("SELECT redis_semaphore_acquire('semaphore:exports', max_permits => 3)")
    n1, n2 = node(), node()
    got = n1.acquire("exports", 3, acquireAttemptsLimit=1)
    assert got["acquired"]
    # 2 SQL + 1 Node: full for Node and for SQL
    assert not n2.acquire("exports", 3, acquireAttemptsLimit=1)["acquired"]
    assert not n2.acquire("exports", 3, acquireTimeout=300)["acquired"]
    assert try_take(c, "semaphore:exports", 3) is False
    assert c.run("SELECT available, taken FROM redis_semaphore_status('semaphore:exports', 3)") == (0, 3)
    held = members(rc, "semaphore:exports")
    assert set(held) == sql_members(a, "semaphore:exports") | sql_members(b, "semaphore:exports") \
        | {got["identifier"]}
    # a SQL release frees a permit Node takes
    assert a.run("SELECT redis_semaphore_release('semaphore:exports')") is True
    assert n2.acquire("exports", 3, acquireAttemptsLimit=1)["acquired"]
    assert try_take(c, "semaphore:exports", 3) is False


def test_node_holders_count_against_sql_limit(sql, node, rc):
    a, b = sql(), sql()
    n = node()
    ids = [n.acquire("exports", 3, name=h, acquireAttemptsLimit=1) for h in "xyz"]
    assert all(r["acquired"] for r in ids)
    assert try_take(a, "semaphore:exports", 3) is False
    with pytest.raises(psycopg2.errors.LockNotAvailable):
        a.run("SELECT redis_semaphore_acquire('semaphore:exports', wait => '300ms', max_permits => 3)")
    assert a.run("SELECT initialized, available, taken, held_by_me "
                 "FROM redis_semaphore_status('semaphore:exports', 3)") == (True, 0, 3, 0)
    assert set(members(rc, "semaphore:exports")) == {r["identifier"] for r in ids}
    n.op("release", "y")
    assert try_take(a, "semaphore:exports", 3) is True
    assert not n.acquire("exports", 3, name="w", acquireAttemptsLimit=1)["acquired"]
    assert try_take(b, "semaphore:exports", 3) is False


def test_multisemaphore_and_sql_permits_share_the_pool(sql, node, rc):
    """MultiSemaphore's k members <id>_0..<id>_k-1 and SQL's permits => k
    come out of the same limit."""
    a, b = sql(), sql()
    n = node()
    m = n.acquire("pool", 5, name="m", permits=3, acquireAttemptsLimit=1)
    assert m["acquired"]
    assert {m["identifier"] + "_%d" % i for i in range(3)} <= set(members(rc, "semaphore:pool"))
    # 3 taken of 5: SQL cannot have 3, can have 2
    assert try_take(a, "semaphore:pool", 5, 3) is False
    assert try_take(a, "semaphore:pool", 5, 2) is True
    assert len(sql_members(a, "semaphore:pool")) == 2
    assert rc.zcard("semaphore:pool") == 5
    assert not n.acquire("pool", 5, name="one", acquireAttemptsLimit=1)["acquired"]
    # Node gives its 3 back: SQL's permits => 3 fits, and then nothing else
    n.op("release", "m")
    assert rc.zcard("semaphore:pool") == 2
    assert try_take(b, "semaphore:pool", 5, 3) is True
    assert not n.acquire("pool", 5, name="m2", permits=2, acquireAttemptsLimit=1)["acquired"]
    assert not n.acquire("pool", 5, name="one", acquireAttemptsLimit=1)["acquired"]
    # SQL's 2 back: a MultiSemaphore of 2 fits exactly
    assert a.run("SELECT redis_semaphore_release('semaphore:pool')") is True
    assert n.acquire("pool", 5, name="m2", permits=2, acquireAttemptsLimit=1)["acquired"]
    assert rc.zcard("semaphore:pool") == 5
    assert n.op("refresh", "m2")["refreshed"]


# --------------------------------------------------------------- hand-over

def test_node_waiter_takes_a_permit_sql_released(sql, node, rc):
    """Node polls every retryInterval (10 ms by default): after a SQL
    release it holds the permit within about that, and not before.  The
    release follows one of Node's polls closely (we wait to see them), so
    this measures nearly a whole retryInterval, not half of one."""
    a = sql()
    n = node()
    out = []
    for _ in range(9):
        assert a.run("SELECT redis_semaphore_acquire('semaphore:handover', max_permits => 1)")
        calls = evalsha_calls(rc)
        n.send(op="acquire", key="handover", limit=1, acquireTimeout=10000)
        wait_until_node_polls(rc, n, calls)
        assert no_answer_yet(n)
        released = time.monotonic()
        assert a.run("SELECT redis_semaphore_release('semaphore:handover')") is True
        r, at = n.receive()
        assert r["ok"] and r["acquired"], r
        out.append(at - released)
        n.op("release", "handover")
    p50 = statistics.median(out)
    report_latency(CLIENT, "SQL release -> Node waiter (p50)", p50)
    assert p50 < testbed.WAKE_BOUND, out


def release_right_after_a_poll(rc):
    """Return just after the SQL waiter's next attempt (an EVALSHA: the Node
    holders do not poll), once its backoff has reached the 100 ms cap: the
    poll after it is then at least that far away."""
    since = evalsha_calls(rc)
    testbed.wait_until(lambda: evalsha_calls(rc) >= since + 4, 10,
                       what="the SQL waiter to poll four times")
    seen = evalsha_calls(rc)
    testbed.wait_until(lambda: evalsha_calls(rc) > seen, 10, interval=0.001,
                       what="the SQL waiter's next poll")


def sql_waiter_handovers(a, admin, node, key, limit, cycles, rc=None):
    """Seconds from a Node release to the SQL waiter holding a permit, once a
    cycle; Node holds all `limit` permits and releases one once the poll
    backoff has reached its 100 ms cap: 300 ms into the wait and i/cycles
    of that 100 ms more in cycle i, so the releases fall at every phase of
    the poll and the median is what a release at a random moment sees.
    With rc, each release comes right after one of the waiter's polls
    instead, so that polling alone would take about 100 ms to find it."""
    n = node()
    out = []
    for i in range(cycles):
        for h in range(limit):
            assert n.acquire(key, limit, name=str(h), acquireAttemptsLimit=1)["acquired"]
        a.start("SELECT redis_semaphore_acquire(%s, wait => '10s', max_permits => %s)",
                ("semaphore:" + key, limit))
        wait_for_wait_event(admin.conn, a.pid)
        if rc is None:
            time.sleep(0.3 + 0.1 * i / cycles)
        else:
            release_right_after_a_poll(rc)
        released = time.monotonic()
        n.op("release", "0")
        a.join()
        assert a.error is None and a.result is True, a.error
        out.append(a.finished_at - released)
        assert a.run("SELECT redis_semaphore_release(%s)", ("semaphore:" + key,)) is True
        for h in range(1, limit):
            n.op("release", str(h))
    return out


def test_sql_waiter_takes_a_permit_node_released(sql, sessions, node, rc):
    """Node publishes nothing: the SQL waiter finds the free permit by
    polling (backoff capped at 100 ms).  Where the server sends keyspace
    notifications, Node's release wakes the waiter at once: the "del" of the
    key when it took the last member, the "zrem" when other holders stay."""
    a, admin = sql(), sessions()
    off = sql_waiter_handovers(a, admin, node, "handover", 1, 10)
    rc.config_set("notify-keyspace-events", "Kgz")
    try:
        # each release right after a poll: only the key's event can wake
        # the waiter well before the next poll, 100 ms on
        on = sql_waiter_handovers(a, admin, node, "handover", 1, 7, rc)
        # two of two held: the release removes a member, the key stays
        part = sql_waiter_handovers(a, admin, node, "handover2", 2, 7, rc)
    finally:
        rc.config_set("notify-keyspace-events", "")
    print("Node release -> SQL waiter, notifications off, ms:",
          [round(x * 1000, 1) for x in off])
    p50_off, p50_on, p50_part = (statistics.median(x) for x in (off, on, part))
    report_latency(CLIENT, "Node release -> SQL waiter, keyspace notifications off (p50)", p50_off)
    report_latency(CLIENT, "Node release -> SQL waiter, notifications on, key deleted (p50)", p50_on)
    report_latency(CLIENT, "Node release -> SQL waiter, notifications on, key stays (p50)", p50_part)
    for x in (off, on, part):
        assert statistics.median(x) < testbed.WAKE_BOUND, (off, on, part)
    # the key's "del" or "zrem" woke it: released right after a poll, a
    # wake by the next poll would take about 100 ms (a ratio against the
    # 'off' run's random phases failed under CI's load: 32.9 against 16.9 ms)
    assert p50_on < 0.05, (off, on)
    assert p50_part < 0.05, (off, part)


# ------------------------------------------------------------------ leases

def test_node_holder_without_refresh_frees_its_permit_after_its_lock_timeout(sql, node, rc):
    """A Node holder that stops refreshing (refreshInterval 0) keeps its
    permit for exactly its lockTimeout: a SQL waiter on the same lease
    takes it then, and not before; Node's next refresh learns it lost it.
    A second Node holder, taken half a lease later, keeps the key from
    expiring meanwhile: SQL's own sweep of the stale member frees it."""
    lease = 2.0 * testbed.TIME_SCALE
    lease_ms = int(lease * 1000)
    a, admin = sql(), sql()
    n = node()
    r = n.acquire("stale", 2, name="old", lockTimeout=lease_ms, acquireAttemptsLimit=1)
    assert r["acquired"]
    # the member's score (Node's Date.now()), on our monotonic clock
    scored_at = on_monotonic(members(rc, "semaphore:stale")[r["identifier"]])
    time.sleep(max(0.0, scored_at + lease / 2 - time.monotonic()))
    young = n.acquire("stale", 2, name="young", lockTimeout=lease_ms, acquireAttemptsLimit=1)
    assert young["acquired"]
    a.start("SELECT redis_semaphore_acquire('semaphore:stale', ttl => %s, wait => '30s', "
            "max_permits => 2)", ("%d ms" % lease_ms,))
    wait_for_wait_event(admin.conn, a.pid)
    # 300 ms before the lease ends it still waits
    time.sleep(max(0.0, scored_at + lease - 0.3 - time.monotonic()))
    assert a.finished_at is None
    a.join()
    assert a.error is None and a.result is True, a.error
    # not taken before the member's score + lease (1 ms: clock rounding)
    assert a.finished_at - scored_at >= lease - 0.001, a.finished_at - scored_at
    assert a.finished_at - scored_at < lease + testbed.WAKE_BOUND, a.finished_at - scored_at
    report_latency(CLIENT, "Node holder's lockTimeout end -> SQL waiter",
                   a.finished_at - scored_at - lease)
    assert set(members(rc, "semaphore:stale")) == \
        sql_members(a, "semaphore:stale") | {young["identifier"]}
    assert n.op("refresh", "old")["refreshed"] is False
    assert n.op("refresh", "young")["refreshed"] is True


def test_sql_holder_with_a_ttl_frees_its_permit_for_node_after_the_lease(sql, node, rc):
    """ttl => '1s': no watchdog; Node (lockTimeout 1 s) takes the permit
    when that second is up, and not before.  A Node holder taken half a
    second later keeps the key from expiring: Node's sweep, reading the
    score SQL wrote, frees it."""
    a = sql()
    n = node()
    assert a.run("SELECT redis_semaphore_acquire('semaphore:ttl1', ttl => '1s', max_permits => 2)")
    assert a.run("SELECT watchdog FROM redis_semaphores_held()") is False
    (mine,) = sql_members(a, "semaphore:ttl1")
    scored_at = on_monotonic(members(rc, "semaphore:ttl1")[mine])
    time.sleep(max(0.0, scored_at + 0.5 - time.monotonic()))
    young = n.acquire("ttl1", 2, name="young", lockTimeout=1000, acquireAttemptsLimit=1)
    assert young["acquired"]
    calls = evalsha_calls(rc)
    n.send(op="acquire", key="ttl1", name="waiter", limit=2, lockTimeout=1000,
           acquireTimeout=10000)
    wait_until_node_polls(rc, n, calls)
    r, got = n.receive()
    assert r["ok"] and r["acquired"], r
    # not before the member's score + 1 s (1 ms: clock rounding)
    assert got - scored_at >= 1.0 - 0.001, got - scored_at
    assert got - scored_at < 1.0 + testbed.WAKE_BOUND, got - scored_at
    report_latency(CLIENT, "SQL ttl end -> Node waiter", got - scored_at - 1.0)
    assert set(members(rc, "semaphore:ttl1")) == {young["identifier"], r["identifier"]}


def test_sql_watchdog_renews_so_node_cannot_take_the_permit(sql, node, rc):
    """ttl NULL, lease_time 3 s: the watchdog rescores the member every
    lease/3, so Node on the same 3 s lease polls for 5 s in vain."""
    a = sql(lease="3s")
    n = node()
    assert a.run("SELECT redis_semaphore_acquire('semaphore:renewed', max_permits => 1)")
    assert a.run("SELECT watchdog FROM redis_semaphores_held()") is True
    mine = sql_members(a, "semaphore:renewed")
    first = members(rc, "semaphore:renewed")
    r = n.acquire("renewed", 1, lockTimeout=3000, acquireTimeout=5000, timeout=20)
    assert r["acquired"] is False
    now = members(rc, "semaphore:renewed")
    assert set(now) == mine
    # renewed: scored again within the last lease/3 (and some slack)
    assert all(now[m] > first[m] for m in mine), (first, now)
    assert all(time.time() * 1000 - now[m] < 1000 + 1000 * testbed.WAKE_BOUND for m in mine)
    assert a.run("SELECT lost FROM redis_semaphores_held()") is False
    assert a.run("SELECT redis_semaphore_release('semaphore:renewed')") is True
    assert n.acquire("renewed", 1, lockTimeout=3000, acquireAttemptsLimit=1)["acquired"]


def test_terminated_sql_backend_gives_its_permit_back_to_a_node_waiter(sql, sessions, node, rc):
    a, admin = sql(), sessions()
    n = node()
    assert a.run("SELECT redis_semaphore_acquire('semaphore:exit', max_permits => 1)")
    calls = evalsha_calls(rc)
    n.send(op="acquire", key="exit", limit=1, acquireTimeout=10000)
    wait_until_node_polls(rc, n, calls)
    assert no_answer_yet(n)
    killed = time.monotonic()
    assert admin.run("SELECT pg_terminate_backend(%s)", (a.pid,)) is True
    r, got = n.receive()
    assert r["ok"] and r["acquired"], r
    report_latency(CLIENT, "SQL backend terminated -> Node waiter", got - killed)
    # long before the 10 s lease
    assert got - killed < testbed.WAKE_BOUND, got - killed
    assert set(members(rc, "semaphore:exit")) == {r["identifier"]}


# ------------------------------------------------------------ whose member

def test_sql_release_never_removes_node_members(sql, node, rc):
    a, b = sql(), sql()
    n = node()
    single = n.acquire("mixed", 4, name="s", acquireAttemptsLimit=1)
    multi = n.acquire("mixed", 4, name="m", permits=2, acquireAttemptsLimit=1)
    assert single["acquired"] and multi["acquired"]
    theirs = {single["identifier"], multi["identifier"] + "_0", multi["identifier"] + "_1"}
    # not held here: false, nothing removed
    assert a.run("SELECT redis_semaphore_release('semaphore:mixed')") is False
    assert set(members(rc, "semaphore:mixed")) == theirs
    assert a.run("SELECT redis_semaphore_acquire('semaphore:mixed', max_permits => 4)")
    assert a.run("SELECT redis_semaphore_release('semaphore:mixed')") is True
    assert a.run("SELECT redis_semaphore_release('semaphore:mixed')") is False
    assert set(members(rc, "semaphore:mixed")) == theirs
    for h in ("s", "m"):
        assert n.op("refresh", h)["refreshed"]


def test_stale_sql_release_removes_nothing_of_node(sql, node, rc):
    """A session whose permit went stale and was taken by Node (both on a
    1 s lease): its release is false and leaves Node's member."""
    b = sql()
    n = node()
    assert b.run("SELECT redis_semaphore_acquire('semaphore:taken', ttl => '1s', "
                 "max_permits => 1)")
    r = n.acquire("taken", 1, name="late", lockTimeout=1000, acquireTimeout=10000)
    assert r["acquired"]
    assert set(members(rc, "semaphore:taken")) == {r["identifier"]}
    assert b.run("SELECT redis_semaphore_release('semaphore:taken')") is False
    assert set(members(rc, "semaphore:taken")) == {r["identifier"]}
    assert n.op("refresh", "late")["refreshed"]


# -------------------------------------------------------- misconfiguration

def test_a_shorter_lease_evicts_holders_of_a_longer_one(sql, node, rc):
    """The lease is the smallest any client uses.  A Node holder on a 60 s
    lockTimeout is stale to a SQL session whose ttl is 200 ms once 200 ms
    have passed: SQL takes the only permit beside it, and Node finds out
    only when it next refreshes.  And a Node client on a 200 ms
    lockTimeout evicts a SQL holder on a 60 s lease.  Every client of a
    semaphore must use one lease."""
    a, b = sql(), sql()
    n = node()
    sent = time.monotonic()
    assert n.acquire("short", 1, name="long", lockTimeout=60000,
                     acquireAttemptsLimit=1)["acquired"]
    assert try_take(a, "semaphore:short", 1) is False
    assert a.run("SELECT redis_semaphore_acquire('semaphore:short', ttl => '200ms', "
                 "wait => '10s', max_permits => 1)")
    assert time.monotonic() - sent >= 0.2
    assert set(members(rc, "semaphore:short")) == sql_members(a, "semaphore:short")
    assert n.op("refresh", "long")["refreshed"] is False
    assert a.run("SELECT redis_semaphore_release('semaphore:short')") is True

    # the reverse: a SQL holder on a 60 s lease, a Node client on 200 ms
    assert b.run("SELECT redis_semaphore_acquire('semaphore:short', ttl => '60s', max_permits => 1)")
    r = n.acquire("short", 1, name="quick", lockTimeout=200, acquireTimeout=10000)
    assert r["acquired"]
    assert set(members(rc, "semaphore:short")) == {r["identifier"]}
    # Node also cut the key's expiry to its 200 ms
    assert rc.pttl("semaphore:short") <= 200
    assert b.run("SELECT redis_semaphore_extend('semaphore:short')") is False


def test_max_permits_must_be_given(sql):
    a = sql()
    for q in ("SELECT redis_semaphore_acquire('semaphore:nolimit')",
              "SELECT redis_semaphore_try_acquire('semaphore:nolimit')",
              "SELECT redis_semaphore_acquire('semaphore:nolimit', 2, max_permits => 1)"):
        with pytest.raises(psycopg2.errors.InvalidParameterValue) as e:
            a.run(q)
        assert e.value.pgcode == "22023"
    assert a.run("SELECT count(*) FROM redis_semaphores_held()") == 0
