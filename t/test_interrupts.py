"""Issue 33: no wait on Redis with interrupts held; no owner value reused
after a doubt.

- item 1: a grant that reads a release of a lock the worker has a command
  under way for takes that lock back from the worker and waits out the
  worker's command with interrupts held: cancel and terminate must still
  end the statement within 1 s (worker stopped, or only its connection
  silent);
- item 3: a redisson_fair waiter cancelled (or terminated) while Redis is
  silent leaves the queue within 1 s, not after command_timeout;
- item 4: a stale release (with_lock's, still on its way on a slow
  connection) never deletes the grant of the acquire that came after it:
  while SQL says the lock is held and not lost, SET NX from another client
  fails, and the retry's owner value differs from the first attempt's;
- item 5: a late grant whose owner value the session's retry would reuse is
  never left without a holder for its lease;
- the sweep: every Redis wait point of a session (WAIT_POINTS below), Redis
  or the worker frozen there, pg_cancel_backend and pg_terminate_backend:
  the statement (or the backend) ends within 1 s of the signal.  The one
  wait allowed with interrupts held, the COMMIT-time verify, must be cut
  within 300 ms.
"""
import os
import re
import signal
import time

import pytest

from conftest import Session
from renewals import watchdog_pid
import testbed
from testbed import TIME_SCALE as S

# the whole promise: a cancel or terminate ends a statement within 1 s
BOUND = 1.0 * S
# the COMMIT-time verify may wait with interrupts held, but a pending or
# served cancel/terminate cuts it to 300 ms; 200 ms more for what the
# measurement itself costs: the signal is sent by an SQL call of another
# backend and the end is seen by a 5 ms poll of this process, and on the
# 2-core machine shared with a build a runnable process waits up to a
# scheduler tick or two before it runs
VERIFY_BOUND = (0.3 + 0.2) * S
# the servers' command_timeout and connect_timeout: what a wait held off by
# interrupts takes today (a defect shows as ~3 s, not as 1 s), and how long
# a case keeps watching after its bound to report what it took
TIMEOUT_S = 3
OBSERVE = (TIMEOUT_S + 1.5) * S


# ================================================================ testbed

class SplitProxy(testbed.DelayProxy):
    """testbed.DelayProxy that tells the watchdog workers' connections apart
    (their CLIENT SETNAME is "redis_lock:<pid>:worker") and can hold back
    the replies to those alone (hold_worker), counting what they send
    (worker_chunks): so a test can see a renewal of the worker's go out and
    keep it in flight while the sessions' connections work."""

    def __init__(self, target_port, delay_s):
        super().__init__(target_port, delay_s)
        self.hold_worker = False
        self.worker_chunks = 0
        # with hold_worker: hold the replies of a worker's connection only
        # once it has sent a chunk containing worker_marker (a renewal of
        # that key), not those of a handshake before it
        self.worker_marker = None
        self.worker_marked = 0
        self.seq = 0

    def unhold(self):
        self.held = self.hold_worker = False
        self.worker_marker = None
        for c in list(self.conns):
            c[3]["marked"] = False

    def backend_io(self, pid):
        """For each connection of backend pid: (name, last chunk sent,
        last reply chunk delivered), as sequence numbers."""
        pre = "redis_lock:%d" % pid
        return sorted((c[3]["name"], c[3]["in"], c[3]["out"]) for c in list(self.conns)
                      if c[3]["name"] and (c[3]["name"] == pre or
                                           c[3]["name"].startswith(pre + ":")))

    async def _pipe(self, reader, writer, replies=False, conn=None):
        loop = self.asyncio.get_running_loop()
        queue = self.asyncio.Queue()
        tag = conn[3]

        def holding():
            return self.held or (self.hold_worker and tag["worker"] and
                                 (self.worker_marker is None or tag["marked"]))

        async def deliver():
            while True:
                due, data = await queue.get()
                if data is None:
                    return
                wait = due - loop.time()
                if wait > 0:
                    await self.asyncio.sleep(wait)
                while replies and holding() and not conn[2]:
                    await self.asyncio.sleep(0.002)
                if conn[2]:
                    return
                writer.write(data)
                if replies:
                    self.seq += 1
                    tag["out"] = self.seq
                await writer.drain()
        sender = loop.create_task(deliver())
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if not replies:
                    self.chunks_in += 1
                    if tag["name"] is None:
                        m = re.search(rb"redis_lock:\d+(:worker)?(:sub)?", data)
                        if m:
                            tag["name"] = m.group(0).decode()
                            tag["worker"] = m.group(1) is not None
                    self.seq += 1
                    tag["in"] = self.seq
                    if tag["worker"]:
                        self.worker_chunks += 1
                        if self.worker_marker is not None and self.worker_marker in data:
                            tag["marked"] = True
                            self.worker_marked += 1
                queue.put_nowait((loop.time() + self.delay, data))
            queue.put_nowait((0, None))
            await sender
        except (ConnectionError, OSError):
            if self.deliver_after_reset and not replies:
                queue.put_nowait((0, None))
                try:
                    await sender
                except (ConnectionError, OSError):
                    pass
        finally:
            sender.cancel()
            writer.close()

    async def _handle(self, creader, cwriter):
        try:
            sreader, swriter = await self.asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cwriter.close()
            return
        conn = [cwriter, swriter, False, {"worker": False, "name": None, "in": 0, "out": 0,
                                            "marked": False}]
        self.conns.append(conn)
        try:
            await self.asyncio.gather(self._pipe(creader, swriter, conn=conn),
                                      self._pipe(sreader, cwriter, replies=True, conn=conn))
        finally:
            self.conns.remove(conn)


class Env:
    """Redis, a SplitProxy in front of it and a preloaded PostgreSQL that
    reaches Redis through the proxy."""

    def __init__(self, **conf):
        self.r = testbed.Redis().start()
        self.proxy = SplitProxy(self.r.port, 0.0).start()
        conf = dict({"redis_lock.url": self.proxy.url}, **conf)
        self.pg = testbed.Postgres(conf=conf).init().start().with_extension()
        self.rc = self.r.client()
        self.admin = self.pg.connect()
        self.sessions = []
        self.worker_stopped = None

    def session(self, protocol=None):
        s = Session(self.pg)
        self.sessions.append(s)
        if protocol:
            s.run("SET redis_lock.protocol = %s", (protocol,))
        # the session's connection is open and in step before any freeze
        assert s.run("SELECT redis_lock_try_acquire('warm-%s')" % s.pid) is True
        assert s.run("SELECT redis_lock_release('warm-%s')" % s.pid) is True
        return s

    def worker(self):
        pid = watchdog_pid(self.pg.postmaster_pid())
        assert pid, "no watchdog worker"
        return pid

    def stop_worker(self):
        self.worker_stopped = self.worker()
        os.kill(self.worker_stopped, signal.SIGSTOP)

    def thaw(self):
        """Undo every freeze of a case."""
        self.r.resume()
        if self.worker_stopped:
            os.kill(self.worker_stopped, signal.SIGCONT)
            self.worker_stopped = None
        self.proxy.unhold()
        self.proxy.delay = 0.0
        for s in self.sessions:
            s.close()
        self.sessions = []

    def state(self, pid):
        return testbed.sql_one(self.admin, "SELECT state, wait_event_type, wait_event "
                               "FROM pg_stat_activity WHERE pid = %s", (pid,))

    def close(self):
        self.thaw()
        self.admin.close()
        self.pg.cleanup()
        self.proxy.stop()
        self.r.stop()


def gone(pid):
    """The process has exited (reaped, or a zombie)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def at_point(env, s, what, io=None, timeout=5):
    """Poll until s's statement sits in a wait of ours (wait_event_type
    Extension; PostgreSQL 15 names no kind of it) or has ended: "wait" or
    "ended".  io="idle": and every connection of the backend has had the
    reply to what it sent last, twice 30 ms apart with nothing sent between
    (a waiter sleeping between attempts, its connections in step);
    io="busy": a connection of the backend waits for a reply (an attempt in
    flight)."""
    last = [None]

    def check():
        if not s.thread.is_alive():
            return "ended"
        st = env.state(s.pid)
        if not (st and st[0] == "active" and st[1] == "Extension"):
            last[0] = None
            return None
        if io is None:
            return "wait"
        conns = env.proxy.backend_io(s.pid)
        idle = bool(conns) and all(o > i for _, i, o in conns)
        if io == "busy":
            return "wait" if not idle else None
        if not idle:
            last[0] = None
            return None
        if last[0] == conns:
            return "wait"
        last[0] = conns
        return None
    return testbed.wait_until(check, timeout, 0.005 if io != "idle" else 0.03, what=what)
    return testbed.wait_until(check, timeout, 0.005, what=what)


def in_body(env, s):
    """Poll until with_lock's query (pg_sleep) runs."""
    testbed.wait_until(lambda: (env.state(s.pid) or (None, None, None))[2] == "PgSleep",
                       5, 0.005, what="with_lock's query to run")


def signal_and_measure(env, s, how, bound):
    """Send pg_cancel_backend or pg_terminate_backend to s's backend; watch
    (up to OBSERVE) until its statement ended (cancel) or the backend
    exited (terminate).  Returns the seconds from the signal; asserts bound."""
    fn = "pg_cancel_backend" if how == "cancel" else "pg_terminate_backend"
    t0 = time.monotonic()
    assert testbed.sql_one(env.admin, "SELECT %s(%%s)" % fn, (s.pid,))

    def ended():
        if how == "cancel":
            return s.thread is None or not s.thread.is_alive()
        return gone(s.pid) and (s.thread is None or not s.thread.is_alive())
    try:
        testbed.wait_until(ended, OBSERVE, 0.005, what="the %s to end it" % how)
        took = time.monotonic() - t0
    except TimeoutError:
        took = None
    shown = ">%.1f" % OBSERVE if took is None else "%.3f" % took
    print("%s: ended %s s after the signal" % (how, shown))
    assert took is not None and took < bound, \
        "%s took %s s (bound %.2f s)" % (how, shown, bound)
    return took


# ================================================================ the sweep

class Point:
    """One Redis wait point of a session.

    setup(env, s, k): before the statement (take what it needs; freeze
      nothing).
    sql: the statement ('{k}' is the case's key), or None (the point is an
      idle backend: terminate only).
    reach(env, s, k): start nothing; called after s.start(sql) when not
      freeze_first; freezes Redis or the worker once s is at the point.
    freeze_first: freeze Redis before the statement starts.
    bound: how soon the signal must end it.
    signals: which of cancel/terminate apply."""

    def __init__(self, name, sql, setup=None, reach=None, freeze_first=True,
                 bound=BOUND, signals=("cancel", "terminate"), protocol=None,
                 by_itself_from=None, signal_at_reach=False, terminate_bound=None,
                 drive=None):
        self.name, self.sql, self.setup, self.reach = name, sql, setup, reach
        self.freeze_first, self.bound, self.signals = freeze_first, bound, signals
        self.protocol = protocol
        # a point the statement passes without waiting (a release sent
        # without waiting for its reply) returns by itself; by_itself_from
        # gives the instant it reached the point, from which it must end
        # within BOUND
        self.by_itself_from = by_itself_from
        # the signal itself sends the statement to the point (the error
        # path of with_lock): signalled as soon as reach() returns
        self.signal_at_reach = signal_at_reach
        # a terminate is measured to the backend's exit, which after a cut
        # COMMIT verify has its own bound (500 ms for all it does with
        # Redis): the 1 s promise applies there
        self.terminate_bound = terminate_bound or bound
        # drive(env, s, k): does it all (setup, freeze, start), returns
        # "wait" at the point or "ended"
        self.drive = drive


def hold(sql):
    def setup(env, s, k):
        s.run(sql.format(k=k))
    return setup


def foreign_holder(env, s, k):
    env.rc.set(k, "pgrl:foreign-holder", px=60000)


def fair_holder(env, s, k):
    h = env.session("redisson_fair")
    assert h.run("SELECT redis_lock_acquire('%s') > 0" % k)


def read_holder(env, s, k):
    h = env.session()
    assert h.run("SELECT redis_lock_acquire_read('%s')" % k) is True


def subscribed(env, k):
    ch = "redis_lock:release:{%s}" % k
    return lambda: dict(env.rc.pubsub_numsub(ch)).get(ch.encode(), 0) >= 1


def wait_then_freeze(env, s, k):
    """A waiter: once it sleeps between attempts (its connection idle and
    in step), Redis freezes."""
    assert at_point(env, s, "the waiter to sleep", "idle") == "wait"
    env.r.pause()


def freeze_then_poll(env, s, k):
    """A waiter: Redis freezes while it sleeps between attempts; its next
    attempt (a poll, at most 1 s later) goes out and waits for a reply."""
    wait_then_freeze(env, s, k)
    assert at_point(env, s, "the waiter's next poll", "busy") == "wait"


def body_then_freeze(env, s, k):
    in_body(env, s)
    env.r.pause()


def statement_timeout_in_body(env, s, k):
    """with_lock's query runs into statement_timeout (1 s) with Redis
    frozen: the error path's release is the point."""
    in_body(env, s)
    env.r.pause()
    age = testbed.sql_one(env.admin, "SELECT extract(epoch FROM clock_timestamp() - "
                          "query_start)::float8 FROM pg_stat_activity WHERE pid = %s",
                          (s.pid,))
    return time.monotonic() - age + 1.0


def take_back_after_a_grant(env, s, k, stop_worker):
    """Item 1's path.  A (transaction-scoped, renewed by the worker) has a
    renewal under way: the reply is held back for the worker's connection,
    then the worker is stopped (stop_worker) or its connection stays silent
    until its command_timeout.  ROLLBACK sends A's release without waiting;
    acquire(B) follows on the same connection.  The sessions' replies are
    held until B's grant has run in Redis, so A's answer is read with B's,
    after the grant, not at the call's start.  Returns "wait" once B is
    granted (in the registry) while the statement still runs, or "ended"."""
    s.run("BEGIN")
    assert s.run("SELECT redis_lock_acquire('%s', xact => true) > 0" % k)
    env.proxy.worker_marker = k.encode()
    env.proxy.hold_worker = True
    sent = env.proxy.worker_marked
    testbed.wait_until(lambda: env.proxy.worker_marked > sent, 5, 0.002,
                       what="the worker to send a renewal of A")
    if stop_worker:
        env.stop_worker()
        env.proxy.hold_worker = False
    env.proxy.held = True
    s.run("ROLLBACK")
    s.start("SELECT redis_lock_acquire('%s-b')" % k)
    testbed.wait_until(lambda: env.rc.exists(k + "-b"), 5, 0.002,
                       what="B's grant to run in Redis")
    env.proxy.held = False

    def granted_or_ended():
        if not s.thread.is_alive():
            return "ended"
        b = testbed.sql_one(env.admin, "SELECT count(*) FROM redis_lock_locks "
                            "WHERE pid = %s AND lock_name = %s", (s.pid, k + "-b"))
        return "wait" if b and s.thread.is_alive() else None
    return testbed.wait_until(granted_or_ended, 5, 0.002, what="B granted")


def commit_after_a_served_cancel(env, s, k):
    """The COMMIT-time verify after a cancel the transaction already served
    (caught by PL/pgSQL): nothing is pending, yet the verify into a frozen
    Redis must be cut within 300 ms (a served cancel counts).  No signal
    is sent at the point: the case measures the COMMIT itself."""
    s.run("BEGIN")
    assert s.run("SELECT redis_lock_acquire('%s', xact => true) > 0" % k)
    s.start("DO $$ BEGIN PERFORM pg_sleep(30); "
            "EXCEPTION WHEN query_canceled THEN NULL; END $$")
    in_body(env, s)
    assert testbed.sql_one(env.admin, "SELECT pg_cancel_backend(%s)", (s.pid,))
    s.join(5)
    assert s.error is None, s.error         # caught: the transaction goes on
    env.r.pause()
    t0 = time.monotonic()
    s.start("COMMIT")
    try:
        s.join(OBSERVE)
        took = s.finished_at - t0
    except AssertionError:
        took = None
    shown = ">%.1f" % OBSERVE if took is None else "%.3f" % took
    print("COMMIT ended %s s after it began (%r)" % (shown, s.error))
    assert took is not None and took < VERIFY_BOUND, \
        "the verify after a served cancel took %s s" % shown
    return "done"


# add a row for every new wait on Redis
WAIT_POINTS = [
    Point("acquire, first attempt", "SELECT redis_lock_acquire('{k}')"),
    Point("acquire, while waiting", "SELECT redis_lock_acquire('{k}', wait => '30s')",
          setup=foreign_holder, reach=wait_then_freeze, freeze_first=False),
    Point("acquire, a waiter's poll in flight",
          "SELECT redis_lock_acquire('{k}', wait => '30s')",
          setup=foreign_holder, reach=freeze_then_poll, freeze_first=False,
          signal_at_reach=True),
    Point("fair acquire, first attempt", "SELECT redis_lock_acquire('{k}')",
          protocol="redisson_fair"),
    Point("fair waiter (item 3)", "SELECT redis_lock_acquire('{k}', wait => '30s')",
          setup=fair_holder, reach=wait_then_freeze, freeze_first=False,
          protocol="redisson_fair"),
    Point("fair waiter, its poll in flight",
          "SELECT redis_lock_acquire('{k}', wait => '30s')",
          setup=fair_holder, reach=freeze_then_poll, freeze_first=False,
          protocol="redisson_fair", signal_at_reach=True),
    Point("release", "SELECT redis_lock_release('{k}')",
          setup=hold("SELECT redis_lock_acquire('{k}')")),
    Point("extend", "SELECT redis_lock_extend('{k}', ttl => '60s')",
          setup=hold("SELECT redis_lock_acquire('{k}')")),
    Point("with_lock, success path",
          "SELECT redis_lock_with_lock('{k}', 'SELECT pg_sleep(0.2)')",
          reach=body_then_freeze, freeze_first=False,
          by_itself_from=lambda t: t + 0.2),
    Point("with_lock, error path (signal in the query)",
          "SELECT redis_lock_with_lock('{k}', 'SELECT pg_sleep(30)')",
          reach=body_then_freeze, freeze_first=False, signal_at_reach=True),
    Point("with_lock, error path (statement_timeout in the query)",
          "SELECT redis_lock_with_lock('{k}', 'SELECT pg_sleep(30)')",
          setup=hold("SET statement_timeout = '1s'"), reach=statement_timeout_in_body,
          freeze_first=False, by_itself_from=lambda t: t),
    Point("COMMIT, verify_on_commit (the allowed wait)", "COMMIT",
          setup=hold("BEGIN; SELECT redis_lock_acquire('{k}', xact => true)"),
          bound=VERIFY_BOUND, terminate_bound=BOUND),
    Point("COMMIT, verify_on_commit, after a served cancel", "COMMIT",
          drive=commit_after_a_served_cancel, signals=("cancel",)),
    Point("COMMIT, verify_on_commit off", "COMMIT",
          setup=hold("SET redis_lock.verify_on_commit = off; BEGIN; "
                     "SELECT redis_lock_acquire('{k}', xact => true)"),
          by_itself_from=lambda t: t),
    Point("ROLLBACK", "ROLLBACK",
          setup=hold("BEGIN; SELECT redis_lock_acquire('{k}', xact => true)"),
          by_itself_from=lambda t: t),
    Point("ROLLBACK TO SAVEPOINT", "ROLLBACK TO SAVEPOINT a",
          setup=hold("BEGIN; SAVEPOINT a; SELECT redis_lock_acquire('{k}', xact => true)"),
          by_itself_from=lambda t: t),
    Point("read lock, first attempt", "SELECT redis_lock_acquire_read('{k}')"),
    Point("write lock, waiting behind a reader",
          "SELECT redis_lock_acquire_write('{k}', wait => '30s')",
          setup=read_holder, reach=wait_then_freeze, freeze_first=False),
    Point("release of a write lock", "SELECT redis_lock_release_write('{k}')",
          setup=hold("SELECT redis_lock_acquire_write('{k}')")),
    Point("acquire_many", "SELECT redis_lock_acquire_many(ARRAY['{k}1', '{k}2'])"),
    Point("release_many", "SELECT redis_lock_release_many(ARRAY['{k}1', '{k}2'])",
          setup=hold("SELECT redis_lock_acquire_many(ARRAY['{k}1', '{k}2'])")),
    Point("backend exit while holding", None,
          setup=hold("SELECT redis_lock_acquire('{k}'); "
                     "SELECT redis_lock_acquire('{k}x', xact => false, ttl => '60s')"),
          signals=("terminate",)),
    Point("worker's take-back after a grant (item 1)", "SELECT redis_lock_acquire('{k}-b')",
          drive=lambda env, s, k: take_back_after_a_grant(env, s, k, stop_worker=True)),
]

# A cancel that PL/pgSQL caught was served and handled by the user's code,
# which chose to go on; PostgreSQL does not tell an extension that a caught
# error was a cancel, so the verify after it waits as any verify does
# (interruptibly: a cancel sent during it ends it at once, the row above).
# Documented in doc/failures.md; strict, so that a fix is noticed.
SERVED_CANCEL_GAP = pytest.mark.xfail(
    strict=True, reason="a cancel caught by PL/pgSQL does not bound the COMMIT verify")

CASES = [pytest.param(p, how, id="%s-%s" % (p.name, how),
                      marks=(SERVED_CANCEL_GAP,) if "served cancel" in p.name else ())
         for p in WAIT_POINTS for how in p.signals]


@pytest.fixture(scope="module")
def sweep_env():
    # lease 3 s: the worker renews every second (item 1's path needs one
    # under way)
    env = Env(**{"redis_lock.lease_time": "3s",
                 "redis_lock.command_timeout": "%ds" % TIMEOUT_S,
                 "redis_lock.connect_timeout": "%ds" % TIMEOUT_S})
    yield env
    env.close()


@pytest.mark.parametrize("point,how", CASES)
def test_sweep(sweep_env, point, how):
    env = sweep_env
    k = "sw%d%s" % (WAIT_POINTS.index(point), how[0])
    s = env.session(point.protocol)
    try:
        if point.setup:
            point.setup(env, s, k)
        bound = point.terminate_bound if how == "terminate" else point.bound
        if point.sql is None:
            env.r.pause()
            signal_and_measure(env, s, how, bound)
            return
        if point.drive:
            where = point.drive(env, s, k)
            reached_at = time.monotonic()
            if where == "done":
                return
        elif point.freeze_first:
            env.r.pause()
            s.start(point.sql.format(k=k))
            reached_at = time.monotonic()
            where = at_point(env, s, "the statement to reach its wait point")
        else:
            s.start(point.sql.format(k=k))
            reached_at = point.reach(env, s, k) or time.monotonic()
            if point.signal_at_reach:
                signal_and_measure(env, s, how, bound)
                return
            where = at_point(env, s, "the statement to wait or end",
                             timeout=5 if point.by_itself_from is None else 5 + 1.0)
        if where == "ended":
            # passed the point without waiting: it ended within BOUND of it,
            # and (terminate) the backend, idle with Redis still frozen,
            # exits within BOUND too
            assert point.by_itself_from is not None or point.drive is not None, \
                "the statement ended before it could be signalled: %r" % (s.error,)
            start = point.by_itself_from(reached_at) if point.by_itself_from else reached_at
            took = s.finished_at - start
            print("returned by itself %.3f s after its point (%r)" % (took, s.error))
            assert took < BOUND, "returned %.2f s after its point" % took
            if how == "terminate":
                signal_and_measure(env, s, how, BOUND)
            return
        signal_and_measure(env, s, how, bound)
    finally:
        env.thaw()
        env.rc.flushall()


# ================================================================ item 1

@pytest.mark.parametrize("how", ["cancel", "terminate"])
def test_item1_take_back_with_the_workers_connection_silent(sweep_env, how):
    """Item 1 with the worker running but its connection silent: its renewal
    of A is in flight until its command_timeout (3 s here); ROLLBACK sends
    A's release without waiting; acquire('B') reads A's answer with B's
    grant and, settling, takes A back from the worker, waiting out the
    worker's renewal.  Cancel and terminate must end it within 1 s.  (The
    sweep's row "worker's take-back" is the same with the worker stopped.)"""
    env = sweep_env
    s = env.session()
    try:
        where = take_back_after_a_grant(env, s, "i1", stop_worker=False)
        if where == "ended":
            assert s.error is None, s.error
            print("acquire(B) did not wait for the worker's command")
            if how == "terminate":
                signal_and_measure(env, s, how, BOUND)
            return
        signal_and_measure(env, s, how, BOUND)
    finally:
        env.thaw()
        env.rc.flushall()


# ================================================================ item 3

@pytest.mark.parametrize("how", ["cancel", "terminate"])
def test_item3_fair_waiter_leaves_the_queue_within_a_second_with_redis_silent(sweep_env, how):
    """A redisson_fair waiter (another session holds the lock) is cancelled
    or terminated while every reply of Redis is held back by the proxy:
    leaving the queue must not wait for command_timeout (3 s here)."""
    env = sweep_env
    h = env.session("redisson_fair")
    s = env.session("redisson_fair")
    try:
        assert h.run("SELECT redis_lock_acquire('i3') > 0")
        s.start("SELECT redis_lock_acquire('i3', wait => '30s')")
        assert at_point(env, s, "the fair waiter to sleep", "idle") == "wait"
        assert env.rc.llen("redisson_lock_queue:{i3}") == 1
        env.proxy.held = True
        signal_and_measure(env, s, how, BOUND)
    finally:
        env.thaw()
        env.rc.flushall()


# ================================================================ items 4 and 5

@pytest.fixture(scope="module")
def slow_env():
    """Default lease (30 s) and command_timeout (2 s); the proxy delays
    what a test sends while its delay is up (3 s > command_timeout), and
    delivers what a client sent also after that client gave up."""
    env = Env()
    env.proxy.deliver_after_reset = True
    yield env
    env.close()


def raise_delay_for_what_is_sent_next(env, s, sql, delay):
    """Start sql with the proxy's delay at `delay`; once its command is in
    the proxy, what comes after (a retry's fresh connection) goes at once.
    Only the session's own connection counts (its CLIENT SETNAME is
    redis_lock:<pid>): a chunk of the worker's, which goes through the same
    proxy, would end the delay before the statement's command came (CI22,
    once in a loaded lane: the acquire went undelayed and was granted)."""
    name = "redis_lock:%d" % s.pid

    def last_sent():
        return max([sent for n, sent, _ in env.proxy.backend_io(s.pid) if n == name] or [0])
    env.proxy.delay = delay
    before = last_sent()
    s.start(sql)
    testbed.wait_until(lambda: last_sent() > before, 5, 0.001,
                       what="the statement's command to be sent")
    env.proxy.delay = 0.0


ITEM4_RUNS = int(os.environ.get("RL_ITEM4_RUNS", "4"))
GAP = 0.5


def test_item4_a_stale_release_never_deletes_the_next_grant(slow_env):
    """with_lock's release is still on its way (3 s each way) when the next
    acquire of the same name comes; that acquire times out (2 s), retries
    on a fresh connection and is granted.  When the old compare-and-delete
    lands it must not match the new grant: while redis_lock_held() says
    held and not lost, a redis-py SET NX on the key must fail.  And the
    retry's owner value differs from the first grant's.  Several runs (the
    issue saw it in 7 of 9)."""
    env = slow_env
    failures = []
    for run in range(ITEM4_RUNS):
        k = "i4-%d" % run
        s = env.session()
        try:
            s.start("SELECT redis_lock_with_lock('%s', 'SELECT pg_sleep(0.3)')" % k)
            in_body(env, s)
            first_owner = env.rc.get(k)
            assert first_owner, "with_lock's grant not in Redis"
            # its release (sent when the query ends) is delayed 3 s
            env.proxy.delay = 3.0
            before = env.proxy.chunks_in
            s.join(10)
            assert s.error is None, s.error
            testbed.wait_until(lambda: env.proxy.chunks_in > before, 5, 0.001,
                               what="with_lock's release to be sent")
            release_sent = time.monotonic()
            # the next acquire comes GAP after the release: the stale release
            # then lands GAP before the acquire's own first attempt (which,
            # carrying the same owner value today, would take the key back
            # at once), so a deleted grant shows for GAP.  Scenario timing,
            # not synchronisation: any GAP from ~0.1 s up shows it.
            time.sleep(GAP)
            raise_delay_for_what_is_sent_next(env, s, "SELECT redis_lock_acquire('%s')" % k,
                                              3.0)
            s.join(15)
            granted_at = s.finished_at
            if s.error is not None:
                failures.append("run %d: the acquire failed: %s" % (run, s.error))
                continue
            owner = env.rc.get(k)
            held = s.run("SELECT hold_count > 0 AND NOT lost FROM redis_lock_held() "
                         "WHERE lock_name = %s", (k,))
            # watch until well after the old release has landed (3 s after it
            # was sent; 1 s more)
            stolen = None
            while time.monotonic() < release_sent + GAP + 3.0 + 1.0 * S:
                if env.rc.set(k, "pgrl:intruder", nx=True, px=60000):
                    held_now = s.run("SELECT hold_count > 0 AND NOT lost FROM "
                                     "redis_lock_held() WHERE lock_name = %s", (k,))
                    stolen = (time.monotonic() - release_sent, held_now)
                    break
                time.sleep(0.005)
            print("run %d: retry granted %.2f s after with_lock's release was sent; "
                  "owner %s -> %s; SET NX %s" % (
                      run, granted_at - release_sent, first_owner, owner,
                      "failed throughout" if stolen is None else
                      "succeeded %.2f s after the release was sent, SQL held=%s" % stolen))
            if held and owner == first_owner:
                failures.append("run %d: the retry reused the owner value %s" % (run, owner))
            if stolen is not None and stolen[1]:
                failures.append("run %d: SET NX succeeded %.2f s after the stale release "
                                "was sent while SQL says held and not lost" % (run, stolen[0]))
        finally:
            env.thaw()
            env.rc.flushall()
    assert not failures, "\n".join(failures)


def test_item5_a_late_grant_is_not_left_without_a_holder(slow_env):
    """An acquire's reply is delayed past command_timeout (its command lands
    3 s after it was sent): a late-grant doubt.  The session's next acquire
    retries on a fresh connection, is granted, and the session releases.
    Then the first attempt's write lands.  No key may stay without a holder
    for the 30 s lease: it must be gone within a few seconds of landing
    (the worker settles the first attempt's owner value)."""
    env = slow_env
    rc = env.rc
    s = env.session()
    k = "i5"
    try:
        sent_before = env.proxy.chunks_in
        raise_delay_for_what_is_sent_next(env, s, "SELECT redis_lock_acquire('%s')" % k, 3.0)
        sent = time.monotonic()
        s.join(10)
        assert s.error is not None and s.error.pgcode == "08006", s.error
        assert env.proxy.chunks_in > sent_before
        assert s.run("SELECT redis_lock_acquire('%s') > 0" % k)
        retry_owner = rc.get(k)
        assert s.run("SELECT redis_lock_release('%s')" % k) is True
        lands = sent + 3.0
        print("retried and released %.2f s after the first attempt was sent (owner %s)"
              % (time.monotonic() - sent, retry_owner))
        assert time.monotonic() < lands, "too slow: released after the first attempt landed"
        # the first attempt lands (3 s after it was sent)
        late_owner = None

        def landed():
            nonlocal late_owner
            late_owner = rc.get(k) or late_owner
            return time.monotonic() > lands + 0.5 or late_owner
        testbed.wait_until(landed, 5, 0.002, what="the first attempt to land")
        # then it must go, well before the lease (30 s)
        try:
            testbed.wait_until(lambda: not rc.exists(k), 4.0 * S, 0.01,
                               what="the late grant to be deleted")
            gone_after = time.monotonic() - lands
        except TimeoutError:
            gone_after = None
        print("first attempt's owner %s (retry's %s); key PTTL %d ms; gone %s" % (
            late_owner, retry_owner, rc.pttl(k),
            "never within 4 s" if gone_after is None else
            "%.2f s after the first attempt landed" % gone_after))
        if late_owner is not None:
            assert late_owner != retry_owner, "the retry reused the owner value %s" % late_owner
        assert gone_after is not None, \
            "a late grant is left without a holder for its lease (PTTL %d ms)" % rc.pttl(k)
        assert s.run("SELECT count(*) FROM redis_lock_held()") == 0
    finally:
        env.thaw()
        rc.flushall()
