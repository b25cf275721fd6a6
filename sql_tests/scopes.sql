-- Transaction-scoped locks go at COMMIT and ROLLBACK; session locks
-- survive ROLLBACK; PREPARE TRANSACTION is refused while xact locks are held.

BEGIN;
SELECT redis_lock_acquire('tx', xact => true) > 0 AS got;
SELECT lock_name, scope, hold_count FROM redis_lock_held();
\! echo "in transaction: $(redis-cli -p $RL_REDIS_PORT exists tx)"
COMMIT;
\! echo "after COMMIT: $(redis-cli -p $RL_REDIS_PORT exists tx)"
SELECT count(*) FROM redis_lock_held();

BEGIN;
SELECT redis_lock_acquire('tx', xact => true) > 0 AS got;
SELECT redis_lock_try_acquire('tx2', xact => true);
ROLLBACK;
\! echo "after ROLLBACK: $(redis-cli -p $RL_REDIS_PORT exists tx tx2)"

-- an error aborts the transaction: xact locks go too
BEGIN;
SELECT redis_lock_acquire('tx', xact => true) > 0 AS got;
SELECT 1/0;
ROLLBACK;
\! echo "after failed transaction: $(redis-cli -p $RL_REDIS_PORT exists tx)"

-- session lock taken inside a transaction that rolls back stays held
BEGIN;
SELECT redis_lock_acquire('sess') > 0 AS got;
ROLLBACK;
SELECT lock_name, scope FROM redis_lock_held();
\! echo "session lock after ROLLBACK: $(redis-cli -p $RL_REDIS_PORT exists sess)"

-- both scopes on one name: the key stays until the last hold goes
BEGIN;
SELECT redis_lock_acquire('sess', xact => true) > 0 AS got;
SELECT lock_name, scope, hold_count FROM redis_lock_held() ORDER BY scope;
-- a transaction-scoped hold cannot be released early
SELECT redis_lock_release('sess');
SELECT redis_lock_release('sess');
\! echo "xact hold keeps the key: $(redis-cli -p $RL_REDIS_PORT exists sess)"
COMMIT;
\! echo "after COMMIT: $(redis-cli -p $RL_REDIS_PORT exists sess)"

-- only-xact lock: release refuses with a WARNING
BEGIN;
SELECT redis_lock_acquire('onlytx', xact => true) > 0 AS got;
SELECT redis_lock_release('onlytx');
COMMIT;

-- many xact locks are released in one go at COMMIT
BEGIN;
SELECT count(*) FROM (SELECT redis_lock_acquire('many' || g, xact => true) FROM generate_series(1, 50) g) s;
COMMIT;
\! echo "left: $(redis-cli -p $RL_REDIS_PORT eval "return #redis.call('keys', 'many*')" 0)"

-- release_all leaves transaction-scoped locks alone
BEGIN;
SELECT redis_lock_acquire('mixA', xact => true) > 0, redis_lock_acquire('mixB') > 0;
SELECT redis_lock_release_all();
SELECT lock_name, scope FROM redis_lock_held();
COMMIT;

-- ROLLBACK TO SAVEPOINT drops the transaction holds taken since the
-- savepoint (like pg_advisory_xact_lock); RELEASE SAVEPOINT keeps them
BEGIN;
SELECT redis_lock_acquire('sp_outer', xact => true) > 0 AS got;
SAVEPOINT a;
SELECT redis_lock_acquire('sp_inner', xact => true) > 0 AS got;
SELECT redis_lock_acquire('sp_outer', xact => true) > 0 AS reentrant;
SELECT redis_lock_acquire('sp_mixed', xact => true) > 0 AND redis_lock_acquire('sp_mixed') > 0 AS both;
ROLLBACK TO SAVEPOINT a;
SELECT lock_name, scope, hold_count FROM redis_lock_held() ORDER BY 1, 2;
\! echo "after ROLLBACK TO: $(redis-cli -p $RL_REDIS_PORT exists sp_outer) $(redis-cli -p $RL_REDIS_PORT exists sp_inner) $(redis-cli -p $RL_REDIS_PORT exists sp_mixed)"
-- nested: a released inner savepoint's holds belong to the outer one
SAVEPOINT b;
SAVEPOINT c;
SELECT redis_lock_acquire('sp_nested', xact => true) > 0 AS got;
RELEASE SAVEPOINT c;
SAVEPOINT d;
ROLLBACK TO SAVEPOINT d;
SELECT lock_name FROM redis_lock_held() WHERE lock_name = 'sp_nested';
ROLLBACK TO SAVEPOINT b;
\! echo "after ROLLBACK TO b: $(redis-cli -p $RL_REDIS_PORT exists sp_nested)"
SAVEPOINT e;
SELECT redis_lock_acquire('sp_kept', xact => true) > 0 AS got;
RELEASE SAVEPOINT e;
COMMIT;
\! echo "after COMMIT: $(redis-cli -p $RL_REDIS_PORT exists sp_outer sp_kept sp_mixed)"
SELECT redis_lock_release('sp_mixed');

-- a PL/pgSQL exception block is a subtransaction too
DO $$
BEGIN
  BEGIN
    PERFORM redis_lock_acquire('sp_block', xact => true);
    RAISE EXCEPTION 'fail inside the block';
  EXCEPTION WHEN raise_exception THEN
    RAISE NOTICE 'held after the failed block: %',
      (SELECT count(*) FROM redis_lock_held() WHERE lock_name = 'sp_block');
  END;
END
$$;
\! echo "after the block: $(redis-cli -p $RL_REDIS_PORT exists sp_block)"

-- PREPARE TRANSACTION with a transaction-scoped lock is refused (0A000)
BEGIN;
SELECT redis_lock_acquire('prep', xact => true) > 0 AS got;
PREPARE TRANSACTION 'p1';
\echo :LAST_ERROR_SQLSTATE
\! echo "after refused PREPARE: $(redis-cli -p $RL_REDIS_PORT exists prep)"
SELECT count(*) FROM pg_prepared_xacts;
