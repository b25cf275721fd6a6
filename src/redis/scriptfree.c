/*-------------------------------------------------------------------------
 *
 * scriptfree.c
 *	  Owns the script-free forms of lock operations (redis_lock.scripting
 *	  off): the commands and MULTI/EXEC groups of each operation on the
 *	  simple layout, and what each server offers of DELIFEQ and DELEX.
 *
 *	  Must not: use Lua, decode replies (replies.c), keep state about held
 *	  locks or waits.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/redis/scriptfree.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/timestamp.h"

#include "net/net.h"
#include "redis/redis_int.h"

/* ----------------------------------------------------------------
 * The simple layout without Lua (redis_lock.scripting off).
 *
 * The same string key holding the same token, taken and given back with
 * commands that compare atomically in the server: SET NX GET, DELIFEQ
 * (Valkey 9.0) or DELEX IFEQ (Redis 8.4), SET IFEQ (Valkey 8.1, Redis 8.4).
 * Each operation is one unit of calls sent as a group in one round trip
 * (MULTI ... EXEC where several commands must see one state).  Every unit
 * is idempotent for a given token, as the scripts are.  What differs from
 * the scripts (doc/topologies.md, "Script-free locks"):
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
 * - Force release inspects the key as redis_lock_status does, then deletes
 *   it if it is a lock and still holds the owner value seen: two round
 *   trips; a lock that changes hands in between is left to its new holder.
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
	const char *pub[3] = {rl_publish_cmd(), n->channel, "0"};

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
 * inspect, also force's first round (rl_build_force_delete then deletes
 *   only what it calls a lock): MULTI / TYPE key / PTTL key / GETRANGE key
 *   0 RL_LOCK_VALUE_MAX / HRANDFIELD key RL_LOCK_FIELDS_MAX + 1
 *   WITHVALUES / EXEC (the one of
 *   GETRANGE and HRANDFIELD that does not fit the type answers WRONGTYPE).
 *   Both are bounded: one byte more than a lock's value may have, one
 *   field more than a lock's hash may have (the whole hash when it has no
 *   more); replies.c keeps only what is a lock's, as the script does.
 */
int
rl_free_unit(RLCall *unit, RLConn *conn, RLOpKind kind, const RLLockNames *n,
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
				rl_ms_text(lease_ms), "GET"};

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
			pg_fallthrough;
		case RL_OP_EXTEND:
			if (unit == NULL)
				return 1;
			{
				const char *set[7] = {"SET", n->key, n->owner, "IFEQ", n->owner,
				"PX", rl_ms_text(lease_ms)};

				free_call(unit, k++, conn, 7, set);
			}
			return k;
		case RL_OP_FORCE:
		case RL_OP_INSPECT:
			if (unit == NULL)
				return 6;
			{
				const char *range[4] = {"GETRANGE", n->key, "0",
				CppAsString2(RL_LOCK_VALUE_MAX)};
				const char *fields[4] = {"HRANDFIELD", n->key,
				psprintf("%d", RL_LOCK_FIELDS_MAX + 1), "WITHVALUES"};

				free_call(unit, k++, conn, 1, multi);
				free_call(unit, k++, conn, 2, type);
				free_call(unit, k++, conn, 2, pttl);
				free_call(unit, k++, conn, 4, range);
				free_call(unit, k++, conn, 4, fields);
				free_call(unit, k++, conn, 1, exec);
			}
			return k;
		case RL_OP_DEQUEUE:
		case RL_OP_SEM_STATUS:
		case RL_OP_SEM_SETUP:
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
 * before anything is sent to any node.  With ask false nothing is asked: a
 * server whose answer is not known (asked before, unanswered) is one that
 * did not answer.
 */
void
rl_learn_offers(RLConn **conns, int n, RLTarget *target, const char *key,
				size_t keylen, RLRunMode mode, bool ask, RLCall **why)
{
	int		   *asked = NULL;
	RLCall	   *calls = NULL;
	int			nask = 0;
	int			i;

	rl_probe_commands(offer_names, lengthof(offer_names));
	for (i = 0; i < n; i++)
	{
		why[i] = NULL;
		if (ask && rl_conn_commands(conns[i], NULL) == RL_COMMANDS_UNKNOWN)
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
