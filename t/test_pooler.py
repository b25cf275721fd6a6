"""Behind a real PgBouncer (Debian's): session-scoped locks leak between
clients in transaction pooling, redis_lock.session_locks = off refuses them
for a role, transaction-scoped locks work through the pooler, and DISCARD ALL
(PgBouncer's server_reset_query in session pooling) releases session-scoped
locks as it releases advisory locks."""
import psycopg2
import pytest

import testbed


@pytest.fixture(scope="module")
def bouncer(pg):
    admin = pg.connect()
    with admin.cursor() as cur:
        cur.execute("DROP ROLE IF EXISTS pooled")
        cur.execute("CREATE ROLE pooled LOGIN")
        cur.execute("ALTER ROLE pooled SET redis_lock.session_locks = off")
    admin.close()
    b = testbed.PgBouncer(pg, users=("postgres", "pooled"), pool_size=1)
    yield b
    b.stop()


def one(conn, q, args=None):
    with conn.cursor() as cur:
        cur.execute(q, args)
        return cur.fetchone()[0]


def test_the_trap_session_locks_leak_to_the_next_client(bouncer, rc):
    """Why the setting exists: in transaction pooling a session-scoped lock
    stays with the server connection, and the next client on it holds it."""
    a, b = bouncer.connect(), bouncer.connect()
    try:
        assert one(a, "SELECT redis_lock_acquire('leak') > 0") is True
        assert one(b, "SELECT count(*) FROM redis_lock_held() WHERE lock_name = 'leak'") == 1
        assert one(b, "SELECT redis_lock_release('leak')") is True   # not b's lock
    finally:
        a.close()
        b.close()


def test_a_role_with_session_locks_off_is_refused_session_locks(bouncer, rc):
    c = bouncer.connect(user="pooled")
    try:
        for q in ("SELECT redis_lock_acquire('pooled-lock')",
                  "SELECT redis_lock_try_acquire('pooled-lock')",
                  "SELECT redis_lock_acquire_read('pooled-lock')",
                  "SELECT redis_lock_try_acquire_write('pooled-lock')"):
            with pytest.raises(psycopg2.errors.FeatureNotSupported) as ei:
                one(c, q)
            assert "xact => true" in ei.value.diag.message_hint
        assert rc.exists("pooled-lock") == 0
        # the setting is the superuser's, not the role's to turn back on
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            one(c, "SELECT set_config('redis_lock.session_locks', 'on', false)")
    finally:
        c.close()


def test_transaction_scoped_locks_work_through_the_pooler(bouncer, rc):
    c, other = bouncer.connect(user="pooled"), bouncer.connect(user="pooled")
    try:
        c.autocommit = False
        assert one(c, "SELECT redis_lock_acquire('tx-pooled', xact => true) > 0") is True
        assert one(c, "SELECT redis_lock_acquire_read('tx-rw', xact => true)") is True
        assert rc.exists("tx-pooled", "tx-rw") == 2
        c.commit()
        assert rc.exists("tx-pooled", "tx-rw") == 0
        # the server connection is the other client's now: nothing is left on it
        assert one(other, "SELECT count(*) FROM redis_lock_held()") == 0
        # redis_lock_with_lock takes and releases within one statement: allowed
        assert one(other, "SELECT redis_lock_with_lock('tx-pooled', 'SELECT 1')") == 1
        assert rc.exists("tx-pooled") == 0
    finally:
        c.close()
        other.close()


def test_discard_all_releases_session_locks(bouncer, pg, rc):
    # directly: DISCARD ALL drops every session-scoped lock, in Redis too
    c = pg.connect()
    try:
        assert one(c, "SELECT redis_lock_acquire('d1') > 0") is True
        assert one(c, "SELECT redis_lock_acquire_write('d2')") is True
        with c.cursor() as cur:
            cur.execute("DISCARD ALL")
        assert rc.exists("d1", "d2") == 0
        assert one(c, "SELECT count(*) FROM redis_lock_held()") == 0
    finally:
        c.close()
    # session pooling: a client that leaves without releasing; PgBouncer's
    # DISCARD ALL on the server connection releases it, the backend lives on
    a = bouncer.connect(dbname="postgres_session")
    pid = one(a, "SELECT pg_backend_pid()")
    assert one(a, "SELECT redis_lock_acquire('left-behind') > 0") is True
    a.close()
    testbed.wait_until(lambda: rc.exists("left-behind") == 0, 5,
                       what="PgBouncer's DISCARD ALL to release the lock")
    b = bouncer.connect(dbname="postgres_session")
    try:
        assert one(b, "SELECT pg_backend_pid()") == pid      # the same backend
        assert one(b, "SELECT count(*) FROM redis_lock_held()") == 0
    finally:
        b.close()
