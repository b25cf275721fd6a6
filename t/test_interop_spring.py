"""SQL sessions and Spring Integration's RedisLockRegistry share locks, both
ways, with the real jar (t/interop/spring, peers.SpringPeer):

* on Redis 7.0 (Debian's: Spring's Lua path) and on Redis 8.6
  (scripts/get-server redis-8.6: Spring's unlock and renewal use
  SET ... IFEQ and DELEX key IFEQ there, and the SQL side runs with
  redis_lock.scripting off, its DELEX path);
* in Spring's default SPIN_LOCK mode and in PUB_SUB_LOCK mode.

A registry with registry key R keeps the lock of obtain(P) in the string
key "R:P", whose value is the registry's client id (one UUID per registry,
shared by its threads); SQL names the same key with redis_lock.key_prefix
= 'R:' and lock name P under the default 'simple' protocol.  A PUB_SUB_LOCK
waiter re-checks only when a message whose body is its key arrives on a
channel matching "R-channel:*" (Spring's own unlock publishes the key on
"R-channel:R:P"), or when its wait ends: SQL's releases publish the same
message when redis_lock.release_channel_prefix = 'R-channel:'.

Hand-over latencies (median of several runs) are printed with -s."""
import statistics
import time

import psycopg2
import pytest

from checks import report_latency
from conftest import Session, wait_for_wait_event
from peers import JavaError, SpringPeer, spring_library_version
from test_scripting import server
import testbed

REGISTRY = "spring-locks"
PREFIX = REGISTRY + ":"                  # redis_lock.key_prefix naming Spring's keys
CHANNEL_PREFIX = REGISTRY + "-channel:"  # redis_lock.release_channel_prefix for its waiters
WAKE_BOUND = testbed.WAKE_BOUND
MODES = ["spin", "pubsub"]
RUNS = 5                                 # hand-overs per direction, for a median
SPIN_IDLE = 0.1                          # Spring's idleBetweenTries default: 100 ms


@pytest.fixture(scope="module", params=["redis-7.0", "redis-8.6"])
def redis_srv(request):
    path = "/usr/bin/redis-server" if request.param == "redis-7.0" else server("redis-8.6")
    r = testbed.Redis(server=path).start()
    r.name = request.param
    yield r
    r.stop()


@pytest.fixture(scope="module")
def pg(redis_srv):
    conf = {"redis_lock.url": redis_srv.url, "redis_lock.key_prefix": PREFIX}
    if redis_srv.name == "redis-8.6":
        conf["redis_lock.scripting"] = "off"     # SQL on its DELEX path too
    p = testbed.Postgres(conf=conf).init().start().with_extension()
    yield p
    p.cleanup()


@pytest.fixture(scope="module")
def spring(redis_srv):
    peer = SpringPeer(redis_srv.port)
    peer.version = spring_library_version("spring-integration-redis")
    peer.server = redis_srv.name
    # one registry per mode, Spring's defaults but for a 30 s expireAfter
    peer.client_id = {m: peer.call("main", "registry", m, REGISTRY, m, 30000, 0) for m in MODES}
    # the PUB_SUB_LOCK registry starts its listener (PSUBSCRIBE
    # "spring-locks-channel:*") at its first wait: have one before the
    # tests, so that none measures a JVM loading and connecting it
    # (held by someone outside the JVM: its own threads queue on a local
    # ReentrantLock first and never get to Redis)
    rc = redis_srv.client()
    rc.set(PREFIX + "warm-up", "someone else", px=30000)
    assert peer.call("warm", "trylock", "pubsub", "warm-up", 100) is False
    testbed.wait_until(lambda: rc.execute_command("PUBSUB", "NUMPAT") >= 1, 10,
                       what="Spring's PSUBSCRIBE")
    rc.delete(PREFIX + "warm-up")
    yield peer
    peer.close()


@pytest.fixture
def keyspace_events(rc):
    """Keyspace notifications on for the test (then off again)."""
    rc.config_set("notify-keyspace-events", "Kgx")
    yield
    rc.config_set("notify-keyspace-events", "")


def next_message(ps, timeout=10):
    """The next message of pub/sub connection ps, waiting up to timeout."""
    end = time.monotonic() + timeout * testbed.TIME_SCALE
    while time.monotonic() < end:
        m = ps.get_message(timeout=0.05)
        if m is not None:
            return m
    raise AssertionError("no message within %ss" % timeout)


def label(spring, mode):
    return "Spring Integration %s %s, %s" % (spring.version, mode, spring.server)


def obtains(rc):
    """Lua scripts run so far: Spring's lock attempts are its OBTAIN script
    (EVALSHA, EVAL after a NOSCRIPT), and the SQL holders of these tests
    run none (a ttl, so no renewal; script-free on Redis 8.6)."""
    st = rc.info("commandstats")
    return sum(st.get(c, {}).get("calls", 0) for c in ("cmdstat_evalsha", "cmdstat_eval"))


def calls(rc, command):
    """How often the server ran command (0 where it does not know it)."""
    return rc.info("commandstats").get("cmdstat_" + command, {}).get("calls", 0)


def spring_waits(spring, rc, rid, before):
    """Until the Spring request rid has found the lock busy twice (a PUB_SUB
    waiter: its first attempt and its re-check after registering for the
    message; a spinning one: two polls): it waits now."""
    testbed.wait_until(lambda: obtains(rc) >= before + 2, 10, 0.002,
                       what="the Spring waiter to find the lock busy")
    assert not spring.done(rid)


def spring_waiter_latency(spring, rc, mode, path, release, wait_ms=20000):
    """A Spring thread waits in tryLock(wait_ms) on path while SQL holds it;
    release() (returning True) lets go: seconds from then to Spring
    holding it."""
    before = obtains(rc)
    rid = spring.send("w", "trylock", mode, path, wait_ms)
    spring_waits(spring, rc, rid, before)
    t0 = time.time()
    assert release() is True
    got, at = spring.result(rid, wait_ms / 1000 + 10)
    assert got is True
    return at - t0


# ================================================================ layout

@pytest.mark.parametrize("mode", MODES)
def test_spring_lock_is_the_sql_lock_of_the_same_name(spring, sessions, rc, mode):
    """Spring's key is "<registryKey>:<path>" holding the registry's client
    id with a PTTL of expireAfter; with key_prefix '<registryKey>:' SQL's
    lock 'orders' is that key: SQL neither takes nor releases it, and
    redis_lock_status shows the client id as its owner."""
    a, admin = sessions(), sessions()
    assert spring.call("t1", "lock", mode, "orders") is True
    assert rc.get(PREFIX + "orders") == spring.client_id[mode].encode()
    assert 29000 < rc.pttl(PREFIX + "orders") <= 30000
    assert rc.type(PREFIX + "orders") == b"string"
    assert admin.run("SELECT locked, held_by_me, owner, redis_type FROM redis_lock_status('orders')") \
        == (True, False, spring.client_id[mode], "string")
    assert a.run("SELECT redis_lock_try_acquire('orders')") is False
    assert a.run("SELECT redis_lock_release('orders')") is False
    assert rc.get(PREFIX + "orders") == spring.client_id[mode].encode()
    delex = calls(rc, "delex")
    assert spring.call("t1", "unlock", mode, "orders") is True
    assert rc.exists(PREFIX + "orders") == 0
    # Spring's SPIN_LOCK unlock is DELEX key IFEQ id on Redis 8.4+, its
    # PUB_SUB_LOCK unlock always a script (UNLINK and PUBLISH)
    native = spring.server == "redis-8.6" and mode == "spin"
    assert calls(rc, "delex") - delex == (1 if native else 0)
    # and Spring neither takes nor unlocks SQL's
    assert a.run("SELECT redis_lock_acquire('orders', ttl => '30s') > 0")
    token = rc.get(PREFIX + "orders")
    assert spring.call("t1", "trylock", mode, "orders", 0) is False
    with pytest.raises(JavaError, match="IllegalStateException.*do not own"):
        spring.call("t1", "unlock", mode, "orders")
    assert spring.call("t1", "held", mode, "orders") is False
    assert rc.get(PREFIX + "orders") == token
    assert a.run("SELECT redis_lock_release('orders')") is True


# ================================================================ exclusion and hand-over

@pytest.mark.parametrize("mode", MODES)
def test_spring_holder_excludes_sql_and_hands_over(spring, sessions, rc, mode, keyspace_events):
    """While Spring holds, a SQL acquire waits; Spring's unlock hands the
    lock to it (the UNLINK/DELEX is a keyspace event the waiter is
    subscribed to).  Median of RUNS hand-overs."""
    a, admin = sessions(), sessions()
    took = []
    for _ in range(RUNS):
        assert spring.call("t1", "lock", mode, "jobs") is True
        a.start("SELECT redis_lock_acquire('jobs', ttl => '30s', wait => '20s') > 0")
        wait_for_wait_event(admin.conn, a.pid)
        assert a.thread.is_alive(), "SQL got a lock Spring holds"
        released = time.monotonic()
        assert spring.call("t1", "unlock", mode, "jobs") is True
        a.join()
        assert a.error is None and a.result is True
        took.append(a.finished_at - released)
        assert a.run("SELECT redis_lock_release('jobs')") is True
    median = statistics.median(took)
    report_latency(label(spring, mode), "Spring unlock() -> SQL waiter (keyspace events on), "
                   "median of %d: %s ms" % (RUNS, [round(t * 1000, 1) for t in took]), median)
    assert median < WAKE_BOUND


@pytest.mark.parametrize("mode", MODES)
def test_sql_holder_excludes_spring_and_hands_over(spring, sessions, rc, mode):
    """While SQL holds, Spring's tryLock waits; SQL's release hands it over.
    A spinning Spring waiter finds it at its next poll (every 100 ms); a
    PUB_SUB_LOCK one needs the message SQL publishes with
    release_channel_prefix (without it: the next test)."""
    a = sessions()
    if mode == "pubsub":
        a.run("SET redis_lock.release_channel_prefix = %s", (CHANNEL_PREFIX,))
    took = []
    for _ in range(RUNS):
        assert a.run("SELECT redis_lock_acquire('batch', ttl => '30s') > 0")
        assert spring.call("t2", "trylock", mode, "batch", 0) is False
        took.append(spring_waiter_latency(spring, rc, mode, "batch", lambda: a.run(
            "SELECT redis_lock_release('batch')")))
        assert rc.get(PREFIX + "batch") == spring.client_id[mode].encode()
        assert a.run("SELECT redis_lock_try_acquire('batch')") is False
        assert spring.call("w", "unlock", mode, "batch") is True
    median = statistics.median(took)
    how = "polls every 100 ms" if mode == "spin" else "woken by release_channel_prefix"
    report_latency(label(spring, mode), "SQL release -> Spring waiter (%s), median of %d: %s ms"
                   % (how, RUNS, [round(t * 1000, 1) for t in took]), median)
    assert median < (SPIN_IDLE + WAKE_BOUND if mode == "spin" else WAKE_BOUND)


def test_a_pubsub_waiter_sleeps_through_a_sql_release_without_the_setting(spring, sessions, rc):
    """Without release_channel_prefix, a PUB_SUB_LOCK waiter is not told of
    SQL's release: it gets the lock only when its wait (3 s here) ends.
    With it, at once."""
    a = sessions()
    assert a.run("SELECT redis_lock_acquire('quiet', ttl => '30s') > 0")
    t0 = time.monotonic()
    late = spring_waiter_latency(spring, rc, "pubsub", "quiet", lambda: a.run(
        "SELECT redis_lock_release('quiet')"), wait_ms=3000)
    print("\nPUB_SUB_LOCK waiter, SQL release without the setting: got it %.0f ms after "
          "the release, %.0f ms into its 3 s wait" % (late * 1000, (time.monotonic() - t0) * 1000))
    assert late > 1.0
    assert spring.call("w", "unlock", "pubsub", "quiet") is True
    a.run("SET redis_lock.release_channel_prefix = %s", (CHANNEL_PREFIX,))
    assert a.run("SELECT redis_lock_acquire('quiet', ttl => '30s') > 0")
    prompt = spring_waiter_latency(spring, rc, "pubsub", "quiet", lambda: a.run(
        "SELECT redis_lock_release('quiet')"), wait_ms=3000)
    assert prompt < WAKE_BOUND
    assert spring.call("w", "unlock", "pubsub", "quiet") is True


def test_sql_release_publishes_what_spring_publishes(spring, sessions, rc):
    """The message of a SQL release (channel and body) is the one Spring's
    own PUB_SUB_LOCK unlock sends for the same lock."""
    a = sessions()
    a.run("SET redis_lock.release_channel_prefix = %s", (CHANNEL_PREFIX,))
    ps = rc.pubsub(ignore_subscribe_messages=True)
    ps.psubscribe(CHANNEL_PREFIX + "*")
    try:
        assert spring.call("t3", "lock", "pubsub", "fmt") is True
        assert spring.call("t3", "unlock", "pubsub", "fmt") is True
        theirs = next_message(ps)
        assert a.run("SELECT redis_lock_acquire('fmt', ttl => '30s') > 0")
        assert a.run("SELECT redis_lock_release('fmt')") is True
        ours = next_message(ps)
        # with_lock's release, sent without waiting for its answer, too
        assert a.run("SELECT redis_lock_with_lock('fmt', 'SELECT 1')") == 1
        with_lock = next_message(ps)
    finally:
        ps.close()
    assert theirs["channel"] == b"spring-locks-channel:spring-locks:fmt"
    assert theirs["data"] == b"spring-locks:fmt"
    for m in (ours, with_lock):
        assert (m["channel"], m["data"]) == (theirs["channel"], theirs["data"])


def test_spring_release_wakes_sql_waiter_with_and_without_keyspace_events(spring, sessions, rc):
    """Neither Spring mode tells SQL of a release (PUB_SUB_LOCK's message is
    on its own channel): with notify-keyspace-events the UNLINK/DELEX wakes
    the SQL waiter at once; without, it finds the lock free at its next
    poll (a backoff capped at 100 ms)."""
    a, admin = sessions(), sessions()
    result = {}
    for events in ("Kgx", ""):
        rc.config_set("notify-keyspace-events", events)
        took = []
        for _ in range(RUNS):
            assert spring.call("t4", "lock", "spin", "evt") is True
            a.start("SELECT redis_lock_acquire('evt', ttl => '30s', wait => '20s') > 0")
            wait_for_wait_event(admin.conn, a.pid)
            time.sleep(0.3)       # let the poll backoff reach its 100 ms cap
            released = time.monotonic()
            assert spring.call("t4", "unlock", "spin", "evt") is True
            a.join()
            assert a.error is None and a.result is True
            took.append(a.finished_at - released)
            assert a.run("SELECT redis_lock_release('evt')") is True
        result[events or "off"] = statistics.median(took)
        report_latency(label(spring, "spin"), "Spring unlock() -> SQL waiter, keyspace events %s, "
                       "median of %d: %s ms" % (events or "off", RUNS,
                                                [round(t * 1000, 1) for t in took]),
                       result[events or "off"])
    assert result["Kgx"] < WAKE_BOUND
    assert result["off"] < 0.1 + WAKE_BOUND


# ================================================================ leases and renewal

def test_spring_expire_after_lapses_and_sql_takes_over(spring, sessions, rc):
    """Without a renewal scheduler (Spring's default) a lock lives
    expireAfter (1 s here) however long its holder works: SQL takes it
    then, and Spring's unlock() fails with ConcurrentModificationException
    without touching SQL's lock."""
    a = sessions()
    spring.call("main", "registry", "short", REGISTRY, "spin", 1000, 0)
    assert spring.call("t5", "lock", "short", "lapse") is True
    assert 0 < rc.pttl(PREFIX + "lapse") <= 1000
    t0 = time.monotonic()
    assert a.run("SELECT redis_lock_acquire('lapse', ttl => '30s', wait => '5s') > 0")
    assert time.monotonic() - t0 < 1.0 + WAKE_BOUND
    token = rc.get(PREFIX + "lapse")
    with pytest.raises(JavaError, match="ConcurrentModificationException"):
        spring.call("t5", "unlock", "short", "lapse")
    assert rc.get(PREFIX + "lapse") == token
    assert a.run("SELECT held_by_me FROM redis_lock_status('lapse')") is True
    assert a.run("SELECT redis_lock_release('lapse')") is True
    spring.call("main", "destroy", "short")
    # lock(Duration): a TTL of the lock's own, whatever the registry's
    assert spring.call("t5", "lockttl", "spin", "lapse", 800) is True
    assert 0 < rc.pttl(PREFIX + "lapse") <= 800
    assert a.run("SELECT redis_lock_acquire('lapse', ttl => '30s', wait => '5s') > 0")
    with pytest.raises(JavaError, match="ConcurrentModificationException"):
        spring.call("t5", "unlock", "spin", "lapse")
    assert a.run("SELECT redis_lock_release('lapse')") is True


def test_spring_renewal_scheduler_keeps_its_lock_from_sql(spring, sessions, rc):
    """With setRenewalTaskScheduler, Spring restarts the lease every
    expireAfter / 3 (500 ms of 1.5 s here): SQL is refused past three
    leases, and gets the lock once Spring unlocks."""
    a = sessions()
    spring.call("main", "registry", "renewing", REGISTRY, "spin", 1500, 1)
    assert spring.call("t6", "lock", "renewing", "long") is True
    sets, scripts = calls(rc, "set"), obtains(rc)
    renewals, last = 0, rc.pttl(PREFIX + "long")
    t_end = time.monotonic() + 4.5
    while time.monotonic() < t_end:
        ttl = rc.pttl(PREFIX + "long")
        assert ttl > 0, "Spring's lock expired while renewed"
        if ttl > last:
            renewals += 1
        last = ttl
        time.sleep(0.05)
    assert renewals >= 5
    # each renewal: SET key id IFEQ id PX on Redis 8.4+, else a script (after
    # one SET IFEQ that Redis 7.0 refuses: Spring then stops trying it)
    if spring.server == "redis-8.6":
        assert calls(rc, "set") - sets >= renewals and obtains(rc) == scripts
    else:
        assert obtains(rc) - scripts >= renewals
    assert a.run("SELECT redis_lock_try_acquire('long')") is False
    assert spring.call("t6", "unlock", "renewing", "long") is True
    assert a.run("SELECT redis_lock_try_acquire('long')") is True
    assert a.run("SELECT redis_lock_release('long')") is True
    spring.call("main", "destroy", "renewing")


def test_spring_renew_lock_of_a_sql_lock_fails_and_leaves_it(spring, sessions, rc):
    """renewLock() compares the value with its client id: on SQL's lock it
    throws and does not touch SQL's lease."""
    a = sessions()
    assert a.run("SELECT redis_lock_acquire('mine', ttl => '5s') > 0")
    token = rc.get(PREFIX + "mine")
    with pytest.raises(JavaError, match="IllegalStateException.*Could not renew"):
        spring.call("t7", "renew", "spin", "mine")
    assert rc.get(PREFIX + "mine") == token
    assert rc.pttl(PREFIX + "mine") <= 5000
    assert a.run("SELECT redis_lock_release('mine')") is True


def test_sql_watchdog_outlasts_a_spring_wait(spring, sessions, rc):
    """A SQL lock with ttl NULL is renewed by the watchdog every
    lease_time / 3 (500 ms of 1.5 s here): a Spring tryLock of 3 s, twice
    the lease, gives up; it gets the lock after SQL's release."""
    a = sessions()
    a.run("SET redis_lock.lease_time = '1500ms'")
    assert a.run("SELECT redis_lock_acquire('renewed') > 0")
    token = rc.get(PREFIX + "renewed")
    assert spring.call("t8", "trylock", "spin", "renewed", 3000, timeout=30) is False
    assert rc.get(PREFIX + "renewed") == token and rc.pttl(PREFIX + "renewed") > 0
    assert a.run("SELECT redis_lock_release('renewed')") is True
    assert spring.call("t8", "trylock", "spin", "renewed", 0) is True
    assert spring.call("t8", "unlock", "spin", "renewed") is True


# ================================================================ release_channel_prefix

def publishes(rc):
    return rc.info("commandstats").get("cmdstat_publish", {}).get("calls", 0)


def test_release_publish_rides_in_the_release_round_trip(spring, redis_srv, sessions, rc):
    """Through a proxy adding 150 ms each way, a release with the setting
    takes one round trip (one chunk of commands sent), as one without it
    does; the PUBLISH went (commandstats)."""
    proxy = testbed.DelayProxy(redis_srv.port, 0.15).start()
    try:
        a = sessions()
        a.run("SET redis_lock.url = %s", (proxy.url,))
        # connected, and whatever a first use of the connection costs paid
        assert a.run("SELECT redis_lock_acquire('rt', ttl => '30s') > 0")
        assert a.run("SELECT redis_lock_release('rt')") is True
        took = {}
        for prefix in ("", CHANNEL_PREFIX):
            a.run("SET redis_lock.release_channel_prefix = %s", (prefix,))
            assert a.run("SELECT redis_lock_acquire('rt', ttl => '30s') > 0")
            p0, chunks = publishes(rc), proxy.chunks_in
            t0 = time.monotonic()
            assert a.run("SELECT redis_lock_release('rt')") is True
            took[prefix] = time.monotonic() - t0
            assert proxy.chunks_in - chunks == 1, "the release took more than one send"
            # a release publishes on redis_lock:release:{rt} for SQL waiters
            # anyway (in its script, or script-free beside DELEX)
            assert publishes(rc) - p0 == 1 + (1 if prefix else 0)
        print("\nrelease through a 300 ms-RTT proxy: %.0f ms without the setting, %.0f ms with"
              % (took[""] * 1000, took[CHANNEL_PREFIX] * 1000))
        assert took[CHANNEL_PREFIX] < 0.6          # two round trips would take 600 ms
    finally:
        proxy.stop()


def test_a_login_only_role_gets_it_from_its_administrator(spring, pg, sessions, rc):
    """SUSET, like key_prefix: a role with LOGIN only cannot choose the
    channels its releases publish on (42501); an administrator gives it one
    with ALTER ROLE ... SET.  Its releases (session and transaction scope
    alike, the prefix read at the acquire) then wake a Spring PUB_SUB_LOCK
    waiter; another session's release publishes nothing on that channel."""
    admin = pg.connect()
    with admin.cursor() as cur:
        cur.execute("DROP ROLE IF EXISTS spring_tenant")
        cur.execute("CREATE ROLE spring_tenant LOGIN")
    t = Session(pg, user="spring_tenant")
    with pytest.raises(psycopg2.Error) as refused:
        t.run("SET redis_lock.release_channel_prefix = 'other-app:'")
    assert refused.value.pgcode == "42501"
    t.close()
    with admin.cursor() as cur:
        cur.execute("ALTER ROLE spring_tenant SET redis_lock.release_channel_prefix = %s",
                    (CHANNEL_PREFIX,))
    admin.close()
    t = Session(pg, user="spring_tenant")
    other = sessions()
    try:
        assert t.run("SHOW redis_lock.release_channel_prefix") == CHANNEL_PREFIX
        assert t.run("SELECT redis_lock_acquire('tenant', ttl => '30s') > 0")
        assert spring_waiter_latency(spring, rc, "pubsub", "tenant", lambda: t.run(
            "SELECT redis_lock_release('tenant')")) < WAKE_BOUND
        assert spring.call("w", "unlock", "pubsub", "tenant") is True
        # transaction scope: released at COMMIT, published as well
        t.conn.autocommit = False
        assert t.run("SELECT redis_lock_acquire('tenant', ttl => '30s', xact => true) > 0")
        before = obtains(rc)
        rid = spring.send("w", "trylock", "pubsub", "tenant", 20000)
        spring_waits(spring, rc, rid, before)
        t0 = time.time()
        t.conn.commit()
        got, at = spring.result(rid)
        assert got is True and at - t0 < WAKE_BOUND
        assert spring.call("w", "unlock", "pubsub", "tenant") is True
        t.conn.autocommit = True
        # the other session (no setting) publishes nothing on Spring's channel
        ps = rc.pubsub(ignore_subscribe_messages=True)
        ps.psubscribe(CHANNEL_PREFIX + "*")
        try:
            assert other.run("SELECT redis_lock_acquire('tenant', ttl => '30s') > 0")
            assert other.run("SELECT redis_lock_release('tenant')") is True
            assert t.run("SELECT redis_lock_acquire('tenant', ttl => '30s') > 0")
            assert t.run("SELECT redis_lock_release('tenant')") is True
            assert next_message(ps)["data"] == (PREFIX + "tenant").encode()
            assert ps.get_message(timeout=0.3) is None, "one release, one message"
        finally:
            ps.close()
    finally:
        t.close()


def test_a_session_that_ends_holding_the_lock_publishes_its_release(spring, pg, rc):
    """A backend's exit releases what it holds with the names it took them
    with, so the PUB_SUB_LOCK waiter is woken by the exit too."""
    s = Session(pg)
    s.run("SET redis_lock.release_channel_prefix = %s", (CHANNEL_PREFIX,))
    assert s.run("SELECT redis_lock_acquire('leaver', ttl => '30s') > 0")
    assert spring_waiter_latency(spring, rc, "pubsub", "leaver", lambda: s.close() is None) \
        < WAKE_BOUND
    assert spring.call("w", "unlock", "pubsub", "leaver") is True


def test_an_acl_refusing_the_publish_leaves_the_release_done(sessions, rc, redis_srv):
    """A Redis user that may not publish on Spring's channels: the release
    is done (the key deleted, no script error), the refused PUBLISH is one
    WARNING per session, and later releases say nothing."""
    rc.execute_command("ACL", "SETUSER", "default", "resetchannels",
                       "&redis_lock:*", "&__keyspace@*")
    try:
        a = sessions()
        a.run("SET redis_lock.release_channel_prefix = %s", (CHANNEL_PREFIX,))
        for i in range(2):
            del a.conn.notices[:]
            assert a.run("SELECT redis_lock_acquire('denied', ttl => '30s') > 0")
            assert a.run("SELECT redis_lock_release('denied')") is True
            assert rc.exists(PREFIX + "denied") == 0
            warned = [n for n in a.conn.notices if "could not publish" in n]
            if i == 0:
                assert len(warned) == 1, a.conn.notices
                assert "NOPERM" in warned[0] or "No permissions" in warned[0], warned[0]
            else:
                assert warned == []
        # still a working session
        assert a.run("SELECT redis_lock_acquire('denied', ttl => '30s') > 0")
        assert a.run("SELECT redis_lock_release('denied')") is True
    finally:
        rc.execute_command("ACL", "SETUSER", "default", "allchannels")
