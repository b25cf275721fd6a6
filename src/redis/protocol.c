/*-------------------------------------------------------------------------
 *
 * protocol.c
 *	  Owns the names of the wire layouts: the keys and channels one lock
 *	  touches under each protocol (with their Redis Cluster hash tags),
 *	  owner values (made only by rl_mint_owner, fresh for every grant),
 *	  the owner forms of every client's locks (what
 *	  redis_lock_status takes for a lock), the pub/sub commands, and the
 *	  arguments every form of an operation shares.  The bottom of the wire layouts: scripts.c,
 *	  scriptfree.c and replies.c build on it (redis_int.h).
 *
 *	  Must not: build or send commands (scripts.c and scriptfree.c build
 *	  them, transport.c sends them), decode replies (replies.c), keep state
 *	  about held locks or waits.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/redis/protocol.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/memutils.h"

#include "net/net.h"
#include "redis/redis_int.h"

/* for each cluster slot, a short tag whose slot it is (fence counters) */
static char (*slot_tags)[6] = NULL;

void
rl_hex_encode(const uint8 *in, int n, char *out)
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
char *
rl_redisson_prefix_name(const char *prefix, const char *key)
{
	if (strchr(key, '{') != NULL)
		return psprintf("%s:%s", prefix, key);
	return psprintf("%s:{%s}", prefix, key);
}

/*
 * What a read-write lock's timeout keys start with: the key, braced unless
 * it has a "{" (Redisson's suffix rule), so they share the key's slot.
 */
char *
rl_rw_timeout_prefix(const char *key)
{
	if (strchr(key, '{') != NULL)
		return pstrdup(key);
	return psprintf("{%s}", key);
}

/*
 * Would the keys Redisson's naming puts beside this key (its per-name token
 * counter, fair queue, read timeout keys) fall in other Cluster hash slots?
 * They do when the key has a "{" but no complete hash tag: the names then
 * hash whole.  Our own fence counters are named for the key's slot
 * (slot_fence_key), and a write hold touches one key (and one channel, a
 * concern only for sharded pub/sub).
 */
bool
rl_key_splits_slots(RLProtocol protocol, const char *key)
{
	/*
	 * A write hold's release publishes on redisson_rwlock:<key>, which with
	 * sharded pub/sub must be in the key's slot too
	 */
	if (protocol == RL_PROTOCOL_SIMPLE || protocol == RL_PROTOCOL_SEM_NPM ||
		(protocol == RL_PROTOCOL_RW_WRITE && !rl_sharded_pubsub))
		return false;
	return strchr(key, '{') != NULL && !has_hash_tag(key, strlen(key));
}

/* A fair lock's queue (a list of owners) and timeout set */
char *
rl_fair_queue_key(const RLLockNames *n)
{
	return rl_redisson_prefix_name("redisson_lock_queue", n->key);
}

char *
rl_fair_timeout_key(const RLLockNames *n)
{
	return rl_redisson_prefix_name("redisson_lock_timeout", n->key);
}

/*
 * Now as Unix milliseconds: the clock fair-lock waiters' times and
 * semaphore permits' expiries are kept in
 */
int64
rl_unix_ms(void)
{
	TimestampTz now = GetCurrentTimestamp();

	return now / 1000 +
		(int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000;
}

char *
rl_unix_ms_text(void)
{
	return psprintf(INT64_FORMAT, rl_unix_ms());
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

/*
 * A Redisson semaphore's set of permits taken: "{key}:timeout", or
 * "key:timeout" when the key has a "{" (Redisson's suffix rule)
 */
char *
rl_sem_timeout_key(const RLLockNames *n)
{
	return psprintf("%s:timeout", rl_rw_timeout_prefix(n->key));
}

/* The timeout key of our one read hold: count 1, so suffix ":1" */
char *
rl_rw_read_timeout_key(const RLLockNames *n)
{
	return psprintf("%s:%s:rwlock_timeout:1", rl_rw_timeout_prefix(n->key),
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
 * The fence counter of the key's Cluster slot under this prefix:
 * prefix || 'redis_lock:fence:{T}', T a short tag of that slot, so the
 * counter lives beside the lock and there are at most 16384 of them per
 * prefix whatever the number of lock names.  The simple, redisson and
 * redisson_fair layouts share it.
 */
static char *
slot_fence_key(const char *prefix, const char *key, size_t keylen)
{
	uint16		slot = rl_key_slot(key, keylen);
	char	   *fence_key;

	if (slot_tags == NULL)
		build_slot_tags();
	fence_key = concat4(prefix ? prefix : "", RL_FENCE_MARKER "{",
						slot_tags[slot], "}");
	/* a hash tag inside the prefix decides the slot of both keys */
	Assert(rl_key_slot(fence_key, strlen(fence_key)) == slot);
	return fence_key;
}

/*
 * Redisson's RFencedLock counter of a lock, redisson_lock_token:{key}: one
 * permanent key per lock name, counted too when the lock was taken with
 * redis_lock.redisson_token_counter on (RLLockNames.name_counter).
 */
char *
rl_name_counter_key(const RLLockNames *n)
{
	return rl_redisson_prefix_name("redisson_lock_token", n->key);
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
	names->name_counter = false;
	names->release_channel = NULL;

	if (protocol == RL_PROTOCOL_REDISSON || protocol == RL_PROTOCOL_REDISSON_FAIR)
	{
		names->channel = rl_redisson_prefix_name("redisson_lock__channel", names->key);
		names->fence_key = slot_fence_key(prefix, names->key, names->keylen);
		names->name_counter = rl_redisson_token_counter;
	}
	else if (protocol == RL_PROTOCOL_SEM_REDISSON)
	{
		/* semaphores have no fencing tokens */
		names->channel = rl_redisson_prefix_name("redisson_sc", names->key);
		names->fence_key = NULL;
	}
	else if (protocol == RL_PROTOCOL_SEM_NPM)
	{
		/* redis-semaphore publishes nothing: waiters poll */
		names->channel = concat4("redis_lock:release:{", names->key, "}", "");
		names->fence_key = NULL;
	}
	else if (RL_PROTOCOL_IS_RW(protocol))
	{
		/* read-write locks have no fencing tokens */
		names->channel = rl_redisson_prefix_name("redisson_rwlock", names->key);
		names->fence_key = NULL;
	}
	else
	{
		if (has_hash_tag(names->key, names->keylen))
			names->channel = concat4("redis_lock:release:", names->key, "", "");
		else
			names->channel = concat4("redis_lock:release:{", names->key, "}", "");
		names->fence_key = slot_fence_key(prefix, names->key, names->keylen);
	}
}

/*
 * What a Redis key must not contain to be a lock's key: the marks of the
 * keys that locks use beside their own, ours and Redisson's.  A lock key
 * equal to one of them would take its place: a string lock where a fence
 * counter should be makes every acquire in that slot fail with WRONGTYPE,
 * a hash where a fair queue should be breaks that lock's queue.  Each
 * such key contains its mark whatever the key prefix (which only ever
 * comes first), so refusing every key that contains one, anywhere, also
 * covers a role whose prefix differs from the owner's of the key (roles
 * of several prefixes may share one Redis user) and a mark that the
 * prefix and the name make only together.
 */
static const char *const reserved_marks[] = {
	RL_FENCE_MARKER,			/* our fence counters, every prefix */
	"redisson_lock_token:",		/* RFencedLock's counter (and ours, with
								 * redis_lock.redisson_token_counter) */
	"redisson_lock_queue:",		/* RFairLock's queue */
	"redisson_lock_timeout:",	/* RFairLock's timeout set */
	":rwlock_timeout:",			/* RReadWriteLock's read hold timeouts */
	"redisson_unlock_latch:",	/* RLock's unlock results (Redisson 3.2x+) */
};

/*
 * The reserved mark (above) that prefix || name contains, or NULL when the
 * key may be a lock's.  Checked on every lock name a SQL function is given
 * (functions.c), before anything is built or sent.
 */
const char *
rl_reserved_mark(const char *prefix, const char *name)
{
	char	   *key = concat4(prefix ? prefix : "", name, "", "");
	const char *found = NULL;

	/* every mark has a ':', most names do not */
	if (strchr(key, ':') != NULL)
	{
		size_t		len = strlen(key);

		for (size_t i = 0; i < lengthof(reserved_marks) && found == NULL; i++)
			if (strstr(key, reserved_marks[i]) != NULL)
				found = reserved_marks[i];

		/*
		 * A Redisson semaphore's set of permits taken, "{K}:timeout" (or
		 * "K:timeout" when K has a "{"): it exists only while permits are
		 * taken, and a lock there would refuse the semaphore to everyone
		 * (SQL and Redisson) for as long as it is held.  Matched by its
		 * shape, a "{" and the ":timeout" end, not by a substring.
		 */
		if (found == NULL && strchr(key, '{') != NULL && len >= 8 &&
			strcmp(key + len - 8, ":timeout") == 0)
			found = "{...}:timeout";
	}
	pfree(key);
	return found;
}

/*
 * Fill names for a Redis key (prefix already applied) under the given
 * protocol; prefix is needed again for the fence counter's name.  The
 * strings are allocated in cxt; owner is left empty (see rl_mint_owner).
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
 * Names for lock_name under the current protocol, key prefix, scripting and
 * release channel prefix settings.  With redis_lock.scripting off only the simple layout has a form
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
	if (protocol == RL_PROTOCOL_SIMPLE && rl_release_channel_prefix != NULL &&
		rl_release_channel_prefix[0] != '\0')
		names->release_channel = concat4(rl_release_channel_prefix, names->key,
										 "", "");
	MemoryContextSwitchTo(old);
}

/*
 * Random bits of owner values, drawn from pg_strong_random a pool
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
					 errmsg("could not generate a random owner value for a Redis lock")));
		next = 0;
		pool_pid = MyProcPid;
	}
	r = &pool[next * RL_TOKEN_BYTES];
	next++;
	return r;
}

/*
 * A Redisson holder field never made before in this process: "<uuid>:<pid>",
 * Redisson's "<client uuid>:<thread id>" with the backend's pid as thread
 * id.  The UUID's first 10 bytes are random, drawn once per process (again
 * if its 48-bit serial ever ran out); its last 6 bytes are that serial,
 * which counts every field made.  So no two calls of one process return
 * the same field, by construction, whatever became of the earlier ones.
 */
#define RL_FIELD_SERIAL_MAX	UINT64CONST(0xffffffffffff)

static void
mint_redisson_field(char *field, size_t size)
{
	static uint8 base[10];
	static uint64 serial = RL_FIELD_SERIAL_MAX;
	static int	base_pid = 0;
	uint8		u[16];
	char		h[33];
	int			i;

	if (serial >= RL_FIELD_SERIAL_MAX || base_pid != MyProcPid)
	{
		memcpy(base, token_random_bytes(), sizeof(base));
		base_pid = MyProcPid;
		serial = 0;
	}
	serial++;
	memcpy(u, base, sizeof(base));
	for (i = 0; i < 6; i++)
		u[10 + i] = (uint8) (serial >> (8 * (5 - i)));
	u[6] = (u[6] & 0x0f) | 0x40;	/* version 4 */
	u[8] = (u[8] & 0x3f) | 0x80;	/* variant */
	rl_hex_encode(u, 16, h);
	snprintf(field, size, "%.8s-%.4s-%.4s-%.4s-%.12s:%d",
			 h, h + 8, h + 12, h + 16, h + 20, MyProcPid);
}

/*
 * A semaphore holder's owner value, fresh for every call: the permits it
 * takes are named from it (semscripts.c).  redisson_semaphore: 112 random bits
 * as 28 hex digits, each permit id those 14 bytes and a 2-byte index (16
 * raw bytes, as Redisson's ids are); redis_semaphore: a version 4 UUID as
 * crypto.randomUUID() makes them, each member "<uuid>_<index>", as the
 * package's MultiSemaphore names its own.
 */
static void
new_semaphore_owner(RLProtocol protocol, char *owner)
{
	const uint8 *r = token_random_bytes();

	if (protocol == RL_PROTOCOL_SEM_REDISSON)
		rl_hex_encode(r, 14, owner);
	else
	{
		uint8		u[16];
		char		h[33];

		memcpy(u, r, sizeof(u));
		u[6] = (u[6] & 0x0f) | 0x40;	/* version 4 */
		u[8] = (u[8] & 0x3f) | 0x80;	/* variant */
		rl_hex_encode(u, 16, h);
		snprintf(owner, RL_OWNER_LEN + 1, "%.8s-%.4s-%.4s-%.4s-%.12s",
				 h, h + 8, h + 12, h + 16, h + 20);
	}
}

/*
 * The owner value of a new grant, under every layout: the one place owner
 * values are made (doc/failures.md, "Owner values").  Called for each new
 * entry of the lock table and for each retry of a doubt, never for a
 * reentrant hold, which keeps its grant's value.  Fresh every call, and
 * without remembering anything of earlier grants: a command of an earlier
 * grant still on its way (a release whose reply was lost, an acquire that
 * lands late) can never match it.  simple: the marker and 128 random bits
 * as hex; semaphores: new_semaphore_owner; Redisson's lock layouts: a
 * field of mint_redisson_field, with ":write" for a write hold.
 */
void
rl_mint_owner(RLProtocol protocol, char *owner)
{
	char		field[RL_OWNER_LEN + 1];

	if (RL_PROTOCOL_IS_SEM(protocol))
		new_semaphore_owner(protocol, owner);
	else if (protocol == RL_PROTOCOL_SIMPLE)
	{
		memcpy(owner, RL_TOKEN_MARKER, strlen(RL_TOKEN_MARKER));
		rl_hex_encode(token_random_bytes(), RL_TOKEN_BYTES,
					  owner + strlen(RL_TOKEN_MARKER));
	}
	else
	{
		mint_redisson_field(field, sizeof(field));
		snprintf(owner, RL_OWNER_LEN + 1, "%s%s", field,
				 protocol == RL_PROTOCOL_RW_WRITE ? ":write" : "");
	}
}

/*
 * The owner forms redis_lock_status() reports (doc/reference.md,
 * "redis_lock_status"); a key in no such form is not taken for a lock, and
 * nothing of it is shown, nor deleted by a force release.  The inspect and
 * force-release scripts (lockscripts.c, lock_owners) make the same checks in
 * Lua, so that a foreign value never leaves the server.
 */

static bool
is_hex_digit(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/*
 * Is this a decimal integer of at most 20 bytes (an optional "-" and
 * digits): what INCR leaves, a counter such as a semaphore's count of free
 * permits?  No client's owner value is one.
 */
static bool
is_counter(const char *s, size_t len)
{
	size_t		i = len > 0 && s[0] == '-' ? 1 : 0;

	if (i == len || len > 20)
		return false;
	for (; i < len; i++)
		if (s[i] < '0' || s[i] > '9')
			return false;
	return true;
}

/*
 * Is this a string lock's owner value as the clients of the simple layout
 * write it: 1 to RL_LOCK_VALUE_MAX bytes of ASCII letters, digits and
 * "+-./:=@_", and no counter?  Ours is "pgrl:" and hex, redis-py's and
 * node-redlock's hex, redsync's base64, a hand-written Java lock's a UUID.
 * JSON, text with spaces or quotes, any byte outside ASCII, and a decimal
 * integer are not.
 */
bool
rl_is_lock_value(const char *s, size_t len)
{
	static const char punct[] = "+-./:=@_";
	size_t		i;

	if (len == 0 || len > RL_LOCK_VALUE_MAX || is_counter(s, len))
		return false;
	for (i = 0; i < len; i++)
	{
		char		c = s[i];

		if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
			  (c >= 'a' && c <= 'z') ||
			  (c != '\0' && memchr(punct, c, sizeof(punct) - 1) != NULL)))
			return false;
	}
	return true;
}

/*
 * Is this a holder field of Redisson's lock hashes: "<uuid>:<thread id>"
 * (RLock, RFairLock, a reader of RReadWriteLock; a SQL session writes
 * "<uuid>:<pid>"), or that and ":write" (RReadWriteLock's writer)?  The
 * thread id is a Java long: an optional "-" and 1 to 19 digits.  *writer
 * says whether it is a writer's field.
 */
bool
rl_is_holder_field(const char *s, size_t len, bool *writer)
{
	static const char uuid[] = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
	const size_t ulen = sizeof(uuid) - 1;
	size_t		i;

	*writer = len > 6 && memcmp(s + len - 6, ":write", 6) == 0;
	if (*writer)
		len -= 6;
	/* "<uuid>:", then the thread id */
	if (len < ulen + 2 || len > ulen + 1 + 20 || s[ulen] != ':')
		return false;
	for (i = 0; i < ulen; i++)
		if (uuid[i] == '-' ? s[i] != '-' : !is_hex_digit(s[i]))
			return false;
	i = ulen + 1;
	if (s[i] == '-')
		i++;
	if (i == len || len - i > 19)
		return false;
	for (; i < len; i++)
		if (s[i] < '0' || s[i] > '9')
			return false;
	return true;
}

/*
 * Is this a hold count of a Redisson lock hash's holder field: a positive
 * decimal integer (Redisson counts reentrant holds there)?
 */
bool
rl_is_hold_count(const char *s, size_t len)
{
	size_t		i;

	if (len == 0 || len > 19 || s[0] == '0')
		return false;
	for (i = 0; i < len; i++)
		if (s[i] < '0' || s[i] > '9')
			return false;
	return true;
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

const char *
rl_publish_cmd(void)
{
	return rl_sharded_pubsub ? "SPUBLISH" : "PUBLISH";
}

char *
rl_ms_text(int64 ms)
{
	return psprintf(INT64_FORMAT, ms);
}
