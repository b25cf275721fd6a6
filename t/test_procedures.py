"""Procedures that COMMIT and ROLLBACK inside (issue 24, item 2).

A PL/pgSQL procedure called with CALL may end its transaction and start a
new one.  Each inner COMMIT and ROLLBACK is a transaction end like any
other: transaction-scoped locks are released there (in Redis, while the
procedure goes on), session-scoped ones survive, and
redis_lock.verify_on_commit checks the transaction-scoped locks before each
inner COMMIT (a lost one fails that COMMIT with 40001 and rolls that
transaction back; what earlier COMMITs made durable stays).  Also through a
transaction-pooling PgBouncer, for a role with redis_lock.session_locks =
off.

doc/migrations.md's procedure, archive_orders, takes a service's lock one batch
at a time; with a fair lock (Redisson's RFairLock in the real service) the
service gets its turn between two batches.

The procedures stop at gates the test opens (an advisory lock the test
holds; archive_orders at each INSERT, through a trigger), so the state of
Redis is looked at from outside while the procedure is between two of its
transactions."""
import threading

import psycopg2
import pytest

from peers import REDISSON_LINES, JavaPeer
import testbed
from testbed import TIME_SCALE as S

PROCEDURES = r"""
CREATE FUNCTION gate(n int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_lock_shared(n);
  PERFORM pg_advisory_unlock_shared(n);
END $$;

CREATE TABLE batches (seq bigserial, n int);

-- doc/migrations.md's procedure; the test stops it at each INSERT (trigger below)
-- README: archive-orders
CREATE PROCEDURE archive_orders() LANGUAGE plpgsql AS $$
BEGIN
  -- the whole job: session-scoped, it survives the COMMITs below
  PERFORM redis_lock_acquire('archive');
  FOR batch IN 1..3 LOOP
    -- the service's lock, one batch at a time: the COMMIT releases it,
    -- and the service gets its turn between two batches
    PERFORM redis_lock_acquire('orders:export', xact => true);
    INSERT INTO batches (n) VALUES (batch);
    COMMIT;
  END LOOP;
  PERFORM redis_lock_release('archive');
END $$;
-- README: end

CREATE FUNCTION gate_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.n BETWEEN 1 AND 9 THEN
    PERFORM gate(NEW.n);
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER gates AFTER INSERT ON batches FOR EACH ROW EXECUTE FUNCTION gate_on_insert();

CREATE PROCEDURE rolled_back_batch() LANGUAGE plpgsql AS $$
BEGIN
  PERFORM redis_lock_acquire('job');
  PERFORM redis_lock_acquire('job', xact => true);
  PERFORM redis_lock_acquire('batch', xact => true);
  PERFORM gate(1);
  ROLLBACK;
  PERFORM gate(2);
END $$;

CREATE PROCEDURE verified_batches() LANGUAGE plpgsql AS $$
BEGIN
  PERFORM redis_lock_acquire('vbatch:1', xact => true);
  INSERT INTO batches (n) VALUES (11);
  COMMIT;
  PERFORM redis_lock_acquire('vbatch:2', xact => true);
  PERFORM redis_lock_acquire('vbatch:2b', xact => true);
  INSERT INTO batches (n) VALUES (12);
  PERFORM gate(1);                                      -- vbatch:2 is taken from us here
  COMMIT;
  INSERT INTO batches (n) VALUES (13);
END $$;

CREATE PROCEDURE pooled_batches() LANGUAGE plpgsql AS $$
BEGIN
  PERFORM redis_lock_acquire('pbatch:1', xact => true);
  INSERT INTO batches (n) VALUES (11);
  COMMIT;
  PERFORM gate(1);
  PERFORM redis_lock_acquire('pbatch:2', xact => true);
  INSERT INTO batches (n) VALUES (12);
END $$;

CREATE PROCEDURE pooled_session_lock() LANGUAGE plpgsql AS $$
BEGIN
  COMMIT;
  PERFORM redis_lock_acquire('pooled:session');
END $$;
"""


@pytest.fixture(scope="module")
def procs(pg):
    c = pg.connect()
    with c.cursor() as cur:
        cur.execute(PROCEDURES)
        cur.execute("DROP ROLE IF EXISTS pooled")
        cur.execute("CREATE ROLE pooled LOGIN")
        cur.execute("ALTER ROLE pooled SET redis_lock.session_locks = off")
        cur.execute("GRANT ALL ON batches, batches_seq_seq TO pooled")
    c.close()


@pytest.fixture
def clean(procs, pg, rc):
    c = pg.connect()
    with c.cursor() as cur:
        cur.execute("TRUNCATE batches")
    c.close()


class Gates:
    """Advisory locks the test holds; gate(n) in a procedure waits until
    the test opens gate n."""

    def __init__(self, pg, n):
        self.conn = pg.connect()
        for i in range(1, n + 1):
            testbed.sql_one(self.conn, "SELECT pg_advisory_lock(%s)", (i,))

    def reached(self, n):
        testbed.wait_until(lambda: testbed.sql_one(
            self.conn, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND NOT granted AND objid = %s", (n,)), 10, what="the procedure at gate %d" % n)

    def open(self, n):
        testbed.sql_one(self.conn, "SELECT pg_advisory_unlock(%s)", (n,))

    def close(self):
        self.conn.close()


def call_in_thread(conn, query):
    """Run query in a thread; returns a function that waits for its end
    and gives the error it raised (None if none).  The first value of its
    first row, if any, is in the function's attribute row."""
    box = {}

    def body():
        try:
            with conn.cursor() as cur:
                cur.execute(query)
                if cur.description:
                    box["row"] = cur.fetchone()[0]
        except psycopg2.Error as e:
            box["error"] = e
    t = threading.Thread(target=body, daemon=True)
    t.start()

    def result():
        t.join(30 * S)
        assert not t.is_alive(), "%s did not end" % query
        result.row = box.get("row")
        return box.get("error")
    return result


def held(conn):
    with conn.cursor() as cur:
        cur.execute("SELECT lock_name, scope FROM redis_lock_held() ORDER BY 1, 2")
        return cur.fetchall()


def batches(pg):
    c = pg.connect()
    try:
        with c.cursor() as cur:
            cur.execute("SELECT array_agg(n ORDER BY n) FROM batches")
            return cur.fetchone()[0]
    finally:
        c.close()


@pytest.fixture(scope="module")
def java(redis_srv):
    peer = JavaPeer([redis_srv.port], line=REDISSON_LINES[-1])
    yield peer
    peer.close()


def test_the_service_gets_its_turn_between_the_batches_of_a_procedure(
        clean, pg, rc, sessions, java):
    """archive_orders (doc/migrations.md's), with a fair lock (Redisson's RFairLock
    in the service, protocol redisson_fair in SQL): each inner COMMIT
    releases the service's lock in Redis while the procedure goes on; the
    service, queued while the batch held it, gets it at that COMMIT, and the
    procedure's next batch queues behind the service; the job's
    session-scoped lock stays throughout."""
    s, service_db = sessions(), pg.connect()
    s.run("SET redis_lock.protocol = 'redisson_fair'")
    queue = "redisson_lock_queue:{orders:export}"
    gates = Gates(pg, 3)
    try:
        done = call_in_thread(s.conn, "CALL archive_orders()")
        for batch in (1, 2, 3):
            gates.reached(batch)
            assert rc.exists("archive", "orders:export") == 2
            # the service asks for its lock while the batch holds it, and queues
            assert java.call("svc", "fairtrylock", "orders:export", 0, -1) is False
            turn = java.send("svc", "fairlock", "orders:export")
            testbed.wait_until(lambda: rc.llen(queue) == 1, 10, what="the service to queue")
            gates.open(batch)       # the batch COMMITs
            assert java.result(turn, 30 * S)[0] is True
            if batch < 3:           # after the last, the procedure releases it
                assert rc.exists("archive") == 1
                # the next batch waits for the service, in the queue
                testbed.wait_until(lambda: rc.llen(queue) == 1, 10,
                                   what="the next batch to queue behind the service")
            with service_db.cursor() as cur:
                cur.execute("INSERT INTO batches (n) VALUES (%s)", (100 + batch,))
            assert java.call("svc", "fairunlock", "orders:export") is True
        assert done() is None
    finally:
        gates.close()
        service_db.close()
    assert rc.exists("archive", "orders:export") == 0
    assert held(s.conn) == []
    with s.conn.cursor() as cur:
        cur.execute("SELECT array_agg(n ORDER BY seq) FROM batches")
        assert cur.fetchone()[0] == [1, 101, 2, 102, 3, 103]


def test_inner_rollback_releases_transaction_locks_session_locks_stay(
        clean, pg, rc, sessions):
    s = sessions()
    gates = Gates(pg, 2)
    try:
        done = call_in_thread(s.conn, "CALL rolled_back_batch()")
        gates.reached(1)
        assert rc.exists("job", "batch") == 2
        gates.open(1)
        gates.reached(2)            # after the ROLLBACK, the procedure going on
        assert rc.exists("batch") == 0 and rc.exists("job") == 1
        gates.open(2)
        assert done() is None
    finally:
        gates.close()
    assert held(s.conn) == [("job", "session")]
    assert s.run("SELECT redis_lock_release('job')") is True
    assert rc.exists("job") == 0


@pytest.mark.parametrize("verify", ["on", "off"])
def test_verify_on_commit_applies_to_each_inner_commit(clean, pg, rc, sessions, verify):
    s = sessions()
    s.run("SET redis_lock.verify_on_commit = " + verify)
    notices_before = len(s.conn.notices)
    gates = Gates(pg, 1)
    try:
        done = call_in_thread(s.conn, "CALL verified_batches()")
        gates.reached(1)
        assert rc.exists("vbatch:1") == 0          # released at the first COMMIT
        # another client takes batch 2's lock from under the procedure
        rc.delete("vbatch:2")
        assert rc.set("vbatch:2", "someone-else", px=30000)
        gates.open(1)
        error = done()
    finally:
        gates.close()
    if verify == "on":
        # the inner COMMIT fails: batch 2 rolled back, batch 1 stays committed
        assert error is not None and error.pgcode == "40001", error
        assert 'Redis lock "vbatch:2" was lost before COMMIT' in error.pgerror
        assert "at COMMIT" in error.diag.context
        assert batches(pg) == [11]
    else:
        assert error is None
        assert batches(pg) == [11, 12, 13]

        # the release after that COMMIT is not waited for: the session's
        # next call reports what its reply said
        def warned():
            s.run("SELECT count(*) FROM redis_lock_held()")
            return any("vbatch:2" in n and "lost" in n for n in s.conn.notices[notices_before:])
        testbed.wait_until(warned, 5, 0.05, what="the WARNING of the lost lock's release")
    # never the other client's key deleted, the other lock released, nothing
    # left held
    assert rc.get("vbatch:2") == b"someone-else"
    assert rc.exists("vbatch:2b") == 0
    assert held(s.conn) == []


@pytest.fixture(scope="module")
def bouncer(pg, procs):
    b = testbed.PgBouncer(pg, users=("postgres", "pooled"), pool_size=1)
    yield b
    b.stop()


def test_procedure_through_a_transaction_pooler(clean, pg, rc, bouncer):
    """Role pooled (session_locks = off) through PgBouncer in transaction
    pooling, one server connection: the CALL keeps it across its inner
    COMMITs, each COMMIT releases its batch's lock, and the next client on
    that connection finds nothing held."""
    c, other = bouncer.connect(user="pooled"), bouncer.connect(user="pooled")
    gates = Gates(pg, 1)
    try:
        done = call_in_thread(c, "CALL pooled_batches()")
        gates.reached(1)
        assert rc.exists("pbatch:1") == 0           # released at the inner COMMIT
        # the other client waits for the server connection the CALL keeps
        asked = call_in_thread(other, "SELECT count(*) FROM redis_lock_held()")
        gates.open(1)
        assert done() is None
        assert asked() is None and asked.row == 0
        assert rc.exists("pbatch:1", "pbatch:2") == 0
        assert testbed.sql_one(other, "SELECT count(*) FROM redis_lock_held()") == 0
        assert batches(pg) == [11, 12]
        # a session-scoped lock stays refused inside a procedure too
        with pytest.raises(psycopg2.errors.FeatureNotSupported):
            with c.cursor() as cur:
                cur.execute("CALL pooled_session_lock()")
        assert rc.exists("pooled:session") == 0
    finally:
        gates.close()
        c.close()
        other.close()
