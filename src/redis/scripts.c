/*-------------------------------------------------------------------------
 *
 * scripts.c
 *	  Owns the table of scripts (their names for messages, Lua bodies from
 *	  lockscripts.c and semscripts.c, and SHA1s), EVALSHA with recovery
 *	  from NOSCRIPT, the scripted form of each lock operation, and
 *	  rl_build_unit, which chooses the scripted or the script-free form
 *	  (scriptfree.c) of an operation.  A call may be sent again unchanged:
 *	  every script is idempotent for its owner token (lockscripts.c).
 *
 *	  Must not: decode replies (replies.c), keep state about held locks or
 *	  waits, or decide anything from the answers of several nodes (lockop.c
 *	  does).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/redis/scripts.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <openssl/evp.h>

#include "utils/resowner.h"

#include "net/net.h"
#include "redis/redis_int.h"

static RLScript scripts[RL_SCRIPT_COUNT];

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
	rl_hex_encode(digest, 20, s->sha);
}

/*
 * Fill the script table (names for messages, Lua bodies) at load time; the
 * SHA1s are computed on first use.
 */
void
rl_scripts_init(void)
{
	rl_lock_scripts_define(scripts);
	rl_sem_scripts_define(scripts);
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
 * Calls
 * ----------------------------------------------------------------
 */

/* EVALSHA sha nkeys keys... args... */
void
rl_script_call(RLCall *call, RLConn *conn, RLScriptId id, int nkeys,
			   const char **keys, int nargs, const char **args)
{
	RLScript   *s = &scripts[id];
	static const char *nkeys_text[] = {"0", "1", "2", "3", "4", "5"};
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

			/* an earlier send that may have run is still told (resent) */
			for (j = 0; j < len; j++)
			{
				bool		resent = calls[idx[i] + j].resent;

				calls[idx[i] + j] = again[k++];
				calls[idx[i] + j].resent |= resent;
			}
		}
		pfree(again);
		pfree(idx);
		pfree(reload);
	}
}

/*
 * Set call up as a semaphore's script for kind (its permits, lease, now):
 * both layouts pass the owner and the number of permits first.
 */
static void
sem_call(RLCall *call, RLConn *conn, RLOpKind kind, const RLLockNames *n,
		 int64 lease_ms, bool renew)
{
	const char *keys[2] = {n->key, NULL};
	const char *args[7];
	int64		now_ms = rl_unix_ms();
	const char *now = psprintf(INT64_FORMAT, now_ms);
	const char *lease = rl_ms_text(lease_ms);
	RLScriptId	id;
	int			nargs = 2;

	args[0] = n->owner;
	args[1] = psprintf("%d", n->permits);
	if (n->protocol == RL_PROTOCOL_SEM_REDISSON)
	{
		keys[1] = rl_sem_timeout_key(n);
		switch (kind)
		{
			case RL_OP_ACQUIRE:
				id = RL_SCRIPT_SEM_ACQUIRE;
				args[2] = now;
				args[3] = psprintf(INT64_FORMAT, now_ms + lease_ms);
				args[4] = rl_publish_cmd();
				args[5] = n->channel;
				nargs = 6;
				break;
			case RL_OP_RELEASE:
				id = RL_SCRIPT_SEM_RELEASE;
				args[2] = rl_publish_cmd();
				args[3] = n->channel;
				nargs = 4;
				break;
			case RL_OP_SEM_STATUS:
				id = RL_SCRIPT_SEM_STATUS;
				args[0] = now;
				nargs = 1;
				break;
			case RL_OP_SEM_SETUP:
				id = RL_SCRIPT_SEM_SETUP;
				args[0] = psprintf("%d", n->permits);
				args[1] = rl_publish_cmd();
				args[2] = n->channel;
				nargs = 3;
				break;
			default:
				id = RL_SCRIPT_SEM_EXTEND;
				args[2] = now;
				args[3] = psprintf(INT64_FORMAT, now_ms + lease_ms);
				args[4] = renew ? "1" : "0";
				args[5] = rl_publish_cmd();
				args[6] = n->channel;
				nargs = 7;
				break;
		}
		rl_script_call(call, conn, id, 2, keys, nargs, args);
		return;
	}
	switch (kind)
	{
		case RL_OP_ACQUIRE:
			id = RL_SCRIPT_NPM_ACQUIRE;
			args[2] = psprintf("%d", n->max_permits);
			args[3] = lease;
			args[4] = now;
			args[5] = psprintf(INT64_FORMAT, now_ms - lease_ms);
			nargs = 6;
			break;
		case RL_OP_RELEASE:
			id = RL_SCRIPT_NPM_RELEASE;
			break;
		case RL_OP_SEM_STATUS:
			id = RL_SCRIPT_NPM_STATUS;
			args[0] = psprintf(INT64_FORMAT, now_ms - lease_ms);
			nargs = 1;
			break;
		case RL_OP_SEM_SETUP:
			elog(ERROR, "redis-semaphore has no stored limit to set");
			break;
		default:
			id = RL_SCRIPT_NPM_EXTEND;
			args[2] = lease;
			args[3] = renew ? "1" : "0";
			args[4] = now;
			nargs = 5;
			break;
	}
	rl_script_call(call, conn, id, 1, keys, nargs, args);
}

/*
 * Set call up as the acquire script of n's protocol with this lease; fence
 * asks the script to count a fencing token.
 */
static void
script_acquire(RLCall *call, RLConn *conn, const RLLockNames *n, int64 lease_ms,
			   bool fence, int64 queue_wait_ms)
{
	const char *keys[3] = {n->key, n->fence_key, NULL};
	const char *f = fence ? "1" : "0";
	bool		by_name = fence && n->name_counter;

	if (by_name)
		f = "2";
	if (RL_PROTOCOL_IS_SEM(n->protocol))
	{
		sem_call(call, conn, RL_OP_ACQUIRE, n, lease_ms, false);
		return;
	}
	if (n->protocol == RL_PROTOCOL_REDISSON_FAIR)
	{
		const char *fkeys[5] = {n->key, n->fence_key, rl_fair_queue_key(n),
			rl_fair_timeout_key(n),
		by_name ? rl_name_counter_key(n) : NULL};
		const char *args[6] = {rl_ms_text(lease_ms), n->owner, f,
			rl_ms_text(queue_wait_ms), rl_unix_ms_text(),
		queue_wait_ms > 0 ? "1" : "0"};

		rl_script_call(call, conn, RL_SCRIPT_FAIR_ACQUIRE, by_name ? 5 : 4,
					   fkeys, 6, args);
	}
	else if (n->protocol == RL_PROTOCOL_REDISSON)
	{
		const char *args[3] = {rl_ms_text(lease_ms), n->owner, f};

		if (by_name)
			keys[2] = rl_name_counter_key(n);
		rl_script_call(call, conn, RL_SCRIPT_REDISSON_ACQUIRE, by_name ? 3 : 2,
					   keys, 3, args);
	}
	else if (n->protocol == RL_PROTOCOL_RW_READ)
	{
		const char *rkeys[2] = {n->key, rl_rw_read_timeout_key(n)};
		const char *args[3] = {rl_ms_text(lease_ms), n->owner, n->writer};

		rl_script_call(call, conn, RL_SCRIPT_RW_READ_ACQUIRE, 2, rkeys, 3, args);
	}
	else if (n->protocol == RL_PROTOCOL_RW_WRITE)
	{
		const char *args[2] = {rl_ms_text(lease_ms), n->owner};

		rl_script_call(call, conn, RL_SCRIPT_RW_WRITE_ACQUIRE, 1, keys, 2, args);
	}
	else
	{
		const char *args[4] = {n->owner, rl_ms_text(lease_ms), RL_TOKEN_MARKER, f};

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
	bool		by_name = false;
	char	   *nkeys;
	int			i;

	Assert(rl_protocol_has_many(names[0]->protocol));

	/*
	 * One choice for the call (a lock held from before a change of the
	 * setting has its own flag, but no token is counted for it)
	 */
	for (i = 0; i < n && fence && !simple; i++)
		by_name |= names[i]->name_counter;
	nkeys = psprintf("%d", (by_name ? 3 : 2) * n);
	ensure_shas();
	rl_call_set(call, conn, 0, NULL, NULL);
	rl_call_arg(call, "EVALSHA", 7);
	rl_call_arg(call, s->sha, 40);
	rl_call_arg(call, nkeys, strlen(nkeys));
	for (i = 0; i < n; i++)
		rl_call_arg(call, names[i]->key, names[i]->keylen);
	for (i = 0; i < n; i++)
		rl_call_arg(call, names[i]->fence_key, strlen(names[i]->fence_key));
	for (i = 0; i < n && by_name; i++)
	{
		char	   *k = rl_name_counter_key(names[i]);

		rl_call_arg(call, k, strlen(k));
	}
	if (simple)
		rl_call_arg(call, RL_TOKEN_MARKER, strlen(RL_TOKEN_MARKER));
	rl_call_arg(call, by_name ? "2" : fence ? "1" : "0", 1);
	for (i = 0; i < n; i++)
	{
		char	   *ms = rl_ms_text(lease_ms[i]);

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
	const char *args[4] = {n->owner, rl_publish_cmd(), n->channel, NULL};

	switch (n->protocol)
	{
		case RL_PROTOCOL_SEM_REDISSON:
		case RL_PROTOCOL_SEM_NPM:
			sem_call(call, conn, RL_OP_RELEASE, n, 0, false);
			break;
		case RL_PROTOCOL_SIMPLE:
			rl_script_call(call, conn, RL_SCRIPT_SIMPLE_RELEASE, 1, keys, 3, args);
			break;
		case RL_PROTOCOL_REDISSON:
			rl_script_call(call, conn, RL_SCRIPT_REDISSON_RELEASE, 1, keys, 3, args);
			break;
		case RL_PROTOCOL_REDISSON_FAIR:
			{
				const char *fkeys[3] = {n->key, rl_fair_queue_key(n),
				rl_fair_timeout_key(n)};

				args[3] = rl_unix_ms_text();
				rl_script_call(call, conn, RL_SCRIPT_FAIR_RELEASE, 3, fkeys, 4, args);
			}
			break;
		case RL_PROTOCOL_RW_READ:
			keys[1] = rl_rw_read_timeout_key(n);
			args[3] = rl_rw_timeout_prefix(n->key);
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
	const char *args[3] = {n->owner, rl_ms_text(lease_ms), renew ? "1" : "0"};

	switch (n->protocol)
	{
		case RL_PROTOCOL_SEM_REDISSON:
		case RL_PROTOCOL_SEM_NPM:
			sem_call(call, conn, RL_OP_EXTEND, n, lease_ms, renew);
			break;
		case RL_PROTOCOL_SIMPLE:
			rl_script_call(call, conn, RL_SCRIPT_SIMPLE_EXTEND, 1, keys, 3, args);
			break;
		case RL_PROTOCOL_REDISSON:
		case RL_PROTOCOL_REDISSON_FAIR:
			rl_script_call(call, conn, RL_SCRIPT_REDISSON_EXTEND, 1, keys, 3, args);
			break;
		case RL_PROTOCOL_RW_READ:
			keys[1] = rl_rw_read_timeout_key(n);
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
	const char *args[7] = {rl_publish_cmd(),
		n->protocol == RL_PROTOCOL_SIMPLE ? "string" : "hash",
		n->channel,
		rl_redisson_prefix_name("redisson_rwlock", n->key),
		fair ? rl_fair_queue_key(n) : "",
		fair ? rl_fair_timeout_key(n) : "",
	fair ? rl_unix_ms_text() : "0"};

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
	const char *keys[3] = {n->key, rl_fair_queue_key(n), rl_fair_timeout_key(n)};
	const char *args[4] = {n->owner, rl_ms_text(queue_wait_ms), rl_publish_cmd(),
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

/* How many calls one node's unit of this operation has */
int
rl_unit_calls(RLOpKind kind, const RLLockNames *n, bool fence)
{
	if (!n->script_free)
		return 1;
	return rl_free_unit(NULL, NULL, kind, n, 0, fence);
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
		k = rl_free_unit(unit, conn, kind, n, lease_ms, fence);
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
		case RL_OP_SEM_STATUS:
		case RL_OP_SEM_SETUP:
			sem_call(unit, conn, kind, n, lease_ms, false);
			break;
	}
}
