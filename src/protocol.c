/*-------------------------------------------------------------------------
 *
 * protocol.c
 *	  Owns the wire layouts: the Lua scripts of the "simple" (SET NX PX)
 *	  and "redisson" (RLock hash) protocols, the names of the keys and
 *	  channels one lock touches, owner tokens, EVALSHA with recovery from
 *	  NOSCRIPT, and decoding of script replies.
 *
 *	  Every script is idempotent for a given owner token: running it twice
 *	  has the effect of running it once.  transport.c relies on that when it
 *	  resends a command after finding a cached connection dead, and
 *	  locktable.c relies on it to clean up acquires whose outcome is unknown.
 *
 *	  Nothing here keeps state about held locks or waits, or decides
 *	  anything from the answers of several nodes (lockop.c does).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/protocol.c
 *
 *-------------------------------------------------------------------------
 */
#include "protocol.h"

#include <hiredis/hiredis.h>
#include <openssl/evp.h>

#include "miscadmin.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

/* Prefix of our simple-protocol tokens: lets waiters tell that the holder
 * publishes on release (foreign clients such as redis-py do not). */
#define RL_TOKEN_MARKER "pgrl:"

/*
 * simple, acquire.  KEYS: lock, fence counter.  ARGV: token, lease ms,
 * marker, fence ("1": count a fencing token, "0": not, for Redlock).  Returns {1, fence} granted (also when the key already holds our
 * token: a retry of an acquire whose reply was lost), {0, pttl, publishes}
 * busy, {-1, type} when the key is not a string.
 *
 * The fence counter is shared by all locks in one cluster slot, so there
 * are at most 16384 of them whatever the number of lock names.  A missing
 * counter (first use, or lost with a non-persistent Redis) starts at the
 * server clock in microseconds, so tokens keep increasing across a reset.
 */
static const char *simple_acquire_lua =
"local function fence()\n"
"  if ARGV[4] ~= '1' then return 0 end\n"
"  local f = redis.call('incr', KEYS[2])\n"
"  if f == 1 then\n"
"    local t = redis.call('time')\n"
"    f = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
"    redis.call('set', KEYS[2], string.format('%.0f', f))\n"
"  end\n"
"  return f\n"
"end\n"
"if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then\n"
"  return {1, fence()}\n"
"end\n"
"local t = redis.call('type', KEYS[1])['ok']\n"
"if t ~= 'string' then return {-1, t} end\n"
"local v = redis.call('get', KEYS[1])\n"
"if v == ARGV[1] then\n"
"  redis.call('pexpire', KEYS[1], ARGV[2])\n"
"  return {1, fence()}\n"
"end\n"
"local p = redis.call('pttl', KEYS[1])\n"
"if string.sub(v, 1, #ARGV[3]) == ARGV[3] then return {0, p, 1} end\n"
"return {0, p, 0}\n";

/*
 * simple, release.  KEYS: lock.  ARGV: token, publish command, channel.
 * The channel is not a key: declaring it would make this a multi-key
 * script, which Redis Cluster answers with TRYAGAIN instead of ASK while the
 * slot migrates.
 */
static const char *simple_release_lua =
"if redis.pcall('get', KEYS[1]) == ARGV[1] then\n"
"  redis.call('del', KEYS[1])\n"
"  redis.call(ARGV[2], ARGV[3], '0')\n"
"  return 1\n"
"end\n"
"return 0\n";

/*
 * simple, extend / verify / renew.  KEYS: lock.  ARGV: token, lease ms,
 * "1" to renew (never shorten what is left: a renewal sent with an older
 * lease must not undo a longer extend).  Every extend script returns 0 when
 * the lock is not ours, else 2 + the PTTL it found (1 for no expiry), so the
 * watchdog sees when another client cut the lease short.
 */
static const char *simple_extend_lua =
"if redis.pcall('get', KEYS[1]) == ARGV[1] then\n"
"  local t = redis.call('pttl', KEYS[1])\n"
"  if ARGV[3] ~= '1' or t < tonumber(ARGV[2]) then\n"
"    redis.call('pexpire', KEYS[1], ARGV[2])\n"
"  end\n"
"  return t + 2\n"
"end\n"
"return 0\n";

/*
 * redisson, acquire (RLock layout; README, "Redisson (Java)").  KEYS: lock, token
 * counter.  ARGV: lease ms, field, fence flag.  Our field's count stays 1: reentrancy
 * is counted in the backend, so a repeated acquire is idempotent.  The
 * counter is incremented on every grant, as RFencedLock does.
 */
static const char *redisson_acquire_lua =
"local function fence()\n"
"  if ARGV[3] ~= '1' then return 0 end\n"
"  return redis.call('incr', KEYS[2])\n"
"end\n"
"if redis.call('exists', KEYS[1]) == 0 then\n"
"  redis.call('hincrby', KEYS[1], ARGV[2], 1)\n"
"  redis.call('pexpire', KEYS[1], ARGV[1])\n"
"  return {1, fence()}\n"
"end\n"
"local t = redis.call('type', KEYS[1])['ok']\n"
"if t ~= 'hash' then return {-1, t} end\n"
"if redis.call('hexists', KEYS[1], 'mode') == 1 then return {-1, 'read-write lock'} end\n"
"if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then\n"
"  redis.call('pexpire', KEYS[1], ARGV[1])\n"
"  return {1, fence()}\n"
"end\n"
"return {0, redis.call('pttl', KEYS[1]), 1}\n";

/*
 * redisson_fair, acquire (RFairLock layout; README, "Fair locks").  KEYS:
 * lock, token counter, queue (list of waiting owners), timeout set (owner ->
 * the time in ms after which that waiter counts as gone).  ARGV: lease ms,
 * field, fence flag, wait ms of this waiter, now (Unix ms, our clock, as
 * Redisson uses its client's), "1" to join the queue when busy.
 *
 * Queue heads whose time has passed leave first.  The lock is granted when
 * it is free and the queue is empty or we are its head; we then leave the
 * queue and every later waiter's time moves up by our wait.  When busy, a
 * waiter joins the tail (once) with a time after the previous waiter's.
 * Reentrancy is counted in the backend, as for "redisson".
 */
static const char *fair_acquire_lua =
"local function fence()\n"
"  if ARGV[3] ~= '1' then return 0 end\n"
"  return redis.call('incr', KEYS[2])\n"
"end\n"
"local now = tonumber(ARGV[5])\n"
"while true do\n"
"  local head = redis.call('lindex', KEYS[3], 0)\n"
"  if not head then break end\n"
"  local gone = redis.call('zscore', KEYS[4], head)\n"
"  if not gone or tonumber(gone) > now then break end\n"
"  redis.call('zrem', KEYS[4], head)\n"
"  redis.call('lpop', KEYS[3])\n"
"end\n"
"local t = redis.call('type', KEYS[1])['ok']\n"
"if t ~= 'none' and t ~= 'hash' then return {-1, t} end\n"
"if t == 'hash' and redis.call('hexists', KEYS[1], 'mode') == 1 then\n"
"  return {-1, 'read-write lock'}\n"
"end\n"
"if t == 'none' then\n"
"  local head = redis.call('lindex', KEYS[3], 0)\n"
"  if not head or head == ARGV[2] then\n"
"    redis.call('lpop', KEYS[3])\n"
"    redis.call('zrem', KEYS[4], ARGV[2])\n"
"    for _, w in ipairs(redis.call('zrange', KEYS[4], 0, -1)) do\n"
"      redis.call('zincrby', KEYS[4], -tonumber(ARGV[4]), w)\n"
"    end\n"
"    redis.call('hset', KEYS[1], ARGV[2], 1)\n"
"    redis.call('pexpire', KEYS[1], ARGV[1])\n"
"    return {1, fence()}\n"
"  end\n"
"elseif redis.call('hexists', KEYS[1], ARGV[2]) == 1 then\n"
"  redis.call('pexpire', KEYS[1], ARGV[1])\n"
"  return {1, fence()}\n"
"end\n"
"local p = redis.call('pttl', KEYS[1])\n"
"if ARGV[6] ~= '1' or redis.call('zscore', KEYS[4], ARGV[2]) then\n"
"  return {0, p, 1}\n"
"end\n"
"local last = redis.call('lindex', KEYS[3], -1)\n"
"local ahead = p\n"
"if last and last ~= ARGV[2] and redis.call('zscore', KEYS[4], last) then\n"
"  ahead = tonumber(redis.call('zscore', KEYS[4], last)) - now\n"
"end\n"
"redis.call('zadd', KEYS[4], ahead + tonumber(ARGV[4]) + now, ARGV[2])\n"
"redis.call('rpush', KEYS[3], ARGV[2])\n"
"return {0, p, 1}\n";

/*
 * redisson_fair, release.  KEYS: lock, queue, timeout set.  ARGV: field,
 * publish command, lock channel, now (Unix ms).  Only the next live waiter
 * is woken, on its own channel "<lock channel>:<owner>"; also when the lock
 * is gone already (our lease ran out: nobody wakes the queue otherwise).
 */
static const char *fair_release_lua =
"local now = tonumber(ARGV[4])\n"
"while true do\n"
"  local head = redis.call('lindex', KEYS[2], 0)\n"
"  if not head then break end\n"
"  local gone = redis.call('zscore', KEYS[3], head)\n"
"  if not gone or tonumber(gone) > now then break end\n"
"  redis.call('zrem', KEYS[3], head)\n"
"  redis.call('lpop', KEYS[2])\n"
"end\n"
"local function wake()\n"
"  local nx = redis.call('lindex', KEYS[2], 0)\n"
"  if nx then redis.call(ARGV[2], ARGV[3] .. ':' .. nx, '0') end\n"
"end\n"
"if redis.call('exists', KEYS[1]) == 0 then\n"
"  wake()\n"
"  return 0\n"
"end\n"
"if redis.pcall('hexists', KEYS[1], ARGV[1]) ~= 1 then return 0 end\n"
"if redis.call('hexists', KEYS[1], 'mode') == 1 then return 0 end\n"
"redis.call('del', KEYS[1])\n"
"wake()\n"
"return 1\n";

/*
 * redisson_fair, leave the queue (a waiter that gives up).  KEYS: lock,
 * queue, timeout set.  ARGV: field, wait ms it joined with, publish command,
 * lock channel.  Later waiters' times move up by that wait, as Redisson's
 * own give-up does; if the lock is free, the new head is woken.
 */
static const char *fair_dequeue_lua =
"local q = redis.call('lrange', KEYS[2], 0, -1)\n"
"local i = 1\n"
"while i <= #q and q[i] ~= ARGV[1] do i = i + 1 end\n"
"for j = i + 1, #q do\n"
"  redis.call('zincrby', KEYS[3], -tonumber(ARGV[2]), q[j])\n"
"end\n"
"redis.call('zrem', KEYS[3], ARGV[1])\n"
"redis.call('lrem', KEYS[2], 0, ARGV[1])\n"
"if i == 1 and redis.call('exists', KEYS[1]) == 0 then\n"
"  local nx = redis.call('lindex', KEYS[2], 0)\n"
"  if nx then redis.call(ARGV[3], ARGV[4] .. ':' .. nx, '0') end\n"
"end\n"
"return 1\n";

/*
 * redisson, release.  KEYS: lock.  ARGV: field, publish command, channel.
 * A read-write lock hash is never ours, even where our field is in it (a
 * read hold's field is the same owner id).
 */
static const char *redisson_release_lua =
"if redis.pcall('hexists', KEYS[1], ARGV[1]) ~= 1 then return 0 end\n"
"if redis.call('hexists', KEYS[1], 'mode') == 1 then return 0 end\n"
"redis.call('del', KEYS[1])\n"
"redis.call(ARGV[2], ARGV[3], '0')\n"
"return 1\n";

/*
 * redisson and redisson_fair, extend / renew (Redisson's watchdog check).
 * ARGV: field, ms, renew flag (see simple_extend_lua, as is the reply).
 * Not a read-write lock hash (see the release).
 */
static const char *redisson_extend_lua =
"if redis.pcall('hexists', KEYS[1], ARGV[1]) ~= 1 then return 0 end\n"
"if redis.call('hexists', KEYS[1], 'mode') == 1 then return 0 end\n"
"local t = redis.call('pttl', KEYS[1])\n"
"if ARGV[3] ~= '1' or t < tonumber(ARGV[2]) then\n"
"  redis.call('pexpire', KEYS[1], ARGV[2])\n"
"end\n"
"return t + 2\n";

/*
 * Force release, every layout.  KEYS: lock.  ARGV: publish command,
 * expected type, channel, read-write lock channel, fair queue ("": none),
 * fair timeout set, now (Unix ms).  A key of another type is never
 * deleted.  A read-write lock (a hash with a "mode" field) is deleted
 * whatever the protocol, and its waiters are all woken ("1", as Redisson's
 * forceUnlock of a write lock does, then "0": see rw_write_release_lua).  Under redisson_fair the queue's heads
 * whose time has passed leave it first, as in Redisson's forceUnlock, and
 * the live head is woken on its own channel.
 */
static const char *force_lua =
"local t = redis.call('type', KEYS[1])['ok']\n"
"if t == 'none' then return 0 end\n"
"if t == 'hash' and redis.call('hexists', KEYS[1], 'mode') == 1 then\n"
"  redis.call('del', KEYS[1])\n"
"  redis.call(ARGV[1], ARGV[4], '1')\n"
"  redis.call(ARGV[1], ARGV[4], '0')\n"
"  return 1\n"
"end\n"
"if t ~= ARGV[2] then return {-1, t} end\n"
"redis.call('del', KEYS[1])\n"
"if ARGV[5] == '' then\n"
"  redis.call(ARGV[1], ARGV[3], '0')\n"
"  return 1\n"
"end\n"
"local now = tonumber(ARGV[7])\n"
"while true do\n"
"  local head = redis.call('lindex', ARGV[5], 0)\n"
"  if not head then break end\n"
"  local gone = redis.call('zscore', ARGV[6], head)\n"
"  if not gone or tonumber(gone) > now then break end\n"
"  redis.call('zrem', ARGV[6], head)\n"
"  redis.call('lpop', ARGV[5])\n"
"end\n"
"local nx = redis.call('lindex', ARGV[5], 0)\n"
"if nx then redis.call(ARGV[1], ARGV[3] .. ':' .. nx, '0') end\n"
"return 1\n";

/*
 * Inspect.  KEYS: lock.  Returns {type, pttl, value or owner fields} (a
 * read-write lock's "mode" field is not an owner).
 */
static const char *inspect_lua =
"local t = redis.call('type', KEYS[1])['ok']\n"
"local p = redis.call('pttl', KEYS[1])\n"
"if t == 'string' then return {t, p, redis.call('get', KEYS[1])} end\n"
"if t == 'hash' then\n"
"  local owners = {}\n"
"  for _, f in ipairs(redis.call('hkeys', KEYS[1])) do\n"
"    if f ~= 'mode' then owners[#owners + 1] = f end\n"
"  end\n"
"  return {t, p, owners}\n"
"end\n"
"return {t, p}\n";

/*
 * Read-write locks: Redisson's RReadWriteLock layout (README, "Read-write
 * locks").  One hash per lock: field "mode" is "read" or "write"; a reader's
 * field is its owner id holding its read count, the writer's field is
 * "<owner id>:write".  Each read hold also has a string key
 * "{lock}:<owner id>:rwlock_timeout:<n>" with its own TTL, and the hash
 * lives as long as the longest of them.  Waiters listen on
 * "redisson_rwlock:{lock}"; a read release publishes "0", a write release
 * "1" (wake every waiter).  As for RLock, reentrancy is counted in the
 * backend: our count in Redis stays 1, so every script is idempotent.
 * A key of another type, or a hash without "mode" (an RLock), is refused.
 *
 * read, acquire.  KEYS: lock, our read timeout key.  ARGV: lease ms, our
 * reader field, our writer field (a writer may also read).
 */
static const char *rw_read_acquire_lua =
"local t = redis.call('type', KEYS[1])['ok']\n"
"if t ~= 'none' and t ~= 'hash' then return {-1, t} end\n"
"local mode = redis.call('hget', KEYS[1], 'mode')\n"
"if t == 'hash' and not mode then return {-1, 'Redisson lock'} end\n"
"if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 0 then\n"
"  return {0, redis.call('pttl', KEYS[1]), 1}\n"
"end\n"
"if not mode then redis.call('hset', KEYS[1], 'mode', 'read') end\n"
"if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then\n"
"  redis.call('hset', KEYS[1], ARGV[2], 1)\n"
"end\n"
"redis.call('set', KEYS[2], 1, 'PX', ARGV[1])\n"
"if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then\n"
"  redis.call('pexpire', KEYS[1], ARGV[1])\n"
"end\n"
"return {1, 0}\n";

/*
 * read, release.  KEYS: lock, our read timeout key.  ARGV: our reader
 * field, publish command, channel, prefix of every timeout key ("{lock}").
 * With other holds left, the hash's TTL becomes the longest remaining read
 * timeout; with none (or only expired ones) the lock is deleted and waiters
 * are woken.
 */
static const char *rw_read_release_lua =
"if redis.pcall('hexists', KEYS[1], ARGV[1]) ~= 1 then return 0 end\n"
"if redis.call('hexists', KEYS[1], 'mode') == 0 then return 0 end\n"
"redis.call('hdel', KEYS[1], ARGV[1])\n"
"redis.call('del', KEYS[2])\n"
"if redis.call('hlen', KEYS[1]) > 1 then\n"
"  local left = -3\n"
"  for _, f in ipairs(redis.call('hkeys', KEYS[1])) do\n"
"    local n = tonumber(redis.call('hget', KEYS[1], f))\n"
"    if n then\n"
"      for i = n, 1, -1 do\n"
"        left = math.max(left, redis.call('pttl', ARGV[4] .. ':' .. f .. ':rwlock_timeout:' .. i))\n"
"      end\n"
"    end\n"
"  end\n"
"  if left > 0 then\n"
"    redis.call('pexpire', KEYS[1], left)\n"
"    return 1\n"
"  end\n"
"  if redis.call('hget', KEYS[1], 'mode') == 'write' then return 1 end\n"
"end\n"
"redis.call('del', KEYS[1])\n"
"redis.call(ARGV[2], ARGV[3], '0')\n"
"return 1\n";

/*
 * read, extend / renew.  KEYS: lock, our read timeout key.  ARGV: field,
 * ms, renew flag.  Returns 0 or 2 + the shorter of the PTTLs found of the
 * hash and our timeout key: a Redisson reader's renewal sets both to its own
 * lockWatchdogTimeout, which may be shorter than our lease.
 */
static const char *rw_read_extend_lua =
"if redis.pcall('hexists', KEYS[1], ARGV[1]) ~= 1 then return 0 end\n"
"if redis.call('hexists', KEYS[1], 'mode') == 0 then return 0 end\n"
"local t = redis.call('pttl', KEYS[1])\n"
"local mine = redis.call('pttl', KEYS[2])\n"
"if mine < t then t = mine end\n"
"if ARGV[3] ~= '1' or mine < tonumber(ARGV[2]) then\n"
"  redis.call('set', KEYS[2], 1, 'PX', ARGV[2])\n"
"end\n"
"if redis.call('pttl', KEYS[1]) < tonumber(ARGV[2]) then\n"
"  redis.call('pexpire', KEYS[1], ARGV[2])\n"
"end\n"
"return math.max(t, -1) + 2\n";

/* write, acquire.  KEYS: lock.  ARGV: lease ms, our writer field. */
static const char *rw_write_acquire_lua =
"local t = redis.call('type', KEYS[1])['ok']\n"
"if t ~= 'none' and t ~= 'hash' then return {-1, t} end\n"
"local mode = redis.call('hget', KEYS[1], 'mode')\n"
"if t == 'hash' and not mode then return {-1, 'Redisson lock'} end\n"
"if not mode then\n"
"  redis.call('hset', KEYS[1], 'mode', 'write')\n"
"  redis.call('hset', KEYS[1], ARGV[2], 1)\n"
"  redis.call('pexpire', KEYS[1], ARGV[1])\n"
"  return {1, 0}\n"
"end\n"
"if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then\n"
"  if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then\n"
"    redis.call('pexpire', KEYS[1], ARGV[1])\n"
"  end\n"
"  return {1, 0}\n"
"end\n"
"return {0, redis.call('pttl', KEYS[1]), 1}\n";

/*
 * write, release.  KEYS: lock.  ARGV: our writer field, publish command,
 * channel.  Read holds of our own left behind (a downgrade) keep the lock
 * in read mode; either way every waiter is woken, since readers may now
 * proceed: "1", as Redisson's write unlock sends, then "0".  Redisson
 * answers "1" by releasing as many latch permits as threads are asleep on
 * it, so a thread that found the lock taken but is not asleep yet misses
 * it and sleeps out the lock's TTL; "0" leaves one permit for such a
 * thread.
 */
static const char *rw_write_release_lua =
"if redis.pcall('hexists', KEYS[1], ARGV[1]) ~= 1 then return 0 end\n"
"if redis.call('hexists', KEYS[1], 'mode') == 0 then return 0 end\n"
"redis.call('hdel', KEYS[1], ARGV[1])\n"
"if redis.call('hlen', KEYS[1]) <= 1 then\n"
"  redis.call('del', KEYS[1])\n"
"else\n"
"  redis.call('hset', KEYS[1], 'mode', 'read')\n"
"end\n"
"redis.call(ARGV[2], ARGV[3], '1')\n"
"redis.call(ARGV[2], ARGV[3], '0')\n"
"return 1\n";

/*
 * write, extend / renew.  ARGV: field, ms, renew flag (unused: it never
 * shortens the hash's TTL anyway, since read holds of our own, a downgrade,
 * may need it longer, unlike Redisson's renewal).  Reply as
 * simple_extend_lua's.
 */
static const char *rw_write_extend_lua =
"if redis.pcall('hexists', KEYS[1], ARGV[1]) ~= 1 then return 0 end\n"
"if redis.call('hexists', KEYS[1], 'mode') == 0 then return 0 end\n"
"local t = redis.call('pttl', KEYS[1])\n"
"if t < tonumber(ARGV[2]) then\n"
"  redis.call('pexpire', KEYS[1], ARGV[2])\n"
"end\n"
"return t + 2\n";

/*
 * Several locks at once (redis_lock_acquire_many), all or nothing, in one
 * script per node: every key is checked first and nothing is written unless
 * every one is free or ours.  Each key's grant is what the single acquire
 * script would do with it.  Replies: {1, token per key} granted; {0, i,
 * pttl, publishes} key i (1-based) busy; {-1, i, type} key i is not a lock
 * of the layout; {-2, i} key i, which the session holds (its held flag),
 * is not ours any more (lost).  A key already holding our token is ours (a
 * retried acquire whose reply was lost): it is refreshed and counted anew.
 *
 * Fencing: one INCR per newly granted key, on the key's own counter as the
 * single script does, and each token is raised above the one before it in
 * the given order (a SET of the counter, which only moves it up), so the
 * tokens of one call increase strictly in the order the names were given.
 * A lock the session held keeps its token (0 in the reply).
 *
 * simple.  KEYS: n locks, then their n fence counters.  ARGV: marker,
 * fence flag, then for each key its token, lease ms and held flag.
 */
static const char *simple_acquire_many_lua =
"local n = #KEYS / 2\n"
"for i = 1, n do\n"
"  local b = 2 + 3 * (i - 1)\n"
"  local v = redis.pcall('get', KEYS[i])\n"
"  if type(v) == 'table' and v.err then\n"
"    return {-1, i, redis.call('type', KEYS[i])['ok']}\n"
"  end\n"
"  if v ~= ARGV[b + 1] then\n"
"    if ARGV[b + 3] == '1' then return {-2, i} end\n"
"    if v then\n"
"      local p = redis.call('pttl', KEYS[i])\n"
"      if string.sub(v, 1, #ARGV[1]) == ARGV[1] then return {0, i, p, 1} end\n"
"      return {0, i, p, 0}\n"
"    end\n"
"  end\n"
"end\n"
"local out = {1}\n"
"local floor = 0\n"
"for i = 1, n do\n"
"  local b = 2 + 3 * (i - 1)\n"
"  redis.call('set', KEYS[i], ARGV[b + 1], 'PX', ARGV[b + 2])\n"
"  local f = 0\n"
"  if ARGV[b + 3] ~= '1' and ARGV[2] == '1' then\n"
"    f = redis.call('incr', KEYS[n + i])\n"
"    local raise = false\n"
"    if f == 1 then\n"
"      local t = redis.call('time')\n"
"      f = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
"      raise = true\n"
"    end\n"
"    if f <= floor then\n"
"      f = floor + 1\n"
"      raise = true\n"
"    end\n"
"    if raise then redis.call('set', KEYS[n + i], string.format('%.0f', f)) end\n"
"    floor = f\n"
"  end\n"
"  out[i + 1] = f\n"
"end\n"
"return out\n";

/*
 * redisson (RLock hashes, as a RedissonMultiLock takes them).  KEYS: n
 * locks, then their n token counters.  ARGV: our field, fence flag, then
 * for each key its lease ms and held flag.
 */
static const char *redisson_acquire_many_lua =
"local n = #KEYS / 2\n"
"for i = 1, n do\n"
"  local b = 2 + 2 * (i - 1)\n"
"  local t = redis.call('type', KEYS[i])['ok']\n"
"  if t == 'none' then\n"
"    if ARGV[b + 2] == '1' then return {-2, i} end\n"
"  elseif t ~= 'hash' then\n"
"    return {-1, i, t}\n"
"  elseif redis.call('hexists', KEYS[i], 'mode') == 1 then\n"
"    return {-1, i, 'read-write lock'}\n"
"  elseif redis.call('hexists', KEYS[i], ARGV[1]) == 0 then\n"
"    if ARGV[b + 2] == '1' then return {-2, i} end\n"
"    return {0, i, redis.call('pttl', KEYS[i]), 1}\n"
"  end\n"
"end\n"
"local out = {1}\n"
"local floor = 0\n"
"for i = 1, n do\n"
"  local b = 2 + 2 * (i - 1)\n"
"  if redis.call('hexists', KEYS[i], ARGV[1]) == 0 then\n"
"    redis.call('hincrby', KEYS[i], ARGV[1], 1)\n"
"  end\n"
"  redis.call('pexpire', KEYS[i], ARGV[b + 1])\n"
"  local f = 0\n"
"  if ARGV[b + 2] ~= '1' and ARGV[2] == '1' then\n"
"    f = redis.call('incr', KEYS[n + i])\n"
"    if f <= floor then\n"
"      f = floor + 1\n"
"      redis.call('set', KEYS[n + i], string.format('%.0f', f))\n"
"    end\n"
"    floor = f\n"
"  end\n"
"  out[i + 1] = f\n"
"end\n"
"return out\n";

typedef struct RLScript
{
	const char *name;			/* for messages */
	const char *body;
	char		sha[41];
} RLScript;

static RLScript scripts[RL_SCRIPT_COUNT];

/* backend identity for the redisson layout: "<uuid>:<pid>" */
static char redisson_field[RL_OWNER_LEN + 1];

/* for each cluster slot, a short tag whose slot it is (fence counters) */
static char (*slot_tags)[6] = NULL;

static void
hex_encode_bytes(const uint8 *in, int n, char *out)
{
	static const char hex[] = "0123456789abcdef";
	int			i;

	for (i = 0; i < n; i++)
	{
		out[2 * i] = hex[in[i] >> 4];
		out[2 * i + 1] = hex[in[i] & 15];
	}
	out[2 * n] = '\0';
}

/*
 * The script's SHA1, as EVALSHA names it.  OpenSSL's, which the extension
 * links for TLS anyway: PostgreSQL's own (pg_cryptohash) exists only from
 * 14, and before it scripts went as EVAL, their whole body every time.
 */
static void
compute_sha(RLScript *s)
{
	uint8		digest[EVP_MAX_MD_SIZE];
	unsigned int len = 0;

	if (EVP_Digest(s->body, strlen(s->body), digest, &len, EVP_sha1(), NULL) != 1 ||
		len != 20)
		elog(ERROR, "could not compute SHA1 of a script");
	hex_encode_bytes(digest, 20, s->sha);
}

/*
 * Fill the script table (names for messages, Lua bodies) at load time; the
 * SHA1s are computed on first use.
 */
void
rl_scripts_init(void)
{
	const RLScript all[RL_SCRIPT_COUNT] = {
		[RL_SCRIPT_SIMPLE_ACQUIRE] = {"simple acquire", simple_acquire_lua},
		[RL_SCRIPT_SIMPLE_RELEASE] = {"simple release", simple_release_lua},
		[RL_SCRIPT_SIMPLE_EXTEND] = {"simple extend", simple_extend_lua},
		[RL_SCRIPT_REDISSON_ACQUIRE] = {"redisson acquire", redisson_acquire_lua},
		[RL_SCRIPT_REDISSON_RELEASE] = {"redisson release", redisson_release_lua},
		[RL_SCRIPT_REDISSON_EXTEND] = {"redisson extend", redisson_extend_lua},
		[RL_SCRIPT_FAIR_ACQUIRE] = {"fair acquire", fair_acquire_lua},
		[RL_SCRIPT_FAIR_RELEASE] = {"fair release", fair_release_lua},
		[RL_SCRIPT_FAIR_DEQUEUE] = {"fair dequeue", fair_dequeue_lua},
		[RL_SCRIPT_RW_READ_ACQUIRE] = {"read-write lock read acquire", rw_read_acquire_lua},
		[RL_SCRIPT_RW_READ_RELEASE] = {"read-write lock read release", rw_read_release_lua},
		[RL_SCRIPT_RW_READ_EXTEND] = {"read-write lock read extend", rw_read_extend_lua},
		[RL_SCRIPT_RW_WRITE_ACQUIRE] = {"read-write lock write acquire", rw_write_acquire_lua},
		[RL_SCRIPT_RW_WRITE_RELEASE] = {"read-write lock write release", rw_write_release_lua},
		[RL_SCRIPT_RW_WRITE_EXTEND] = {"read-write lock write extend", rw_write_extend_lua},
		[RL_SCRIPT_FORCE] = {"force release", force_lua},
		[RL_SCRIPT_INSPECT] = {"inspect", inspect_lua},
		[RL_SCRIPT_SIMPLE_ACQUIRE_MANY] = {"simple acquire many", simple_acquire_many_lua},
		[RL_SCRIPT_REDISSON_ACQUIRE_MANY] = {"redisson acquire many", redisson_acquire_many_lua},
	};

	memcpy(scripts, all, sizeof(scripts));
}

/*
 * SHA1s are computed on first use, not in _PG_init: the hash needs a
 * resource owner, which the postmaster does not have.
 */
static void
ensure_shas(void)
{
	static bool ready = false;
	ResourceOwner saved = CurrentResourceOwner;
	ResourceOwner tmp = NULL;
	int			i;

	if (ready)
		return;
	if (saved == NULL)
		CurrentResourceOwner = tmp = ResourceOwnerCreate(NULL, "redis_lock scripts");
	for (i = 0; i < RL_SCRIPT_COUNT; i++)
		compute_sha(&scripts[i]);
	if (tmp != NULL)
	{
		CurrentResourceOwner = saved;
		ResourceOwnerDelete(tmp);
	}
	ready = true;
}

/* ----------------------------------------------------------------
 * Names
 * ----------------------------------------------------------------
 */

/* Does the key contain a Redis Cluster hash tag ({...} non-empty)? */
static bool
has_hash_tag(const char *key, size_t len)
{
	const char *open = memchr(key, '{', len);
	const char *close;

	if (open == NULL)
		return false;
	close = memchr(open + 1, '}', len - (open + 1 - key));
	return close != NULL && close > open + 1;
}

static void
build_slot_tags(void)
{
	static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyz";
	int			remaining = 16384;
	int			len;

	slot_tags = MemoryContextAllocZero(TopMemoryContext, 16384 * sizeof(*slot_tags));
	for (len = 1; len <= 5 && remaining > 0; len++)
	{
		int			idx[5] = {0};
		char		buf[6];

		for (;;)
		{
			int			i;
			uint16		slot;

			for (i = 0; i < len; i++)
				buf[i] = alphabet[idx[i]];
			buf[len] = '\0';
			slot = rl_key_slot(buf, len);
			if (slot_tags[slot][0] == '\0')
			{
				memcpy(slot_tags[slot], buf, len + 1);
				if (--remaining == 0)
					break;
			}
			for (i = len - 1; i >= 0; i--)
			{
				if (++idx[i] < (int) sizeof(alphabet) - 1)
					break;
				idx[i] = 0;
			}
			if (i < 0)
				break;
		}
	}
	if (remaining > 0)
		elog(ERROR, "could not find a tag for every cluster slot");
}

/* prefix + ":" + key, braced unless key has a "{" (Redisson's rule) */
static char *
redisson_prefix_name(const char *prefix, const char *key)
{
	if (strchr(key, '{') != NULL)
		return psprintf("%s:%s", prefix, key);
	return psprintf("%s:{%s}", prefix, key);
}

/*
 * What a read-write lock's timeout keys start with: the key, braced unless
 * it has a "{" (Redisson's suffix rule), so they share the key's slot.
 */
static char *
rw_timeout_prefix(const char *key)
{
	if (strchr(key, '{') != NULL)
		return pstrdup(key);
	return psprintf("{%s}", key);
}

/*
 * Would the keys Redisson's naming puts beside this key (fence counter,
 * fair queue, read timeout keys) fall in other Cluster hash slots?  They do
 * when the key has a "{" but no complete hash tag: the names then hash
 * whole.  The simple layout chooses its own counter name, and a write hold
 * touches one key (and one channel, a concern only for sharded pub/sub).
 */
bool
rl_key_splits_slots(RLProtocol protocol, const char *key)
{
	/*
	 * A write hold's release publishes on redisson_rwlock:<key>, which with
	 * sharded pub/sub must be in the key's slot too
	 */
	if (protocol == RL_PROTOCOL_SIMPLE ||
		(protocol == RL_PROTOCOL_RW_WRITE && !rl_sharded_pubsub))
		return false;
	return strchr(key, '{') != NULL && !has_hash_tag(key, strlen(key));
}

/* A fair lock's queue (a list of owners) and timeout set */
static char *
fair_queue_key(const RLLockNames *n)
{
	return redisson_prefix_name("redisson_lock_queue", n->key);
}

static char *
fair_timeout_key(const RLLockNames *n)
{
	return redisson_prefix_name("redisson_lock_timeout", n->key);
}

/* Now as Unix milliseconds: the clock fair-lock waiters' times are kept in */
static char *
unix_ms_text(void)
{
	TimestampTz now = GetCurrentTimestamp();

	return psprintf(INT64_FORMAT, now / 1000 +
					(int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000);
}

/*
 * The channel a waiter for this lock listens on: the lock's, or under
 * redisson_fair the waiter's own "<lock channel>:<owner>".
 */
char *
rl_wait_channel(const RLLockNames *n)
{
	if (n->protocol == RL_PROTOCOL_REDISSON_FAIR)
		return psprintf("%s:%s", n->channel, n->owner);
	return n->channel;
}

/* The timeout key of our one read hold: count 1, so suffix ":1" */
static char *
rw_read_timeout_key(const RLLockNames *n)
{
	return psprintf("%s:%s:rwlock_timeout:1", rw_timeout_prefix(n->key),
					n->owner);
}

/*
 * a, b, c and d one after the other, palloc'd: the simple layout's names
 * are built on every acquire, where psprintf's format parsing cost more
 * than the rest of building them.
 */
static char *
concat4(const char *a, const char *b, const char *c, const char *d)
{
	size_t		la = strlen(a);
	size_t		lb = strlen(b);
	size_t		lc = strlen(c);
	size_t		ld = strlen(d);
	char	   *out = palloc(la + lb + lc + ld + 1);

	memcpy(out, a, la);
	memcpy(out + la, b, lb);
	memcpy(out + la + lb, c, lc);
	memcpy(out + la + lb + lc, d, ld + 1);
	return out;
}

/*
 * Fill names around key, already allocated in the current memory context
 * (the prefix applied); prefix is needed again for the fence counter's
 * name.
 */
static void
names_around_key(RLLockNames *names, RLProtocol protocol, const char *prefix,
				 char *key)
{
	names->protocol = protocol;
	names->key = key;
	names->keylen = strlen(key);
	names->owner[0] = '\0';

	if (protocol == RL_PROTOCOL_REDISSON || protocol == RL_PROTOCOL_REDISSON_FAIR)
	{
		names->channel = redisson_prefix_name("redisson_lock__channel", names->key);
		names->fence_key = redisson_prefix_name("redisson_lock_token", names->key);
	}
	else if (RL_PROTOCOL_IS_RW(protocol))
	{
		/* read-write locks have no fencing tokens */
		names->channel = redisson_prefix_name("redisson_rwlock", names->key);
		names->fence_key = NULL;
	}
	else
	{
		uint16		slot = rl_key_slot(names->key, names->keylen);

		if (has_hash_tag(names->key, names->keylen))
			names->channel = concat4("redis_lock:release:", names->key, "", "");
		else
			names->channel = concat4("redis_lock:release:{", names->key, "}", "");
		if (slot_tags == NULL)
			build_slot_tags();
		names->fence_key = concat4(prefix ? prefix : "", "redis_lock:fence:{",
								   slot_tags[slot], "}");
		/* a hash tag inside the prefix decides the slot of both keys */
		Assert(rl_key_slot(names->fence_key, strlen(names->fence_key)) == slot);
	}
}

/*
 * Fill names for a Redis key (prefix already applied) under the given
 * protocol; prefix is needed again for the fence counter's name.  The
 * strings are allocated in cxt; owner is left empty (see rl_new_owner).
 */
void
rl_names_from_key(RLLockNames *names, RLProtocol protocol, const char *prefix,
				  const char *key, MemoryContext cxt)
{
	MemoryContext old = MemoryContextSwitchTo(cxt);

	names_around_key(names, protocol, prefix, pstrdup(key));
	/* the caller says which form the lock was taken with */
	names->script_free = false;
	MemoryContextSwitchTo(old);
}

/*
 * Names for lock_name under the current protocol, key prefix and scripting
 * setting.  With redis_lock.scripting off only the simple layout has a form
 * without Lua scripts: any other is refused (0A000) before anything is
 * made or sent.
 */
void
rl_names_build(RLLockNames *names, RLProtocol protocol, const char *prefix,
			   const char *lock_name, MemoryContext cxt)
{
	MemoryContext old;

	if (!rl_scripting && protocol != RL_PROTOCOL_SIMPLE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("Redis lock layout \"%s\" needs Lua scripts",
						rl_protocol_name(protocol)),
				 errdetail("Lock \"%s\" would use it, and redis_lock.scripting is off.",
						   lock_name),
				 errhint("Only redis_lock.protocol = 'simple' works without scripts.")));
	old = MemoryContextSwitchTo(cxt);

	names_around_key(names, protocol, prefix,
					 concat4(prefix ? prefix : "", lock_name, "", ""));
	names->script_free = !rl_scripting;
	MemoryContextSwitchTo(old);
}

/*
 * Random bits of simple-protocol tokens, drawn from pg_strong_random a pool
 * at a time: each call costs OpenSSL a fixed several thousand instructions
 * (and a getpid() for its fork check) whatever its length, more than the
 * rest of an uncontended acquire.  Every token still gets bytes of its own,
 * never reused.  The pool belongs to the process that filled it: a child
 * forked with it would otherwise repeat its parent's tokens.
 */
#define RL_TOKEN_BYTES	16
#define RL_TOKEN_POOL	32		/* tokens per pg_strong_random call */

static const uint8 *
token_random_bytes(void)
{
	static uint8 pool[RL_TOKEN_POOL * RL_TOKEN_BYTES];
	static int	next = RL_TOKEN_POOL;
	static int	pool_pid = 0;
	const uint8 *r;

	if (next >= RL_TOKEN_POOL || pool_pid != MyProcPid)
	{
		if (!pg_strong_random(pool, sizeof(pool)))
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not generate a random lock token")));
		next = 0;
		pool_pid = MyProcPid;
	}
	r = &pool[next * RL_TOKEN_BYTES];
	next++;
	return r;
}

/*
 * A fresh owner identity.  simple: marker + 128 random bits as hex, unique
 * per grant.  redisson and read holds: this backend's "<uuid>:<pid>", like
 * Redisson's "<client uuid>:<thread id>"; write holds: that + ":write".
 */
void
rl_new_owner(RLProtocol protocol, char *owner)
{
	if (protocol != RL_PROTOCOL_SIMPLE)
	{
		if (redisson_field[0] == '\0')
		{
			uint8		u[16];
			char		h[33];

			if (!pg_strong_random(u, sizeof(u)))
				ereport(ERROR,
						(errcode(ERRCODE_INTERNAL_ERROR),
						 errmsg("could not generate a random lock owner")));
			u[6] = (u[6] & 0x0f) | 0x40;	/* version 4 */
			u[8] = (u[8] & 0x3f) | 0x80;	/* variant */
			hex_encode_bytes(u, 16, h);
			snprintf(redisson_field, sizeof(redisson_field),
					 "%.8s-%.4s-%.4s-%.4s-%.12s:%d",
					 h, h + 8, h + 12, h + 16, h + 20, MyProcPid);
		}
		if (protocol == RL_PROTOCOL_RW_WRITE)
			snprintf(owner, RL_OWNER_LEN + 1, "%s:write", redisson_field);
		else
			strlcpy(owner, redisson_field, RL_OWNER_LEN + 1);
	}
	else
	{
		memcpy(owner, RL_TOKEN_MARKER, strlen(RL_TOKEN_MARKER));
		hex_encode_bytes(token_random_bytes(), RL_TOKEN_BYTES,
						 owner + strlen(RL_TOKEN_MARKER));
	}
}

/* The subscribe command for release channels: sharded or classic pub/sub */
const char *
rl_pubsub_subscribe_cmd(void)
{
	return rl_sharded_pubsub ? "SSUBSCRIBE" : "SUBSCRIBE";
}

/* The unsubscribe command matching rl_pubsub_subscribe_cmd() */
const char *
rl_pubsub_unsubscribe_cmd(void)
{
	return rl_sharded_pubsub ? "SUNSUBSCRIBE" : "UNSUBSCRIBE";
}

static const char *
publish_cmd(void)
{
	return rl_sharded_pubsub ? "SPUBLISH" : "PUBLISH";
}

/* ----------------------------------------------------------------
 * Calls
 * ----------------------------------------------------------------
 */
static char *
ms_text(int64 ms)
{
	return psprintf(INT64_FORMAT, ms);
}

/* EVALSHA sha nkeys keys... args... */
void
rl_script_call(RLCall *call, RLConn *conn, RLScriptId id, int nkeys,
			   const char **keys, int nargs, const char **args)
{
	RLScript   *s = &scripts[id];
	static const char *nkeys_text[] = {"0", "1", "2", "3", "4"};
	int			i;

	Assert(nkeys < (int) lengthof(nkeys_text));
	ensure_shas();
	rl_call_set(call, conn, 0, NULL, NULL);
	rl_call_arg(call, "EVALSHA", 7);
	rl_call_arg(call, s->sha, 40);
	rl_call_arg(call, nkeys_text[nkeys], 1);
	for (i = 0; i < nkeys; i++)
		rl_call_arg(call, keys[i], strlen(keys[i]));
	for (i = 0; i < nargs; i++)
		rl_call_arg(call, args[i], strlen(args[i]));
}

/* Which script does this call run? (by its SHA) */
static RLScript *
script_of(RLCall *call)
{
	int			i;

	if (call->argc < 2 || pg_strcasecmp(call->argv[0], "EVALSHA") != 0)
		return NULL;
	for (i = 0; i < RL_SCRIPT_COUNT; i++)
		if (call->argvlen[1] == 40 && memcmp(call->argv[1], scripts[i].sha, 40) == 0)
			return &scripts[i];
	return NULL;
}

/* What a call runs, for messages: "script \"simple acquire\"" or its command */
char *
rl_call_command_name(RLCall *call)
{
	RLScript   *s = NULL;

	if (call->argc >= 2 && (pg_strcasecmp(call->argv[0], "EVALSHA") == 0 ||
							pg_strcasecmp(call->argv[0], "EVAL") == 0))
	{
		int			i;

		s = script_of(call);
		for (i = 0; s == NULL && i < RL_SCRIPT_COUNT; i++)
			if (call->argv[1] == scripts[i].body)
				s = &scripts[i];
	}
	if (s != NULL)
		return psprintf("script \"%s\"", s->name);
	return pnstrdup(call->argv[0], call->argvlen[0]);
}

/*
 * Run script calls on their nodes.  A NOSCRIPT reply (Redis restarted or
 * SCRIPT FLUSH) means the script did not run: those calls are sent again as
 * EVAL, and in the same round trip every other script is loaded on that
 * connection, so the next first use of another script costs nothing extra.
 */
void
rl_script_run(RLCall *calls, int ncalls, RLRunMode mode)
{
	int		   *idx = NULL;
	int			nretry = 0;
	RLConn	  **reload = NULL;
	int			nreload = 0;
	int			i;

	rl_target_run(calls, ncalls, mode);
	for (i = 0; i < ncalls; i++)
	{
		RLCall	   *c = &calls[i];
		RLScript   *s;
		int			j;

		if (!rl_reply_is_error(c->reply, "NOSCRIPT") || (s = script_of(c)) == NULL)
			continue;
		c->argv[0] = "EVAL";
		c->argvlen[0] = 4;
		c->argv[1] = s->body;
		c->argvlen[1] = strlen(s->body);
		if (idx == NULL)
		{
			idx = palloc(sizeof(int) * ncalls);
			reload = palloc(sizeof(RLConn *) * ncalls);
		}
		idx[nretry++] = i;
		for (j = 0; j < nreload && reload[j] != c->conn; j++)
			;
		if (j == nreload)
			reload[nreload++] = c->conn;
	}
	if (nretry > 0)
	{
		int			nagain = nretry + nreload * RL_SCRIPT_COUNT;
		RLCall	   *again;
		int			k = 0;

		/* what follows a script that did not run (a WAIT) runs again */
		for (i = 0; i < nretry; i++)
			nagain += rl_group_len(calls, ncalls, idx[i]) - 1;
		again = palloc0(sizeof(RLCall) * nagain);
		for (i = 0; i < nretry; i++)
		{
			int			len = rl_group_len(calls, ncalls, idx[i]);
			int			j;

			for (j = 0; j < len; j++)
				again[k++] = calls[idx[i] + j];
		}
		for (i = 0; i < nreload; i++)
		{
			int			sid;

			for (sid = 0; sid < RL_SCRIPT_COUNT; sid++)
			{
				const char *argv[3] = {"SCRIPT", "LOAD", scripts[sid].body};

				rl_call_set(&again[k], reload[i], 3, argv, NULL);
				/* follow the connection the NOSCRIPT came from */
				again[k++].target = NULL;
			}
		}
		rl_target_run(again, nagain, mode);
		k = 0;
		for (i = 0; i < nretry; i++)
		{
			int			len = rl_group_len(calls, ncalls, idx[i]);
			int			j;

			for (j = 0; j < len; j++)
				calls[idx[i] + j] = again[k++];
		}
		pfree(again);
		pfree(idx);
		pfree(reload);
	}
}

/*
 * Set call up as the acquire script of n's protocol with this lease; fence
 * asks the script to count a fencing token.
 */
static void
script_acquire(RLCall *call, RLConn *conn, const RLLockNames *n, int64 lease_ms,
			   bool fence, int64 queue_wait_ms)
{
	const char *keys[2] = {n->key, n->fence_key};
	const char *f = fence ? "1" : "0";

	if (n->protocol == RL_PROTOCOL_REDISSON_FAIR)
	{
		const char *fkeys[4] = {n->key, n->fence_key, fair_queue_key(n),
		fair_timeout_key(n)};
		const char *args[6] = {ms_text(lease_ms), n->owner, f,
			ms_text(queue_wait_ms), unix_ms_text(),
		queue_wait_ms > 0 ? "1" : "0"};

		rl_script_call(call, conn, RL_SCRIPT_FAIR_ACQUIRE, 4, fkeys, 6, args);
	}
	else if (n->protocol == RL_PROTOCOL_REDISSON)
	{
		const char *args[3] = {ms_text(lease_ms), n->owner, f};

		rl_script_call(call, conn, RL_SCRIPT_REDISSON_ACQUIRE, 2, keys, 3, args);
	}
	else if (n->protocol == RL_PROTOCOL_RW_READ)
	{
		const char *rkeys[2] = {n->key, rw_read_timeout_key(n)};
		const char *args[3] = {ms_text(lease_ms), n->owner,
		psprintf("%s:write", n->owner)};

		rl_script_call(call, conn, RL_SCRIPT_RW_READ_ACQUIRE, 2, rkeys, 3, args);
	}
	else if (n->protocol == RL_PROTOCOL_RW_WRITE)
	{
		const char *args[2] = {ms_text(lease_ms), n->owner};

		rl_script_call(call, conn, RL_SCRIPT_RW_WRITE_ACQUIRE, 1, keys, 2, args);
	}
	else
	{
		const char *args[4] = {n->owner, ms_text(lease_ms), RL_TOKEN_MARKER, f};

		rl_script_call(call, conn, RL_SCRIPT_SIMPLE_ACQUIRE, 2, keys, 4, args);
	}
}

/* Which layouts have a multi-key acquire script */
bool
rl_protocol_has_many(RLProtocol protocol)
{
	return protocol == RL_PROTOCOL_SIMPLE || protocol == RL_PROTOCOL_REDISSON;
}

/*
 * Set call up as the multi-key acquire script of the layout of names[0] (all
 * names have it): every lock, with its lease, or none; held[i]: the session
 * holds lock i (then it must still be ours, and keeps its token); fence
 * asks for fencing tokens.  The arguments past RL_MAX_ARGS are palloc'd in
 * the current memory context.
 */
void
rl_call_acquire_many(RLCall *call, RLConn *conn, const RLLockNames *const *names,
					 int n, const int64 *lease_ms, const bool *held, bool fence)
{
	bool		simple = names[0]->protocol == RL_PROTOCOL_SIMPLE;
	RLScript   *s = &scripts[simple ? RL_SCRIPT_SIMPLE_ACQUIRE_MANY :
								 RL_SCRIPT_REDISSON_ACQUIRE_MANY];
	char	   *nkeys = psprintf("%d", 2 * n);
	int			i;

	Assert(rl_protocol_has_many(names[0]->protocol));
	ensure_shas();
	rl_call_set(call, conn, 0, NULL, NULL);
	rl_call_arg(call, "EVALSHA", 7);
	rl_call_arg(call, s->sha, 40);
	rl_call_arg(call, nkeys, strlen(nkeys));
	for (i = 0; i < n; i++)
		rl_call_arg(call, names[i]->key, names[i]->keylen);
	for (i = 0; i < n; i++)
		rl_call_arg(call, names[i]->fence_key, strlen(names[i]->fence_key));
	if (simple)
		rl_call_arg(call, RL_TOKEN_MARKER, strlen(RL_TOKEN_MARKER));
	else
		rl_call_arg(call, names[0]->owner, strlen(names[0]->owner));
	rl_call_arg(call, fence ? "1" : "0", 1);
	for (i = 0; i < n; i++)
	{
		char	   *ms = ms_text(lease_ms[i]);

		if (simple)
			rl_call_arg(call, names[i]->owner, strlen(names[i]->owner));
		rl_call_arg(call, ms, strlen(ms));
		rl_call_arg(call, held[i] ? "1" : "0", 1);
	}
}

/*
 * Set call up as the release script of n's protocol: delete the lock if it
 * is ours and publish on its channel.
 */
static void
script_release(RLCall *call, RLConn *conn, const RLLockNames *n)
{
	const char *keys[2] = {n->key, NULL};
	const char *args[4] = {n->owner, publish_cmd(), n->channel, NULL};

	switch (n->protocol)
	{
		case RL_PROTOCOL_SIMPLE:
			rl_script_call(call, conn, RL_SCRIPT_SIMPLE_RELEASE, 1, keys, 3, args);
			break;
		case RL_PROTOCOL_REDISSON:
			rl_script_call(call, conn, RL_SCRIPT_REDISSON_RELEASE, 1, keys, 3, args);
			break;
		case RL_PROTOCOL_REDISSON_FAIR:
			{
				const char *fkeys[3] = {n->key, fair_queue_key(n),
				fair_timeout_key(n)};

				args[3] = unix_ms_text();
				rl_script_call(call, conn, RL_SCRIPT_FAIR_RELEASE, 3, fkeys, 4, args);
			}
			break;
		case RL_PROTOCOL_RW_READ:
			keys[1] = rw_read_timeout_key(n);
			args[3] = rw_timeout_prefix(n->key);
			rl_script_call(call, conn, RL_SCRIPT_RW_READ_RELEASE, 2, keys, 4, args);
			break;
		case RL_PROTOCOL_RW_WRITE:
			rl_script_call(call, conn, RL_SCRIPT_RW_WRITE_RELEASE, 1, keys, 3, args);
			break;
	}
}

/*
 * Set call up as the extend script of n's protocol: restart the lease if the
 * lock is still ours (also how a lock is verified); with renew, only
 * lengthen what is left of it (the watchdog's renewals).
 */
static void
script_extend(RLCall *call, RLConn *conn, const RLLockNames *n, int64 lease_ms,
			  bool renew)
{
	const char *keys[2] = {n->key, NULL};
	const char *args[3] = {n->owner, ms_text(lease_ms), renew ? "1" : "0"};

	switch (n->protocol)
	{
		case RL_PROTOCOL_SIMPLE:
			rl_script_call(call, conn, RL_SCRIPT_SIMPLE_EXTEND, 1, keys, 3, args);
			break;
		case RL_PROTOCOL_REDISSON:
		case RL_PROTOCOL_REDISSON_FAIR:
			rl_script_call(call, conn, RL_SCRIPT_REDISSON_EXTEND, 1, keys, 3, args);
			break;
		case RL_PROTOCOL_RW_READ:
			keys[1] = rw_read_timeout_key(n);
			rl_script_call(call, conn, RL_SCRIPT_RW_READ_EXTEND, 2, keys, 3, args);
			break;
		case RL_PROTOCOL_RW_WRITE:
			rl_script_call(call, conn, RL_SCRIPT_RW_WRITE_EXTEND, 1, keys, 3, args);
			break;
	}
}

/*
 * Set call up as the force-release script: delete the lock whoever holds it
 * and publish on its channel, refusing a key of a foreign type.
 */
static void
script_force(RLCall *call, RLConn *conn, const RLLockNames *n)
{
	bool		fair = n->protocol == RL_PROTOCOL_REDISSON_FAIR;
	const char *keys[1] = {n->key};
	const char *args[7] = {publish_cmd(),
		n->protocol == RL_PROTOCOL_SIMPLE ? "string" : "hash",
		n->channel,
		redisson_prefix_name("redisson_rwlock", n->key),
		fair ? fair_queue_key(n) : "",
		fair ? fair_timeout_key(n) : "",
	fair ? unix_ms_text() : "0"};

	rl_script_call(call, conn, RL_SCRIPT_FORCE, 1, keys, 7, args);
}

/*
 * Leave a fair lock's queue (a waiter that gives up); queue_wait_ms is the
 * wait it joined with.
 */
static void
script_dequeue(RLCall *call, RLConn *conn, const RLLockNames *n,
			   int64 queue_wait_ms)
{
	const char *keys[3] = {n->key, fair_queue_key(n), fair_timeout_key(n)};
	const char *args[4] = {n->owner, ms_text(queue_wait_ms), publish_cmd(),
	n->channel};

	Assert(n->protocol == RL_PROTOCOL_REDISSON_FAIR);
	rl_script_call(call, conn, RL_SCRIPT_FAIR_DEQUEUE, 3, keys, 4, args);
}

/* Set call up as the inspect script: the key's type, pttl and holder(s) */
static void
script_inspect(RLCall *call, RLConn *conn, const RLLockNames *n)
{
	const char *keys[1] = {n->key};

	rl_script_call(call, conn, RL_SCRIPT_INSPECT, 1, keys, 0, NULL);
}

/* ----------------------------------------------------------------
 * The simple layout without Lua (redis_lock.scripting off).
 *
 * The same string key holding the same token, taken and given back with
 * commands that compare atomically in the server: SET NX GET, DELIFEQ
 * (Valkey 9.0) or DELEX IFEQ (Redis 8.4), SET IFEQ (Valkey 8.1, Redis 8.4).
 * Each operation is one unit of calls sent as a group in one round trip
 * (MULTI ... EXEC where several commands must see one state).  Every unit
 * is idempotent for a given token, as the scripts are.  What differs from
 * the scripts (README, "Script-free locks"):
 *
 * - The fence counter is counted on every acquire attempt, not only on a
 *   grant: a transaction cannot make INCR depend on the SET before it.
 *   Tokens still strictly increase from one grant to the next (INCR only
 *   goes up); they merely skip the numbers busy attempts took.  A missing
 *   counter starts at this server's clock in microseconds (SET NX before
 *   the INCR), not Redis' (no TIME can feed a later command of the same
 *   transaction): tokens keep increasing across a Redis reset as long as
 *   that clock is ahead of the last token, which it is by far unless more
 *   than a million attempts a second went to one counter.
 * - Our own token found by an acquire (a retry whose reply was lost) costs
 *   a second round trip, a SET IFEQ that restarts its lease.
 * - A renewal cannot compare what is left of the lease with the lease
 *   before setting it, so it does not "never shorten": it restarts the
 *   lease whatever is left.  Only our own extend could have left more, and
 *   the registry keeps extend and renewals apart (rl_extend).  It still
 *   reports what it found, with a PTTL before its SET.
 * - Force release reads the token, then deletes the key if it still holds
 *   it: two round trips; a lock that changes hands in between is left to
 *   its new holder.
 * ----------------------------------------------------------------
 */

/* Bits of rl_conn_commands: what each server offers */
static const char *const offer_names[] = {"DELIFEQ", "DELEX"};

#define OFFERS_DELIFEQ	0x1		/* Valkey 9.0 and later */
#define OFFERS_DELEX	0x2		/* Redis 8.4 and later */

/* Now as Unix microseconds: where a missing fence counter starts */
static char *
unix_us_text(void)
{
	int64		epoch_us = (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) *
		SECS_PER_DAY * USECS_PER_SEC;

	return psprintf(INT64_FORMAT, GetCurrentTimestamp() + epoch_us);
}

/* unit[i] becomes the command argv for conn */
static void
free_call(RLCall *unit, int i, RLConn *conn, int argc, const char **argv)
{
	rl_call_set(&unit[i], conn, argc, argv, NULL);
}

/*
 * Compare-and-delete of key if it holds token, on what the server offers,
 * then a wake-up on the lock's channel in the same round trip: our waiters
 * sleep on it.  When the key was not ours the message wakes them for
 * nothing, and they find the lock as busy as before.  A PUBLISH refused
 * (an ACL) does not undo the release: waiters then find it by polling.
 */
static int
free_delete(RLCall *unit, RLConn *conn, const RLLockNames *n, const char *token)
{
	int			offers = rl_conn_commands(conn, NULL);
	const char *pub[3] = {publish_cmd(), n->channel, "0"};

	if (offers > 0 && (offers & OFFERS_DELIFEQ) == 0 && (offers & OFFERS_DELEX))
	{
		const char *argv[4] = {"DELEX", n->key, "IFEQ", token};

		free_call(unit, 0, conn, 4, argv);
	}
	else
	{
		const char *argv[3] = {"DELIFEQ", n->key, token};

		free_call(unit, 0, conn, 3, argv);
	}
	free_call(unit, 1, conn, 3, pub);
	return 2;
}

/*
 * The calls of an operation without scripts; returns how many (count only,
 * unit NULL).  The layouts of each, and what their replies mean:
 *
 * acquire: MULTI / SET key token NX PX lease GET / [SET fence <now us> NX /
 *   INCR fence] / PTTL key / TYPE key / EXEC.  SET's GET gives what was
 *   there: nil, we took it; our token, a retry (RL_ACQ_OURS); another
 *   value, busy (publishing if it has our marker), with PTTL's answer; an
 *   error WRONGTYPE, a key of another type (TYPE names it), left as it was.
 * release: DELIFEQ key token (or DELEX key IFEQ token) / PUBLISH.
 * extend: SET key token IFEQ token PX lease (nil: not ours; never creates).
 * renew: PTTL key / SET key token IFEQ token PX lease.
 * force: MULTI / TYPE key / GET key / EXEC, then rl_build_force_delete.
 * inspect: MULTI / TYPE key / PTTL key / GET key / HKEYS key / EXEC (the
 *   one of GET and HKEYS that does not fit the type answers WRONGTYPE).
 */
static int
free_unit(RLCall *unit, RLConn *conn, RLOpKind kind, const RLLockNames *n,
		  int64 lease_ms, bool fence)
{
	const char *multi[1] = {"MULTI"};
	const char *exec[1] = {"EXEC"};
	const char *pttl[2] = {"PTTL", n->key};
	const char *type[2] = {"TYPE", n->key};
	int			k = 0;

	switch (kind)
	{
		case RL_OP_ACQUIRE:
			if (unit == NULL)
				return fence ? 7 : 5;
			{
				const char *set[7] = {"SET", n->key, n->owner, "NX", "PX",
				ms_text(lease_ms), "GET"};

				free_call(unit, k++, conn, 1, multi);
				free_call(unit, k++, conn, 7, set);
				if (fence)
				{
					const char *start[4] = {"SET", n->fence_key, unix_us_text(), "NX"};
					const char *incr[2] = {"INCR", n->fence_key};

					free_call(unit, k++, conn, 4, start);
					free_call(unit, k++, conn, 2, incr);
				}
				free_call(unit, k++, conn, 2, pttl);
				free_call(unit, k++, conn, 2, type);
				free_call(unit, k++, conn, 1, exec);
			}
			return k;
		case RL_OP_RELEASE:
			if (unit == NULL)
				return 2;
			return free_delete(unit, conn, n, n->owner);
		case RL_OP_RENEW:
			if (unit == NULL)
				return 2;
			free_call(unit, k++, conn, 2, pttl);
			/* FALLTHROUGH */
		case RL_OP_EXTEND:
			if (unit == NULL)
				return 1;
			{
				const char *set[7] = {"SET", n->key, n->owner, "IFEQ", n->owner,
				"PX", ms_text(lease_ms)};

				free_call(unit, k++, conn, 7, set);
			}
			return k;
		case RL_OP_FORCE:
			if (unit == NULL)
				return 4;
			{
				const char *get[2] = {"GET", n->key};

				free_call(unit, k++, conn, 1, multi);
				free_call(unit, k++, conn, 2, type);
				free_call(unit, k++, conn, 2, get);
				free_call(unit, k++, conn, 1, exec);
			}
			return k;
		case RL_OP_INSPECT:
			if (unit == NULL)
				return 6;
			{
				const char *get[2] = {"GET", n->key};
				const char *hkeys[2] = {"HKEYS", n->key};

				free_call(unit, k++, conn, 1, multi);
				free_call(unit, k++, conn, 2, type);
				free_call(unit, k++, conn, 2, pttl);
				free_call(unit, k++, conn, 2, get);
				free_call(unit, k++, conn, 2, hkeys);
				free_call(unit, k++, conn, 1, exec);
			}
			return k;
		case RL_OP_DEQUEUE:
			break;
	}
	elog(ERROR, "no script-free form of lock operation %d", (int) kind);
	return 0;					/* keep compiler quiet */
}

/*
 * Force release without scripts, second round: delete the lock if it still
 * holds the token the first round saw, and wake its waiters.
 */
int
rl_build_force_delete(RLCall *unit, RLConn *conn, const RLLockNames *n,
					  const char *token)
{
	return free_delete(unit, conn, n, token);
}

/* How many calls one node's unit of this operation has */
int
rl_unit_calls(RLOpKind kind, const RLLockNames *n, bool fence)
{
	if (!n->script_free)
		return 1;
	return free_unit(NULL, NULL, kind, n, 0, fence);
}

/*
 * Set unit up as the operation on one node: its script, or its script-free
 * form (rl_unit_calls of them, the first leading, the rest following it).
 */
void
rl_build_unit(RLCall *unit, RLConn *conn, RLOpKind kind, const RLLockNames *n,
			  int64 lease_ms, bool fence, int64 queue_wait_ms)
{
	int			k;
	int			i;

	if (n->script_free)
	{
		k = free_unit(unit, conn, kind, n, lease_ms, fence);
		for (i = 1; i < k; i++)
			unit[i].follows = true;
		return;
	}
	switch (kind)
	{
		case RL_OP_ACQUIRE:
			script_acquire(unit, conn, n, lease_ms, fence, queue_wait_ms);
			break;
		case RL_OP_DEQUEUE:
			script_dequeue(unit, conn, n, queue_wait_ms);
			break;
		case RL_OP_EXTEND:
		case RL_OP_RENEW:
			script_extend(unit, conn, n, lease_ms, kind == RL_OP_RENEW);
			break;
		case RL_OP_RELEASE:
			script_release(unit, conn, n);
			break;
		case RL_OP_FORCE:
			script_force(unit, conn, n);
			break;
		case RL_OP_INSPECT:
			script_inspect(unit, conn, n);
			break;
	}
}

/*
 * Before script-free units about key go to these nodes of target: what
 * each server offers, asked where no connection to it has yet, all in one
 * round trip (on a new connection, in the same round trip as its
 * handshake).  From then on every new connection of this process asks in
 * its handshake.  The question is routed like the units: a Sentinel master
 * or Cluster node that does not answer is looked for again, and conns[i]
 * becomes where it was answered.  why[i] is NULL where units may go, else
 * a call saying why not: the question's own failure (a node that did not
 * answer), or RL_FAIL_UNSUPPORTED, which in hard mode is raised at once,
 * before anything is sent to any node.
 */
void
rl_learn_offers(RLConn **conns, int n, RLTarget *target, const char *key,
				size_t keylen, RLRunMode mode, RLCall **why)
{
	int		   *asked = NULL;
	RLCall	   *calls = NULL;
	int			nask = 0;
	int			i;

	rl_probe_commands(offer_names, lengthof(offer_names));
	for (i = 0; i < n; i++)
	{
		why[i] = NULL;
		if (rl_conn_commands(conns[i], NULL) == RL_COMMANDS_UNKNOWN)
		{
			if (calls == NULL)
			{
				calls = palloc0(sizeof(RLCall) * n);
				asked = palloc0(sizeof(int) * n);
			}
			rl_call_probe(&calls[nask], conns[i]);
			calls[nask].target = target;
			calls[nask].key = key;
			calls[nask].keylen = keylen;
			asked[nask++] = i;
		}
	}
	if (nask > 0)
	{
		int			j;

		rl_target_run(calls, nask, RL_RUN_SOFT);
		for (j = 0; j < nask; j++)
			conns[asked[j]] = calls[j].conn;
	}
	for (i = 0; i < n; i++)
	{
		const char *refusal;
		int			offers = rl_conn_commands(conns[i], &refusal);
		RLCall	   *c;
		int			j;

		if (offers >= 0 && (offers & (OFFERS_DELIFEQ | OFFERS_DELEX)) != 0)
			continue;
		c = palloc0(sizeof(RLCall));
		c->conn = conns[i];
		if (offers == RL_COMMANDS_UNKNOWN)
		{
			/* no answer: the question's failure */
			for (j = 0; j < nask && asked[j] != i; j++)
				;
			if (j < nask && calls[j].error != NULL)
				*c = calls[j];
			else
				rl_call_fail(c, RL_FAIL_RECEIVE, ERRCODE_CONNECTION_FAILURE,
							 pstrdup("no answer to COMMAND INFO"));
			c->reply = NULL;
			c->sent = false;
		}
		else if (offers == RL_COMMANDS_REFUSED)
			rl_call_fail(c, RL_FAIL_UNSUPPORTED, ERRCODE_FEATURE_NOT_SUPPORTED,
						 psprintf("Locks without scripts need DELIFEQ (Valkey 9.0 or later) or DELEX (Redis 8.4 or later); asking the server which it has (COMMAND INFO) failed: %s",
								  refusal));
		else
			rl_call_fail(c, RL_FAIL_UNSUPPORTED, ERRCODE_FEATURE_NOT_SUPPORTED,
						 pstrdup("Locks without scripts need DELIFEQ (Valkey 9.0 or later) or DELEX (Redis 8.4 or later), and the server has neither."));
		if (c->failure == RL_FAIL_UNSUPPORTED && mode == RL_RUN_HARD)
			rl_raise_call_error(c);
		why[i] = c;
	}
	if (calls != NULL)
	{
		pfree(calls);
		pfree(asked);
	}
}

/* ----------------------------------------------------------------
 * Replies
 * ----------------------------------------------------------------
 */
static bool
is_text(const RLReply *r)
{
	return r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS;
}

/* The head of a unit runs a script (EVALSHA, or EVAL after NOSCRIPT) */
static bool
is_script_unit(const RLCall *unit)
{
	return unit->argc > 0 &&
		(pg_strcasecmp(unit->argv[0], "EVALSHA") == 0 ||
		 pg_strcasecmp(unit->argv[0], "EVAL") == 0);
}

static bool
is_status(const RLReply *r, const char *text)
{
	return r != NULL && r->type == REDIS_REPLY_STATUS && strcmp(r->str, text) == 0;
}

/*
 * The array EXEC answered for a MULTI ... EXEC unit of n calls, once MULTI
 * said OK and every command in between QUEUED; NULL otherwise (a command
 * refused while queued -- an ACL, a redirection -- aborts the transaction:
 * nothing of it ran).
 */
static RLReply *
exec_reply(RLCall *unit, int n)
{
	RLReply    *r = unit[n - 1].reply;
	int			i;

	if (n < 3 || !is_status(unit[0].reply, "OK"))
		return NULL;
	for (i = 1; i < n - 1; i++)
		if (!is_status(unit[i].reply, "QUEUED"))
			return NULL;
	if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != (size_t) (n - 2))
		return NULL;
	return r;
}

/*
 * The script-free acquire's transaction (free_unit): SET's GET, the fence
 * counter's INCR (when fence), PTTL, TYPE.
 */
static void
free_parse_acquire(RLCall *unit, int n, RLAcquireResult *res)
{
	RLReply    *x = exec_reply(unit, n);
	bool		fence = n == 7;
	RLReply    *got;
	RLReply    *incr;
	RLReply    *pttl;
	RLReply    *type;
	const char *token = unit[1].argv[2];

	if (x == NULL)
		return;
	got = x->element[0];
	incr = fence ? x->element[2] : NULL;
	pttl = x->element[fence ? 3 : 1];
	type = x->element[fence ? 4 : 2];
	if (!is_text(type) || pttl->type != REDIS_REPLY_INTEGER)
		return;
	if (got->type == REDIS_REPLY_ERROR)
	{
		if (strncmp(got->str, "WRONGTYPE", 9) == 0 && strcmp(type->str, "string") != 0)
		{
			res->outcome = RL_ACQ_WRONGTYPE;
			res->type = type->str;
		}
		return;
	}
	if (got->type == REDIS_REPLY_STRING && strcmp(got->str, token) != 0)
	{
		res->outcome = RL_ACQ_BUSY;
		res->pttl = pttl->integer;
		res->holder_publishes = strncmp(got->str, RL_TOKEN_MARKER,
										strlen(RL_TOKEN_MARKER)) == 0;
		return;
	}
	if (got->type != REDIS_REPLY_NIL && got->type != REDIS_REPLY_STRING)
		return;
	/* ours now, or ours already: the counter has counted for us */
	if (incr != NULL && incr->type != REDIS_REPLY_INTEGER)
		return;
	res->fence = incr != NULL ? incr->integer : 0;
	res->outcome = got->type == REDIS_REPLY_NIL ? RL_ACQ_GRANTED : RL_ACQ_OURS;
}

/*
 * Decode an acquire unit of n calls into res: granted with its token, ours
 * already (script-free: its lease must be restarted), busy with the
 * holder's pttl, wrong type, or failed (res->failure: the call to blame).
 */
void
rl_parse_acquire(RLCall *unit, int n, RLAcquireResult *res)
{
	RLReply    *r = unit->reply;

	memset(res, 0, sizeof(*res));
	res->outcome = RL_ACQ_FAILED;
	res->failure = rl_unit_failure(RL_OP_ACQUIRE, unit, n);
	if (!is_script_unit(unit))
	{
		free_parse_acquire(unit, n, res);
		if (res->outcome != RL_ACQ_FAILED)
			res->failure = NULL;
		return;
	}
	/* {1, fence} | {0, pttl[, publishes]} | {-1, type}; anything else failed */
	if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
		r->elements > 3 || r->element[0]->type != REDIS_REPLY_INTEGER)
		return;
	switch (r->element[0]->integer)
	{
		case 1:
			if (r->elements != 2 || r->element[1]->type != REDIS_REPLY_INTEGER)
				break;
			res->outcome = RL_ACQ_GRANTED;
			res->fence = r->element[1]->integer;
			break;
		case 0:
			if (r->element[1]->type != REDIS_REPLY_INTEGER ||
				(r->elements == 3 && r->element[2]->type != REDIS_REPLY_INTEGER))
				break;
			res->outcome = RL_ACQ_BUSY;
			res->pttl = r->element[1]->integer;
			res->holder_publishes = r->elements == 3 && r->element[2]->integer == 1;
			break;
		case -1:
			if (r->elements != 2 || !is_text(r->element[1]))
				break;
			res->outcome = RL_ACQ_WRONGTYPE;
			res->type = r->element[1]->str;
			break;
		default:
			break;
	}
	if (res->outcome != RL_ACQ_FAILED)
		res->failure = NULL;
}

/*
 * Decode a multi-key acquire script's reply for n locks into res (see
 * simple_acquire_many_lua); anything else is failed.
 */
void
rl_parse_acquire_many(RLCall *call, int n, RLAcquireManyResult *res)
{
	RLReply    *r = call->reply;
	size_t		i;

	memset(res, 0, sizeof(*res));
	res->outcome = RL_ACQ_FAILED;
	if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 2)
		return;
	for (i = 0; i < r->elements; i++)
		if (r->element[i]->type != REDIS_REPLY_INTEGER &&
			!(i == 2 && r->element[0]->type == REDIS_REPLY_INTEGER &&
			  r->element[0]->integer == -1 && is_text(r->element[i])))
			return;
	if (r->element[0]->integer == 1)
	{
		if (r->elements != (size_t) n + 1)
			return;
		res->fences = palloc(sizeof(int64) * n);
		for (i = 0; i < (size_t) n; i++)
			res->fences[i] = r->element[i + 1]->integer;
		res->outcome = RL_ACQ_GRANTED;
		return;
	}
	if (r->element[1]->integer < 1 || r->element[1]->integer > n)
		return;
	res->index = (int) r->element[1]->integer - 1;
	switch (r->element[0]->integer)
	{
		case 0:
			if (r->elements != 4)
				return;
			res->outcome = RL_ACQ_BUSY;
			res->pttl = r->element[2]->integer;
			res->holder_publishes = r->element[3]->integer == 1;
			break;
		case -1:
			if (r->elements != 3)
				return;
			res->outcome = RL_ACQ_WRONGTYPE;
			res->type = r->element[2]->str;
			break;
		case -2:
			if (r->elements != 2)
				return;
			res->outcome = RL_ACQ_BUSY;
			res->lost = true;
			break;
		default:
			break;
	}
}

/*
 * Is this the inspect script's reply: {type, pttl[, value or field names]},
 * every part of the type the script returns?
 */
bool
rl_inspect_reply_valid(const RLReply *r)
{
	size_t		i;

	if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
		r->elements > 3 || !is_text(r->element[0]) ||
		r->element[1]->type != REDIS_REPLY_INTEGER)
		return false;
	if (r->elements == 2)
		return true;
	if (is_text(r->element[2]))
		return true;
	if (r->element[2]->type != REDIS_REPLY_ARRAY)
		return false;
	for (i = 0; i < r->element[2]->elements; i++)
		if (!is_text(r->element[2]->element[i]))
			return false;
	return true;
}

/*
 * The inspect reply of a unit of n calls in the script's form, {type,
 * pttl[, value or field names]} (a script-free unit's answers put in that
 * form, without a read-write lock's "mode" field), or NULL if it has none.
 */
RLReply *
rl_inspect_reply(RLCall *unit, int n)
{
	RLReply    *x;
	RLReply    *out;
	RLReply    *type;
	RLReply    *v = NULL;

	if (is_script_unit(unit))
		return rl_inspect_reply_valid(unit->reply) ? unit->reply : NULL;
	/* TYPE, PTTL, GET, HKEYS */
	x = exec_reply(unit, n);
	if (x == NULL || !is_text(x->element[0]) ||
		x->element[1]->type != REDIS_REPLY_INTEGER)
		return NULL;
	type = x->element[0];
	if (strcmp(type->str, "string") == 0)
		v = x->element[2];
	else if (strcmp(type->str, "hash") == 0)
	{
		RLReply    *keys = x->element[3];
		size_t		i;

		if (keys->type != REDIS_REPLY_ARRAY)
			return NULL;
		v = palloc0(sizeof(RLReply));
		v->type = REDIS_REPLY_ARRAY;
		v->element = palloc(sizeof(RLReply *) * Max(keys->elements, 1));
		for (i = 0; i < keys->elements; i++)
			if (!is_text(keys->element[i]) || strcmp(keys->element[i]->str, "mode") != 0)
				v->element[v->elements++] = keys->element[i];
	}
	out = palloc0(sizeof(RLReply));
	out->type = REDIS_REPLY_ARRAY;
	out->elements = v != NULL ? 3 : 2;
	out->element = palloc(sizeof(RLReply *) * 3);
	out->element[0] = type;
	out->element[1] = x->element[1];
	out->element[2] = v;
	return rl_inspect_reply_valid(out) ? out : NULL;
}

/*
 * The call whose reply answers for a script-free unit of n calls: EXEC of a
 * transaction, the SET of a renewal (after its PTTL), else the first.
 */
static RLCall *
free_answer(RLOpKind kind, RLCall *unit, int n)
{
	if (pg_strcasecmp(unit->argv[0], "MULTI") == 0)
		return &unit[n - 1];
	if (kind == RL_OP_RENEW)
		return &unit[1];
	return unit;
}

/*
 * The call to blame when a unit of n calls gave no usable answer: the first
 * that failed or got an error (a transaction's refused command rather than
 * its EXECABORT), else the one whose reply made no sense.
 */
RLCall *
rl_unit_failure(RLOpKind kind, RLCall *unit, int n)
{
	int			i;

	if (is_script_unit(unit))
		return unit;
	for (i = 0; i < n; i++)
		if (unit[i].error != NULL || rl_reply_is_error(unit[i].reply, NULL))
			return &unit[i];
	return free_answer(kind, unit, n);
}

/*
 * May a unit of n calls that gave no usable answer have changed something
 * in Redis?  A script may have run part way whatever it replied.  A
 * script-free unit did nothing when every call got its reply: an error
 * means its command (or the transaction) did not run.
 */
bool
rl_unit_may_have_run(RLCall *unit, int n)
{
	int			i;

	if (is_script_unit(unit))
		return unit->sent || unit->reply != NULL;
	for (i = 0; i < n; i++)
		if (unit[i].reply == NULL && unit[i].sent)
			return true;
	return false;
}

/*
 * What an extend or renew unit that said "ours" found left of the lease, in
 * ms: -1 for no expiry, an unknown one (a script-free extend does not ask),
 * or a reply of another form.
 */
int64
rl_extend_found_ttl(RLOpKind kind, RLCall *unit, int n)
{
	RLReply    *r = unit->reply;

	if (!is_script_unit(unit))
	{
		/* the renewal's PTTL, just before its SET */
		if (kind == RL_OP_RENEW && r != NULL && r->type == REDIS_REPLY_INTEGER &&
			r->integer >= 0)
			return r->integer;
		return -1;
	}
	if (r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer >= 2)
		return r->integer - 2;
	return -1;
}

/*
 * A script-free release, extend, renew or force-delete: its compare said
 * yes or no.  A key of another type is not ours (as in the scripts, whose
 * GET fails on it the same way) and stays untouched.
 */
static RLFlag
free_parse_flag(RLOpKind kind, RLCall *unit, int n, char **text)
{
	RLReply    *r = free_answer(kind, unit, n)->reply;

	if (kind == RL_OP_FORCE)
	{
		/* TYPE, GET */
		RLReply    *x = exec_reply(unit, n);

		if (x == NULL || !is_text(x->element[0]))
			return RL_FLAG_FAILED;
		if (strcmp(x->element[0]->str, "none") == 0)
			return RL_FLAG_NO;
		if (strcmp(x->element[0]->str, "string") != 0)
		{
			*text = x->element[0]->str;
			return RL_FLAG_WRONGTYPE;
		}
		if (x->element[1]->type != REDIS_REPLY_STRING)
			return RL_FLAG_FAILED;
		*text = x->element[1]->str;
		return RL_FLAG_SEEN;
	}
	if (r == NULL)
		return RL_FLAG_FAILED;
	if (rl_reply_is_error(r, "WRONGTYPE"))
		return RL_FLAG_NO;
	if (kind == RL_OP_RELEASE)
	{
		if (r->type != REDIS_REPLY_INTEGER)
			return RL_FLAG_FAILED;
		return r->integer == 1 ? RL_FLAG_YES : RL_FLAG_NO;
	}
	/* SET ... IFEQ: OK, or nil when the key is not ours (or not there) */
	if (is_status(r, "OK"))
		return RL_FLAG_YES;
	if (r->type == REDIS_REPLY_NIL)
		return RL_FLAG_NO;
	return RL_FLAG_FAILED;
}

/*
 * Decode a release/extend/force unit of n calls: RL_FLAG_YES or
 * RL_FLAG_NO; RL_FLAG_WRONGTYPE with *text the type when the key has a
 * foreign type; RL_FLAG_SEEN with *text the token (script-free force);
 * RL_FLAG_FAILED when the round trip failed or the reply makes no sense.
 */
RLFlag
rl_parse_flag(RLOpKind kind, RLCall *unit, int n, char **text)
{
	RLReply    *r = unit->reply;

	*text = NULL;
	if (!is_script_unit(unit))
		return free_parse_flag(kind, unit, n, text);
	if (r != NULL && r->type == REDIS_REPLY_INTEGER)
		return r->integer ? RL_FLAG_YES : RL_FLAG_NO;
	if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
		r->element[0]->type == REDIS_REPLY_INTEGER &&
		r->element[0]->integer == -1 && is_text(r->element[1]))
	{
		*text = r->element[1]->str;
		return RL_FLAG_WRONGTYPE;
	}
	return RL_FLAG_FAILED;
}
