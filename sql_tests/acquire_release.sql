-- Acquire and release against a real Redis, checked on the Redis side.

SELECT redis_lock_acquire('orders') > 0 AS got;
-- the key exists, holds our token, and has a TTL of about lease_time (30s)
SELECT owner AS token FROM redis_lock_status('orders') \gset
\setenv TOKEN :token
\! test "$(redis-cli -p $RL_REDIS_PORT get orders)" = "$TOKEN" && echo "key holds our token"
\! t=$(redis-cli -p $RL_REDIS_PORT pttl orders); test $t -gt 25000 -a $t -le 30000 && echo "ttl about 30s"
SELECT length(:'token') AS token_len, :'token' LIKE 'pgrl:%' AS marked;
SELECT locked, held_by_me, ttl > '25s' AS ttl_ok, redis_key, redis_type FROM redis_lock_status('orders');

-- reentrant: same fence, hold count 2
SELECT redis_lock_fence('orders') AS f1 \gset
SELECT redis_lock_acquire('orders') = :f1 AS same_fence;
SELECT lock_name, scope, hold_count, fence = :f1 AS fence_ok, lease, lost, redis_key, protocol
FROM redis_lock_held();
SELECT redis_lock_release('orders');
\! echo "after first release: $(redis-cli -p $RL_REDIS_PORT exists orders)"
SELECT redis_lock_release('orders');
\! echo "after second release: $(redis-cli -p $RL_REDIS_PORT exists orders)"
SELECT count(*) FROM redis_lock_held();
SELECT redis_lock_fence('orders') IS NULL AS no_fence;

-- fencing tokens strictly increase per lock name, grant after grant
CREATE TEMP TABLE fences(n int, f bigint);
INSERT INTO fences SELECT 1, redis_lock_acquire('orders');
SELECT redis_lock_release('orders');
INSERT INTO fences SELECT 2, redis_lock_acquire('orders');
SELECT redis_lock_release('orders');
INSERT INTO fences SELECT 3, redis_lock_acquire('orders', ttl => '5s');
SELECT redis_lock_release('orders');
SELECT bool_and(f > prev) AS increasing FROM
  (SELECT f, lag(f) OVER (ORDER BY n) AS prev FROM fences) s WHERE prev IS NOT NULL;

-- explicit ttl: a fixed lease of that length
SELECT redis_lock_acquire('short', ttl => '1500ms') > 0 AS got;
\! t=$(redis-cli -p $RL_REDIS_PORT pttl short); test $t -gt 1000 -a $t -le 1500 && echo "ttl about 1.5s"
SELECT lease, watchdog FROM redis_lock_held() WHERE lock_name = 'short';
SELECT redis_lock_release('short');

-- release of a lock we do not hold: false and a WARNING
SELECT redis_lock_release('never-taken');

-- someone else (another client) holds the lock: try_acquire is false,
-- acquire waits and times out with 55P03, nothing of theirs is touched
\! redis-cli -p $RL_REDIS_PORT set busy someone-elses-token px 60000
SELECT redis_lock_try_acquire('busy');
SELECT redis_lock_try_acquire('busy', wait => '200ms');
SELECT try($$SELECT redis_lock_acquire('busy', wait => '300ms')$$);
SELECT try($$SELECT redis_lock_acquire('busy', wait => '0')$$);
\! echo "their token: $(redis-cli -p $RL_REDIS_PORT get busy)"
SELECT locked, held_by_me, owner, redis_type FROM redis_lock_status('busy');

-- our lock is taken over behind our back: release says false + WARNING
-- and must not delete the new holder's key
SELECT redis_lock_acquire('stolen', ttl => '30s') > 0 AS got;
\! redis-cli -p $RL_REDIS_PORT set stolen thief-token px 60000 > /dev/null
SELECT redis_lock_release('stolen');
\! echo "thief still holds: $(redis-cli -p $RL_REDIS_PORT get stolen)"
SELECT count(*) FROM redis_lock_held();

-- same for an expired lease, seen by extend and release
SELECT redis_lock_acquire('expiring', ttl => '100ms') > 0 AS got;
\! while [ "$(redis-cli -p $RL_REDIS_PORT exists expiring)" = 1 ]; do sleep 0.02; done; echo expired
SELECT redis_lock_extend('expiring', '10s');
SELECT lost FROM redis_lock_held() WHERE lock_name = 'expiring';
SELECT redis_lock_release('expiring');

-- extend resets the lease
SELECT redis_lock_acquire('ext', ttl => '2s') > 0 AS got;
SELECT redis_lock_extend('ext', '40s');
\! t=$(redis-cli -p $RL_REDIS_PORT pttl ext); test $t -gt 35000 && echo "lease extended"
SELECT lease, watchdog FROM redis_lock_held() WHERE lock_name = 'ext';
SELECT redis_lock_extend('not-mine', '40s');
SELECT redis_lock_release('ext');

-- release_all drops every session lock, counted by name
SELECT redis_lock_acquire('ra1') > 0, redis_lock_acquire('ra2') > 0,
       redis_lock_acquire('ra2') > 0, redis_lock_acquire('ra3') > 0;
SELECT redis_lock_release_all();
\! echo "left in redis: $(redis-cli -p $RL_REDIS_PORT exists ra1 ra2 ra3)"
SELECT redis_lock_release_all();

-- status of a free lock
SELECT * FROM redis_lock_status('free-lock');

-- names are bytes: non-ASCII, spaces, braces, binary-looking text
SELECT redis_lock_acquire('zamówienie 42 ✓') > 0 AS utf8,
       redis_lock_acquire('{tag}:x y') > 0 AS braces,
       redis_lock_acquire(E'\\x00\\x01') > 0 AS binaryish;
\! redis-cli -p $RL_REDIS_PORT --raw exists 'zamówienie 42 ✓' '{tag}:x y'
SELECT redis_lock_release_all();

-- key_prefix is prepended byte for byte (superuser setting)
SET redis_lock.key_prefix = 'app:';
SELECT redis_lock_acquire('pfx') > 0 AS got;
\! echo "app:pfx exists: $(redis-cli -p $RL_REDIS_PORT exists app:pfx), pfx exists: $(redis-cli -p $RL_REDIS_PORT exists pfx)"
SELECT redis_key FROM redis_lock_held();
RESET redis_lock.key_prefix;
-- the held lock keeps its key even after the prefix changed
SELECT redis_lock_release('pfx');
\! echo "app:pfx exists: $(redis-cli -p $RL_REDIS_PORT exists app:pfx)"

-- the database number in the URL is SELECTed on connect
SELECT regexp_replace(current_setting('redis_lock.url'), '/0$', '/3') AS db3_url \gset
SET redis_lock.url = :'db3_url';
SELECT redis_lock_acquire('in-db3') > 0 AS got;
\! echo "db 3: $(redis-cli -p $RL_REDIS_PORT -n 3 exists in-db3), db 0: $(redis-cli -p $RL_REDIS_PORT -n 0 exists in-db3)"
SELECT redis_lock_release('in-db3');
RESET redis_lock.url;
