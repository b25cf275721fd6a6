"""Edges of the watchdog's keyspace watch (watchevents.c), of the worker's
cancel told by cancelled_at (locklost.c loss_within), and of
redis_lock.release_channel_prefix, found by an adversarial review: each
test reproduced a suspected defect and checks that it is gone."""
import time

import psycopg2
import pytest

import testbed

# the servers and helpers of t/test_lost.py (3 s lease, 1 s timeouts)
from conftest import Session
from test_lost import (DETECT, EVENT_BOUND, assert_loss_stops_a_statement,  # noqa: F401
                       channel_refusals, ended_with, env, events, lenv, running,
                       server_for_acl_user, worker_watches)

# enough on_lost = warn locks that, whatever order the session's table of
# held locks is walked in, one of them comes before the error lock
WARNED = ["w%d" % i for i in range(8)]


def lost_seen(admin, name):
    return testbed.sql_one(admin, "SELECT coalesce(bool_or(lost), false) FROM "
                           "redis_lock_locks WHERE lock_name = %s", (name,))


def lose_warned_locks(rc, admin, a):
    """Take WARNED with on_lost = warn and have the worker find each lost
    while the session is idle: nothing reports them before its next
    redis_lock call (so none may follow), and they stay unreported."""
    a.run("SET redis_lock.on_lost = warn")
    for n in WARNED:
        assert a.run("SELECT redis_lock_acquire(%s) > 0", (n,))
    for n in WARNED:
        rc.delete(n)
    for n in WARNED:
        testbed.wait_until(lambda: lost_seen(admin, n), DETECT + 5, 0.02,
                           what="the worker to find %s lost" % n)


def test_an_unreported_warn_loss_does_not_hide_the_workers_cancel(env):
    """unreported_loss returns the first unreported loss it meets and
    loss_within takes any loss with cancelled_at = 0 as this statement's:
    an on_lost = warn lock is never signalled, so its cancelled_at stays 0
    and, met first, it hid the error lock the cancel was for: the holder got
    57014 'canceling statement due to user request' instead of 40001."""
    r, rc, pg, admin, session = env
    a = session()
    assert a.run("SELECT redis_lock_acquire('guarded') > 0")
    lose_warned_locks(rc, admin, a)
    a.start("SELECT pg_sleep(60)")
    testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
    rc.delete("guarded")
    err = ended_with(a, DETECT + 5)
    assert err is not None
    assert err.pgcode == "40001", (err.pgcode, str(err))
    assert 'Redis lock "guarded" was lost' in str(err)


def test_an_unreported_warn_loss_does_not_hide_a_loss_while_idle_in_transaction(env):
    """The same walk before each statement (rl_lost_check_statement): a warn
    lock lost in the transaction, met first, made it skip the error lock
    lost with it, and note the events as seen: the transaction went on."""
    r, rc, pg, admin, session = env
    a = session()
    a.run("SET redis_lock.on_lost = warn")
    for n in WARNED:
        assert a.run("SELECT redis_lock_acquire(%s) > 0", (n,))
    a.run("SET redis_lock.on_lost = error")
    assert a.run("SELECT redis_lock_acquire('guarded-x') > 0")
    a.run("BEGIN")
    a.run("SELECT 1")
    for n in WARNED + ["guarded-x"]:
        rc.delete(n)
    for n in WARNED + ["guarded-x"]:
        testbed.wait_until(lambda: lost_seen(admin, n), DETECT + 5, 0.02,
                           what="the worker to find %s lost" % n)
    with pytest.raises(psycopg2.Error) as ei:
        a.run("SELECT 2")
    assert ei.value.pgcode == "40001", (ei.value.pgcode, str(ei.value))
    assert 'Redis lock "guarded-x" was lost' in str(ei.value)
    a.run("ROLLBACK")


# ----------------------------------------------------------------------
# The keyspace watch (watchevents.c)
# ----------------------------------------------------------------------

def test_subscriptions_lost_with_their_connection_are_made_again(events):
    """A subscriber connection killed (a Redis restart, CLIENT KILL, a
    proxy's idle cut) takes its subscriptions with it: the worker notices
    in its sleep and subscribes again, so a later loss is still found by
    its event, not by the next renewal (30 s lease: every 10 s)."""
    r, rc, pg, admin, session = events
    a = session()
    a.run("SET redis_lock.lease_time = '30s'")
    assert a.run("SELECT redis_lock_acquire('rewatched') > 0")
    testbed.wait_until(lambda: worker_watches(rc, "rewatched"), 10, what="subscribed")
    assert rc.execute_command("CLIENT", "KILL", "TYPE", "pubsub") >= 1
    testbed.wait_until(lambda: worker_watches(rc, "rewatched"), 10,
                       what="subscribed again")
    assert_loss_stops_a_statement(a, admin, rc, "rewatched", EVENT_BOUND)


# ----------------------------------------------------------------------
# redis_lock.release_channel_prefix
# ----------------------------------------------------------------------
def names_bytes(a):
    return a.run("SELECT coalesce(sum(used_bytes), 0) FROM pg_backend_memory_contexts "
                 "WHERE name = 'redis_lock names'")


def test_release_channels_are_freed_with_their_locks(env):
    """Each lock taken builds its release channel's name in the session's
    long-lived names context (rl_names_build); free_names freed the key and
    channels but not it, so a session that takes and releases locks with
    the setting on grew by a string per lock for as long as it lived."""
    r, rc, pg, admin, session = env
    a = session()
    a.run("SET redis_lock.release_channel_prefix = 'spring-locks-channel:'")
    loop = ("DO $$ BEGIN FOR i IN 1..%d LOOP "
            "PERFORM redis_lock_acquire('churn-' || i); "
            "PERFORM redis_lock_release('churn-' || i); END LOOP; END $$")
    a.run(loop % 200)                   # the context's first blocks
    before = names_bytes(a)
    a.run(loop % 5000)
    grown = names_bytes(a) - before
    # without the setting the context does not grow at all; 5000 leaked
    # names of ~40 bytes are ~200 kB
    assert grown < 16384, grown
    assert not rc.keys("churn-*")       # every one released


def test_redlock_a_minority_deleted_is_no_loss_a_majority_is_found_at_once():
    """Several nodes: every node's copy is watched.  A "del" on one node of
    three makes the renewal due at once, and that renewal still holds a
    majority: no loss, the statement runs on.  A second node's "del" loses
    the majority, and the loss is found by the event."""
    ms = [testbed.Redis().start() for _ in range(3)]
    pg = None
    a = None
    try:
        cs = [m.client() for m in ms]
        for c in cs:
            c.config_set("notify-keyspace-events", "Kgx")
        pg = testbed.Postgres(conf={
            "redis_lock.nodes": ",".join(m.url for m in ms),
            "redis_lock.lease_time": "30s"}).init().start().with_extension()
        admin = pg.connect()
        a = Session(pg)
        assert a.run("SELECT redis_lock_try_acquire('rl-watch')")
        for c in cs:
            testbed.wait_until(lambda: worker_watches(c, "rl-watch"), 10,
                               what="every node's copy watched")
        a.start("SELECT pg_sleep(60)")
        testbed.wait_until(lambda: running(admin, a.pid), 5, what="statement running")
        renewed = testbed.sql_one(admin, "SELECT renewals FROM redis_lock_stats()")
        cs[0].delete("rl-watch")
        # the early renewal ran (and kept the majority)
        testbed.wait_until(lambda: testbed.sql_one(
            admin, "SELECT renewals FROM redis_lock_stats()") > renewed, 5,
            what="the renewal the event made due")
        assert a.error is None and a.thread.is_alive()
        assert not lost_seen(admin, "rl-watch")
        t0 = time.monotonic()
        cs[1].delete("rl-watch")
        err = ended_with(a, 15)
        took = time.monotonic() - t0
        assert err is not None and err.pgcode == "40001", err
        assert took < EVENT_BOUND, took
        admin.close()
    finally:
        if a is not None:
            a.close()
        if pg is not None:
            pg.cleanup()
        for m in ms:
            m.stop()


def test_one_refused_subscription_leaves_the_others_of_its_node_standing():
    """An ACL may let the extension's Redis user subscribe to some keyspace
    channels only (a pattern per application's key prefix).  A SUBSCRIBE
    refused for one held key closed the node's whole subscriber
    connection, with every other key's subscription on it, again at every
    retry: one lock outside the pattern (any role can name one) turned the
    event detection off for every lock of that target."""
    rules = ["~*", "resetchannels", "&__keyspace@0__:ok-*", "+@all"]
    with server_for_acl_user("somechan", rules, "30s") as (rc, pg, admin):
        a, b = Session(pg), Session(pg)
        try:
            assert a.run("SELECT redis_lock_acquire('ok-1') > 0")
            testbed.wait_until(lambda: worker_watches(rc, "ok-1"), 10, what="subscribed")
            assert b.run("SELECT redis_lock_acquire('other-1') > 0")
            testbed.wait_until(lambda: channel_refusals(rc) >= 2, 20,
                               what="the other key refused, and tried again")
            assert worker_watches(rc, "ok-1")
            assert_loss_stops_a_statement(a, admin, rc, "ok-1", EVENT_BOUND)
        finally:
            a.close()
            b.close()


def test_a_release_the_worker_makes_for_a_session_publishes_too(env):
    """A release the session cannot make itself (its exit found Redis
    down) goes to the worker, which makes it from the registry's key alone:
    it deleted the key but published nothing, so a PUB_SUB_LOCK waiter
    slept until its own timeout, though every release of a simple-layout
    lock is to publish.  The workers are stopped meanwhile so that the
    release waits for this test's subscriber."""
    import os
    import signal
    from renewals import watchdog_pids
    r, rc, pg, admin, session = env
    s = session()
    s.run("SET redis_lock.release_channel_prefix = 'spring-locks-channel:'")
    s.run("SET redis_lock.lease_time = '60s'")
    assert s.run("SELECT redis_lock_acquire('handed') > 0")
    pid = s.pid
    rc.save()                       # the key survives the restart below
    workers = watchdog_pids(pg.postmaster_pid())
    assert workers
    for w in workers:
        os.kill(w, signal.SIGSTOP)
    try:
        r.stop()
        s.conn.close()              # its exit's release finds Redis down
        testbed.wait_until(lambda: not testbed.sql_one(
            admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)),
            15, what="the backend gone")
        r.start()
        os.unlink(os.path.join(r.dir, "dump.rdb"))
        rc = r.client()
        assert rc.exists("handed")
        ps = rc.pubsub()
        ps.subscribe("spring-locks-channel:handed")
        assert ps.get_message(timeout=5)["type"] == "subscribe"
    finally:
        for w in workers:
            os.kill(w, signal.SIGCONT)
    testbed.wait_until(lambda: not rc.exists("handed"), 20,
                       what="the worker's release")
    got = None
    deadline = time.monotonic() + 5
    while got is None and time.monotonic() < deadline:
        m = ps.get_message(timeout=0.2)
        if m is not None and m["type"] == "message":
            got = m
    ps.close()
    assert got is not None, "no message on the release channel"
    assert got["data"] == b"handed"


def test_a_release_channel_prefix_longer_than_a_registry_slot_keeps_is_refused(env):
    r, rc, pg, admin, session = env
    a = session()
    a.run("SET redis_lock.release_channel_prefix = %s", ("c" * 256,))
    with pytest.raises(psycopg2.Error) as ei:
        a.run("SET redis_lock.release_channel_prefix = %s", ("c" * 257,))
    assert ei.value.pgcode == "22023", ei.value.pgcode
    assert "not be longer than 256 bytes" in str(ei.value)


@pytest.fixture(scope="module")
def tls_env():
    pki = testbed.PKI()
    r = testbed.TLSRedis(pki, *pki.make("redis-server")).start()
    pg = testbed.Postgres(conf={"redis_lock.url": r.url,
                                "redis_lock.tls_ca_file": pki.ca,
                                "redis_lock.lease_time": "30s"}
                          ).init().start().with_extension()
    yield r, pg
    pg.cleanup()
    r.stop()
    pki.cleanup()


def test_keyspace_events_over_tls_each_found_at_once(tls_env):
    """Over TLS a read may leave decrypted bytes in the TLS layer that the
    socket no longer shows: events that came in one record (one DEL of two
    watched keys) must each be found, at once."""
    r, pg = tls_env
    rc = r.client()
    rc.config_set("notify-keyspace-events", "Kgx")
    admin = pg.connect()
    ss = [Session(pg) for _ in range(2)]
    try:
        for i, s in enumerate(ss):
            assert s.run("SELECT redis_lock_acquire(%s) > 0", ("tk%d" % i,))
        for i in range(2):
            testbed.wait_until(lambda: worker_watches(rc, "tk%d" % i), 10,
                               what="subscribed over TLS")
        for s in ss:
            s.start("SELECT pg_sleep(60)")
            testbed.wait_until(lambda: running(admin, s.pid), 5, what="running")
        t0 = time.monotonic()
        rc.delete("tk0", "tk1")
        for s in ss:
            err = ended_with(s, 15)
            assert err is not None and err.pgcode == "40001", err
        took = time.monotonic() - t0
        assert took < EVENT_BOUND, took
    finally:
        for s in ss:
            s.close()
        admin.close()


def test_a_slow_subscription_never_makes_a_renewal_late():
    """The worker subscribes to the keyspace notifications of the locks it
    renews between its renewals, never into one: a server whose subscriber
    connections answer 3 s late (a proxy delays only their replies), while
    it answers renewals at once, keeps a 900 ms lease renewed through three
    rounds of subscriptions that each ran out.  (Before: each round waited
    up to 1 s whatever was due, and the lease ran out in the first.)"""
    r = testbed.Redis().start()
    proxy = testbed.DelayProxy(r.port, 0.0).start()
    proxy.slow_replies = (":worker:sub", 3.0)
    pg = testbed.Postgres(conf={"redis_lock.url": proxy.url,
                                "redis_lock.lease_time": "900ms"}).init().start().with_extension()
    s = Session(pg)
    try:
        assert s.run("SELECT redis_lock_acquire('slow-sub') > 0")
        # a round that ran out closes its connection: the next opens another
        testbed.wait_until(lambda: proxy.names_seen(":worker:sub") >= 3, 30, 0.02,
                           what="three rounds of the worker's subscriptions")
        assert s.run("SELECT lost FROM redis_lock_held() WHERE lock_name = 'slow-sub'") is False
        assert "was lost" not in pg.log_text()
        assert s.run("SELECT redis_lock_release('slow-sub')") is True
    finally:
        s.close()
        pg.cleanup()
        proxy.stop()
        r.stop()
