-- redis_lock_with_lock: acquire, run, release -- also when the query fails,
-- and the query's error comes back unchanged.
CREATE TABLE wl_items(id int PRIMARY KEY, note text);

SELECT redis_lock_with_lock('wl', 'INSERT INTO wl_items SELECT g, ''x'' FROM generate_series(1, 7) g');
SELECT count(*) FROM wl_items;
SELECT count(*) AS still_held FROM redis_lock_held();
\! echo "key after success: $(redis-cli -p $RL_REDIS_PORT exists wl)"

SELECT redis_lock_with_lock('wl', 'SELECT * FROM wl_items WHERE id <= 3');
SELECT redis_lock_with_lock('wl', 'UPDATE wl_items SET note = ''y'' WHERE id > 5', ttl => '5s', wait => '1s');

-- failing query: the original error, same SQLSTATE, lock released
SELECT try($$SELECT redis_lock_with_lock('wl', 'INSERT INTO wl_items VALUES (1, ''dup'')')$$);
SELECT try($$SELECT redis_lock_with_lock('wl', 'SELECT 1/0')$$);
SELECT try($$SELECT redis_lock_with_lock('wl', 'SELECT * FROM no_such_table')$$);
SELECT redis_lock_with_lock('wl', 'SELECT 1/0');
SELECT count(*) AS still_held FROM redis_lock_held();
\! echo "key after failures: $(redis-cli -p $RL_REDIS_PORT exists wl)"
-- the failed insert left nothing behind
SELECT count(*) FROM wl_items WHERE note = 'dup';

-- lock busy elsewhere: 55P03 and the query does not run
\! redis-cli -p $RL_REDIS_PORT set wl other-client px 60000 > /dev/null
SELECT try($$SELECT redis_lock_with_lock('wl', 'DELETE FROM wl_items', wait => '200ms')$$);
SELECT count(*) FROM wl_items;
\! redis-cli -p $RL_REDIS_PORT del wl > /dev/null

-- reentrant use: a lock the session already holds stays held afterwards
SELECT redis_lock_acquire('wl') > 0 AS got;
SELECT redis_lock_with_lock('wl', 'SELECT 1');
SELECT lock_name, hold_count FROM redis_lock_held();
SELECT redis_lock_release('wl');

-- nested with_lock inside the query
SELECT redis_lock_with_lock('outer', $q$SELECT redis_lock_with_lock('inner', 'SELECT 1')$q$);
SELECT count(*) FROM redis_lock_held();

-- the query runs with the caller's rights
CREATE ROLE regress_wl_user;
GRANT SELECT ON wl_items TO regress_wl_user;
SET ROLE regress_wl_user;
SELECT redis_lock_with_lock('wl', 'SELECT * FROM wl_items');
SELECT try($$SELECT redis_lock_with_lock('wl', 'DELETE FROM wl_items')$$);
RESET ROLE;
SELECT count(*) FROM wl_items;

SELECT try($$SELECT redis_lock_with_lock('wl', NULL)$$);
DROP TABLE wl_items;
DROP ROLE regress_wl_user;
