/*-------------------------------------------------------------------------
 *
 * semscripts.c
 *	  Owns the Lua scripts of the semaphore layouts: Redisson's
 *	  RPermitExpirableSemaphore and redis-semaphore's (npm);
 *	  rl_sem_scripts_define puts them in scripts.c's table, which sends
 *	  them.  They follow the rules of lockscripts.c's: idempotent for a
 *	  given owner, every check before the first write.
 *
 *	  Must not: hold anything but Lua text and the table entries naming
 *	  it; build calls or decode replies.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/redis/semscripts.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "redis/redis_int.h"

/*
 * Semaphores, Redisson's RPermitExpirableSemaphore layout
 * (doc/semaphores.md): the key holds the count of free permits (a decimal
 * integer), "{key}:timeout" (Redisson's suffix rule) is a sorted set of
 * the permits taken, each a 16-byte id scored with its expiry in Unix ms
 * by the clock of the client that took it.  Any client's next script puts
 * an expired permit back (the count goes up, and "redisson_sc:{key}" is
 * told the new count, as Redisson's scripts do); nothing in Redis does it
 * by itself.  RSemaphore takes and gives back from the same count,
 * without ids.  Our holder's permits are its owner value's 14 bytes (28
 * hex digits) and a 2-byte index, all with one score, so one owner value
 * names them all and every script is idempotent for it: a permit is
 * counted back only when its id was removed, so no script ever makes a
 * permit that was not taken.  Scripts check the types (and that the count
 * is an integer) before they write.
 *
 * Each script starts with this prelude.  KEYS: count, timeout set.
 */
#define RL_SEM_PRELUDE \
"local function ids(o, k)\n" \
"  local b = ''\n" \
"  for i = 1, #o, 2 do b = b .. string.char(tonumber(string.sub(o, i, i + 1), 16)) end\n" \
"  local t = {}\n" \
"  for i = 0, k - 1 do t[#t + 1] = b .. string.char(math.floor(i / 256), i % 256) end\n" \
"  return t\n" \
"end\n" \
"local function foreign()\n" \
"  local t = redis.call('type', KEYS[1])['ok']\n" \
"  if t ~= 'none' and t ~= 'string' then return KEYS[1] .. ' holds a ' .. t end\n" \
"  if t == 'string' and (redis.call('strlen', KEYS[1]) > 18 or\n" \
"      not string.find(redis.call('get', KEYS[1]), '^%-?%d+$')) then\n" \
"    return KEYS[1] .. ' holds a string that is not a count'\n" \
"  end\n" \
"  local z = redis.call('type', KEYS[2])['ok']\n" \
"  if z ~= 'none' and z ~= 'zset' then return KEYS[2] .. ' holds a ' .. z end\n" \
"  return nil\n" \
"end\n" \
"local function reclaim(now, pub, ch)\n" \
"  local e = redis.call('zrangebyscore', KEYS[2], 0, now, 'limit', 0, 1000)\n" \
"  if #e > 0 then\n" \
"    redis.call('zrem', KEYS[2], unpack(e))\n" \
"    local v = redis.call('incrby', KEYS[1], #e)\n" \
"    if v > 0 then redis.call(pub, ch, v) end\n" \
"  end\n" \
"end\n" \
"local function present(mine)\n" \
"  for _, id in ipairs(mine) do\n" \
"    if not redis.call('zscore', KEYS[2], id) then return false end\n" \
"  end\n" \
"  return true\n" \
"end\n"

/*
 * acquire.  ARGV: owner, permits, now, expiry (now + lease), publish
 * command, channel.  {1, 0} granted (also when our permits are there
 * already: a retry), {0, ms to the nearest expiry or -1, 1} busy (a
 * release publishes), {-1, type} when a key is of another kind.
 */
static const char *sem_acquire_lua =
RL_SEM_PRELUDE
"local bad = foreign()\n"
"if bad then return {-1, bad} end\n"
"reclaim(ARGV[3], ARGV[5], ARGV[6])\n"
"local mine = ids(ARGV[1], tonumber(ARGV[2]))\n"
"if redis.call('zscore', KEYS[2], mine[1]) then\n"
"  for _, id in ipairs(mine) do redis.call('zadd', KEYS[2], 'XX', ARGV[4], id) end\n"
"  return {1, 0}\n"
"end\n"
"local v = redis.call('get', KEYS[1])\n"
"if v and tonumber(v) >= #mine then\n"
"  redis.call('decrby', KEYS[1], #mine)\n"
"  for _, id in ipairs(mine) do redis.call('zadd', KEYS[2], ARGV[4], id) end\n"
"  local ttl = redis.call('pttl', KEYS[1])\n"
"  if ttl > 0 then redis.call('pexpire', KEYS[2], ttl) end\n"
"  return {1, 0}\n"
"end\n"
"local h = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')\n"
"if h[1] and h[2] ~= '922337203685477' then\n"
"  return {0, math.max(tonumber(h[2]) - tonumber(ARGV[3]), 1), 1}\n"
"end\n"
"return {0, -1, 1}\n";

/*
 * release.  ARGV: owner, permits, publish command, channel.  Only our own
 * ids are removed, and only what was removed is counted back; 1 when all
 * of them were there, 0 when some were not (lost: another client put
 * them back once they expired).
 */
static const char *sem_release_lua =
RL_SEM_PRELUDE
"if foreign() then return 0 end\n"
"local mine = ids(ARGV[1], tonumber(ARGV[2]))\n"
"local n = redis.call('zrem', KEYS[2], unpack(mine))\n"
"if n == 0 then return 0 end\n"
"redis.call(ARGV[3], ARGV[4], redis.call('incrby', KEYS[1], n))\n"
"if n < #mine then return 0 end\n"
"return 1\n";

/*
 * extend / verify / renew.  ARGV: owner, permits, now, expiry, renew
 * flag, publish command, channel.  Expired permits go back first (ours
 * too: then it is lost); 0 when any of ours is gone, else 2 + what was
 * left of their lease.
 */
static const char *sem_extend_lua =
RL_SEM_PRELUDE
"if foreign() then return 0 end\n"
"reclaim(ARGV[3], ARGV[6], ARGV[7])\n"
"local mine = ids(ARGV[1], tonumber(ARGV[2]))\n"
"if not present(mine) then return 0 end\n"
"local s = tonumber(redis.call('zscore', KEYS[2], mine[1]))\n"
"if ARGV[5] ~= '1' or s < tonumber(ARGV[4]) then\n"
"  for _, id in ipairs(mine) do redis.call('zadd', KEYS[2], 'XX', ARGV[4], id) end\n"
"end\n"
"return math.max(s - tonumber(ARGV[3]), -1) + 2\n";

/*
 * status, read only.  ARGV: now.  {exists, free, taken}: free counts the
 * expired permits too (the next script puts them back), taken the others;
 * {-1, type} for a key of another kind.
 */
static const char *sem_status_lua =
RL_SEM_PRELUDE
"local bad = foreign()\n"
"if bad then return {-1, bad} end\n"
"local held = redis.call('zcount', KEYS[2], '(' .. ARGV[1], '+inf')\n"
"local v = redis.call('get', KEYS[1])\n"
"if not v then return {0, 0, held} end\n"
"return {1, tonumber(v) + redis.call('zcount', KEYS[2], 0, ARGV[1]), held}\n";

/*
 * set up: Redisson's trySetPermits.  ARGV: permits, publish command,
 * channel.  1 when the count was set, 0 when the semaphore had one.
 */
static const char *sem_setup_lua =
RL_SEM_PRELUDE
"local bad = foreign()\n"
"if bad then return {-1, bad} end\n"
"if redis.call('exists', KEYS[1]) == 1 then return 0 end\n"
"redis.call('set', KEYS[1], ARGV[1])\n"
"redis.call(ARGV[2], ARGV[3], ARGV[1])\n"
"return 1\n";

/*
 * Semaphores, redis-semaphore's layout (npm, doc/semaphores.md): one
 * sorted set whose members are the holders' identifiers scored with when
 * they took or last refreshed their permit, in Unix ms by their own
 * clock.  A member older than the lease of the client looking is stale
 * and removed before counting; the limit is each client's to pass, none
 * is stored; nothing is published.  Our holder's permits are
 * "<owner>_<index>", as the package's MultiSemaphore names its own.
 *
 * Prelude.  KEYS: the set.
 */
#define RL_NPM_PRELUDE \
"local function ids(o, k)\n" \
"  local t = {}\n" \
"  for i = 0, k - 1 do t[#t + 1] = o .. '_' .. i end\n" \
"  return t\n" \
"end\n" \
"local function foreign()\n" \
"  local t = redis.call('type', KEYS[1])['ok']\n" \
"  if t ~= 'none' and t ~= 'zset' then return KEYS[1] .. ' holds a ' .. t end\n" \
"  return nil\n" \
"end\n" \
"local function present(mine)\n" \
"  for _, id in ipairs(mine) do\n" \
"    if not redis.call('zscore', KEYS[1], id) then return false end\n" \
"  end\n" \
"  return true\n" \
"end\n" \
"local function keep(lease)\n" \
"  if redis.call('pttl', KEYS[1]) < tonumber(lease) then\n" \
"    redis.call('pexpire', KEYS[1], lease)\n" \
"  end\n" \
"end\n"

/*
 * acquire.  ARGV: owner, permits, limit, lease, now, now - lease.  As
 * sem_acquire_lua's replies; busy: until the oldest member goes stale by
 * our lease, and 0: nobody publishes.
 */
static const char *npm_acquire_lua =
RL_NPM_PRELUDE
"local bad = foreign()\n"
"if bad then return {-1, bad} end\n"
"redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[6])\n"
"local mine = ids(ARGV[1], tonumber(ARGV[2]))\n"
"if redis.call('zscore', KEYS[1], mine[1]) then\n"
"  for _, id in ipairs(mine) do redis.call('zadd', KEYS[1], 'XX', ARGV[5], id) end\n"
"  keep(ARGV[4])\n"
"  return {1, 0}\n"
"end\n"
"if redis.call('zcard', KEYS[1]) + #mine <= tonumber(ARGV[3]) then\n"
"  for _, id in ipairs(mine) do redis.call('zadd', KEYS[1], ARGV[5], id) end\n"
"  keep(ARGV[4])\n"
"  return {1, 0}\n"
"end\n"
"local h = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')\n"
"if not h[1] then return {0, -1, 0} end\n"
"return {0, math.max(tonumber(h[2]) - tonumber(ARGV[6]), 1), 0}\n";

/* release.  ARGV: owner, permits.  1 when all were there, else 0. */
static const char *npm_release_lua =
RL_NPM_PRELUDE
"if foreign() then return 0 end\n"
"local mine = ids(ARGV[1], tonumber(ARGV[2]))\n"
"if redis.call('zrem', KEYS[1], unpack(mine)) < #mine then return 0 end\n"
"return 1\n";

/*
 * extend / verify / renew.  ARGV: owner, permits, lease, renew flag, now.
 * A member still there was counted by every script that ran since it was
 * scored (none removed it), so scoring it now keeps the limit; 0 when any
 * of ours is gone, else 2 + what was left of the lease by our lease.
 */
static const char *npm_extend_lua =
RL_NPM_PRELUDE
"if foreign() then return 0 end\n"
"local mine = ids(ARGV[1], tonumber(ARGV[2]))\n"
"if not present(mine) then return 0 end\n"
"local s = tonumber(redis.call('zscore', KEYS[1], mine[1]))\n"
"if ARGV[4] ~= '1' or s < tonumber(ARGV[5]) then\n"
"  for _, id in ipairs(mine) do redis.call('zadd', KEYS[1], 'XX', ARGV[5], id) end\n"
"end\n"
"keep(ARGV[3])\n"
"return math.max(s + tonumber(ARGV[3]) - tonumber(ARGV[5]), -1) + 2\n";

/*
 * status, read only.  ARGV: now - lease.  {exists, -1, taken}: the free
 * count is the caller's limit less taken.
 */
static const char *npm_status_lua =
RL_NPM_PRELUDE
"local bad = foreign()\n"
"if bad then return {-1, bad} end\n"
"return {redis.call('exists', KEYS[1]), -1,\n"
"        redis.call('zcount', KEYS[1], '(' .. ARGV[1], '+inf')}\n";

/*
 * Name (for messages) and body of every semaphore layout's script into table,
 * which is indexed by RLScriptId (the SHA1s are scripts.c's).
 */
void
rl_sem_scripts_define(RLScript *table)
{
	table[RL_SCRIPT_SEM_ACQUIRE].name = "redisson semaphore acquire";
	table[RL_SCRIPT_SEM_ACQUIRE].body = sem_acquire_lua;
	table[RL_SCRIPT_SEM_RELEASE].name = "redisson semaphore release";
	table[RL_SCRIPT_SEM_RELEASE].body = sem_release_lua;
	table[RL_SCRIPT_SEM_EXTEND].name = "redisson semaphore extend";
	table[RL_SCRIPT_SEM_EXTEND].body = sem_extend_lua;
	table[RL_SCRIPT_SEM_STATUS].name = "redisson semaphore status";
	table[RL_SCRIPT_SEM_STATUS].body = sem_status_lua;
	table[RL_SCRIPT_SEM_SETUP].name = "redisson semaphore set up";
	table[RL_SCRIPT_SEM_SETUP].body = sem_setup_lua;
	table[RL_SCRIPT_NPM_ACQUIRE].name = "redis-semaphore acquire";
	table[RL_SCRIPT_NPM_ACQUIRE].body = npm_acquire_lua;
	table[RL_SCRIPT_NPM_RELEASE].name = "redis-semaphore release";
	table[RL_SCRIPT_NPM_RELEASE].body = npm_release_lua;
	table[RL_SCRIPT_NPM_EXTEND].name = "redis-semaphore extend";
	table[RL_SCRIPT_NPM_EXTEND].body = npm_extend_lua;
	table[RL_SCRIPT_NPM_STATUS].name = "redis-semaphore status";
	table[RL_SCRIPT_NPM_STATUS].body = npm_status_lua;
}
