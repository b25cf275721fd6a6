"""Round trips waited per operation (issue 43): the table of doc/performance.md, kept.

Every Redis sits behind a CountingProxy: testbed.DelayProxy's delay line
(D each way), which also records, for every chunk it passes, when it came
in and when it went out, each way, per connection.  From that record
round_trips() counts the round trips a backend waited for while a
statement ran, by what could have caused what, not by elapsed time:

- a chunk the backend sent during the statement is as deep as the deepest
  reply delivered to it before it was sent (0 if none: it waited for
  nothing);
- a chunk Redis sent is one deeper than the deepest chunk of that
  connection the proxy had passed on to Redis before Redis sent it (a
  subscriber's message: of any of the backend's connections); what was
  sent before the statement began is of depth 0, so a statement that waits
  for the reply to an earlier statement's release pays for that round trip;
- the statement waited for as many round trips as the deepest reply
  delivered to it before it returned.

A release sent and not waited for adds nothing; an acquire that is sent
only once the reply of the release before it has come adds one (a build
made to wait for every owed reply before sending fails the four
back-to-back tests below, and test_commit_and_rollback when a COMMIT's
release reaches the proxy only after the next acquire began).  The count does not depend on how long
anything took, as long as a statement's next command follows what it
answers by less than a round trip (2 D = 200 ms): a reply reaches the
backend 2 D after its request at the earliest, so a command sent right
behind a release is never taken for one that waited for its reply.

Each row of the round-trip table in doc/performance.md (section 9 of the
published run) has its exact count here; the back-to-back sequences
(with_lock, and whole transactions with and without verify_on_commit, and
with ROLLBACK) are what issue 43 found unmeasured.
"""
import re
import time

import pytest
import redis

from conftest import Session
import testbed

D = 0.1             # each way: a round trip is 200 ms, far longer than a
                    # statement's own work takes on the loaded 2-core machine


class CountingProxy(testbed.DelayProxy):
    """testbed.DelayProxy that records every chunk it passes (its record:
    direction, "c" from the backend, "s" from Redis; its connection's tag,
    whose name is the one from CLIENT SETNAME, "" when it cannot be read, as
    over TLS; when it came in and when it went out).  Several proxies may
    share one record (Redlock).  A backend that exits resets its
    connections: what it sent before is on the network still, and reaches
    Redis."""

    def __init__(self, target_port, delay_s, record=None):
        super().__init__(target_port, delay_s)
        self.record = record if record is not None else []
        self.deliver_after_reset = True


def of_backends(pids, unnamed=False):
    """A filter of connection names: those of the backends pids (their
    subscriber connections too, not their server's workers), and with
    unnamed those whose name the proxy could not read (TLS)."""
    prefixes = ["redis_lock:%d" % p for p in pids]

    def keep(name):
        if not name:
            return unnamed
        return any(name == p or name == p + ":sub" for p in prefixes)
    return keep


def round_trips(record, t0, t1, keep):
    """The round trips the backends kept (see of_backends) waited for
    between t0 and t1 (time.monotonic), from record (see the module's
    comment)."""
    # what came before t0 has depth 0 (a chunk of the backend's) or 1 (of
    # Redis'), and only Redis' chunks delivered from t0 on count: the rest
    # is left out, so the record's length does not matter
    events = sorted((e for e in list(record)
                     if keep(e[1]["name"]) and e[2] <= t1 and
                     (e[2] >= t0 or (e[0] == "s" and e[3] >= t0))), key=lambda e: e[2])
    sent = []           # (tag, forwarded at, depth)
    delivered = []      # (delivered at, depth)
    deepest = 0
    for kind, tag, came, went in events:
        if kind == "c":
            depth = max([d for at, d in delivered if at <= came], default=0)
            sent.append((tag, went, depth))
        else:
            sub = (tag["name"] or "").endswith(":sub")
            depth = 1 + max([d for t, at, d in sent
                             if at <= came and (sub or t is tag)], default=0)
            delivered.append((went, depth))
            if t0 <= went <= t1:
                deepest = max(deepest, depth)
    return deepest


class Counter:
    """One session whose statements are counted in round trips waited."""

    def __init__(self, pg, record, unnamed=False):
        self.s = Session(pg)
        self.record = record
        self.unnamed = unnamed

    def count(self, q, args=None):
        """Run q; the round trips it waited for, and its result."""
        t0 = time.monotonic()
        out = self.s.run(q, args)
        return self.counted(t0, time.monotonic()), out

    def count_in_a_row(self, q, n):
        """Run q n times back to back; the round trips each waited for, and
        those of the whole run (counted once all ran)."""
        spans = []
        for _ in range(n):
            t0 = time.monotonic()
            self.s.run(q)
            spans.append((t0, time.monotonic()))
        return ([self.counted(t0, t1) for t0, t1 in spans],
                self.counted(spans[0][0], spans[-1][1]))

    def counted(self, t0, t1, others=()):
        """The round trips waited between t0 and t1, once nothing is in
        flight (with others' backends' connections counted as its own)."""
        self.settled(others)
        keep = of_backends([self.s.pid] + [o.pid for o in others], self.unnamed)
        return round_trips(self.record, t0, t1, keep)

    def settled(self, others=()):
        """Wait until every chunk the backends sent has had a reply after
        it: nothing of theirs is in flight."""
        keep = of_backends([self.s.pid] + [o.pid for o in others], self.unnamed)

        def quiet():
            last = {}
            for kind, tag, came, went in list(self.record):
                if keep(tag["name"]):
                    last.setdefault(id(tag), {"tag": tag})[kind] = came if kind == "c" else went
            return all(t["tag"]["flight"] == 0 and t.get("s", 0) > t.get("c", 0)
                       for t in last.values())
        testbed.wait_until(quiet, 10, what="every reply delivered")

    def close(self):
        self.s.close()


@pytest.fixture(scope="module")
def bed():
    """One Redis behind a proxy (the server's URL), five more as Redlock
    masters each behind its own proxy sharing one record, a TLS Redis behind
    a proxy of its own."""
    record = []
    pki = testbed.PKI()
    r = testbed.Redis().start()
    masters = [testbed.Redis().start() for _ in range(5)]
    tls = testbed.TLSRedis(pki, *pki.make("redis-server")).start()
    proxy = CountingProxy(r.port, D, record).start()
    mproxies = [CountingProxy(m.port, D, record).start() for m in masters]
    tls_record = []
    tproxy = CountingProxy(tls.port, D, tls_record).start()
    pg = testbed.Postgres(conf={"redis_lock.url": proxy.url,
                                "redis_lock.tls_ca_file": pki.ca,
                                "redis_lock.command_timeout": "10s"}).init().start().with_extension()
    yield {"r": r, "record": record, "pg": pg, "masters": mproxies,
           "tls_url": "rediss://127.0.0.1:%d/0" % tproxy.port, "tls_record": tls_record}
    pg.cleanup()
    for p in [proxy, tproxy] + mproxies:
        p.stop()
    for s in [r, tls] + masters:
        s.stop()
    pki.cleanup()


@pytest.fixture
def counter(bed):
    made = []

    def make(record=None, unnamed=False):
        c = Counter(bed["pg"], bed["record"] if record is None else record, unnamed)
        made.append(c)
        # connected, handshaken and its scripts loaded: what is counted is warm
        assert c.s.run("SELECT redis_lock_try_acquire('warm-up-%s' || pg_backend_pid())"
                       % len(made))
        assert c.s.run("SELECT redis_lock_release('warm-up-%s' || pg_backend_pid())"
                       % len(made))
        return c
    yield make
    for c in made:
        c.close()


# ---------------------------------------------------------------- the counter itself

def test_the_counter_counts_a_sequential_round_trip_and_not_a_pipelined_one(bed):
    """redis-py, through the same kind of proxy: one PING, two PINGs one
    after the other, two PINGs pipelined."""
    record = []
    proxy = CountingProxy(bed["r"].port, D, record).start()
    try:
        c = redis.Redis(port=proxy.port, socket_timeout=5)
        c.client_setname("redis_lock:1")       # named as backend 1's would be
        keep = of_backends([1])

        def count(f):
            t0 = time.monotonic()
            f()
            t1 = time.monotonic()
            testbed.wait_until(lambda: all(k[3].get("flight", 0) == 0 for k in list(proxy.conns)),
                               5, what="every chunk passed on")
            return round_trips(record, t0, t1, keep)
        assert count(c.ping) == 1
        assert count(lambda: (c.ping(), c.ping())) == 2
        assert count(lambda: c.pipeline(transaction=False).ping().ping().execute()) == 1
        assert count(lambda: None) == 0
        c.close()
    finally:
        proxy.stop()


# ---------------------------------------------------------------- doc/performance.md's rows

def test_acquire_and_release_each_wait_one(counter):
    a = counter()
    assert a.count("SELECT redis_lock_acquire('rt-a') > 0") == (1, True)
    assert a.count("SELECT redis_lock_release('rt-a')") == (1, True)
    assert a.count("SELECT redis_lock_acquire('rt-a', ttl => '30s') > 0") == (1, True)
    assert a.count("SELECT redis_lock_release('rt-a')") == (1, True)


def test_reentrant_acquire_waits_one(counter):
    a = counter()
    assert a.s.run("SELECT redis_lock_acquire('rt-r') > 0")
    assert a.count("SELECT redis_lock_acquire('rt-r') > 0") == (1, True)
    assert a.s.run("SELECT redis_lock_release('rt-r') AND redis_lock_release('rt-r')")


def test_acquire_after_a_wait_waits_two_from_the_release(counter, bed):
    """From the holder's release statement's start to the waiter's return:
    the release's request, the publish's delivery, the waiter's attempt."""
    holder, waiter = counter(), counter()
    rc = bed["r"].client()
    assert holder.s.run("SELECT redis_lock_acquire('rt-w', ttl => '60s') > 0")
    waiter.s.start("SELECT redis_lock_acquire('rt-w', ttl => '60s', wait => '30s') > 0")
    testbed.wait_until(lambda: rc.pubsub_numsub("redis_lock:release:{rt-w}")[0][1] >= 1,
                       10, what="the waiter subscribed")
    # the waiter's attempt after subscribing has been answered: it sleeps
    waiter.settled()
    t0 = time.monotonic()
    assert holder.s.run("SELECT redis_lock_release('rt-w')")
    waiter.s.join()
    assert waiter.s.error is None and waiter.s.result is True
    assert holder.counted(t0, waiter.s.finished_at, others=[waiter.s]) == 2
    assert waiter.s.run("SELECT redis_lock_release('rt-w')")


def test_commit_and_rollback(counter):
    """COMMIT waits for its verify only; its release, and ROLLBACK's, is
    sent and not waited for."""
    a = counter()
    acquire = "SELECT redis_lock_acquire('rt-x', xact => true) > 0"
    for verify, commit in (("on", 1), ("off", 0)):
        a.s.run("SET redis_lock.verify_on_commit = " + verify)
        a.s.run("BEGIN")
        assert a.count(acquire) == (1, True)
        assert a.count("COMMIT") == (commit, None)
    a.s.run("RESET redis_lock.verify_on_commit")
    a.s.run("BEGIN")
    assert a.count(acquire) == (1, True)
    assert a.count("ROLLBACK") == (0, None)


@pytest.mark.parametrize("end,verify,expected", [("COMMIT", "on", 2), ("COMMIT", "off", 1),
                                                 ("ROLLBACK", "on", 1)])
def test_whole_transactions_back_to_back(counter, end, verify, expected):
    """BEGIN; acquire(xact => true); COMMIT (or ROLLBACK), five in a row:
    each acquire goes right behind the release of the transaction before,
    still on its way, and waits for nothing more than its own reply."""
    a = counter()
    a.s.run("SET redis_lock.verify_on_commit = " + verify)
    q = "BEGIN; SELECT redis_lock_acquire('rt-xx-%s-%s', xact => true); %s" % (end, verify, end)
    assert a.count_in_a_row(q, 5) == ([expected] * 5, 5 * expected)


def test_with_lock_back_to_back(counter):
    """redis_lock_with_lock waits for its acquire only, five in a row: its
    release is sent and not waited for, and the next call's acquire goes
    right behind it."""
    a = counter()
    q = "SELECT redis_lock_with_lock('rt-wl', 'SELECT 1')"
    assert a.count_in_a_row(q, 5) == ([1] * 5, 5)
    # and alone (count() waits until nothing is in flight), the same
    assert a.count(q)[0] == 1


def test_release_all_and_many_wait_one(counter):
    a = counter()
    assert a.s.run("SELECT count(redis_lock_acquire('rt-all' || g)) FROM generate_series(1, 100) g") == 100
    assert a.count("SELECT redis_lock_release_all()") == (1, 100)
    names = ["rt-m%d" % i for i in range(10)]
    assert a.count("SELECT redis_lock_acquire_many(%s)", (names,))[0] == 1
    assert a.count("SELECT redis_lock_release_many(%s)", (names,))[0] == 1


@pytest.mark.parametrize("n", [3, 5])
def test_redlock_acquire_and_release_wait_one(counter, bed, n):
    """Each master behind its own proxy: the masters are asked together."""
    a = counter()
    a.s.run("SELECT set_config('redis_lock.nodes', %s, false)",
            (",".join(p.url for p in bed["masters"][:n]),))
    a.s.run("SET redis_lock.node_timeout = '5s'")    # a master is 200 ms away
    assert a.s.run("SELECT redis_lock_try_acquire('rt-warm') AND redis_lock_release('rt-warm')")
    # (Redlock gives no fencing token)
    assert a.count("SELECT redis_lock_acquire('rt-red') IS NULL") == (1, True)
    assert a.count("SELECT redis_lock_release('rt-red')") == (1, True)


def test_tls_acquire_and_release_wait_one(counter, bed):
    a = counter(record=bed["tls_record"], unnamed=True)
    a.s.run("SET redis_lock.url = %s", (bed["tls_url"],))
    assert a.s.run("SELECT redis_lock_try_acquire('rt-warm') AND redis_lock_release('rt-warm')")
    assert a.count("SELECT redis_lock_acquire('rt-tls') > 0") == (1, True)
    assert a.count("SELECT redis_lock_release('rt-tls')") == (1, True)
