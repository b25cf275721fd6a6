/*-------------------------------------------------------------------------
 *
 * lockmany.c
 *	  Owns the acquire of several exclusive locks at once
 *	  (redis_lock_acquire_many): all or nothing.  On one Redis (and on a
 *	  Cluster when every key is in one hash slot) one multi-key script
 *	  grants every free key or none, in one round trip; across the hash
 *	  slots of a Cluster the slots are taken one at a time in one canonical
 *	  order (ascending slot), and what was taken is given back when one is
 *	  busy; on Redlock masters one script per master, counted by majority,
 *	  grants below the quorum given back.  A waiter holds nothing while it
 *	  sleeps, so two sessions asking for overlapping sets cannot deadlock;
 *	  the canonical order makes them collide on the first slot they share,
 *	  where one wins, instead of each taking a part again and again.
 *
 *	  Each name is an entry of locktable.c's table, kept through the small
 *	  interface of lock.h (rl_many_*): reentrancy, holds, scopes,
 *	  watchdog slots and doubts are exactly those of a single acquire, one
 *	  entry per name.  An attempt cut short (cancel, timeout, lost
 *	  connection) leaves each key it may have granted as a doubt of that
 *	  entry, which the watchdog worker settles as for a single acquire.
 *
 *	  A waiter for several locks does not use the server-local wait queue
 *	  (waitqueue.c): a seat in one queue per lock, held while waiting for
 *	  the others, would make it sleep behind single waiters holding seats
 *	  it needs and let two such waiters wait for each other's seats; so it
 *	  contends in Redis like a waiter without preloading.
 *
 *	  Must not: call hiredis, know script bodies (scripts.c does), touch
 *	  locktable.c's table other than through its declared interface, or
 *	  define SQL-callable functions (functions.c does).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/lock/lockmany.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/memutils.h"

#include "net/net.h"
#include "redis/redis.h"
#include "worker/worker.h"
#include "wait/wait.h"
#include "lock/lock.h"

typedef enum ManyOutcome
{
	MANY_GOT,
	MANY_BUSY,					/* a lock held elsewhere (or too slow, Redlock) */
	MANY_LOST,					/* a lock the session held is not ours */
	MANY_WRONGTYPE,
	MANY_UNREPLICATED,			/* granted, but WAIT saw too few replicas */
	MANY_UNDECIDED				/* no majority answered */
} ManyOutcome;

typedef struct Member
{
	const char *name;
	RLHeld	   *e;
	bool		held;			/* the session held it before this call */
	int64		lease_ms;		/* the lease last sent for it */
	TimestampTz sent_at;		/* when that was sent: its lease starts later */
	bool		sent;			/* an acquire of it was sent in this call */
	bool		late;			/* the last one's outcome is unknown */
	bool		stuck;			/* a grant of it could not be given back */
	bool		taken;			/* granted by the attempt under way */
	int64		fence;
	uint16		slot;
} Member;

typedef struct Group
{
	int			n;
	int		   *idx;			/* members, in the order given */
} Group;

typedef struct Many
{
	RLTarget   *target;
	bool		redlock;
	int			n;
	Member	   *m;
	int			ngroups;
	Group	   *groups;			/* in the canonical order */
	int64		lease_ms;		/* lease of a new grant */
	MemoryContext attempt_cxt;	/* reset by every attempt */
	/* what stopped the last attempt */
	int			busy;			/* member, -1: none */
	int64		pttl;
	bool		publishes;
	char	   *wrongtype;
	RLManyOp   *failed_op;		/* undecided, or not replicated */
	int			failed_group;
} Many;

/* ----------------------------------------------------------------
 * Groups: which locks go into one script
 * ----------------------------------------------------------------
 */
static int
slot_cmp(const void *a, const void *b, void *arg)
{
	const Member *m = arg;
	int			x = *(const int *) a;
	int			y = *(const int *) b;

	if (m[x].slot != m[y].slot)
		return m[x].slot < m[y].slot ? -1 : 1;
	return x < y ? -1 : x > y;
}

/*
 * One group of every lock, in the order given, except on a Cluster: one
 * group per hash slot (a script's keys must share one), ordered by slot.
 */
static void
build_groups(Many *c)
{
	int		   *order = palloc(sizeof(int) * c->n);
	int			i;

	for (i = 0; i < c->n; i++)
		order[i] = i;
	c->groups = palloc0(sizeof(Group) * c->n);
	c->ngroups = 0;
	if (c->target->kind != RL_TOPO_CLUSTER)
	{
		c->groups[0].n = c->n;
		c->groups[0].idx = order;
		c->ngroups = 1;
		return;
	}
	for (i = 0; i < c->n; i++)
		c->m[i].slot = rl_key_slot(c->m[i].e->names.key, c->m[i].e->names.keylen);
	qsort_arg(order, c->n, sizeof(int), slot_cmp, c->m);
	for (i = 0; i < c->n; i++)
	{
		if (i == 0 || c->m[order[i]].slot != c->m[order[i - 1]].slot)
		{
			c->groups[c->ngroups].idx = &order[i];
			c->ngroups++;
		}
		c->groups[c->ngroups - 1].n++;
	}
}

/* ----------------------------------------------------------------
 * One attempt at the whole set
 * ----------------------------------------------------------------
 */

/*
 * Give back every lock the attempt under way took and did not keep, in one
 * round trip per node; a grant that cannot be given back stays a doubt.
 */
static void
give_back(Many *c)
{
	RLHeld	  **ents = palloc(sizeof(RLHeld *) * c->n);
	bool	   *settled = palloc(sizeof(bool) * c->n);
	int		   *idx = palloc(sizeof(int) * c->n);
	int			k = 0;
	int			i;

	for (i = 0; i < c->n; i++)
	{
		if (!c->m[i].taken || c->m[i].held)
			continue;
		idx[k] = i;
		ents[k++] = c->m[i].e;
	}
	if (k > 0)
		rl_many_give_back(ents, k, settled);
	for (i = 0; i < k; i++)
		c->m[idx[i]].stuck = !settled[i];
	for (i = 0; i < c->n; i++)
		c->m[i].taken = false;
}

/*
 * Run the script of each group in turn, stopping at the first that does not
 * grant; then give back what the earlier groups took.  Interrupts raise:
 * each key sent is a doubt until its answer is known.
 */
static ManyOutcome
attempt(Many *c)
{
	ManyOutcome out = MANY_GOT;
	MemoryContext old;
	int			g;

	MemoryContextReset(c->attempt_cxt);
	old = MemoryContextSwitchTo(c->attempt_cxt);
	c->busy = -1;
	c->pttl = 0;
	c->publishes = false;
	c->wrongtype = NULL;
	c->failed_op = NULL;
	for (g = 0; g < c->ngroups && out == MANY_GOT; g++)
	{
		Group	   *gr = &c->groups[g];
		RLManyOp   *op = palloc0(sizeof(RLManyOp));
		const RLLockNames **names = palloc(sizeof(RLLockNames *) * gr->n);
		int64	   *lease = palloc(sizeof(int64) * gr->n);
		bool	   *held = palloc(sizeof(bool) * gr->n);
		bool		late;
		int			k;

		op->target = c->target;
		op->nlocks = gr->n;
		op->names = names;
		for (k = 0; k < gr->n; k++)
			names[k] = &c->m[gr->idx[k]].e->names;
		/* what stops it before it is sent raises before they are doubts */
		rl_many_op_route(op);
		for (k = 0; k < gr->n; k++)
		{
			Member	   *m = &c->m[gr->idx[k]];

			held[k] = m->held;
			/* a reentrant hold renews as a single acquire's does */
			lease[k] = (m->held && m->e->watchdog) ? m->e->lease_ms : c->lease_ms;
			m->lease_ms = lease[k];
			m->sent_at = GetCurrentTimestamp();
			if (!m->held)
			{
				rl_many_sending(m->e, lease[k]);
				m->sent = true;
			}
		}
		op->lease_ms = lease;
		op->held = held;
		/* tokens from independent masters would not be ordered: none */
		op->fence = !c->redlock;
		rl_many_op_run(op, RL_RUN_HARD);

		/* only a node that failed once our bytes may have reached it runs it late */
		late = op->failed > 0 && op->maybe_ran;
		for (k = 0; k < gr->n; k++)
		{
			Member	   *m = &c->m[gr->idx[k]];

			if (m->held)
				continue;
			rl_many_answered(m->e, late);
			m->late = late;
		}
		if (rl_many_op_granted(op))
		{
			for (k = 0; k < gr->n; k++)
			{
				c->m[gr->idx[k]].taken = true;
				c->m[gr->idx[k]].fence = op->fences != NULL ? op->fences[k] : 0;
			}
			if (op->replicas_short > 0)
			{
				out = MANY_UNREPLICATED;
				c->failed_group = g;
			}
			continue;
		}
		/* grants below a Redlock quorum (or too late) are given back too */
		if (op->yes > 0)
			for (k = 0; k < gr->n; k++)
				c->m[gr->idx[k]].taken = true;
		if (op->busy_index >= 0)
			c->busy = gr->idx[op->busy_index];
		if (op->wrongtype != NULL)
			out = MANY_WRONGTYPE;
		else if (RL_MANY_YES(op) || RL_MANY_NO(op))
			out = op->lost ? MANY_LOST : MANY_BUSY;
		else
			out = MANY_UNDECIDED;
		c->pttl = op->pttl;
		c->publishes = op->holder_publishes;
		c->failed_op = op;
		c->failed_group = g;
		if (op->wrongtype != NULL)
			c->wrongtype = MemoryContextStrdup(MemoryContextGetParent(c->attempt_cxt),
											   op->wrongtype);
	}
	if (out != MANY_GOT && out != MANY_UNREPLICATED)
		give_back(c);
	MemoryContextSwitchTo(old);
	return out;
}

/*
 * Attempts until one is not stopped by a lock the session held and lost
 * (each lost one is discarded with a WARNING and taken anew, as a single
 * acquire does; a name can be lost only once).
 */
static ManyOutcome
attempt_round(Many *c)
{
	for (;;)
	{
		ManyOutcome out = attempt(c);
		Member	   *m;

		if (out != MANY_LOST)
			return out;
		m = &c->m[c->busy];
		Assert(m->held);
		rl_many_discard_lost(m->e);
		m->e = rl_many_entry(m->name, c->lease_ms, &m->held);
	}
}

/* ----------------------------------------------------------------
 * Waiting
 * ----------------------------------------------------------------
 */
/*
 * Wait for the set.  Every key's release channel, and its keyspace
 * notifications, are subscribed at once, in one round trip; then attempts
 * of the whole set alternate with latch waits that end when the lock that
 * stopped the last attempt is released (its channel, or its key deleted or
 * expired), on its holder's expiry, or on a bounded backoff for holders
 * that never publish, as a single waiter's do.  The releases of the other
 * locks do not end a wait: the set cannot be had while that one is held,
 * and the attempt's own give-back of the locks before it (a Cluster's
 * earlier slots) publishes on theirs.  A later attempt stopped by another
 * lock waits for that one, already subscribed.
 */
static ManyOutcome
wait_many(Many *c, int64 wait_ms, ManyOutcome outcome)
{
	TimestampTz start = GetCurrentTimestamp();
	TimestampTz deadline = TimestampTzPlusMilliseconds(start, wait_ms);
	int			cap = c->n * rl_target_max_nodes(c->target);
	RLConn	  **subs = palloc(sizeof(RLConn *) * cap);
	const char **channels = palloc(sizeof(char *) * cap);
	const char **keys = palloc(sizeof(char *) * cap);
	int		   *owner = palloc(sizeof(int) * cap);
	RLConn	  **wsubs = palloc(sizeof(RLConn *) * cap);
	const char **wchannels = palloc(sizeof(char *) * cap);
	const char **wkeys = palloc(sizeof(char *) * cap);
	RLConn	  **distinct = palloc(sizeof(RLConn *) * cap);
	int			ns = 0;
	int			nd = 0;
	long		backoff = 8;
	MemoryContext old;
	RLWaitKey  *wait_keys;
	const char **wait_names;
	const char **wait_owners;
	int			nwait = 0;
	int			i;

	rl_stats_add(RL_STAT_WAITS, 1);
	for (i = 0; i < c->n; i++)
	{
		RLLockNames *nm = &c->m[i].e->names;
		RLConn	   *conns[RL_MAX_NODES];
		int			nn = rl_target_nodes_or_raise(c->target, nm->key, nm->keylen,
												  conns, true);
		int			j;

		for (j = 0; j < nn; j++)
		{
			int			d;

			/* copies: an entry taken anew (lost) frees its names */
			subs[ns] = conns[j];
			channels[ns] = pstrdup(rl_wait_channel(nm));
			keys[ns] = pstrdup(nm->key);
			owner[ns++] = i;
			for (d = 0; d < nd && distinct[d] != conns[j]; d++)
				;
			if (d == nd)
				distinct[nd++] = conns[j];
		}
	}
	rl_many_subscribed(distinct, nd);
	rl_subscribe_each(subs, ns, rl_pubsub_subscribe_cmd(), channels, keys,
					  rl_command_timeout_ms);

	/*
	 * For the deadlock check (deadlock.c) the set's waiter waits for every
	 * lock of it that the session does not hold yet: any of them held
	 * elsewhere keeps the whole set from being granted.
	 */
	wait_keys = palloc(sizeof(RLWaitKey) * c->n);
	wait_names = palloc(sizeof(char *) * c->n);
	wait_owners = palloc(sizeof(char *) * c->n);
	for (i = 0; i < c->n; i++)
	{
		if (c->m[i].held)
			continue;
		wait_names[nwait] = c->m[i].name;
		wait_owners[nwait] = pstrdup(c->m[i].e->names.owner);
		wait_keys[nwait].target_spec = c->target->spec;
		wait_keys[nwait].key = pstrdup(c->m[i].e->names.key);
		wait_keys[nwait++].protocol = c->m[i].e->names.protocol;
	}
	rl_waiters_begin(wait_keys, wait_names, wait_owners, nwait);
	rl_deadlock_wait_begin(wait_keys, nwait);

	for (;;)
	{
		TimestampTz now;
		TimestampTz wake;
		long		sleep_ms;
		int			nw = 0;

		/* the release may have happened before the subscription took */
		outcome = attempt_round(c);
		if (outcome != MANY_BUSY && outcome != MANY_UNDECIDED)
			break;
		if (outcome == MANY_UNDECIDED && !c->redlock)
			break;				/* one node and it failed: an error now */
		now = GetCurrentTimestamp();
		if (now >= deadline)
			break;

		sleep_ms = rl_retry_sleep_ms(outcome == MANY_BUSY && c->publishes,
									 c->pttl, c->redlock, &backoff, now, deadline);
		for (i = 0; i < ns; i++)
		{
			if (c->busy >= 0 && owner[i] != c->busy)
				continue;
			wsubs[nw] = subs[i];
			wchannels[nw] = channels[i];
			wkeys[nw++] = keys[i];
		}
		wake = TimestampTzPlusMilliseconds(now, sleep_ms);
		/* what the wait allocates goes with the next attempt's reset */
		old = MemoryContextSwitchTo(c->attempt_cxt);
		/* a deadlock check that comes due meanwhile runs without an attempt */
		while (!rl_wait_for_any_message(wsubs, nw, wchannels, wkeys,
										(long) ((rl_deadlock_wake_at(wake) - now + 999) / 1000)) &&
			   (now = GetCurrentTimestamp()) < wake)
			rl_many_check_deadlock(now);
		MemoryContextSwitchTo(old);
	}
	rl_deadlock_wait_end();
	rl_waiters_end();
	rl_unsubscribe_each_async(subs, ns, rl_pubsub_unsubscribe_cmd(), channels, keys);
	rl_many_unsubscribed();
	rl_stats_add(RL_STAT_WAIT_US, (uint64) (GetCurrentTimestamp() - start));
	return outcome;
}

/* ----------------------------------------------------------------
 * Outcomes
 * ----------------------------------------------------------------
 */

/*
 * Not granted: forget the entries of which nothing can be in Redis, leave
 * the others as doubts (to the worker), and raise unless the set was
 * simply busy.
 */
static void
not_granted(Many *c, ManyOutcome outcome)
{
	RLManyOp   *op = c->failed_op;
	const char *stopped = c->busy >= 0 ? c->m[c->busy].name :
		c->m[c->groups[c->failed_group].idx[0]].name;
	int			i;

	/* the error below names the failed call's key, in an entry's names */
	if (op != NULL && op->failure != NULL && op->failure->key != NULL)
		op->failure->key = pnstrdup(op->failure->key, op->failure->keylen);
	for (i = 0; i < c->n; i++)
	{
		Member	   *m = &c->m[i];

		if (m->held || m->late || m->stuck || m->taken)
			continue;
		/* never sent in this call: it may be an older doubt, still unsure */
		if (m->sent || m->e->expires_at == 0)
			rl_many_forget(m->e);
	}
	rl_many_doubts_to_worker();
	switch (outcome)
	{
		case MANY_WRONGTYPE:
			{
				RLLockNames n;

				memset(&n, 0, sizeof(n));
				rl_names_build(&n, (RLProtocol) rl_protocol, rl_key_prefix,
							   stopped, CurrentMemoryContext);
				rl_stats_add(RL_STAT_FAILED, 1);
				rl_raise_wrong_type(stopped, &n, c->wrongtype);
			}
			break;
		case MANY_UNDECIDED:
			{
				RLLockOp	fake;

				/* what rl_raise_undecided reads of an op */
				memset(&fake, 0, sizeof(fake));
				fake.target = op->target;
				fake.nodes = op->nodes;
				fake.yes = op->yes;
				fake.no = op->no;
				fake.failed = op->failed;
				fake.failure = op->failure;
				rl_stats_add(RL_STAT_FAILED, 1);
				rl_raise_undecided(RL_ACTION_ACQUIRE, stopped, &fake);
			}
			break;
		case MANY_UNREPLICATED:
			rl_stats_add(RL_STAT_FAILED, 1);
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("Redis lock \"%s\" was not replicated to %d replica(s) within %s",
							stopped, rl_wait_replicas,
							rl_format_ms(rl_wait_replicas_timeout_ms)),
					 errdetail("None of the %d locks asked for is held: those granted were released again; without replicas a failover could lose them.",
							   c->n),
					 errhint("Check the replicas, or lower redis_lock.wait_replicas.")));
			break;
		default:
			rl_stats_add(RL_STAT_TIMED_OUT, 1);
			break;
	}
}

/* Refuse what several locks at once cannot do where the settings point */
static void
refuse_unsupported(const char *const *names, int n)
{
	int			i;

	if (!rl_protocol_has_many((RLProtocol) rl_protocol))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("several Redis locks at once are not supported with layout \"%s\"",
						rl_protocol_name((RLProtocol) rl_protocol)),
				 errdetail("redis_lock_acquire_many takes locks of protocol simple or redisson."),
				 errhint("Take the locks one at a time with redis_lock_acquire, in one order in every session.")));
	/* all or nothing needs a script: MULTI cannot make a SET depend on others */
	if (!rl_scripting)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("several Redis locks at once need Lua scripting"),
				 errdetail("redis_lock.scripting is off, and only a script can grant every lock or none."),
				 errhint("Take the locks one at a time with redis_lock_acquire, in one order in every session.")));
	for (i = 0; i < n; i++)
		rl_many_check_layout(names[i]);

	/*
	 * One script takes the whole set, in one layout: a name held in another
	 * (taken before redis_lock.protocol changed) would be written in the
	 * wrong one.  Whatever the order of the names.
	 */
	for (i = 1; i < n; i++)
	{
		RLProtocol	first = rl_many_layout(names[0]);
		RLProtocol	other = rl_many_layout(names[i]);

		if (other != first)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("Redis locks of one set must share a layout"),
					 errdetail("Lock \"%s\" is in layout \"%s\" and lock \"%s\" in layout \"%s\"; this session holds one of them in a layout redis_lock.protocol no longer names.",
							   names[0], rl_protocol_name(first),
							   names[i], rl_protocol_name(other)),
					 errhint("Take them in separate calls, or set redis_lock.protocol to the layout of the held lock.")));
	}
}

/*
 * Take every lock of names (distinct) or none.  ttl_ms <= 0 means "ttl
 * NULL": the lease is redis_lock.lease_time, renewed by the watchdog when
 * it runs.  Returns the fencing tokens in the order given (0 where there is
 * none: Redlock), palloc'd; a name this session holds gets one more hold
 * and keeps its token.  *obtained is false when the wait elapsed, with
 * *busy the index of the lock that stopped the last attempt.
 */
int64 *
rl_acquire_many(const char *const *names, int n, int64 ttl_ms, int64 wait_ms,
				RLScope scope, bool *obtained, int *busy)
{
	Many		c;
	ManyOutcome outcome;
	int64	   *fences;
	bool		watchdog = ttl_ms <= 0 && rl_watchdog_enabled();
	int			i;

	*obtained = false;
	*busy = 0;
	rl_safe_point();
	refuse_unsupported(names, n);
	rl_many_check_room(names, n);

	memset(&c, 0, sizeof(c));
	c.target = rl_current_target();
	c.redlock = c.target->kind == RL_TOPO_REDLOCK;
	c.n = n;
	c.lease_ms = ttl_ms > 0 ? ttl_ms : rl_lease_time_ms;
	c.m = palloc0(sizeof(Member) * n);
	c.attempt_cxt = AllocSetContextCreate(CurrentMemoryContext,
										  "redis_lock acquire many",
										  ALLOCSET_DEFAULT_SIZES);
	for (i = 0; i < n; i++)
	{
		c.m[i].name = names[i];
		c.m[i].e = rl_many_entry(names[i], c.lease_ms, &c.m[i].held);
	}
	build_groups(&c);

	outcome = attempt_round(&c);
	if (wait_ms > 0 &&
		(outcome == MANY_BUSY || (outcome == MANY_UNDECIDED && c.redlock)))
		outcome = wait_many(&c, wait_ms, outcome);

	if (outcome == MANY_UNREPLICATED)
		give_back(&c);
	if (outcome != MANY_GOT)
	{
		*busy = c.busy >= 0 ? c.busy : 0;
		not_granted(&c, outcome);
		MemoryContextDelete(c.attempt_cxt);
		return NULL;
	}
	fences = palloc(sizeof(int64) * n);
	for (i = 0; i < n; i++)
	{
		Member	   *m = &c.m[i];

		rl_many_grant(m->e, m->held, m->fence, m->lease_ms, m->sent_at,
					  watchdog, scope);
		fences[i] = m->e->fence;
	}
	MemoryContextDelete(c.attempt_cxt);
	*obtained = true;
	return fences;
}
