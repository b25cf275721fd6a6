"""Real migration tools take the Redis lock a service takes (issue 24).

Flyway, Liquibase, Alembic, golang-migrate and sqitch, each the real tool
from its registry (versions pinned under t/migrations/, built by
scripts/install-deps), run the migrations of t/migrations/<tool>/ against
a database whose table `orders` a service writes to:

1. a transactional migration takes the lock with xact => true
   (orders.total_cents, added and backfilled);
2. a migration that cannot run in a transaction (CREATE INDEX
   CONCURRENTLY), marked so in the tool's own way, takes it session-scoped
   and releases it explicitly.

The service is real: Redisson (the Java peer, latest 4.x, protocol
'redisson') for the JVM tools, redis-py (protocol 'simple') for the others.
For every tool and both kinds of migration:

(a) the service holds the lock: the migration waits, and runs after the
    service let go (the service's row, written while the migration waited,
    is backfilled); the same for the non-transactional migration alone
    (the first one already deployed): it waits, then builds the index;
(b)+(d) the migration holds the lock for two and a half leases of 1 s while
    a transaction of the service keeps it from finishing (a write the
    ALTER TABLE waits for; a snapshot CREATE INDEX CONCURRENTLY waits for):
    the watchdog renews it, the service never gets it meanwhile, and gets it
    once the migration is done (and sees its result);
(c) the migration fails after taking the lock (the schema has drifted): the
    tool exits non-zero reporting the migration's own error, no lock error,
    and the lock is free (a service waiting for it gets it).

Every tool run is bounded in time; on a timeout the test shows the tool's
output and what the database's sessions were waiting for.  Redisson runs
its latest line only here (t/test_interop_java.py covers both lines)."""
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

import psycopg2
import pytest

from peers import REDISSON_LINES, JavaPeer
import testbed
from testbed import TIME_SCALE as S

HERE = os.path.dirname(os.path.abspath(__file__))
MIGRATIONS = os.path.join(HERE, "migrations")
LOCK = "migrate:orders"
RUN_BOUND = 120 * S          # one tool run, JVM start included, on a loaded machine
RUN_WAIT = 120               # the same for testbed.wait_until, which scales by itself
LEASE = "1s"                 # redis_lock.lease_time for (b)+(d): renewed every 333 ms
HOLD_FOR = 2.5               # the lock must outlive two and a half leases, held


def _need(path):
    if not os.path.exists(path):
        pytest.fail("%s is missing: run scripts/install-deps" % path)
    return path


class Tool:
    """One migration tool: how to run it against a database, all pending
    migrations or only the first; how it ends when a migration fails."""
    name = protocol = None
    failure_code = 1            # its exit code when a migration fails
    also_after_tx_failure = None    # what else it reports after the migration's error
    reverts_run_on_failure = False  # a failure undoes what the same run deployed

    def command(self, port, db, first_only):
        raise NotImplementedError

    def start(self, pg, db, first_only=False, options=()):
        """options: the tool's own, given before its command."""
        argv, cwd, env = self.command(pg.port, db, first_only)
        argv[-1:-1] = options
        return Run(argv, cwd, dict(os.environ, **env), pg, db)

    def run(self, pg, db, first_only=False):
        return self.start(pg, db, first_only).finish()


def jvm(lib, main):
    # C1 only: these are short runs, where the JVM's start is most of the time
    return ["java", "-XX:TieredStopAtLevel=1", "-cp", os.path.join(_need(lib), "*"), main]


class Flyway(Tool):
    name, protocol = "flyway", "redisson"
    dir = os.path.join(MIGRATIONS, "flyway")

    def command(self, port, db, first_only):
        # the service's table exists before Flyway does: a baseline below V1
        argv = jvm(os.path.join(self.dir, "target", "lib"), "org.flywaydb.commandline.Main") + [
            "-skipCheckForUpdate", "-configFiles=flyway.toml",
            "-url=jdbc:postgresql://127.0.0.1:%d/%s" % (port, db), "-user=postgres",
            "-baselineOnMigrate=true", "-baselineVersion=0"]
        argv += (["-target=1"] if first_only else []) + ["migrate"]
        return argv, self.dir, {"REDGATE_DISABLE_TELEMETRY": "true"}


class Liquibase(Tool):
    name, protocol = "liquibase", "redisson"
    dir = os.path.join(MIGRATIONS, "liquibase")

    def command(self, port, db, first_only):
        argv = jvm(os.path.join(self.dir, "target", "lib"),
                   "liquibase.integration.commandline.LiquibaseCommandLine") + [
            "--show-banner=false", "--changelog-file=changelog.sql",
            "--url=jdbc:postgresql://127.0.0.1:%d/%s" % (port, db), "--username=postgres"]
        argv += ["update-count", "--count=1"] if first_only else ["update"]
        return argv, self.dir, {"LIQUIBASE_ANALYTICS_ENABLED": "false"}


class Alembic(Tool):
    name, protocol = "alembic", "simple"
    dir = os.path.join(MIGRATIONS, "alembic")

    def command(self, port, db, first_only):
        argv = [_need(os.path.join(self.dir, "venv", "bin", "alembic")), "-c", "alembic.ini",
                "upgrade", "0001" if first_only else "head"]
        return argv, self.dir, {
            "DATABASE_URL": "postgresql+psycopg2://postgres@127.0.0.1:%d/%s" % (port, db)}


class GolangMigrate(Tool):
    name, protocol = "golang-migrate", "simple"
    # after a failed statement inside BEGIN, migrate's own advisory unlock on
    # the same connection fails too ("current transaction is aborted")
    also_after_tx_failure = "pg_advisory_unlock"
    dir = os.path.join(MIGRATIONS, "golang-migrate")

    def command(self, port, db, first_only):
        url = "postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&x-multi-statement=true" % (
            port, db)
        argv = [_need(os.path.join(self.dir, "bin", "migrate")), "-path", "migrations",
                "-database", url, "up"] + (["1"] if first_only else [])
        return argv, self.dir, {}


class Sqitch(Tool):
    name, protocol = "sqitch", "simple"
    failure_code = 2
    reverts_run_on_failure = True   # --mode all, the default: revert/*.sql run
    dir = os.path.join(MIGRATIONS, "sqitch")

    def command(self, port, db, first_only):
        argv = [_need(shutil.which("sqitch") or "/usr/bin/sqitch"), "deploy"]
        argv += ["--to", "orders_total_cents"] if first_only else []
        argv += ["db:pg://postgres@127.0.0.1:%d/%s" % (port, db)]
        return argv, self.dir, {"SQITCH_FULLNAME": "redis_lock tests",
                                "SQITCH_EMAIL": "tests@redis-lock.invalid"}


TOOLS = [Flyway(), Liquibase(), Alembic(), GolangMigrate(), Sqitch()]


class Run:
    """A tool run in the background: its output in a file, its end bounded
    by RUN_BOUND."""

    def __init__(self, argv, cwd, env, pg, db):
        self.pg, self.db = pg, db
        self.out = tempfile.TemporaryFile(mode="w+")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def output(self):
        self.out.seek(0)
        return self.out.read()

    def running(self):
        return self.proc.poll() is None

    def finish(self):
        """(exit code, output) once the tool has ended."""
        left = RUN_BOUND - (time.monotonic() - self.started)
        try:
            self.proc.wait(max(left, 1))
        except subprocess.TimeoutExpired:
            activity = sessions_of(self.pg, self.db)
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)
            raise AssertionError("the tool ran longer than %ds\noutput:\n%s\nsessions:\n%s"
                                 % (RUN_BOUND, self.output(), activity))
        return self.proc.returncode, self.output()


def sessions_of(pg, db):
    admin = pg.connect()
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT pid, state, wait_event_type, wait_event, left(query, 80) "
                        "FROM pg_stat_activity WHERE datname = %s", (db,))
            return "\n".join(str(r) for r in cur.fetchall())
    finally:
        admin.close()


def waiting_session(pg, db, wait_event_type):
    """The pid of a session of db waiting on wait_event_type ('Extension':
    for a Redis lock; 'Lock': for a PostgreSQL lock), or None."""
    admin = pg.connect()
    try:
        return testbed.sql_one(admin, "SELECT pid FROM pg_stat_activity WHERE datname = %s "
                               "AND wait_event_type = %s LIMIT 1", (db, wait_event_type))
    finally:
        admin.close()


# ---------------------------------------------------------------- services

class RedisPyService:
    """The service side in Python: redis-py's lock (protocol 'simple')."""

    def __init__(self, rc):
        self.rc = rc
        # acquired in a waiting thread, released by the test: not thread-local
        self.lock = rc.lock(LOCK, timeout=30, thread_local=False)

    def hold(self):
        assert self.lock.acquire(blocking=False)

    def release(self):
        self.lock.release()

    def try_take(self):
        probe = self.rc.lock(LOCK, timeout=30)
        got = probe.acquire(blocking=False)
        if got:
            probe.release()
        return got

    def wait_for_it(self, then):
        """Wait (in a thread) for the lock; once held, then() runs at once.
        Returns a function giving (got, then()'s result)."""
        box = {}

        def body():
            box["got"] = self.lock.acquire(blocking=True, blocking_timeout=RUN_BOUND)
            if box["got"]:
                box["seen"] = then()
        t = threading.Thread(target=body, daemon=True)
        t.start()

        def result():
            t.join(RUN_BOUND)
            assert not t.is_alive(), "the service is still waiting"
            return box["got"], box.get("seen")
        return result

    def owner(self):
        return self.rc.get(LOCK)


class RedissonService:
    """The service side in Java: Redisson's RLock (protocol 'redisson'),
    held by the peer's thread "svc"."""

    def __init__(self, java, rc):
        self.java, self.rc = java, rc

    def hold(self):
        assert self.java.call("svc", "lock", LOCK) is True

    def release(self):
        assert self.java.call("svc", "unlock", LOCK) is True

    def try_take(self):
        got = self.java.call("probe", "trylock", LOCK, 0, -1)
        if got:
            self.java.call("probe", "unlock", LOCK)
        return got

    def wait_for_it(self, then):
        rid = self.java.send("svc", "lock", LOCK)

        def result():
            got = self.java.result(rid, RUN_BOUND)[0]
            return got, then() if got else None
        return result

    def owner(self):
        return sorted(self.rc.hkeys(LOCK))


@pytest.fixture(scope="module")
def java(redis_srv):
    peer = JavaPeer([redis_srv.port], line=REDISSON_LINES[-1])
    yield peer
    peer.close()


@pytest.fixture(params=TOOLS, ids=lambda t: t.name)
def tool(request):
    return request.param


@pytest.fixture
def service(tool, rc, request):
    if tool.protocol == "redisson":
        return RedissonService(request.getfixturevalue("java"), rc)
    return RedisPyService(rc)


_dbs = iter(range(1, 1 << 30))


@pytest.fixture
def db(pg, tool, rc):
    """A database of the service's: table orders, two orders, redis_lock,
    and the tool's protocol as the database's default."""
    name = "orders_%s_%d" % (tool.name.replace("-", "_"), next(_dbs))
    admin = pg.connect()
    with admin.cursor() as cur:
        cur.execute("CREATE DATABASE %s" % name)
        cur.execute("ALTER DATABASE %s SET redis_lock.protocol = '%s'" % (name, tool.protocol))
    c = pg.connect(dbname=name)
    with c.cursor() as cur:
        cur.execute("CREATE EXTENSION redis_lock")
        cur.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL, "
                    "total numeric(12,2) NOT NULL)")
        cur.execute("INSERT INTO orders (customer, total) VALUES ('ada', 12.50), ('grace', 7.25)")
    yield name
    c.close()
    with admin.cursor() as cur:
        cur.execute("DROP DATABASE %s WITH (FORCE)" % name)
    admin.close()


def sql(pg, db, query, args=None):
    c = pg.connect(dbname=db)
    try:
        with c.cursor() as cur:
            cur.execute(query, args)
            return cur.fetchone()[0] if cur.description else None
    finally:
        c.close()


def set_for_database(pg, db, setting, value):
    """The default of setting in db's new sessions (the tool's)."""
    admin = pg.connect()
    try:
        with admin.cursor() as cur:
            cur.execute("ALTER DATABASE %s SET %s = '%s'" % (db, setting, value))
    finally:
        admin.close()


def backfilled(pg, db):
    """Orders the migration has not filled in total_cents for (None if the
    column does not exist yet)."""
    if not sql(pg, db, "SELECT count(*) FROM pg_attribute WHERE attrelid = 'orders'::regclass "
               "AND attname = 'total_cents'"):
        return None
    return sql(pg, db, "SELECT count(*) FROM orders WHERE total_cents IS DISTINCT FROM total * 100")


def index_valid(pg, db):
    return sql(pg, db, "SELECT indisvalid FROM pg_index "
               "WHERE indexrelid = to_regclass('orders_customer_idx')")


def service_transaction(pg, db):
    """A transaction of the service's, writing to orders and not yet
    committed: ALTER TABLE (and CREATE INDEX CONCURRENTLY) wait for it."""
    c = pg.connect(dbname=db, autocommit=False)
    with c.cursor() as cur:
        cur.execute("INSERT INTO orders (customer, total) VALUES ('in flight', 1.00)")
    return c


def service_snapshot(pg, db):
    """A transaction of the service's that keeps a snapshot and no lock on
    orders: ALTER TABLE goes on, CREATE INDEX CONCURRENTLY waits for it (it
    waits for every older snapshot before it is done)."""
    c = pg.connect(dbname=db, autocommit=False)
    c.set_session(isolation_level="REPEATABLE READ")
    with c.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_class")
    return c


def assert_own_error(tool, code, out, error):
    assert code == tool.failure_code, out
    assert error in out, out
    assert "Redis" not in out, "a lock error in the tool's output:\n" + out
    # no second error raised while handling the first (a Python traceback's words)
    assert "another exception occurred" not in out, out


# ================================================================ (a)

def test_migration_waits_for_the_service_holding_the_lock(tool, service, pg, db, rc):
    service.hold()
    run = tool.start(pg, db)
    testbed.wait_until(lambda: waiting_session(pg, db, "Extension") or not run.running(),
                       RUN_WAIT, what="the migration to wait for the lock")
    assert run.running(), run.output()
    # the service writes while the migration waits ...
    sql(pg, db, "INSERT INTO orders (customer, total) VALUES ('service', 3.00)")
    assert backfilled(pg, db) is None
    service.release()
    code, out = run.finish()
    assert code == 0, out
    # ... and the migration ran after it: the service's order is backfilled
    assert backfilled(pg, db) == 0
    assert sql(pg, db, "SELECT total_cents FROM orders WHERE customer = 'service'") == 300
    assert index_valid(pg, db) is True
    assert rc.exists(LOCK) == 0


def test_non_transactional_migration_waits_for_the_service_holding_the_lock(
        tool, service, pg, db, rc):
    code, out = tool.start(pg, db, first_only=True).finish()
    assert code == 0, out
    service.hold()
    run = tool.start(pg, db)        # only the CREATE INDEX CONCURRENTLY is left
    testbed.wait_until(lambda: waiting_session(pg, db, "Extension") or not run.running(),
                       RUN_WAIT, what="the migration to wait for the lock")
    assert run.running(), run.output()
    assert sql(pg, db, "SELECT to_regclass('orders_customer_idx') IS NULL"), \
        "the index was begun while the service held the lock"
    service.release()
    code, out = run.finish()
    assert code == 0, out
    assert index_valid(pg, db) is True
    assert rc.exists(LOCK) == 0


def test_sqitch_is_the_version_the_docs_name():
    """sqitch comes from Debian (apt, scripts/install-deps), not pinned by
    a lock file: the version doc/migrations.md names is checked here."""
    out = subprocess.run([_need(shutil.which("sqitch") or "/usr/bin/sqitch"), "--version"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "v1.3.1" in out, out
    with open(os.path.join(HERE, "..", "doc", "migrations.md")) as f:
        assert "| sqitch 1.3.1 (psql) | Debian bookworm |" in f.read()


# ================================================================ (b) + (d)

def hold_while_service_tries(run, pg, db, service, rc):
    """The migration, holding the lock, is kept waiting on a PostgreSQL lock
    (the service's open transaction) for three leases: the lock stays its
    own, its lease renewed, and the service never gets it."""
    testbed.wait_until(lambda: (waiting_session(pg, db, "Lock") and rc.exists(LOCK))
                       or not run.running(), RUN_WAIT,
                       what="the migration to hold the lock and wait for the table")
    assert run.running(), run.output()
    owner = service.owner()
    until = time.monotonic() + HOLD_FOR
    tries = 0
    # at least 10 tries however slow the service's round trips are under
    # load: the migration keeps waiting as long as the blocker is open
    while time.monotonic() < until or tries < 10:
        assert service.try_take() is False
        tries += 1
        assert service.owner() == owner
        assert 0 < rc.pttl(LOCK) <= 1000, "a lease of %s is not what the tool's session has" % LEASE
        time.sleep(0.1)
    assert tries >= 10 and waiting_session(pg, db, "Lock"), "the migration stopped waiting"


def test_service_waits_while_a_transactional_migration_outlives_its_lease(
        tool, service, pg, db, rc):
    set_for_database(pg, db, "redis_lock.lease_time", LEASE)
    blocker = service_transaction(pg, db)
    run = tool.start(pg, db, first_only=True)
    try:
        hold_while_service_tries(run, pg, db, service, rc)
        result = service.wait_for_it(lambda: backfilled(pg, db))
        blocker.commit()
        got, seen = result()
        assert got is True
        assert seen == 0            # the migration had committed, backfill and all
        service.release()
        code, out = run.finish()
        assert code == 0, out
    finally:
        blocker.close()


def test_service_waits_while_a_non_transactional_migration_outlives_its_lease(
        tool, service, pg, db, rc):
    set_for_database(pg, db, "redis_lock.lease_time", LEASE)
    blocker = service_snapshot(pg, db)
    run = tool.start(pg, db)        # the first migration goes through
    try:
        hold_while_service_tries(run, pg, db, service, rc)
        assert backfilled(pg, db) == 0 and index_valid(pg, db) is not True
        result = service.wait_for_it(lambda: index_valid(pg, db))
        blocker.commit()
        got, seen = result()
        assert got is True
        assert seen is True         # the index was built before the lock was released
        service.release()
        code, out = run.finish()
        assert code == 0, out
    finally:
        blocker.close()


# ================================================================ (c)

def test_failing_transactional_migration_reports_its_error_and_frees_the_lock(
        tool, service, pg, db, rc):
    sql(pg, db, "ALTER TABLE orders ADD COLUMN total_cents bigint")    # drift
    blocker = service_transaction(pg, db)
    run = tool.start(pg, db)
    try:
        testbed.wait_until(lambda: (waiting_session(pg, db, "Lock") and rc.exists(LOCK))
                           or not run.running(), RUN_WAIT,
                           what="the migration to hold the lock and wait for the table")
        assert run.running(), run.output()
        result = service.wait_for_it(lambda: None)
        blocker.commit()            # the ALTER TABLE goes on, and fails
        code, out = run.finish()
        own = 'column "total_cents" of relation "orders" already exists'
        assert_own_error(tool, code, out, own)
        if tool.also_after_tx_failure:
            assert out.index(own) < out.index(tool.also_after_tx_failure), out
        got, _ = result()
        assert got is True          # the service waiting for the migration got the lock
        service.release()
    finally:
        blocker.close()


def test_failing_non_transactional_migration_reports_its_error_and_frees_the_lock(
        tool, service, pg, db, rc):
    sql(pg, db, "CREATE INDEX orders_customer_idx ON orders (id)")     # drift
    # which statements the tool's session ran after the failure
    set_for_database(pg, db, "log_statement", "all")
    log_from = len(pg.log_text())
    code, out = tool.run(pg, db)
    assert_own_error(tool, code, out, 'relation "orders_customer_idx" already exists')
    # the first migration stays, unless the tool reverts what this run did
    # (sqitch, whose revert script takes the lock too)
    assert backfilled(pg, db) == (None if tool.reverts_run_on_failure else 0)
    # released by the migration itself (Alembic's finally), or with the
    # tool's connection when the tool stops at the error
    testbed.wait_until(lambda: rc.exists(LOCK) == 0, 10, what="the lock to be free")
    assert service.try_take() is True
    log = pg.log_text()[log_from:]
    failed = log.index('ERROR:  relation "orders_customer_idx" already exists')
    released = re.search(r"LOG:  .*SELECT redis_lock_release\('migrate:orders'\)", log[failed:])
    assert bool(released) == isinstance(tool, Alembic), log[failed:]


# ================================================================ Flyway's own lock

@pytest.mark.parametrize("tool", [Flyway()], ids=["flyway"])
def test_flyway_holding_its_own_lock_in_a_transaction_never_builds_the_index(
        tool, pg, db, rc):
    """Why flyway.toml sets postgresql.transactional.lock = false: with
    Flyway's own lock in a transaction of its own, CREATE INDEX CONCURRENTLY
    waits for that transaction, which waits for it.  Ending the tool ends
    its session, and with it the Redis lock its migration held."""
    run = tool.start(pg, db, options=["-postgresql.transactional.lock=true"])
    try:
        def stuck():
            activity = sessions_of(pg, db)
            return ("'Lock', 'virtualxid', 'CREATE INDEX CONCURRENTLY" in activity
                    and "'idle in transaction'" in activity)
        testbed.wait_until(lambda: stuck() or not run.running(), RUN_WAIT,
                           what="CREATE INDEX CONCURRENTLY to wait for Flyway")
        assert run.running(), run.output()
        time.sleep(1.0)
        assert stuck() and rc.exists(LOCK) == 1
    finally:
        os.killpg(run.proc.pid, 9)
        run.proc.wait(10)
    testbed.wait_until(lambda: rc.exists(LOCK) == 0, 10,
                       what="the lock to go with the killed tool's session")


# ================================================================ with_lock

@pytest.mark.parametrize("tool", [GolangMigrate()], ids=["sql"])
def test_with_lock_cannot_build_an_index_concurrently(tool, pg, db, rc):
    """Why the non-transactional migrations release explicitly instead of
    using redis_lock_with_lock: its query runs inside the calling statement's
    transaction, where PostgreSQL refuses CREATE INDEX CONCURRENTLY (25001);
    the error comes back unchanged and the lock is not left behind."""
    c = pg.connect(dbname=db)
    try:
        with pytest.raises(psycopg2.errors.ActiveSqlTransaction) as e:
            testbed.sql_one(c, "SELECT redis_lock_with_lock('migrate:orders', "
                            "'CREATE INDEX CONCURRENTLY orders_customer_idx ON orders (customer)')")
        assert "cannot run inside a transaction block" in str(e.value)
        assert rc.exists(LOCK) == 0
        assert testbed.sql_one(c, "SELECT count(*) FROM redis_lock_held()") == 0
    finally:
        c.close()
