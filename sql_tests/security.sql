-- A tenant role confined to its key prefix: every key it makes (locks and
-- fence counters) starts with the prefix, and it cannot change the prefix.
\! redis-cli -p $RL_REDIS_PORT flushall > /dev/null
CREATE ROLE regress_tenant LOGIN;
ALTER ROLE regress_tenant SET redis_lock.key_prefix = 'tenantA:';
\c - regress_tenant
SHOW redis_lock.key_prefix;
SELECT redis_lock_acquire('orders') > 0 AS plain,
       redis_lock_acquire('{x}:../../other') > 0 AS tricky,
       redis_lock_acquire(' ') > 0 AS blank;
\! redis-cli -p $RL_REDIS_PORT --scan | sort
SELECT try($$SET redis_lock.key_prefix = ''$$);
SELECT try($$SELECT set_config('redis_lock.key_prefix', 'tenantB:', false)$$);
SELECT try($$RESET redis_lock.key_prefix$$);
SELECT try($$SET redis_lock.url = 'redis://127.0.0.1:1/0'$$);
SELECT try($$SET redis_lock.nodes = 'redis://127.0.0.1:1/0'$$);
SELECT try($$SET redis_lock.cluster = on$$);
SELECT try($$SELECT redis_lock_force_release('orders')$$);
-- status and release stay inside the prefix too
SELECT redis_key FROM redis_lock_status('orders');
SELECT redis_lock_release_all();
\! redis-cli -p $RL_REDIS_PORT --scan | sort
\c - postgres
DROP ROLE regress_tenant;
