"""pytest fixtures: a Redis and a preloaded PostgreSQL per test module."""
import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import testbed  # noqa: E402


# Parallel runs (scripts/run-tests with RL_PYTEST_WORKERS, doc/testing.md):
# pytest-xdist gives each worker whole files (--dist loadfile), those with
# the most tests first; every server, port (t/testbed.py gives each worker
# its own block), temporary directory and peer process of a test is its
# own.  Tests marked serial run afterwards, alone, in one process: the
# reason is beside each mark.
def pytest_configure(config):
    config.addinivalue_line(
        "markers", "serial: run alone after the parallel pass (a machine-wide "
        "resource or a bound a parallel neighbour would distort)")


@pytest.fixture(scope="module")
def redis_srv():
    r = testbed.Redis().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def pg(redis_srv):
    p = testbed.Postgres(conf={"redis_lock.url": redis_srv.url}).init().start().with_extension()
    yield p
    p.cleanup()


@pytest.fixture
def rc(redis_srv):
    c = redis_srv.client()
    c.flushall()
    return c


class Session:
    """One backend; run() in the foreground, start() in a thread."""

    def __init__(self, pg, **kw):
        self.conn = pg.connect(**kw)
        self.pid = testbed.sql_one(self.conn, "SELECT pg_backend_pid()")
        self.thread = None
        self.result = None
        self.error = None
        self.finished_at = None

    def run(self, q, args=None):
        with self.conn.cursor() as cur:
            cur.execute(q, args)
            if cur.description is None:
                return None
            row = cur.fetchone()
            return row[0] if row is not None and len(row) == 1 else row

    def start(self, q, args=None):
        def body():
            try:
                self.result = self.run(q, args)
            except Exception as e:  # noqa: BLE001 - tests inspect it
                self.error = e
            self.finished_at = time.monotonic()
        self.result = self.error = self.finished_at = None
        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()
        return self

    def join(self, timeout=30):
        self.thread.join(timeout * testbed.TIME_SCALE)
        assert not self.thread.is_alive(), "statement did not finish in %ss" % timeout
        return self

    def close(self):
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass


@pytest.fixture
def sessions(pg):
    made = []

    def make(**kw):
        s = Session(pg, **kw)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


@pytest.fixture
def rsql(sessions):
    """Sessions speaking Redisson's layout."""
    def make():
        s = sessions()
        s.run("SET redis_lock.protocol = 'redisson'")
        return s
    return make


def terminating_sessions(pg):
    """A fixture's body: it yields a maker of Sessions on pg, and at the
    end terminates their backends, so that one left waiting by a failed
    assertion cannot hang the teardown."""
    made = []

    def make(**kw):
        s = Session(pg, **kw)
        made.append(s)
        return s
    yield make
    admin = pg.connect()
    try:
        for s in made:
            admin.cursor().execute("SELECT pg_terminate_backend(%s)", (s.pid,))
    finally:
        admin.close()
    for s in made:
        if s.thread is not None:
            s.thread.join(10 * testbed.TIME_SCALE)
        s.close()


def wait_for_queue_lead(rc, s):
    """Poll until s, waiting for a Redis lock, leads this server's local
    queue for it: a waiter subscribes in Redis (its connection
    "redis_lock:PID:sub") only once it has taken the queue's first seat.
    Its wait event does not show that: the attempt it makes before it
    queues (and its connection's handshake) wait on Redis too, and a
    waiter that comes while it is there finds no queue and works in Redis
    itself."""
    name = "redis_lock:%d:sub" % s.pid
    testbed.wait_until(lambda: any(c["name"] == name and c.get("sub", "0") != "0"
                                   for c in rc.client_list()), 10,
                       what="backend %d to lead the local queue" % s.pid)


def wait_for_wait_event(admin, pid, timeout=10):
    """Poll until backend pid sits in our Extension wait."""
    def waiting():
        return testbed.sql_one(admin, "SELECT wait_event_type = 'Extension' "
                               "FROM pg_stat_activity WHERE pid = %s", (pid,))
    testbed.wait_until(waiting, timeout, what="backend %d to wait on Redis" % pid)


@pytest.fixture
def env():
    """A Redis and a preloaded PostgreSQL of the test's own (it may stop,
    freeze or reconfigure them), and a factory of sessions on it."""
    r = testbed.Redis().start()
    pg = testbed.Postgres(conf={"redis_lock.url": r.url}).init().start().with_extension()
    made = []

    def session(**kw):
        s = Session(pg, **kw)
        made.append(s)
        return s
    yield r, pg, session
    for s in made:
        s.close()
    pg.cleanup()
    r.stop()
