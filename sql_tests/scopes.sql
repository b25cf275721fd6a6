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

-- PREPARE TRANSACTION with a transaction-scoped lock is refused (0A000)
BEGIN;
SELECT redis_lock_acquire('prep', xact => true) > 0 AS got;
PREPARE TRANSACTION 'p1';
\echo :LAST_ERROR_SQLSTATE
\! echo "after refused PREPARE: $(redis-cli -p $RL_REDIS_PORT exists prep)"
SELECT count(*) FROM pg_prepared_xacts;
