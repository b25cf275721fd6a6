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

The procedures stop at gates the test opens (an advisory lock the test
holds), so the state of Redis is looked at from outside while the
procedure is between two of its transactions."""
import threading

import psycopg2
import pytest

import testbed
from testbed import TIME_SCALE as S

PROCEDURES = r"""
CREATE FUNCTION gate(n int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_lock_shared(n);
  PERFORM pg_advisory_unlock_shared(n);
END $$;

CREATE TABLE batches (n int);

-- the shape of a batch job: a lock for the whole job, one per batch
CREATE PROCEDURE batch_job() LANGUAGE plpgsql AS $$
BEGIN
  PERFORM redis_lock_acquire('job');                    -- session: the whole job
  PERFORM redis_lock_acquire('job', xact => true);      -- and a hold in batch 1
  PERFORM redis_lock_acquire('batch:1', xact => true);
  INSERT INTO batches VALUES (1);
  PERFORM gate(1);
  COMMIT;                                               -- batch 1 done
  PERFORM gate(2);
  PERFORM redis_lock_acquire('batch:2', xact => true);
  INSERT INTO batches VALUES (2);
  ROLLBACK;                                             -- batch 2 given up
  PERFORM gate(3);
  PERFORM redis_lock_acquire('batch:3', xact => true);
  INSERT INTO batches VALUES (3);
END $$;

CREATE PROCEDURE verified_batches() LANGUAGE plpgsql AS $$
BEGIN
  PERFORM redis_lock_acquire('vbatch:1', xact => true);
  INSERT INTO batches VALUES (1);
  COMMIT;
  PERFORM redis_lock_acquire('vbatch:2', xact => true);
  PERFORM redis_lock_acquire('vbatch:2b', xact => true);
  INSERT INTO batches VALUES (2);
  PERFORM gate(1);                                      -- vbatch:2 is taken from us here
  COMMIT;
  INSERT INTO batches VALUES (3);
END $$;

CREATE PROCEDURE pooled_batches() LANGUAGE plpgsql AS $$
BEGIN
  PERFORM redis_lock_acquire('pbatch:1', xact => true);
  INSERT INTO batches VALUES (1);
  COMMIT;
  PERFORM gate(1);
  PERFORM redis_lock_acquire('pbatch:2', xact => true);
  INSERT INTO batches VALUES (2);
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
        cur.execute("GRANT ALL ON batches TO pooled")
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


def test_inner_commit_and_rollback_release_transaction_locks_session_locks_stay(
        clean, pg, rc, sessions):
    s = sessions()
    gates = Gates(pg, 3)
    try:
        done = call_in_thread(s.conn, "CALL batch_job()")
        gates.reached(1)
        assert rc.exists("job", "batch:1") == 2
        gates.open(1)
        # after COMMIT, the procedure going on: batch 1's lock is free in
        # Redis (a service takes it), the job's session lock is not
        gates.reached(2)
        assert rc.exists("batch:1") == 0 and rc.exists("job") == 1
        service = rc.lock("batch:1", timeout=30)
        assert service.acquire(blocking=False)
        service.release()
        assert rc.lock("job", timeout=30).acquire(blocking=False) is False
        gates.open(2)
        # after ROLLBACK: batch 2's lock is free too
        gates.reached(3)
        assert rc.exists("batch:2") == 0 and rc.exists("job") == 1
        gates.open(3)
        assert done() is None
    finally:
        gates.close()
    # batch 3's lock went at the CALL's own COMMIT; the job's stays the session's
    assert rc.exists("batch:1", "batch:2", "batch:3") == 0
    assert held(s.conn) == [("job", "session")]
    assert batches(pg) == [1, 3]
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
        assert batches(pg) == [1]
    else:
        assert error is None
        assert batches(pg) == [1, 2, 3]
        assert any("vbatch:2" in n and "lost" in n for n in s.conn.notices[notices_before:]), \
            s.conn.notices
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
        assert batches(pg) == [1, 2]
        # a session-scoped lock stays refused inside a procedure too
        with pytest.raises(psycopg2.errors.FeatureNotSupported):
            with c.cursor() as cur:
                cur.execute("CALL pooled_session_lock()")
        assert rc.exists("pooled:session") == 0
    finally:
        gates.close()
        c.close()
        other.close()
