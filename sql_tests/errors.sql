-- Every error of the README (Functions, Failure semantics), with its SQLSTATE,
-- message and hint.

-- bad lock names: NULL 22004, empty / oversized 22023 (512 bytes is fine)
SELECT try($$SELECT redis_lock_acquire(NULL)$$);
SELECT try($$SELECT redis_lock_try_acquire(NULL)$$);
SELECT try($$SELECT redis_lock_release(NULL)$$);
SELECT try($$SELECT redis_lock_acquire('')$$);
SELECT try($$SELECT redis_lock_acquire(repeat('x', 513))$$);
SELECT try($$SELECT redis_lock_acquire(repeat('é', 257))$$);
SELECT redis_lock_acquire(repeat('x', 512)) > 0 AS max_len_ok;
SELECT redis_lock_release(repeat('x', 512));
SELECT try($$SELECT redis_lock_fence('')$$);
SELECT try($$SELECT redis_lock_status(NULL)$$);
SELECT try($$SELECT redis_lock_extend(NULL, '1s')$$);

-- ttl: zero, negative, huge; wait: negative, huge; NULL xact
SELECT try($$SELECT redis_lock_acquire('e', ttl => '0')$$);
SELECT try($$SELECT redis_lock_acquire('e', ttl => '-5s')$$);
SELECT try($$SELECT redis_lock_acquire('e', ttl => '1 year')$$);
SELECT try($$SELECT redis_lock_acquire('e', wait => '-1s')$$);
SELECT try($$SELECT redis_lock_acquire('e', wait => '100 years')$$);
SELECT try($$SELECT redis_lock_extend('e', '0')$$);
SELECT try($$SELECT redis_lock_acquire('e', xact => NULL)$$);
-- a sub-millisecond ttl is one millisecond, not "no expiry"
SELECT redis_lock_acquire('tiny', ttl => '10 microseconds') > 0 AS got;
SELECT lease FROM redis_lock_held();
\! while [ "$(redis-cli -p $RL_REDIS_PORT exists tiny)" = 1 ]; do sleep 0.01; done; echo expired
SELECT redis_lock_release('tiny');
SELECT count(*) FROM redis_lock_held();

-- wait elapsed: 55P03, message names the lock and the wait
\! redis-cli -p $RL_REDIS_PORT set held-elsewhere x px 60000 > /dev/null
SELECT try($$SELECT redis_lock_acquire('held-elsewhere', wait => '5ms')$$);
SELECT try($$SELECT redis_lock_acquire('held-elsewhere', wait => '1500ms')$$);
SET redis_lock.wait_timeout = '100ms';
SELECT try($$SELECT redis_lock_acquire('held-elsewhere')$$);
RESET redis_lock.wait_timeout;

-- the key holds something that is not a lock of this protocol: 42809,
-- never overwritten, never deleted
\! redis-cli -p $RL_REDIS_PORT rpush a-list 1 2 3 > /dev/null
\! redis-cli -p $RL_REDIS_PORT hset a-hash field 1 > /dev/null
SELECT try($$SELECT redis_lock_acquire('a-list')$$);
SELECT try($$SELECT redis_lock_try_acquire('a-hash')$$);
SELECT try($$SELECT redis_lock_force_release('a-list')$$);
SELECT locked, held_by_me, redis_type FROM redis_lock_status('a-list');
\! echo "list: $(redis-cli -p $RL_REDIS_PORT lrange a-list 0 -1 | tr '\n' ' ') hash: $(redis-cli -p $RL_REDIS_PORT hget a-hash field)"
SELECT count(*) FROM redis_lock_held();

-- Redis unreachable: 08001 with a hint naming redis_lock.url; nothing held
SET redis_lock.url = 'redis://127.0.0.1:1/0';
SELECT try($$SELECT redis_lock_acquire('down')$$);
SELECT try($$SELECT redis_lock_try_acquire('down')$$);
SELECT try($$SELECT * FROM redis_lock_status('down')$$);
SELECT count(*) FROM redis_lock_held();
RESET redis_lock.url;
SELECT redis_lock_acquire('down') > 0 AS works_again;
SELECT redis_lock_release('down');

-- Redis database number from the URL (SELECT)
SET redis_lock.url TO DEFAULT;
SELECT current_setting('redis_lock.url') ~ '^redis://127\.0\.0\.1:[0-9]+/0$' AS default_is_testbed;

-- authentication: NOAUTH 28000, wrong password 28P01; never print it
\! redis-cli -p $RL_REDIS_PORT config set requirepass 's3cret-pw' > /dev/null
SELECT try($$SELECT redis_lock_acquire('auth')$$);
SET redis_lock.password = 'wrong-pw';
SELECT try($$SELECT redis_lock_acquire('auth')$$);
SET redis_lock.password = 's3cret-pw';
SELECT redis_lock_acquire('auth') > 0 AS authenticated;
SELECT redis_lock_release('auth');
-- ACL user from the URL
\! redis-cli -p $RL_REDIS_PORT -a s3cret-pw --no-auth-warning acl setuser regress_rl on '>user-pw' '~*' '&*' '+@all' > /dev/null
SELECT current_setting('redis_lock.url') AS url \gset
SELECT replace(:'url', 'redis://', 'redis://regress_rl@') AS acl_url \gset
SET redis_lock.url = :'acl_url';
SELECT try($$SELECT redis_lock_acquire('auth')$$);
SET redis_lock.password = 'user-pw';
SELECT redis_lock_acquire('auth') > 0 AS acl_authenticated;
SELECT redis_lock_release('auth');
RESET redis_lock.url;
\! redis-cli -p $RL_REDIS_PORT -a s3cret-pw --no-auth-warning acl deluser regress_rl > /dev/null
\! redis-cli -p $RL_REDIS_PORT -a s3cret-pw --no-auth-warning config set requirepass '' > /dev/null
RESET redis_lock.password;
SELECT redis_lock_acquire('auth') > 0 AS open_again;
SELECT redis_lock_release('auth');

-- a Redis error reply (here an ACL that forbids writes: NOPERM) is an
-- error with its own SQLSTATE, not a crash, and nothing is held
\! redis-cli -p $RL_REDIS_PORT acl setuser regress_ro on nopass '~*' '&*' '+@all' '-set' '-@write' > /dev/null
SELECT replace(:'url', 'redis://', 'redis://regress_ro@') AS ro_url \gset
SET redis_lock.url = :'ro_url';
SELECT try($$SELECT redis_lock_acquire('ro')$$);
SELECT count(*) FROM redis_lock_held();
RESET redis_lock.url;
\! redis-cli -p $RL_REDIS_PORT acl deluser regress_ro > /dev/null
\! redis-cli -p $RL_REDIS_PORT del held-elsewhere a-list a-hash > /dev/null

-- session-scoped locks refused where redis_lock.session_locks is off (a role
-- behind a transaction-pooling pooler): 0A000 with a hint; xact works
SET redis_lock.session_locks = off;
SELECT try($$SELECT redis_lock_acquire('pooled')$$);
SELECT try($$SELECT redis_lock_acquire_read('pooled')$$);
BEGIN;
SELECT redis_lock_acquire('pooled', xact => true) > 0 AS xact_ok;
COMMIT;
RESET redis_lock.session_locks;

-- DISCARD ALL releases session-scoped locks, as it does advisory locks
SELECT redis_lock_acquire('discarded') > 0 AS got, redis_lock_acquire_read('discarded-rw');
DISCARD ALL;
\! echo "after DISCARD ALL: $(redis-cli -p $RL_REDIS_PORT exists discarded discarded-rw)"
SELECT count(*) FROM redis_lock_held();

-- without Lua scripts (redis_lock.scripting off) only the simple layout
-- works: the Redisson layouts and read-write locks are refused (0A000)
-- before anything is made or sent (t/test_scripting.py runs the rest)
SET redis_lock.scripting = off;
SET redis_lock.protocol = 'redisson';
SELECT try($$SELECT redis_lock_acquire('no-lua')$$);
SELECT try($$SELECT redis_lock_force_release('no-lua')$$);
SET redis_lock.protocol = 'redisson_fair';
SELECT try($$SELECT redis_lock_try_acquire('no-lua')$$);
RESET redis_lock.protocol;
SELECT try($$SELECT redis_lock_acquire_read('no-lua')$$);
SELECT try($$SELECT redis_lock_acquire_write('no-lua')$$);
RESET redis_lock.scripting;
SELECT count(*) FROM redis_lock_held();
\! redis-cli -p $RL_REDIS_PORT exists no-lua
