/*-------------------------------------------------------------------------
 *
 * lockscripts.c
 *	  Owns the Lua scripts of the lock layouts: "simple" (SET NX PX),
 *	  "redisson" (RLock hash), its fair and read-write variants, force
 *	  release, inspect, and several locks at once; rl_lock_scripts_define
 *	  puts them in scripts.c's table, which sends them.
 *
 *	  Every script is idempotent for a given owner token: running it twice
 *	  has the effect of running it once.  transport.c relies on that when it
 *	  resends a command after finding a cached connection dead, and
 *	  locktable.c relies on it to clean up acquires whose outcome is unknown.
 *
 *	  A script stops at the first command that fails, and Redis keeps what
 *	  it wrote before.  So every script makes its checks (is the key free,
 *	  ours, of the layout's type) before its first write, or with it (the
 *	  simple acquire's SET NX), reading a key of another type with TYPE or
 *	  pcall so that it is answered, not raised; only the fair lock's scripts
 *	  first drop queue heads whose time has passed, which any client may
 *	  do.  What can still fail comes after a write: the INCR of a corrupted
 *	  fence counter after the grant's SET, a PUBLISH the ACL denies after
 *	  the release's DEL.  replies.c (rl_reply_proves_not_run) therefore
 *	  takes an error raised while a script ran for one that may have
 *	  written, and a refusal of EVALSHA itself (NOPERM, NOSCRIPT, ...) for
 *	  nothing done.
 *
 *	  Must not: hold anything but Lua text and the table entries naming
 *	  it; build calls or decode replies.  bench/run reads the bodies out of
 *	  this file by their C variable names.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/redis/lockscripts.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "redis/redis_int.h"

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
 * The fencing token of a grant under the redisson layouts (Lua, put in
 * front of their acquire scripts): token(c, nc, floor) counts the slot's
 * fence counter c, the one the simple layout counts (a missing one starts
 * at the server clock in microseconds, as in simple_acquire_lua), and,
 * when nc is given (redis_lock.redisson_token_counter on), Redisson's
 * RFencedLock counter of the lock too.  The token is one more than the
 * highest of them (and than floor: acquire many's order), and every
 * counter counted is left at the token.  So both counters are at least
 * every token SQL has handed out for the lock, whichever setting each
 * grant was made with, and the next token, from either, is larger; a
 * per-name counter that Redisson's INCR started at 1 is raised to the
 * slot's sequence at SQL's first grant (doc/clients.md, "Fencing tokens
 * and what stays in Redis").
 */
#define REDISSON_TOKEN_LUA \
"local function token(c, nc, floor)\n" \
"  local f = redis.call('incr', c)\n" \
"  local setc = false\n" \
"  local setnc = false\n" \
"  if f == 1 then\n" \
"    local t = redis.call('time')\n" \
"    f = tonumber(t[1]) * 1000000 + tonumber(t[2])\n" \
"    setc = true\n" \
"  end\n" \
"  if nc then\n" \
"    local g = redis.call('incr', nc)\n" \
"    if g > f then\n" \
"      f = g\n" \
"      setc = true\n" \
"    elseif g < f then\n" \
"      setnc = true\n" \
"    end\n" \
"  end\n" \
"  if f <= floor then\n" \
"    f = floor + 1\n" \
"    setc = true\n" \
"    setnc = nc ~= nil\n" \
"  end\n" \
"  if setc then redis.call('set', c, string.format('%.0f', f)) end\n" \
"  if setnc then redis.call('set', nc, string.format('%.0f', f)) end\n" \
"  return f\n" \
"end\n"

/*
 * redisson, acquire (RLock layout; doc/clients.md, "Redisson (Java)").
 * KEYS: lock, the slot's fence counter, [Redisson's per-name counter].
 * ARGV: lease ms, field, fence flag ("0": no token, as for Redlock; "1":
 * the slot's counter; "2": both counters, KEYS[3]).  Our field's count
 * stays 1: reentrancy is counted in the backend, so a repeated acquire is
 * idempotent.  A token is counted on every grant, as RFencedLock does.
 */
static const char *redisson_acquire_lua =
REDISSON_TOKEN_LUA
"local function fence()\n"
"  if ARGV[3] == '0' then return 0 end\n"
"  if ARGV[3] == '2' then return token(KEYS[2], KEYS[3], 0) end\n"
"  return token(KEYS[2], nil, 0)\n"
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
 * redisson_fair, acquire (RFairLock layout; doc/rwlock-fairlock.md).  KEYS:
 * lock, the slot's fence counter, queue (list of waiting owners), timeout
 * set (owner -> the time in ms after which that waiter counts as gone),
 * [Redisson's per-name counter].  ARGV: lease ms, field, fence flag (as
 * redisson_acquire_lua's; "2": KEYS[5]), wait ms of this waiter, now (Unix
 * ms, our clock, as Redisson uses its client's), "1" to join the queue
 * when busy.
 *
 * Queue heads whose time has passed leave first.  The lock is granted when
 * it is free and the queue is empty or we are its head; we then leave the
 * queue and every later waiter's time moves up by our wait.  When busy, a
 * waiter joins the tail (once) with a time after the previous waiter's.
 * Reentrancy is counted in the backend, as for "redisson".
 */
static const char *fair_acquire_lua =
REDISSON_TOKEN_LUA
"local function fence()\n"
"  if ARGV[3] == '0' then return 0 end\n"
"  if ARGV[3] == '2' then return token(KEYS[2], KEYS[5], 0) end\n"
"  return token(KEYS[2], nil, 0)\n"
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
 * What a lock is: the one test, in Lua, that the inspect and the force
 * release scripts both start with (so redis_lock_status shows an owner of
 * exactly the keys redis_lock_force_release deletes); rl_inspect_reply
 * makes the same checks on the script-free inspect's answers, which the
 * script-free force release reads too.  lock_owners(k) returns the key's
 * type, and for a lock also its pttl, its owner and, for a read-write lock,
 * its mode.  A lock has a TTL and is a string holding an owner value
 * (rl_is_lock_value: at most RL_LOCK_VALUE_MAX bytes of letters, digits and
 * "+-./:=@_", and not a decimal integer of at most 20 bytes, a counter such
 * as a semaphore's count), or a hash as Redisson's layouts write it (at
 * most RL_LOCK_FIELDS_MAX fields, each "<uuid>:<thread id>" or a writer's
 * "<uuid>:<thread id>:write" holding a positive count, or "mode" = "read"
 * or "write", with writers exactly when the mode is "write"); its owner is
 * then the holder fields, a writer's first.  A value is read only once its
 * length is known to be small, and a hash only once it has few fields: the
 * script's work is bounded too.
 */
#define LOCK_OWNERS_LUA \
"local function lock_owners(k)\n" \
"  local t = redis.call('type', k)['ok']\n" \
"  local p = redis.call('pttl', k)\n" \
"  if p < 0 then return t end\n" \
"  if t == 'string' then\n" \
"    if redis.call('strlen', k) > " CppAsString2(RL_LOCK_VALUE_MAX) " then return t end\n" \
"    local v = redis.call('get', k)\n" \
"    if not string.find(v, '^[0-9A-Za-z%+%-%./:=@_]+$') then return t end\n" \
"    if #v <= 20 and string.find(v, '^%-?%d+$') then return t end\n" \
"    return t, p, v\n" \
"  end\n" \
"  if t ~= 'hash' or redis.call('hlen', k) > " CppAsString2(RL_LOCK_FIELDS_MAX) " then\n" \
"    return t\n" \
"  end\n" \
"  local id = '^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x:%-?(%d+)$'\n" \
"  local kv = redis.call('hgetall', k)\n" \
"  local mode, writers, owners = nil, 0, {}\n" \
"  for i = 1, #kv, 2 do\n" \
"    local f, v = kv[i], kv[i + 1]\n" \
"    if f == 'mode' then\n" \
"      if v ~= 'read' and v ~= 'write' then return t end\n" \
"      mode = v\n" \
"    else\n" \
"      local h, w = f, string.sub(f, -6) == ':write'\n" \
"      if w then h = string.sub(f, 1, -7) end\n" \
"      local tid = string.match(h, id)\n" \
"      if not tid or #tid > 19 or #v > 19 or not string.find(v, '^[1-9]%d*$') then\n" \
"        return t\n" \
"      end\n" \
"      if w then\n" \
"        writers = writers + 1\n" \
"        table.insert(owners, 1, f)\n" \
"      else\n" \
"        owners[#owners + 1] = f\n" \
"      end\n" \
"    end\n" \
"  end\n" \
"  if #owners == 0 or (writers > 0) ~= (mode == 'write') then return t end\n" \
"  return t, p, owners, mode\n" \
"end\n"

/*
 * Force release, every layout.  KEYS: lock.  ARGV: publish command,
 * expected type, channel, read-write lock channel, fair queue ("": none),
 * fair timeout set, now (Unix ms).  Only a lock (lock_owners) is deleted:
 * a key of another type, or of the layout's type that is not a lock
 * (another application's value or hash, a counter such as a Redisson
 * semaphore's count of free permits), is answered {-1, its type} and left
 * as it is.  A read-write lock is deleted whatever the protocol, and its
 * waiters are all woken ("1", as Redisson's forceUnlock of a write lock
 * does, then "0": see rw_write_release_lua).  Under redisson_fair the
 * queue's heads whose time has passed leave it first, as in Redisson's
 * forceUnlock, and the live head is woken on its own channel.
 */
static const char *force_lua =
LOCK_OWNERS_LUA
"local t, p, owner, mode = lock_owners(KEYS[1])\n"
"if t == 'none' then return 0 end\n"
"if owner and mode then\n"
"  redis.call('del', KEYS[1])\n"
"  redis.call(ARGV[1], ARGV[4], '1')\n"
"  redis.call(ARGV[1], ARGV[4], '0')\n"
"  return 1\n"
"end\n"
"if t ~= ARGV[2] or not owner then return {-1, t} end\n"
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
 * Inspect.  KEYS: lock.  Returns {type, pttl, owner} for a lock of any
 * layout (lock_owners), {type} for anything else (rl_inspect_reply_valid):
 * nothing of a key that is not a lock leaves the server.
 */
static const char *inspect_lua =
LOCK_OWNERS_LUA
"local t, p, owner = lock_owners(KEYS[1])\n"
"if not owner then return {t} end\n"
"return {t, p, owner}\n";

/*
 * Read-write locks: Redisson's RReadWriteLock layout
 * (doc/rwlock-fairlock.md).  One hash per lock: field "mode" is "read" or "write"; a reader's
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
 * reader field, the field of our write hold of the lock or "" (a writer may
 * also read: RLLockNames.writer).  Every grant has a field of its own
 * (rl_mint_owner), so a read beside our write hold has another field than
 * the write's; a Redisson client reads either as a holder.
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
 * locks, then their n slots' fence counters, then (fence flag "2") their
 * n per-name counters.  ARGV: fence flag (as redisson_acquire_lua's), then
 * for each key our field (each grant has its own, rl_mint_owner), lease ms
 * and held flag.
 */
static const char *redisson_acquire_many_lua =
REDISSON_TOKEN_LUA
"local n = #KEYS / 2\n"
"if ARGV[1] == '2' then n = #KEYS / 3 end\n"
"for i = 1, n do\n"
"  local b = 1 + 3 * (i - 1)\n"
"  local t = redis.call('type', KEYS[i])['ok']\n"
"  if t == 'none' then\n"
"    if ARGV[b + 3] == '1' then return {-2, i} end\n"
"  elseif t ~= 'hash' then\n"
"    return {-1, i, t}\n"
"  elseif redis.call('hexists', KEYS[i], 'mode') == 1 then\n"
"    return {-1, i, 'read-write lock'}\n"
"  elseif redis.call('hexists', KEYS[i], ARGV[b + 1]) == 0 then\n"
"    if ARGV[b + 3] == '1' then return {-2, i} end\n"
"    return {0, i, redis.call('pttl', KEYS[i]), 1}\n"
"  end\n"
"end\n"
"local out = {1}\n"
"local floor = 0\n"
"for i = 1, n do\n"
"  local b = 1 + 3 * (i - 1)\n"
"  if redis.call('hexists', KEYS[i], ARGV[b + 1]) == 0 then\n"
"    redis.call('hincrby', KEYS[i], ARGV[b + 1], 1)\n"
"  end\n"
"  redis.call('pexpire', KEYS[i], ARGV[b + 2])\n"
"  local f = 0\n"
"  if ARGV[b + 3] ~= '1' and ARGV[1] ~= '0' then\n"
"    local nc = nil\n"
"    if ARGV[1] == '2' then nc = KEYS[2 * n + i] end\n"
"    f = token(KEYS[n + i], nc, floor)\n"
"    floor = f\n"
"  end\n"
"  out[i + 1] = f\n"
"end\n"
"return out\n";

/*
 * Name (for messages) and body of every lock layout's script into table,
 * which is indexed by RLScriptId (the SHA1s are scripts.c's).
 */
void
rl_lock_scripts_define(RLScript *table)
{
	table[RL_SCRIPT_SIMPLE_ACQUIRE].name = "simple acquire";
	table[RL_SCRIPT_SIMPLE_ACQUIRE].body = simple_acquire_lua;
	table[RL_SCRIPT_SIMPLE_RELEASE].name = "simple release";
	table[RL_SCRIPT_SIMPLE_RELEASE].body = simple_release_lua;
	table[RL_SCRIPT_SIMPLE_EXTEND].name = "simple extend";
	table[RL_SCRIPT_SIMPLE_EXTEND].body = simple_extend_lua;
	table[RL_SCRIPT_REDISSON_ACQUIRE].name = "redisson acquire";
	table[RL_SCRIPT_REDISSON_ACQUIRE].body = redisson_acquire_lua;
	table[RL_SCRIPT_REDISSON_RELEASE].name = "redisson release";
	table[RL_SCRIPT_REDISSON_RELEASE].body = redisson_release_lua;
	table[RL_SCRIPT_REDISSON_EXTEND].name = "redisson extend";
	table[RL_SCRIPT_REDISSON_EXTEND].body = redisson_extend_lua;
	table[RL_SCRIPT_FAIR_ACQUIRE].name = "fair acquire";
	table[RL_SCRIPT_FAIR_ACQUIRE].body = fair_acquire_lua;
	table[RL_SCRIPT_FAIR_RELEASE].name = "fair release";
	table[RL_SCRIPT_FAIR_RELEASE].body = fair_release_lua;
	table[RL_SCRIPT_FAIR_DEQUEUE].name = "fair dequeue";
	table[RL_SCRIPT_FAIR_DEQUEUE].body = fair_dequeue_lua;
	table[RL_SCRIPT_RW_READ_ACQUIRE].name = "read-write lock read acquire";
	table[RL_SCRIPT_RW_READ_ACQUIRE].body = rw_read_acquire_lua;
	table[RL_SCRIPT_RW_READ_RELEASE].name = "read-write lock read release";
	table[RL_SCRIPT_RW_READ_RELEASE].body = rw_read_release_lua;
	table[RL_SCRIPT_RW_READ_EXTEND].name = "read-write lock read extend";
	table[RL_SCRIPT_RW_READ_EXTEND].body = rw_read_extend_lua;
	table[RL_SCRIPT_RW_WRITE_ACQUIRE].name = "read-write lock write acquire";
	table[RL_SCRIPT_RW_WRITE_ACQUIRE].body = rw_write_acquire_lua;
	table[RL_SCRIPT_RW_WRITE_RELEASE].name = "read-write lock write release";
	table[RL_SCRIPT_RW_WRITE_RELEASE].body = rw_write_release_lua;
	table[RL_SCRIPT_RW_WRITE_EXTEND].name = "read-write lock write extend";
	table[RL_SCRIPT_RW_WRITE_EXTEND].body = rw_write_extend_lua;
	table[RL_SCRIPT_FORCE].name = "force release";
	table[RL_SCRIPT_FORCE].body = force_lua;
	table[RL_SCRIPT_INSPECT].name = "inspect";
	table[RL_SCRIPT_INSPECT].body = inspect_lua;
	table[RL_SCRIPT_SIMPLE_ACQUIRE_MANY].name = "simple acquire many";
	table[RL_SCRIPT_SIMPLE_ACQUIRE_MANY].body = simple_acquire_many_lua;
	table[RL_SCRIPT_REDISSON_ACQUIRE_MANY].name = "redisson acquire many";
	table[RL_SCRIPT_REDISSON_ACQUIRE_MANY].body = redisson_acquire_many_lua;
}
