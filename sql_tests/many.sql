-- Several locks at once: redis_lock_acquire_many / redis_lock_release_many.
-- Argument errors come before any round trip; the SQL shapes of both.

-- argument errors: NULL array or element 22004, empty or duplicates 22023
SELECT try($$SELECT redis_lock_acquire_many(NULL)$$);
SELECT try($$SELECT redis_lock_acquire_many(ARRAY['a', NULL, 'b'])$$);
SELECT try($$SELECT redis_lock_acquire_many(ARRAY[]::text[])$$);
SELECT try($$SELECT redis_lock_acquire_many(ARRAY['a', 'b', 'a'])$$);
SELECT try($$SELECT redis_lock_acquire_many(ARRAY['a', ''])$$);
SELECT try($$SELECT redis_lock_acquire_many(ARRAY['a', repeat('x', 513)])$$);
SELECT try($$SELECT redis_lock_acquire_many(ARRAY[['a', 'b'], ['c', 'd']])$$);
SELECT try($$SELECT redis_lock_acquire_many(ARRAY['a'], ttl => '0')$$);
SELECT try($$SELECT redis_lock_acquire_many(ARRAY['a'], wait => '-1s')$$);
SELECT try($$SELECT redis_lock_acquire_many(ARRAY['a'], xact => NULL)$$);
-- more names than redis_lock.max_locks_per_session (an eighth of max_locks: 128): 53400
SELECT try($$SELECT redis_lock_acquire_many((SELECT array_agg('n' || g) FROM generate_series(1, 129) g))$$);
SELECT try($$SELECT redis_lock_release_many(NULL)$$);
SELECT try($$SELECT redis_lock_release_many(ARRAY[NULL]::text[])$$);
SELECT try($$SELECT redis_lock_release_many('{}')$$);
SELECT try($$SELECT redis_lock_release_many(ARRAY['a', 'a'])$$);
SELECT try($$SELECT redis_lock_release_many((SELECT array_agg('n' || g) FROM generate_series(1, 129) g))$$);
-- a layout without a multi-key script: 0A000
SET redis_lock.protocol = 'redisson_fair';
SELECT try($$SELECT redis_lock_acquire_many(ARRAY['a', 'b'])$$);
RESET redis_lock.protocol;
-- all or nothing needs a script: refused with redis_lock.scripting off
SET redis_lock.scripting = off;
SELECT try($$SELECT redis_lock_acquire_many(ARRAY['a', 'b'])$$);
RESET redis_lock.scripting;
\! echo "keys after the errors: $(redis-cli -p $RL_REDIS_PORT --scan --pattern '[abn]*' | wc -l)"

-- the shapes: bigint[] in the order given, integer
SELECT pg_typeof(redis_lock_acquire_many(ARRAY['m2', 'm1'])) AS acquire_many;
SELECT lock_name, scope, hold_count FROM redis_lock_held() ORDER BY 1;
SELECT redis_lock_fence('m2') < redis_lock_fence('m1') AS in_order;
\! echo "m1 m2 in Redis: $(redis-cli -p $RL_REDIS_PORT exists m1 m2)"
SELECT redis_lock_release_many(ARRAY['m1', 'm2', 'm3']) AS released;
\! echo "m1 m2 in Redis: $(redis-cli -p $RL_REDIS_PORT exists m1 m2)"
SELECT count(*) FROM redis_lock_held();
-- 500 at once, and back, where a superuser raised the session's limit
SET redis_lock.max_locks_per_session = 500;
SELECT array_length(redis_lock_acquire_many(array_agg('n' || g)), 1)
FROM generate_series(1, 500) g;
SELECT count(*) FROM redis_lock_held();
SELECT redis_lock_release_many(array_agg('n' || g)) FROM generate_series(1, 500) g;
RESET redis_lock.max_locks_per_session;
\! echo "left in Redis: $(redis-cli -p $RL_REDIS_PORT --scan --pattern 'n*' | wc -l)"
-- busy: 55P03 naming the lock that was busy
\! redis-cli -p $RL_REDIS_PORT set m2 foreign px 30000 >/dev/null
SELECT try($$SELECT redis_lock_acquire_many(ARRAY['m1', 'm2'], wait => '0')$$);
SELECT try($$SELECT redis_lock_acquire_many(ARRAY['m1', 'm2', 'm3', 'm4', 'm5', 'm6', 'm7'], wait => '50ms')$$);
\! echo "m1 in Redis: $(redis-cli -p $RL_REDIS_PORT exists m1)"
\! redis-cli -p $RL_REDIS_PORT del m2 >/dev/null
