-- Read-write locks (1.2): shared and exclusive holds of one name on
-- Redisson's RReadWriteLock layout, checked on the Redis side.
\! redis-cli -p $RL_REDIS_PORT flushall > /dev/null

-- a read hold: hash with mode=read, our field at 1, a timeout key with a TTL
SELECT redis_lock_acquire_read('report');
\! redis-cli -p $RL_REDIS_PORT hget report mode
\! redis-cli -p $RL_REDIS_PORT hlen report
\! t=$(redis-cli -p $RL_REDIS_PORT pttl report); test $t -gt 25000 -a $t -le 30000 && echo "hash ttl about 30s"
\! k=$(redis-cli -p $RL_REDIS_PORT --scan --pattern '{report}:*:rwlock_timeout:1'); t=$(redis-cli -p $RL_REDIS_PORT pttl "$k"); test $t -gt 25000 -a $t -le 30000 && echo "timeout key ttl about 30s"
-- reentrant: counted in the session, the count in Redis stays 1
SELECT redis_lock_acquire_read('report');
SELECT lock_name, mode, scope, hold_count, protocol, redis_key FROM redis_lock_held();
SELECT lock_name, mode, scope, hold_count FROM redis_lock_locks;
\! redis-cli -p $RL_REDIS_PORT --scan --pattern '{report}:*:rwlock_timeout:*' | wc -l
SELECT locked, held_by_me, redis_type FROM redis_lock_status('report');

-- another reader (a Java thread, as Redisson writes it) shares it
\! redis-cli -p $RL_REDIS_PORT hset report 0e2c6f5a-0000-4000-8000-000000000001:7 1 > /dev/null
\! redis-cli -p $RL_REDIS_PORT set '{report}:0e2c6f5a-0000-4000-8000-000000000001:7:rwlock_timeout:1' 1 px 60000 > /dev/null
-- no upgrade: a reader asking for the write hold is refused at once
SELECT redis_lock_try_acquire_write('report');
SELECT try($$SELECT redis_lock_acquire_write('report', wait => '10s')$$);
-- our last read release leaves the other reader's hold, with its TTL
SELECT redis_lock_release_read('report');
SELECT redis_lock_release_read('report');
\! redis-cli -p $RL_REDIS_PORT hget report mode
\! t=$(redis-cli -p $RL_REDIS_PORT pttl report); test $t -gt 55000 && echo "hash lives as long as the other reader"
\! redis-cli -p $RL_REDIS_PORT --scan --pattern '{report}:*:rwlock_timeout:*' | wc -l
SELECT redis_lock_release_read('report');
-- a writer is excluded while the other reader holds; readers are not
SELECT redis_lock_try_acquire_write('report', wait => '100ms');
SELECT try($$SELECT redis_lock_acquire_write('report', wait => '100ms')$$);
SELECT redis_lock_try_acquire_read('report');
SELECT redis_lock_release_read('report');
\! redis-cli -p $RL_REDIS_PORT del report > /dev/null

-- a write hold: mode=write, field <owner>:write; excludes every reader
SELECT redis_lock_acquire_write('report', ttl => '20s');
\! redis-cli -p $RL_REDIS_PORT hget report mode
\! redis-cli -p $RL_REDIS_PORT hkeys report | grep -c ':write$'
\! t=$(redis-cli -p $RL_REDIS_PORT pttl report); test $t -gt 15000 -a $t -le 20000 && echo "ttl about 20s"
SELECT lock_name, mode, hold_count, lease, watchdog FROM redis_lock_held();
-- downgrade: the writer may read too; releasing the write hold keeps the read
SELECT redis_lock_acquire_read('report');
SELECT redis_lock_acquire_write('report');
SELECT lock_name, mode, hold_count FROM redis_lock_held() ORDER BY mode;
SELECT redis_lock_release_write('report');
SELECT redis_lock_release_write('report');
\! redis-cli -p $RL_REDIS_PORT hget report mode
SELECT redis_lock_release_write('report');
SELECT redis_lock_release_read('report');
\! echo "after the last release: $(redis-cli -p $RL_REDIS_PORT exists report)"
SELECT count(*) FROM redis_lock_held();

-- a foreign writer excludes us
\! redis-cli -p $RL_REDIS_PORT hset report mode write 0e2c6f5a-0000-4000-8000-000000000001:7:write 1 > /dev/null
\! redis-cli -p $RL_REDIS_PORT pexpire report 60000 > /dev/null
SELECT redis_lock_try_acquire_read('report');
SELECT try($$SELECT redis_lock_acquire_read('report', wait => '50ms')$$);
SELECT redis_lock_try_acquire_write('report');
\! redis-cli -p $RL_REDIS_PORT del report > /dev/null

-- transaction scope: released at COMMIT and at ROLLBACK
BEGIN;
SELECT redis_lock_acquire_read('tx', xact => true);
SELECT redis_lock_acquire_write('tx2', xact => true);
SELECT lock_name, mode, scope FROM redis_lock_held() ORDER BY lock_name;
SELECT redis_lock_release_read('tx');
COMMIT;
\! echo "after commit: $(redis-cli -p $RL_REDIS_PORT exists tx tx2)"
BEGIN;
SELECT redis_lock_acquire_write('tx', xact => true);
ROLLBACK;
\! echo "after rollback: $(redis-cli -p $RL_REDIS_PORT exists tx)"

-- release_all drops read and write holds too
SELECT redis_lock_acquire_read('all1'), redis_lock_acquire_write('all2');
SELECT redis_lock_release_all();
\! echo "after release_all: $(redis-cli -p $RL_REDIS_PORT exists all1 all2)"

-- a lost read hold: release says false + WARNING, deletes nothing of others'
SELECT redis_lock_acquire_read('gone', ttl => '30s');
\! redis-cli -p $RL_REDIS_PORT del gone > /dev/null
SELECT redis_lock_release_read('gone');
SELECT count(*) FROM redis_lock_held();

-- layouts never mix: 42809, and the key is not touched
\! redis-cli -p $RL_REDIS_PORT set plain x px 60000 > /dev/null
SELECT try($$SELECT redis_lock_acquire_read('plain')$$);
SELECT try($$SELECT redis_lock_acquire_write('plain')$$);
\! redis-cli -p $RL_REDIS_PORT hset rlock 0e2c6f5a-0000-4000-8000-000000000001:7 1 > /dev/null
SELECT try($$SELECT redis_lock_acquire_read('rlock')$$);
\! echo "RLock untouched: $(redis-cli -p $RL_REDIS_PORT hlen rlock) $(redis-cli -p $RL_REDIS_PORT hget rlock mode)"
SELECT redis_lock_acquire_read('rw');
SET redis_lock.protocol = 'redisson';
SELECT try($$SELECT redis_lock_acquire('rw')$$);
RESET redis_lock.protocol;
SELECT try($$SELECT redis_lock_acquire('rw')$$);
SELECT redis_lock_release_read('rw');

-- an exclusive Redisson lock and a read hold have the same owner id as
-- their hash field: neither ever acts on the other's layout
SET redis_lock.protocol = 'redisson';
SELECT redis_lock_acquire('same-owner', ttl => '300ms') > 0 AS got;
\! while [ "$(redis-cli -p $RL_REDIS_PORT exists same-owner)" = 1 ]; do sleep 0.01; done; echo expired
SELECT redis_lock_acquire_read('same-owner');
SELECT redis_lock_release('same-owner');
\! echo "read-write lock kept: $(redis-cli -p $RL_REDIS_PORT hget same-owner mode)"
SELECT redis_lock_release_read('same-owner');
RESET redis_lock.protocol;

-- force release deletes a read-write lock whatever the protocol
SELECT redis_lock_acquire_write('forced');
SELECT redis_lock_force_release('forced');
\! echo "after force: $(redis-cli -p $RL_REDIS_PORT exists forced)"
SELECT count(*) FROM redis_lock_held();

-- bad arguments, as for exclusive locks
SELECT try($$SELECT redis_lock_acquire_read(NULL)$$);
SELECT try($$SELECT redis_lock_acquire_write('', ttl => '1s')$$);
SELECT try($$SELECT redis_lock_try_acquire_read('x', ttl => '0')$$);
SELECT try($$SELECT redis_lock_release_write(NULL)$$);
SELECT redis_lock_release_write('never-taken');
