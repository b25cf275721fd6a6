"""Name resolution bounded and cancellable, and the next address tried when
a connect times out (src/net/resolve.c, src/net/stream.c rl_stream_next_address).

The server is pointed at a resolv.conf of the test's own
(RL_TEST_RESOLV_CONF, read only by src/net/resolve.c), naming a DNS server on
a loopback address that the test runs: one that never answers, or one that
gives the name two addresses.  What each test would catch:
- getaddrinfo blocking the backend past connect_timeout (5-6 s against a
  DNS server that never answers) and ignoring cancel;
- a connect to an address that never answers (SYN dropped) failing the
  whole connect instead of moving on to the next address;
- a resolution made with interrupts held (the release after COMMIT on a
  fresh connection) holding off terminate for connect_timeout;
- the names of one round (Redlock masters) resolved one after another,
  each costing connect_timeout against a DNS server that never answers."""
import os
import socket
import struct
import subprocess
import tempfile
import threading
import time

import psycopg2
import pytest

from conftest import Session
import testbed
from testbed import TIME_SCALE as S

# serial (t/conftest.py): the fake DNS servers and the blackhole listen on
# fixed loopback addresses (127.0.0.77-79 port 53, 127.0.0.16), one test at a
# time on the machine; and the tests bound a resolution's cost by
# connect_timeout (500 ms), which a parallel neighbour would stretch
pytestmark = pytest.mark.serial

NAME = "redis.rl-test"


class FakeDNS:
    """A UDP DNS server on addr:53 answering every A query (for NAME, or any
    name) with answers (IPv4 strings), delay seconds after it came, or never
    answering when answers is None."""

    def __init__(self, addr, answers, delay=0):
        self.addr = addr
        self.answers = answers
        self.delay = delay
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((addr, 53))
        self.sock.settimeout(0.2)
        self.queries = 0
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopped:
            try:
                data, peer = self.sock.recvfrom(512)
            except socket.timeout:
                continue
            except OSError:
                return
            self.queries += 1
            if self.answers is None:
                continue                      # a server that never answers
            if self.delay:
                threading.Timer(self.delay, self._send, (self._answer(data), peer)).start()
            else:
                self._send(self._answer(data), peer)

    def _send(self, answer, peer):
        try:
            self.sock.sendto(answer, peer)
        except OSError:
            pass                              # closed meanwhile

    def _answer(self, query):
        qid = query[:2]
        # the question: name labels, then type and class
        end = 12
        while query[end] != 0:
            end += 1 + query[end]
        question = query[12:end + 5]
        qtype = struct.unpack(">H", query[end + 1:end + 3])[0]
        answers = self.answers if qtype == 1 else []
        header = qid + struct.pack(">HHHHH", 0x8180, 1, len(answers), 0, 0)
        body = b"".join(b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 0, 4) + socket.inet_aton(a)
                        for a in answers)
        return header + question + body

    def close(self):
        self.stopped = True
        self.sock.close()
        self.thread.join(2)


class Blackhole:
    """A listener on addr:port whose accept queue is full: the kernel drops
    every further SYN, so a connect to it never completes (nor is refused)."""

    def __init__(self, addr, port):
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind((addr, port))
        self.lsock.listen(0)
        self.fillers = []
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect((addr, port))
            except BlockingIOError:
                pass
            self.fillers.append(c)
        time.sleep(0.2)
        probe = socket.socket()
        probe.settimeout(0.5)
        try:
            probe.connect((addr, port))
            raise RuntimeError("the blackhole answered a connect")
        except socket.timeout:
            pass
        finally:
            probe.close()

    def close(self):
        for c in self.fillers:
            c.close()
        self.lsock.close()


def resolv_conf(nameserver):
    d = tempfile.mkdtemp(prefix="rl-resolv-")
    path = os.path.join(d, "resolv.conf")
    with open(path, "w") as f:
        f.write("nameserver %s\noptions timeout:5 attempts:2\n" % nameserver)
    os.chmod(d, 0o755)
    os.chmod(path, 0o644)
    return path


def server_with_resolver(nameserver, **conf):
    """A preloaded PostgreSQL whose resolver reads our resolv.conf."""
    with testbed.server_env("RL_TEST_RESOLV_CONF=" + resolv_conf(nameserver)):
        return testbed.Postgres(conf=conf).init().start().with_extension()


@pytest.fixture
def silent_dns():
    dns = FakeDNS("127.0.0.77", None)
    pg = server_with_resolver("127.0.0.77", **{
        "redis_lock.url": "redis://%s:6399/0" % NAME,
        "redis_lock.connect_timeout": "500ms"})
    yield dns, pg
    pg.cleanup()
    dns.close()


def test_a_dns_server_that_never_answers_costs_connect_timeout(silent_dns):
    dns, pg = silent_dns
    s = Session(pg)
    try:
        t0 = time.monotonic()
        with pytest.raises(psycopg2.Error) as ei:
            s.run("SELECT redis_lock_try_acquire('dns')")
        elapsed = time.monotonic() - t0
        assert ei.value.pgcode == "08001", ei.value
        assert "name resolution timed out" in str(ei.value), ei.value
        assert dns.queries > 0, "the resolver never asked our DNS server"
        assert elapsed < 0.5 + 0.5 * S, "resolution took %.2fs" % elapsed
    finally:
        s.close()


def test_the_names_of_one_round_are_resolved_together():
    """Five Redlock masters named on a DNS server that answers each query
    after 200 ms, with a 500 ms connect_timeout: their names are asked for
    together, so all five resolve and the lock is taken.  Resolved one after
    another, each connect's clock started with the round: the third name's
    share was gone before its answer came, and with two of five masters the
    acquire failed (08006)."""
    masters = [testbed.Redis().start() for _ in range(5)]
    dns = FakeDNS("127.0.0.78", ["127.0.0.1"], delay=0.2)
    pg = server_with_resolver("127.0.0.78", **{
        "redis_lock.nodes": ",".join("redis://m%d.rl-test:%d/0" % (i, m.port)
                                     for i, m in enumerate(masters)),
        "redis_lock.connect_timeout": "500ms"})
    s = Session(pg)
    try:
        t0 = time.monotonic()
        assert s.run("SELECT redis_lock_try_acquire('dns-redlock')") is True
        elapsed = time.monotonic() - t0
        print("\n5 masters behind a DNS server answering in 200 ms: acquired in %.2f s"
              % elapsed)
        assert sum(m.client().exists("dns-redlock") for m in masters) == 5
        assert s.run("SELECT redis_lock_release('dns-redlock')") is True
    finally:
        s.close()
        pg.cleanup()
        dns.close()
        for m in masters:
            m.stop()


def test_a_name_that_never_resolves_leaves_the_others_their_connect_timeout(silent_dns):
    """Three Redlock masters, two by address and one by a name its DNS
    server never answers: the two still get connect_timeout for their
    connects and the lock is taken by majority.  When all connects shared
    the round's clock, the silent name ate it and all three failed."""
    dns, pg = silent_dns
    masters = [testbed.Redis().start() for _ in range(2)]
    s = Session(pg)
    try:
        s.run("SET redis_lock.nodes = %s",
              (",".join([m.url for m in masters] + ["redis://m9.rl-test:6399/0"]),))
        t0 = time.monotonic()
        assert s.run("SELECT redis_lock_try_acquire('dns-minority')") is True
        print("\ntwo masters by address, one behind a silent DNS server: acquired in %.2f s"
              % (time.monotonic() - t0))
        assert all(m.client().exists("dns-minority") for m in masters)
        assert s.run("SELECT redis_lock_release('dns-minority')") is True
    finally:
        s.close()
        for m in masters:
            m.stop()


@pytest.mark.parametrize("stop", ["cancel", "terminate"])
def test_cancel_and_terminate_end_a_name_resolution_at_once(silent_dns, stop):
    dns, pg = silent_dns
    s = Session(pg)
    admin = pg.connect()
    try:
        s.run("SET redis_lock.connect_timeout = '30s'")
        s.start("SELECT redis_lock_try_acquire('dns')")
        testbed.wait_until(lambda: dns.queries > 0, 5, 0.01, what="the DNS query")
        time.sleep(0.2)
        sent = time.monotonic()
        if stop == "cancel":
            assert testbed.sql_one(admin, "SELECT pg_cancel_backend(%s)", (s.pid,))
            s.join(5)
            assert s.error is not None and s.error.pgcode == "57014", s.error
        else:
            assert testbed.sql_one(admin, "SELECT pg_terminate_backend(%s)", (s.pid,))
            testbed.wait_until(lambda: not testbed.sql_one(
                admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (s.pid,)),
                5, 0.01, what="the backend to exit")
        assert time.monotonic() - sent < 1.0 * S, "took %.2fs" % (time.monotonic() - sent)
    finally:
        admin.close()
        s.close()


@pytest.mark.parametrize("stop", ["cancel", "terminate"])
def test_a_resolution_with_interrupts_held_is_cut_by_cancel_and_terminate(stop):
    """COMMIT releases an xact lock with interrupts held; its connection was
    closed by Redis, so the release connects again and resolves the name,
    now against a DNS server that stopped answering, with a 30 s
    connect_timeout.  A cancel or terminate then ends the COMMIT within
    about a second (the held wait is cut to 300 ms), not after 30 s."""
    redis = testbed.Redis().start()
    dns = FakeDNS("127.0.0.79", ["127.0.0.1"])
    pg = None
    try:
        pg = server_with_resolver("127.0.0.79", **{
            "redis_lock.url": "redis://%s:%d/0" % (NAME, redis.port)})
        rc = redis.client()
        s = Session(pg)
        admin = pg.connect()
        s.run("SET redis_lock.connect_timeout = '30s'")
        s.run("BEGIN")
        # a fixed lease: the watchdog worker has nothing to renew, so every
        # DNS query from now on is the COMMIT's
        assert s.run("SELECT redis_lock_acquire('held-dns', ttl => '60s', xact => true) > 0")
        dns.answers = None                       # the DNS server goes silent
        asked = dns.queries
        rc.client_kill_filter(_type="normal", skipme=True)
        s.start("COMMIT")
        testbed.wait_until(lambda: dns.queries > asked and testbed.sql_one(
            admin, "SELECT wait_event_type = 'Extension' FROM pg_stat_activity"
            " WHERE pid = %s", (s.pid,)), 10, 0.01,
            what="COMMIT's release to resolve the name again")
        sent = time.monotonic()
        fn = "pg_cancel_backend" if stop == "cancel" else "pg_terminate_backend"
        assert testbed.sql_one(admin, "SELECT %s(%%s)" % fn, (s.pid,))
        if stop == "cancel":
            s.join(5)            # the transaction had committed: no error
        testbed.wait_until(lambda: s.finished_at is not None, 5, 0.01,
                           what="COMMIT to return")
        took = s.finished_at - sent
        print("COMMIT ended %.0f ms after the %s" % (took * 1000, stop))
        assert took < 1.0 * S, "took %.2fs" % took
        if stop == "terminate":
            testbed.wait_until(lambda: not testbed.sql_one(
                admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (s.pid,)),
                5, 0.01, what="the backend to exit")
        # the release was not made: the worker makes it once the name
        # resolves again
        assert rc.exists("held-dns")
        dns.answers = ["127.0.0.1"]
        testbed.wait_until(lambda: not rc.exists("held-dns"), 3, 0.01,
                           what="the worker to release the lock")
        admin.close()
        s.close()
    finally:
        if pg is not None:
            pg.cleanup()
        dns.close()
        redis.stop()


def test_a_connect_that_times_out_moves_on_to_the_next_address():
    """The name has two addresses; the first never answers a connect (its
    SYNs are dropped), the second is Redis.  The acquire succeeds within
    connect_timeout: the first address got its share and was given up."""
    port = testbed.free_port()
    hole = Blackhole("127.0.0.16", port)
    redis_dir = tempfile.mkdtemp(prefix="rl-redis-")
    redis = subprocess.Popen([testbed.REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.17",
                              "--save", "", "--appendonly", "no", "--dir", redis_dir],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dns = FakeDNS("127.0.0.78", ["127.0.0.16", "127.0.0.17"])
    pg = None
    try:
        import redis as redis_py
        rc = redis_py.Redis(host="127.0.0.17", port=port)
        testbed.wait_until(lambda: _pings(rc), 10, what="redis on 127.0.0.17")
        pg = server_with_resolver("127.0.0.78", **{
            "redis_lock.url": "redis://%s:%d/0" % (NAME, port),
            "redis_lock.connect_timeout": "2s"})
        s = Session(pg)
        t0 = time.monotonic()
        assert s.run("SELECT redis_lock_acquire('two') > 0")
        elapsed = time.monotonic() - t0
        print("connected through the second address after %.0f ms" % (elapsed * 1000))
        # the first address had half of the 2 s before it was given up
        assert 0.9 <= elapsed < 2.0 * S, elapsed
        assert rc.exists("two")
        assert s.run("SELECT redis_lock_release('two')") is True
        s.close()
    finally:
        if pg is not None:
            pg.cleanup()
        dns.close()
        redis.terminate()
        redis.wait(10)
        hole.close()


def _pings(rc):
    try:
        return rc.ping()
    except Exception:  # noqa: BLE001
        return False
