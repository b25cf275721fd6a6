"""Edges of the semaphores (issue 36), from an adversarial review: each
test states the property it checks.  Four of them failed on the first
version and pass since its fixes: force release deleting a Redisson count,
a lock squatting the "{...}:timeout" set, the refusal naming the wrong key,
status and init on a broken Cluster hash tag.  Waits are polled, bounded
and scaled."""
import os
import signal
import time

import psycopg2
import psycopg2.errors
import pytest

from conftest import Session, wait_for_wait_event
from test_semaphore import free, taken
import testbed
from testbed import TIME_SCALE as S

CMD_TIMEOUT_S = 8


def redisson_release(rc, name):
    """What a Redisson holder's release does: its id out, the count up and
    published."""
    member = rc.zrange("{%s}:timeout" % name, 0, 0)[0]
    rc.zrem("{%s}:timeout" % name, member)
    rc.publish("redisson_sc:{%s}" % name, rc.incr(name))


# ----------------------------------------------------------------------------
# A server of the test's own, reached directly or through a delay proxy
# ----------------------------------------------------------------------------

class Bed:
    def __init__(self, proxy=False, **conf):
        self.r = testbed.Redis().start()
        self.proxy = testbed.DelayProxy(self.r.port, 0.0).start() if proxy else None
        url = self.proxy.url if proxy else self.r.url
        c = {"redis_lock.url": url}
        c.update(conf)
        self.pg = testbed.Postgres(conf=c).init().start().with_extension()
        self.rc = self.r.client()
        self.made = []

    def session(self, **kw):
        s = Session(self.pg, **kw)
        self.made.append(s)
        return s

    def close(self):
        self.r.resume()
        if self.proxy is not None:
            self.proxy.held = False
        for s in self.made:
            s.close()
        self.pg.cleanup()
        if self.proxy is not None:
            self.proxy.stop()
        self.r.stop()


@pytest.fixture
def frozen_bed():
    """command_timeout long (8 s): a wait that is not cancellable shows."""
    b = Bed(**{"redis_lock.command_timeout": "%ds" % CMD_TIMEOUT_S})
    yield b
    b.close()


@pytest.fixture(scope="module")
def proxied():
    b = Bed(proxy=True)
    yield b
    b.close()


def cancel_and_time(admin, s):
    cancelled = time.monotonic()
    admin.run("SELECT pg_cancel_backend(%s)", (s.pid,))
    s.join(CMD_TIMEOUT_S + 5)
    return s.finished_at - cancelled


# ----------------------------------------------------------------------------
# 4. Interrupts with Redis frozen
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("query", [
    "SELECT redis_semaphore_status('st')",
    "SELECT redis_semaphore_init('st', 3)",
    "SELECT redis_semaphore_try_acquire('st')",
    "SELECT redis_semaphore_acquire('st', wait => '30s')",
    "SELECT redis_semaphore_release('st')",
])
def test_every_semaphore_call_ends_on_cancel_while_redis_is_frozen(frozen_bed, query):
    """Redis is stopped (SIGSTOP) with the session's connection up; the call
    must end on cancel within a second, not at command_timeout (8 s)."""
    b = frozen_bed
    a, admin = b.session(), b.session()
    a.run("SELECT redis_semaphore_init('st', 0)")
    if "release" in query:
        b.rc.set("st", 1)
        assert a.run("SELECT redis_semaphore_acquire('st')") is True
    else:
        a.run("SELECT redis_semaphore_status('st')")       # connection up
    b.r.pause()
    a.start(query)
    wait_for_wait_event(admin.conn, a.pid)
    took = cancel_and_time(admin, a)
    b.r.resume()
    assert isinstance(a.error, psycopg2.errors.QueryCanceled), a.error
    assert took < 1.0 * S, "%s ended %.2f s after the cancel" % (query, took)


@pytest.mark.parametrize("layout", ["redisson", "redis_semaphore"])
def test_a_semaphore_wait_ends_on_cancel_when_redis_freezes_during_it(frozen_bed, layout):
    """A waits (the semaphore is exhausted), then Redis freezes: the cancel
    must still end the wait within a second; nothing is taken after the
    thaw."""
    b = frozen_bed
    a, h, admin = b.session(), b.session(), b.session()
    npm = layout == "redis_semaphore"
    name = "semaphore:fz" if npm else "fz"
    extra = ", max_permits => 1" if npm else ""
    for s in (a, h):
        s.run("SET redis_lock.semaphore_protocol = %s", (layout,))
    if not npm:
        h.run("SELECT redis_semaphore_init('fz', 1)")
    assert h.run("SELECT redis_semaphore_acquire(%%s%s)" % extra, (name,)) is True
    a.start("SELECT redis_semaphore_acquire(%%s, wait => '60s'%s)" % extra, (name,))
    wait_for_wait_event(admin.conn, a.pid)
    time.sleep(0.3)                 # the wait under way, a poll or two
    b.r.pause()
    took = cancel_and_time(admin, a)
    b.r.resume()
    assert isinstance(a.error, psycopg2.errors.QueryCanceled), a.error
    assert took < 1.0 * S, "the wait ended %.2f s after the cancel" % took
    time.sleep(0.3)
    if npm:
        assert b.rc.zcard(name) == 1
    else:
        assert (free(b.rc, "fz"), taken(b.rc, "fz")) == (0, 1)


# ----------------------------------------------------------------------------
# 2. Scores as Redisson reads them
# ----------------------------------------------------------------------------

def test_a_sql_permits_score_is_integer_unix_ms_of_its_expiry(frozen_bed):
    """ZRANGE WITHSCORES, raw: decimal digits (Java's Long.parseLong), the
    expiry in Unix ms (now + ttl), not microseconds or seconds."""
    b = frozen_bed
    a = b.session()
    a.run("SELECT redis_semaphore_init('sc', 2)")
    before = int(time.time() * 1000)
    assert a.run("SELECT redis_semaphore_acquire('sc', 2, ttl => '7s')") is True
    after = int(time.time() * 1000)
    raw = b.rc.execute_command("ZRANGE", "{sc}:timeout", 0, -1, "WITHSCORES")
    assert len(raw) == 4
    for score in raw[1::2]:
        assert score.decode().isdigit(), score
        assert before + 7000 <= int(score) <= after + 7000
    # the busy reply a Redisson acquire would parse: the lowest score
    low = b.rc.execute_command("ZRANGE", "{sc}:timeout", 0, 0, "WITHSCORES")[1]
    assert int(low.decode()) == int(raw[1])


# ----------------------------------------------------------------------------
# 1. Safety at the edges of a round trip
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["cancel", "terminate", "cancel then retry"])
def test_a_waiter_stopped_while_its_grant_is_in_flight_leaves_no_permit(proxied, how):
    """A foreign holder releases; B's acquire is granted in Redis but its
    reply is held in the proxy while B is cancelled (or its backend
    terminated).  The permit must come back at once (the worker), not
    after B's 30 s lease; with a retry, B's new attempt takes exactly one
    permit beside it."""
    b_ = proxied
    rc = b_.rc
    rc.flushall()
    admin = b_.session()
    b = b_.session()
    try:
        rc.set("ho", 0)
        rc.zadd("{ho}:timeout", {b"\x01" * 16: int(time.time() * 1000) + 60000})
        b.start("SELECT redis_semaphore_acquire('ho', wait => '30s')")
        wait_for_wait_event(admin.conn, b.pid)
        testbed.wait_until(lambda: dict(rc.pubsub_numsub("redisson_sc:{ho}"))
                           .get(b"redisson_sc:{ho}", 0) == 1, 5, what="B subscribed")
        b_.proxy.delay = 1.0 * S
        redisson_release(rc, "ho")
        testbed.wait_until(lambda: taken(rc, "ho") == 1, 5, 0.002,
                           what="B's grant to land in Redis")
        b_.proxy.held = True
        b_.proxy.delay = 0.0
        os.kill(b.pid, signal.SIGTERM if how == "terminate" else signal.SIGINT)
        stopped = time.monotonic()
        b.join(5)
        b_.proxy.held = False
        if how == "cancel then retry":
            assert b.error is not None and b.error.pgcode == "57014"
            assert b.run("SELECT redis_semaphore_acquire('ho', wait => '10s')") is True
            ids = b.run("SELECT permit_ids FROM redis_semaphores_held()")
            time.sleep(0.5)             # a window for a stray settlement
            assert (free(rc, "ho"), taken(rc, "ho")) == (0, 1)
            assert rc.zscore("{ho}:timeout", bytes.fromhex(ids[0])) is not None
            assert b.run("SELECT redis_semaphore_release('ho')") is True
            assert (free(rc, "ho"), taken(rc, "ho")) == (1, 0)
            return
        testbed.wait_until(lambda: (free(rc, "ho"), taken(rc, "ho")) == (1, 0),
                           2 * S, 0.005, what="B's late permit back")
        print("permit back %.0f ms after B was stopped" % ((time.monotonic() - stopped) * 1000))
    finally:
        b_.proxy.held = False
        b_.proxy.delay = 0.0


def test_a_release_whose_reply_is_lost_gives_back_exactly_once(proxied):
    """The release runs in Redis, its reply is lost (connection reset): the
    permit is back exactly once, the session holds nothing, and its next
    acquire and release balance."""
    b_ = proxied
    rc = b_.rc
    rc.flushall()
    a = b_.session()
    a.run("SELECT redis_semaphore_init('rl', 2)")
    assert a.run("SELECT redis_semaphore_acquire('rl', 2)") is True
    b_.proxy.held = True
    a.start("SELECT redis_semaphore_release('rl')")
    testbed.wait_until(lambda: taken(rc, "rl") == 0, 5, 0.002, what="the release to run")
    b_.proxy.reset_clients()
    b_.proxy.held = False
    a.join(10)
    print("release with its reply lost:", a.error, a.result)
    testbed.wait_until(lambda: a.run("SELECT count(*) FROM redis_semaphores_held()") == 0
                       if not a.thread.is_alive() else False, 5, what="nothing held")
    time.sleep(0.5)
    assert (free(rc, "rl"), taken(rc, "rl")) == (2, 0)
    assert a.run("SELECT redis_semaphore_acquire('rl', 2)") is True
    assert a.run("SELECT redis_semaphore_release('rl')") is True
    assert (free(rc, "rl"), taken(rc, "rl")) == (2, 0)


def test_xact_permits_taken_in_a_subtransaction_go_back_when_it_rolls_back(frozen_bed):
    """An exception block is a subtransaction: permits taken with xact in it
    go back when it is rolled back; session permits taken in it stay, as
    advisory locks do."""
    b = frozen_bed
    a = b.session()
    a.run("SELECT redis_semaphore_init('sx', 3)")
    a.run("BEGIN")
    a.run("DO $$ BEGIN BEGIN "
          "PERFORM redis_semaphore_acquire('sx', 2, xact => true); "
          "RAISE EXCEPTION 'boom'; "
          "EXCEPTION WHEN raise_exception THEN NULL; END; END $$")
    # the subtransaction's release is sent without waiting: poll for it
    testbed.wait_until(lambda: (free(b.rc, "sx"), taken(b.rc, "sx")) == (3, 0), 2 * S,
                       what="the subtransaction's permits back")
    held = a.run("SELECT count(*) FROM redis_semaphores_held()")
    a.run("COMMIT")
    assert held == 0
    a.run("BEGIN")
    a.run("DO $$ BEGIN BEGIN "
          "PERFORM redis_semaphore_acquire('sx', 1); "
          "RAISE EXCEPTION 'boom'; "
          "EXCEPTION WHEN raise_exception THEN NULL; END; END $$")
    a.run("COMMIT")
    assert (free(b.rc, "sx"), taken(b.rc, "sx")) == (2, 1)
    assert a.run("SELECT redis_semaphore_release('sx')") is True


def test_renewals_racing_releases_never_bring_a_permit_back(frozen_bed):
    """lease_time 600 ms (a renewal every 200 ms): 300 acquire/release
    rounds; the count and the set always add up to the permits, and once
    released nothing of the session's is renewed back into the set."""
    b = frozen_bed
    a = b.session()
    a.run("SET redis_lock.lease_time = '600ms'")
    a.run("SELECT redis_semaphore_init('rr', 1)")
    for i in range(300):
        assert a.run("SELECT redis_semaphore_acquire('rr', wait => '0')") is True
        if i % 7 == 0:
            time.sleep(0.03)
        assert a.run("SELECT redis_semaphore_release('rr')") is True
        assert free(b.rc, "rr") + taken(b.rc, "rr") == 1
    time.sleep(0.5)
    assert (free(b.rc, "rr"), taken(b.rc, "rr")) == (1, 0)


def test_a_doubt_retried_with_fewer_permits_gives_all_the_old_ones_back(frozen_bed):
    """acquire(3) is lost in a frozen Redis (it runs at the thaw); the
    session retries at once with 1 permit: the 3 ids of the first attempt
    all go back (the worker has the old owner and count), and exactly one
    permit is taken in the end."""
    b = frozen_bed
    a = b.session()
    a.run("SET redis_lock.command_timeout = '300ms'")
    a.run("SELECT redis_semaphore_init('dp', 4)")
    b.r.pause()
    with pytest.raises(psycopg2.errors.ConnectionFailure):
        a.run("SELECT redis_semaphore_acquire('dp', 3)")
    b.r.resume()
    assert a.run("SELECT redis_semaphore_acquire('dp', 1, wait => '20s')") is True
    ids = a.run("SELECT permit_ids FROM redis_semaphores_held()")
    assert len(ids) == 1
    testbed.wait_until(lambda: (free(b.rc, "dp"), taken(b.rc, "dp")) == (3, 1), 10 * S,
                       what="the lost attempt's 3 permits back")
    time.sleep(0.5)
    assert (free(b.rc, "dp"), taken(b.rc, "dp")) == (3, 1)
    assert b.rc.zscore("{dp}:timeout", bytes.fromhex(ids[0])) is not None


@pytest.mark.parametrize("flush", [False, True])
def test_permits_taken_again_while_their_release_is_on_its_way(frozen_bed, flush):
    """xact permits (3) go back at COMMIT without waiting; the session takes
    1 permit at once, its release still on its way (and, with flush, that
    release meets NOSCRIPT and must be sent again).  In the end exactly the
    new permit is taken."""
    b = frozen_bed
    a = b.session()
    a.run("SELECT redis_semaphore_init('ra', 4)")
    a.run("BEGIN")
    assert a.run("SELECT redis_semaphore_acquire('ra', 3, xact => true)") is True
    if flush:
        b.rc.script_flush()
    a.run("COMMIT")
    assert a.run("SELECT redis_semaphore_acquire('ra', 1, wait => '5s')") is True
    testbed.wait_until(lambda: (free(b.rc, "ra"), taken(b.rc, "ra")) == (3, 1), 5 * S,
                       what="the old 3 back, the new 1 taken")
    time.sleep(0.5)
    assert (free(b.rc, "ra"), taken(b.rc, "ra")) == (3, 1)
    assert a.run("SELECT redis_semaphore_release('ra')") is True
    assert (free(b.rc, "ra"), taken(b.rc, "ra")) == (4, 0)


# ----------------------------------------------------------------------------
# 3 and 5. Who may do what; locks and semaphores of one name
# ----------------------------------------------------------------------------

def make_role(admin, name):
    admin.run("DROP ROLE IF EXISTS %s" % name)
    admin.run("CREATE ROLE %s LOGIN" % name)


def test_a_login_only_role_cannot_squat_a_semaphores_timeout_set_with_a_lock(frozen_bed):
    """The project refuses lock names that would take the place of a key
    locks use beside their own (protocol.c reserved_marks).  A Redisson
    semaphore's "{name}:timeout" is such a key, and it does not exist
    while no permit is taken: a LOGIN-only role's redis_lock_acquire
    (PUBLIC) of that name must be refused, or every acquire of the
    semaphore (SQL's and Redisson's) fails for as long as the lock is
    held."""
    b = frozen_bed
    admin = b.session()
    make_role(admin, "squatter")
    admin.run("SELECT redis_semaphore_init('exports', 3)")
    u = b.session(user="squatter")
    squatted = False
    try:
        squatted = u.run("SELECT redis_lock_acquire('{exports}:timeout', wait => '0') IS NOT NULL")
    except psycopg2.Error as e:
        print("refused:", e.pgcode, e)
    try:
        assert admin.run("SELECT redis_semaphore_acquire('exports', wait => '0')") is True
    finally:
        if squatted:
            u.run("SELECT redis_lock_release_all()")
    assert not squatted, "a LOGIN-only role took a lock on the semaphore's timeout set"


def test_force_release_does_not_delete_a_semaphores_count(frozen_bed):
    """redis_lock_force_release (a superuser's) of a semaphore's name: the
    count is a string, the type of a simple lock, so it is deleted; init
    then gives the semaphore its permits again while the holders keep
    theirs, and the limit is exceeded.  A count is not a lock value
    (inspect_lua tells them apart): it should be refused (42809)."""
    b = frozen_bed
    h, c, admin = b.session(), b.session(), b.session()
    admin.run("SELECT redis_semaphore_init('fr', 2)")
    assert h.run("SELECT redis_semaphore_acquire('fr', 2)") is True
    refused = False
    try:
        admin.run("SELECT redis_lock_force_release('fr')")
    except psycopg2.errors.WrongObjectType:
        refused = True
    if not refused:
        # what an owner does seeing a semaphore without a count
        assert admin.run("SELECT redis_semaphore_init('fr', 2)") is True
        assert c.run("SELECT redis_semaphore_acquire('fr', 2, wait => '0')") is True
        print("holders now:", taken(b.rc, "fr"), "of a semaphore of 2")
    assert refused, "force release deleted the semaphore's count"


def test_locks_and_permits_of_one_name_stay_apart(frozen_bed):
    """Under redis_semaphore the lock 'x' and the semaphore 'semaphore:x'
    differ; a session holding a lock and permits whose names are equal
    (a prefix of its own for the lock): redis_lock_release, _check,
    _extend, _held, _locks, _release_many and with_lock see only the
    lock; release_all gives both back."""
    b = frozen_bed
    a, admin = b.session(), b.session()
    a.run("SELECT redis_semaphore_init('same', 2)")
    assert a.run("SELECT redis_semaphore_acquire('same')") is True
    # the lock 'same' would be the same key: under a prefix of its own
    a.run("SET redis_lock.key_prefix = 'L:'")
    assert a.run("SELECT redis_lock_acquire('same') IS NOT NULL") is True
    assert a.run("SELECT count(*) FROM redis_lock_held()") == 1
    assert a.run("SELECT count(*) FROM redis_semaphores_held()") == 1
    assert a.run("SELECT redis_lock_check('same')") is True
    assert a.run("SELECT redis_lock_extend('same', '10s')") is True
    assert a.run("SELECT redis_lock_release('same')") is True
    assert a.run("SELECT redis_lock_check('same')") is False
    assert a.run("SELECT count(*) FROM redis_semaphores_held()") == 1
    assert (free(b.rc, "same"), taken(b.rc, "same")) == (1, 1)
    # a lock of the name while the session holds permits of it: acquire_many
    assert a.run("SELECT redis_lock_acquire_many(ARRAY['same', 'other']) IS NOT NULL") is True
    assert a.run("SELECT redis_lock_release_many(ARRAY['same', 'other'])") == 2
    assert a.run("SELECT count(*) FROM redis_semaphores_held()") == 1
    assert admin.run("SELECT count(*) FROM redis_lock_locks WHERE pid = %s", (a.pid,)) == 1
    # a semaphore release does not touch the lock, nor a lock release the permits
    assert a.run("SELECT redis_lock_acquire('same') IS NOT NULL") is True
    assert a.run("SELECT redis_semaphore_release('same')") is True
    assert a.run("SELECT count(*) FROM redis_lock_held()") == 1
    a.run("RESET redis_lock.key_prefix")
    assert a.run("SELECT redis_semaphore_acquire('same')") is True
    assert a.run("SELECT redis_lock_release_all()") == 2
    assert (free(b.rc, "same"), taken(b.rc, "same")) == (2, 0)
    assert b.rc.exists("L:same") == 0


def test_a_foreign_timeout_set_is_named_in_the_refusal(frozen_bed):
    """The count is a good integer and "{name}:timeout" is of another kind:
    the 42809 must name the key that is foreign, not the count."""
    b = frozen_bed
    a = b.session()
    b.rc.set("wk", 3)
    b.rc.set("{wk}:timeout", "x")
    with pytest.raises(psycopg2.errors.WrongObjectType) as e:
        a.run("SELECT redis_semaphore_acquire('wk', wait => '0')")
    print(e.value)
    assert "{wk}:timeout" in str(e.value)


def test_on_a_cluster_status_and_init_refuse_a_broken_hash_tag_as_acquire_does():
    """acquire refuses 'half{tag' on a Cluster with 0A000 before sending;
    status and init send a script naming keys of two slots (CROSSSLOT)."""
    nodes = [testbed.cluster_node().start() for _ in range(3)]
    pg = None
    try:
        testbed.create_cluster(nodes)
        pg = testbed.Postgres(conf={"redis_lock.url": nodes[0].url,
                                    "redis_lock.cluster": "on"}).init().start().with_extension()
        a = pg.connect()
        codes = {}
        for q in ("SELECT redis_semaphore_acquire('half{tag')",
                  "SELECT redis_semaphore_status('half{tag')",
                  "SELECT redis_semaphore_init('half{tag', 1)"):
            try:
                testbed.sql_one(a, q)
                codes[q] = None
            except psycopg2.Error as e:
                codes[q] = (e.pgcode, str(e).splitlines()[0])
        print(codes)
        assert all(c is not None and c[0] == "0A000" for c in codes.values()), codes
        a.close()
    finally:
        if pg is not None:
            pg.cleanup()
        for n in nodes:
            n.stop()
