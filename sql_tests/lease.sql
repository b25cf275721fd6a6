-- 1.1: the cluster-wide view, counters, and the fencing helpers.
-- (Renewal, loss detection and crash behaviour need time and several
-- sessions: t/test_lease.py.)

-- the view shows this backend's locks with renewal data (preloaded bed)
SELECT redis_lock_acquire('v-sess') > 0, redis_lock_acquire('v-fixed', ttl => '20s') > 0;
SELECT pid = pg_backend_pid() AS mine, database = current_database() AS db,
       lock_name, scope, hold_count, fence > 0 AS fenced,
       last_renewed_at >= acquired_at AS renewed_ok, lease, watchdog, lost, redis_key
FROM redis_lock_locks ORDER BY lock_name;
BEGIN;
SELECT redis_lock_acquire('v-sess', xact => true) > 0;
SELECT lock_name, scope, hold_count FROM redis_lock_locks ORDER BY lock_name, scope;
COMMIT;
SELECT redis_lock_release_all();
SELECT count(*) FROM redis_lock_locks;

-- counters move
SELECT acquired AS a0, released AS r0, timed_out AS t0 FROM redis_lock_stats() \gset
SELECT redis_lock_acquire('counted') > 0;
SELECT redis_lock_release('counted');
\! redis-cli -p $RL_REDIS_PORT set counted-busy x px 10000 > /dev/null
SELECT redis_lock_try_acquire('counted-busy', wait => '20ms');
SELECT acquired - :a0 AS acquired, released - :r0 AS released,
       timed_out - :t0 AS timed_out, waits > 0 AS waited, shared
FROM redis_lock_stats();

-- fencing marks: higher or equal tokens pass, lower ones fail with 40001
SELECT redis_lock_fence_check('acct', 10);
SELECT redis_lock_fence_check('acct', 10);
SELECT redis_lock_fence_check('acct', 12);
SELECT try($$SELECT redis_lock_fence_check('acct', 11)$$);
SELECT try($$SELECT redis_lock_fence_check('acct', NULL)$$);
SELECT lock_name, fence FROM redis_lock_fence_marks ORDER BY 1;

-- the check function is not for everybody; marks are readable
CREATE ROLE regress_fence_user;
SET ROLE regress_fence_user;
SELECT try($$SELECT redis_lock_fence_check('acct', 99999)$$);
SELECT try($$DELETE FROM redis_lock_fence_marks$$);
SELECT count(*) FROM redis_lock_fence_marks;
RESET ROLE;

-- the trigger helper on a table the user may write
CREATE TABLE fenced_items(id int PRIMARY KEY, v text, fence bigint);
CREATE TRIGGER fenced BEFORE INSERT OR UPDATE ON fenced_items
  FOR EACH ROW EXECUTE FUNCTION redis_lock_fence_guard('items');
GRANT ALL ON fenced_items TO regress_fence_user;
SELECT redis_lock_acquire('items') AS items_fence \gset
SET ROLE regress_fence_user;
INSERT INTO fenced_items VALUES (1, 'a', redis_lock_fence('items'));
UPDATE fenced_items SET v = 'b', fence = :items_fence WHERE id = 1;
SELECT try(format('UPDATE fenced_items SET v = %L, fence = %s', 'old', :items_fence - 1));
SELECT try($$INSERT INTO fenced_items VALUES (2, 'no token', NULL)$$);
RESET ROLE;
SELECT id, v, fence = :items_fence AS current_fence FROM fenced_items;
SELECT redis_lock_release('items');

-- a custom token column, and misuse of the trigger
CREATE TABLE fenced_other(id int, tok bigint);
CREATE TRIGGER fenced BEFORE INSERT ON fenced_other
  FOR EACH ROW EXECUTE FUNCTION redis_lock_fence_guard('other', 'tok');
INSERT INTO fenced_other VALUES (1, 5);
SELECT try($$INSERT INTO fenced_other VALUES (2, 4)$$);
CREATE TABLE misfenced(id int);
CREATE TRIGGER fenced BEFORE INSERT ON misfenced
  FOR EACH ROW EXECUTE FUNCTION redis_lock_fence_guard('x');
SELECT try($$INSERT INTO misfenced VALUES (1)$$);
CREATE TABLE unnamed(id int, fence bigint);
CREATE TRIGGER fenced BEFORE INSERT ON unnamed
  FOR EACH ROW EXECUTE FUNCTION redis_lock_fence_guard();
SELECT try($$INSERT INTO unnamed VALUES (1, 1)$$);
-- a role that may not write fenced_items cannot poison its mark: the guard on
-- a table of its own advances that table's mark only
CREATE ROLE regress_fence_attacker;
GRANT CREATE ON SCHEMA public TO regress_fence_attacker;
SET ROLE regress_fence_attacker;
CREATE TABLE attacker_items(id int, fence bigint);
CREATE TRIGGER poison BEFORE INSERT ON attacker_items
  FOR EACH ROW EXECUTE FUNCTION redis_lock_fence_guard('items');
INSERT INTO attacker_items VALUES (1, 9223372036854775807);
SELECT try($$SELECT redis_lock_fence_advance('fenced_items', 'items', 9223372036854775807)$$);
RESET ROLE;
SELECT redis_lock_acquire('items') > :items_fence AS newer_token;
UPDATE fenced_items SET v = 'after poisoning attempt', fence = redis_lock_fence('items') WHERE id = 1;
SELECT redis_lock_release('items');
-- tenants (key prefixes) have marks of their own on one table
SET redis_lock.key_prefix = 'tenantA:';
INSERT INTO fenced_items VALUES (3, 'tenant A', 1000);
SET redis_lock.key_prefix = 'tenantB:';
INSERT INTO fenced_items VALUES (4, 'tenant B', 5);
SELECT try($$INSERT INTO fenced_items VALUES (5, 'tenant B, stale', 4)$$);
RESET redis_lock.key_prefix;
SELECT protected_table, key_prefix, lock_name, fence > 1000000 AS clock_based
FROM redis_lock_fence_marks ORDER BY 1, 2, 3;
DROP TABLE attacker_items;
REVOKE CREATE ON SCHEMA public FROM regress_fence_attacker;
DROP ROLE regress_fence_attacker;
DROP TABLE fenced_items, fenced_other, misfenced, unnamed;
DROP ROLE regress_fence_user;
-- a partitioned table has one mark for all its partitions; a dropped table's
-- marks go with it
CREATE TABLE fenced_parts(id int, fence bigint) PARTITION BY RANGE (id);
CREATE TABLE fenced_parts_1 PARTITION OF fenced_parts FOR VALUES FROM (0) TO (10);
CREATE TABLE fenced_parts_2 PARTITION OF fenced_parts FOR VALUES FROM (10) TO (20);
CREATE TRIGGER fenced BEFORE INSERT OR UPDATE ON fenced_parts
  FOR EACH ROW EXECUTE FUNCTION redis_lock_fence_guard('parts');
INSERT INTO fenced_parts VALUES (1, 50);
SELECT try($$INSERT INTO fenced_parts VALUES (15, 49)$$);
SELECT protected_table, lock_name, fence FROM redis_lock_fence_marks WHERE lock_name = 'parts';
DROP TABLE fenced_parts;
SELECT count(*) AS marks_left FROM redis_lock_fence_marks WHERE protected_table <> 0;
\! redis-cli -p $RL_REDIS_PORT del counted-busy > /dev/null
