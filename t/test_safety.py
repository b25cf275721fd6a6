"""End-to-end lock safety, with PostgreSQL as the ground truth.

Several holders run a deliberately NON-atomic read-modify-write on one
counter row while holding one Redis lock: read the balance in one
statement, pause, write balance + 1 in another, commit.  Holders are
SQL sessions (redis_lock_acquire(..., xact => true)) and a redis-py
"service" (threads with their own PostgreSQL connection) taking the same key
in the `simple` layout.  Every committed increment also inserts one ledger
row, so the workers' own count of commits can be checked against the table.

Faults are scheduled, not random (FAULTS): a named holder pauses past its
lease either between its read and its write (`read_pause`) or between its
write and its COMMIT (`commit_pause`), and for some of them Redis is
restarted (no persistence: every lock vanishes) while that holder sleeps.
Ordinary pauses and think times come from a seeded RNG.

* protected run: `redis_lock.verify_on_commit = on`, every write carries its
  fencing token and the table has a `redis_lock_fence_guard` trigger; the
  service takes its token from the extension's fence counter in the same Lua
  script as its SET NX PX, and checks that it still owns the lock just before
  its COMMIT (the service's equivalent of verify_on_commit).  Expect no lost
  update, and faults that were actually caught (40001 at COMMIT, stale
  tokens, lost locks).
  The check on commit is not optional for a read-modify-write: a fenced
  write only rejects LOWER tokens.  A holder that writes while its lease is
  still valid and commits after it ran out (`commit_pause`) passes the
  fence, and the next holder, which read the old value before that commit,
  then writes with a higher token and passes too (Run(..., verify=False) or
  Run(..., service_check=False) lose updates on this schedule).
* control run: the same workload and fault schedule with verify_on_commit
  off, no fencing and no check by the service.  Expect lost updates: without
  them the protected run would prove nothing.

scripts/run-tests t/test_safety.py -s prints the counts.
"""
import itertools
import random
import threading
import time
from collections import Counter

import psycopg2
import redis
import redis.lock

import testbed

LEASE_MS = 400                 # fixed lease of every grant, both sides
LONG_PAUSE = 0.7               # a faulted holder sleeps this long: > lease
SQL_WORKERS = ("sql0", "sql1", "sql2")
SVC_WORKERS = ("svc0", "svc1")
SEED = 20240611
MAX_ITERATIONS = 3000          # per worker, a bound on top of the deadline
RUN_DEADLINE = 45.0            # seconds; the schedule needs about 12

# (holder, where it pauses past its lease, restart Redis during that pause)
FAULTS = (
    ("sql0", "read_pause", False),
    ("svc0", "read_pause", False),
    ("sql1", "commit_pause", False),
    ("svc1", "commit_pause", False),
    ("sql2", "commit_pause", True),
    ("sql0", "read_pause", True),
    ("svc0", "commit_pause", True),
    ("svc1", "read_pause", False),
)

# ---------------------------------------------------------------------------
# The simple protocol's fence counter, as the extension names it
# (src/redis/protocol.c rl_names_from_key): key_prefix || 'redis_lock:fence:{T}',
# T the first tag, shortest first, then in alphabet order, whose Redis
# Cluster slot is the lock key's slot.
# ---------------------------------------------------------------------------
_TAG_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def _crc16_table():
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_CRC16 = _crc16_table()


def key_slot(key):
    """Redis Cluster slot of a key (CRC16/XMODEM of its {hash tag} or all)."""
    if isinstance(key, str):
        key = key.encode()
    open_ = key.find(b"{")
    if open_ >= 0:
        close = key.find(b"}", open_ + 1)
        if close > open_ + 1:
            key = key[open_ + 1:close]
    crc = 0
    for b in key:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ b) & 0xFF]
    return crc & 16383


def fence_counter_key(redis_key, key_prefix=""):
    slot = key_slot(redis_key)
    for n in range(1, 6):
        for tag in itertools.product(_TAG_ALPHABET, repeat=n):
            tag = "".join(tag)
            if key_slot(tag) == slot:
                return "%sredis_lock:fence:{%s}" % (key_prefix, tag)
    raise AssertionError("no tag for slot %d" % slot)


# The service's grant: SET NX PX and the fencing token in one script, so a
# token is issued atomically with the grant, from the extension's counter.
# A counter that is missing (first use, or a Redis restarted without
# persistence) starts at the server clock in microseconds, as the extension's
# does, so tokens keep increasing across the restart.
SERVICE_ACQUIRE_LUA = """
if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
local token = redis.call('incr', KEYS[2])
if token == 1 then
  local now = redis.call('time')
  token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('set', KEYS[2], string.format('%d', token))
end
return token
"""


class FencedServiceLock(redis.lock.Lock):
    """redis-py's Lock (release, reacquire: its own scripts), acquiring with
    SERVICE_ACQUIRE_LUA; the token of the current grant is in .local.fence."""

    def __init__(self, client, name, counter_key, **kw):
        super().__init__(client, name, **kw)
        self.counter_key = counter_key
        self.fenced_acquire = client.register_script(SERVICE_ACQUIRE_LUA)
        self.local.fence = None

    def do_acquire(self, token):
        fence = self.fenced_acquire(keys=[self.name, self.counter_key],
                                    args=[token, int(self.timeout * 1000)],
                                    client=self.redis)
        if fence is None:
            return False
        self.local.fence = int(fence)
        return True


# ---------------------------------------------------------------------------
# The workload
# ---------------------------------------------------------------------------
class Order:
    """One scheduled fault for one holder's next complete iteration."""

    def __init__(self, who, kind, restart):
        self.who, self.kind, self.restart = who, kind, restart
        self.paused = threading.Event()     # the holder is asleep past its lease
        self.done = threading.Event()       # that iteration has ended
        self.outcome = None


class Run:
    """One run of the workload.  protected=True turns on all three
    protections; verify / fenced / service_check override them one by one
    (mode names the tables and the lock, so runs do not share them)."""

    def __init__(self, pg, redis_srv, protected, verify=None, fenced=None,
                 service_check=None, mode=None):
        self.pg, self.redis_srv, self.protected = pg, redis_srv, protected
        self.verify = protected if verify is None else verify
        self.fenced = protected if fenced is None else fenced
        self.service_check = protected if service_check is None else service_check
        mode = mode or ("protected" if protected else "control")
        self.mode = mode
        self.lock = "safety:" + mode
        self.table = "safety_acct_" + mode
        self.ledger = "safety_ledger_" + mode
        self.counter_key = fence_counter_key(self.lock)
        self.tally = Counter()
        self.unexpected = []
        self.orders = {}
        self.mutex = threading.Lock()
        self.stop = threading.Event()
        self.deadline = None

    # -- bookkeeping --------------------------------------------------------
    def count(self, what, n=1):
        with self.mutex:
            self.tally[what] += n

    def note_unexpected(self, who, stage, e):
        with self.mutex:
            self.unexpected.append("%s at %s: %s %r" % (
                who, stage, getattr(e, "pgcode", None) or type(e).__name__, str(e)[:300]))

    def take_order(self, who):
        with self.mutex:
            return self.orders.get(who)

    def finish_order(self, order, outcome):
        """The faulted iteration is over; an order whose pause was never
        reached (e.g. Redis was down at the acquire) stays for the next."""
        if order is None or not order.paused.is_set():
            return
        with self.mutex:
            self.orders.pop(order.who, None)
        order.outcome = outcome
        order.done.set()

    def keep_going(self, it):
        return (not self.stop.is_set() and it < MAX_ITERATIONS
                and time.monotonic() < self.deadline)

    def pause(self, rng, order, where):
        if order is not None and order.kind == where:
            order.paused.set()
            time.sleep(LONG_PAUSE)
        else:
            time.sleep(rng.uniform(0, 0.015))

    # -- schema -------------------------------------------------------------
    def setup(self, admin):
        testbed.sql_one(admin, "SELECT 1")
        with admin.cursor() as cur:
            cur.execute("CREATE TABLE %s (id int PRIMARY KEY, balance bigint NOT NULL, "
                        "fence bigint)" % self.table)
            cur.execute("CREATE TABLE %s (who text NOT NULL, iteration int NOT NULL, "
                        "read_value bigint NOT NULL, token bigint)" % self.ledger)
            cur.execute("INSERT INTO %s VALUES (1, 0, NULL)" % self.table)
            if self.fenced:
                cur.execute("CREATE TRIGGER fenced BEFORE INSERT OR UPDATE ON %s FOR EACH ROW "
                            "EXECUTE FUNCTION redis_lock_fence_guard(%%s)" % self.table,
                            (self.lock,))

    # -- SQL holders --------------------------------------------------------
    def sql_worker(self, who):
        conn = self.pg.connect(autocommit=False, options="-c redis_lock.verify_on_commit=%s"
                               % ("on" if self.verify else "off"))
        cur = conn.cursor()
        rng = random.Random("%d-%s-%s" % (SEED, who, self.mode))
        it = 0
        try:
            while self.keep_going(it):
                it += 1
                order = self.take_order(who)
                stage, outcome = "acquire", None
                try:
                    cur.execute("SELECT redis_lock_acquire(%s, ttl => %s, wait => '3s', "
                                "xact => true)", (self.lock, "%dms" % LEASE_MS))
                    token = cur.fetchone()[0]
                    stage = "read-modify-write"
                    self.read_modify_write(cur, rng, order, who, it, token)
                    stage = "commit"
                    conn.commit()
                    outcome = "committed"
                    self.count("committed")
                    self.count("committed_" + who)
                except psycopg2.Error as e:
                    conn.rollback()
                    outcome = self.classify_sql(who, stage, e)
                    if outcome.startswith("redis_unavailable"):
                        time.sleep(0.02)
                self.finish_order(order, outcome)
                # think time, lock not held: a little longer than the service's
                # 10 ms poll, or SQL waiters (woken by PUBLISH) starve it
                time.sleep(rng.uniform(0, 0.02))
        finally:
            conn.close()

    def read_modify_write(self, cur, rng, order, who, it, token):
        """The non-atomic increment, with the schedule's pauses (after the
        read, and after the write before COMMIT)."""
        cur.execute("SELECT balance FROM %s WHERE id = 1" % self.table)
        value = cur.fetchone()[0]
        self.pause(rng, order, "read_pause")
        if self.fenced:
            cur.execute("UPDATE %s SET balance = %%s, fence = %%s WHERE id = 1"
                        % self.table, (value + 1, token))
        else:
            cur.execute("UPDATE %s SET balance = %%s WHERE id = 1"
                        % self.table, (value + 1,))
        cur.execute("INSERT INTO %s VALUES (%%s, %%s, %%s, %%s)" % self.ledger,
                    (who, it, value, token))
        self.pause(rng, order, "commit_pause")

    def classify_sql(self, who, stage, e):
        code, msg = e.pgcode or "", str(e)
        if code == "40001" and "stale fencing token" in msg:
            what = "stale_token"
        elif code == "40001" and stage == "commit" and "was lost before COMMIT" in msg:
            what = "commit_refused_40001"
        elif code == "55P03" and stage == "acquire":
            what = "acquire_timeout_sql"
        elif code.startswith("08"):
            what = "redis_unavailable_at_" + stage
        else:
            self.note_unexpected(who, stage, e)
            what = "unexpected"
        self.count(what)
        return what

    # -- the redis-py service -----------------------------------------------
    def service_worker(self, who):
        client = self.redis_srv.client(socket_timeout=1, socket_connect_timeout=0.5)
        lock = FencedServiceLock(client, self.lock, self.counter_key,
                                 timeout=LEASE_MS / 1000.0, sleep=0.01, blocking_timeout=3)
        conn = self.pg.connect(autocommit=False)
        cur = conn.cursor()
        rng = random.Random("%d-%s-%s" % (SEED, who, self.mode))
        redis_errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
        it = 0
        try:
            while self.keep_going(it):
                it += 1
                order = self.take_order(who)
                stage, outcome = "acquire", None
                try:
                    if not lock.acquire():
                        self.count("acquire_timeout_svc")
                        continue
                except redis_errors:
                    self.count("svc_redis_unavailable_at_acquire")
                    time.sleep(0.02)
                    continue
                token = lock.local.fence
                try:
                    stage = "read-modify-write"
                    self.read_modify_write(cur, rng, order, who, it, token)
                    if self.service_check:
                        # still ours?  (compare-and-PEXPIRE: redis-py's reacquire)
                        stage = "verify"
                        lock.reacquire()
                    stage = "commit"
                    conn.commit()
                    outcome = "committed"
                    self.count("committed")
                    self.count("committed_" + who)
                except psycopg2.Error as e:
                    conn.rollback()
                    outcome = self.classify_sql(who, stage, e)
                except redis.exceptions.LockNotOwnedError:
                    conn.rollback()
                    outcome = "svc_lost_at_verify"
                    self.count(outcome)
                except redis_errors:
                    conn.rollback()
                    outcome = "svc_redis_unavailable_at_" + stage
                    self.count(outcome)
                finally:
                    try:
                        lock.release()
                    except redis.exceptions.LockNotOwnedError:
                        self.count("svc_lost_at_release")
                    except redis_errors:
                        self.count("svc_redis_unavailable_at_release")
                self.finish_order(order, outcome)
                time.sleep(rng.uniform(0, 0.01))
        finally:
            conn.close()
            client.close()

    # -- the schedule -------------------------------------------------------
    def execute(self):
        admin = self.pg.connect()
        rc = self.redis_srv.client()
        try:
            self.setup(admin)
            lost_before = testbed.sql_one(admin, "SELECT lost FROM redis_lock_stats()")
            self.deadline = time.monotonic() + RUN_DEADLINE * testbed.TIME_SCALE
            threads = [threading.Thread(target=self.sql_worker, args=(w,), daemon=True)
                       for w in SQL_WORKERS]
            threads += [threading.Thread(target=self.service_worker, args=(w,), daemon=True)
                        for w in SVC_WORKERS]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            try:
                time.sleep(0.5)
                for who, kind, restart in FAULTS:
                    order = Order(who, kind, restart)
                    with self.mutex:
                        self.orders[who] = order
                    assert order.paused.wait(15 * testbed.TIME_SCALE), \
                        "%s never reached its %s" % (who, kind)
                    if restart:
                        time.sleep(0.05)
                        self.redis_srv.restart()     # every lock (and counter) vanishes
                        self.count("redis_restarts")
                    assert order.done.wait(15 * testbed.TIME_SCALE), \
                        "%s's faulted iteration did not end" % who
                    self.count("fault_" + order.outcome)
                    time.sleep(0.3)
                time.sleep(0.3)
            finally:
                self.stop.set()
                for t in threads:
                    t.join(15 * testbed.TIME_SCALE)
            assert not any(t.is_alive() for t in threads), "a worker did not stop"
            self.elapsed = time.monotonic() - t0
            self.lost_sql = testbed.sql_one(admin, "SELECT lost FROM redis_lock_stats()") \
                - lost_before
            self.balance, self.last_fence = testbed.sql_one(
                admin, "SELECT balance, fence FROM %s WHERE id = 1" % self.table)
            self.ledger_rows = testbed.sql_one(admin, "SELECT count(*) FROM %s" % self.ledger)
            self.committed_reads = [r for r, in self.query(
                admin, "SELECT read_value FROM %s ORDER BY read_value" % self.ledger)]
            self.tokens_in_value_order = [t for t, in self.query(
                admin, "SELECT token FROM %s ORDER BY read_value, token" % self.ledger)]
            self.counter_exists = rc.exists(self.counter_key)
        finally:
            admin.close()
            rc.close()
        print("\n%s run, %.1f s: counter %d, committed %d (ledger %d), lost updates %d; "
              "SQL locks lost %d; %s"
              % (self.mode, self.elapsed, self.balance,
                 self.tally["committed"], self.ledger_rows,
                 self.tally["committed"] - self.balance, self.lost_sql,
                 ", ".join("%s=%d" % kv for kv in sorted(self.tally.items()))))
        return self

    @staticmethod
    def query(conn, q):
        with conn.cursor() as cur:
            cur.execute(q)
            return cur.fetchall()


def test_fence_counter_name_matches_the_extension(pg, redis_srv):
    """The service's tokens come from the extension's counter: same name."""
    rc = redis_srv.client()
    s = pg.connect()
    try:
        for name in ("safety:protected", "safety:control", "orders:export", "x{tag}y"):
            key = fence_counter_key(name)
            rc.delete(key)
            testbed.sql_one(s, "SELECT redis_lock_acquire(%s, ttl => '5s')", (name,))
            testbed.sql_one(s, "SELECT redis_lock_release(%s)", (name,))
            assert rc.exists(key) == 1, "extension's counter for %r is not %r" % (name, key)
        # a service grant takes the next token of the sequence
        lock = FencedServiceLock(rc, "orders:export", fence_counter_key("orders:export"),
                                 timeout=5)
        sql_token = testbed.sql_one(s, "SELECT redis_lock_acquire('orders:export', ttl => '5s')")
        testbed.sql_one(s, "SELECT redis_lock_release('orders:export')")
        assert lock.acquire(blocking=False)
        assert lock.local.fence == sql_token + 1
        lock.release()
        assert testbed.sql_one(s, "SELECT redis_lock_acquire('orders:export', ttl => '5s')") \
            == sql_token + 2
        testbed.sql_one(s, "SELECT redis_lock_release('orders:export')")
    finally:
        s.close()
        rc.close()


def test_protected_run_loses_no_update(pg, redis_srv):
    run = Run(pg, redis_srv, protected=True).execute()
    t = run.tally
    assert run.unexpected == []
    # ground truth: the table has exactly what the workers say they committed
    assert run.ledger_rows == t["committed"]
    assert run.balance == t["committed"], "lost updates with verify_on_commit and fencing"
    # each committed transaction read a different value: 0, 1, 2, ... and the
    # tokens of those commits increase in that order (fencing order = write order)
    assert run.committed_reads == list(range(t["committed"]))
    assert all(a < b for a, b in zip(run.tokens_in_value_order, run.tokens_in_value_order[1:]))
    assert run.last_fence == run.tokens_in_value_order[-1]
    # every worker made progress
    for w in SQL_WORKERS + SVC_WORKERS:
        assert t["committed_" + w] > 0, "%s never committed" % w
    # the faults happened and were caught: no holder that slept past its
    # lease committed, and each protection fired
    assert t["fault_committed"] == 0
    assert t["redis_restarts"] == sum(1 for f in FAULTS if f[2])
    assert t["commit_refused_40001"] > 0
    assert t["stale_token"] > 0
    assert run.lost_sql > 0
    assert t["svc_lost_at_verify"] + t["svc_redis_unavailable_at_verify"] > 0
    assert run.counter_exists


def test_control_run_loses_updates(pg, redis_srv):
    run = Run(pg, redis_srv, protected=False).execute()
    t = run.tally
    assert run.unexpected == []
    assert run.ledger_rows == t["committed"]
    # the same schedule without the protections: holders that slept past
    # their lease committed anyway, and increments were lost
    assert t["fault_committed"] > 0
    assert run.balance < t["committed"], "the workload has no teeth"
    # nothing refused anything
    assert t["commit_refused_40001"] == 0 and t["stale_token"] == 0
