/*-------------------------------------------------------------------------
 *
 * lockrelease.c
 *	  Owns giving locks back at the session's request: release (one hold,
 *	  or with_lock's release not waited for), release of several locks at
 *	  once, release of every session hold, extend, and dropping the holds of
 *	  a scope, which lockxact.c uses at transaction end.
 *
 *	  Must not: call hiredis, know script bodies (scripts.c does), define
 *	  SQL-callable functions (functions.c does), acquire (lockacquire.c), or
 *	  act at transaction end (lockxact.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/lock/lockrelease.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/memutils.h"

#include "redis/redis.h"
#include "worker/worker.h"
#include "lock/lock_int.h"

/* ----------------------------------------------------------------
 * Release / extend
 * ----------------------------------------------------------------
 */
/*
 * Drop one session hold of one mode of name and, when it was the last hold,
 * delete it in Redis.  Returns false with a WARNING when it is not held at
 * session scope or was lost; raises when Redis' answer is unknown.
 */
static bool release_one(RLLockMode mode, const char *name, bool nowait);

bool
rl_release(RLLockMode mode, const char *name)
{
	return release_one(mode, name, false);
}

/*
 * The release at the end of redis_lock_with_lock: as rl_release, but when
 * the last hold goes the release is sent without waiting for its answer
 * (rl_lt_release_later), which is reported by the next call.
 */
void
rl_release_nowait(const char *name)
{
	(void) release_one(RL_MODE_EXCLUSIVE, name, true);
}

static bool
release_one(RLLockMode mode, const char *name, bool nowait)
{
	RLHeld	   *e;
	int			result;
	RLLockOp   *op;

	rl_safe_point();
	e = rl_lt_entry_find(mode, name);
	if (e == NULL || RL_HOLDS(e) == 0)
	{
		ereport(WARNING,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("you do not hold Redis lock \"%s\"", name),
				 mode == RL_MODE_READ ?
				 errdetail("This session has no read hold of it.") :
				 mode == RL_MODE_WRITE ?
				 errdetail("This session has no write hold of it.") :
				 mode == RL_MODE_PERMIT ?
				 errdetail("This session holds no permits of semaphore \"%s\".", name) : 0));
		return false;
	}
	if (e->session_holds == 0)
	{
		ereport(WARNING,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("Redis lock \"%s\" is held only at transaction scope", name),
				 errdetail("It is released when the transaction ends.")));
		return false;
	}
	e->session_holds--;
	if (RL_HOLDS(e) > 0)
	{
		rl_lt_registry_sync(e, false);
		if (e->lost)
		{
			rl_lt_warn_lost(e);
			return false;
		}
		return true;
	}
	rl_lt_became_doubt(e);
	if (e->lost && !e->loss_presumed)
	{
		/* known gone or taken over: nothing of ours to delete */
		rl_lt_warn_lost(e);
		rl_lt_entry_remove(e);
		return false;
	}
	if (nowait && rl_lt_release_later(&e, 1) == 0)
		return true;
	op = rl_lt_release_entries(&e, 1, RL_RUN_HARD, &result);
	if (result == RELEASE_UNKNOWN)
		rl_raise_undecided(RL_ACTION_RELEASE, name, op);
	if (result == 0)
	{
		rl_lt_mark_lost(e);
		rl_lt_warn_lost(e);
		rl_lt_entry_remove(e);
		return false;
	}
	rl_stats_add(RL_STAT_RELEASED, 1);
	rl_lt_entry_remove(e);
	return true;
}

/*
 * Drop one session hold on name without raising; used on the error path of
 * redis_lock_with_lock, as an abort releases (end_of_xact): the release is
 * sent without waiting for its answer, which the next call reads; one that
 * cannot go at once goes to the worker with preloading.  Waiting for the
 * answer here, with interrupts held, held off for up to command_timeout the
 * very cancel or statement_timeout that stopped the query: served already,
 * nothing pending was left to cut the wait short.  Without preloading a
 * release that cannot be sent at once is still made here, bounded.
 */
void
rl_release_one_error_safe(const char *name)
{
	RLHeld	   *e;

	e = rl_lt_entry_find(RL_MODE_EXCLUSIVE, name);
	if (e == NULL || e->session_holds == 0)
		return;
	e->session_holds--;
	if (RL_HOLDS(e) > 0)
	{
		rl_lt_registry_sync(e, false);
		return;
	}
	rl_lt_became_doubt(e);
	rl_lt_release_without_waiting(&e, 1);
}

/*
 * Take k holds of one scope from e.  If it is still held it only has its
 * registry slot updated; if it is now free it goes to out for a release
 * round trip, unless it is known lost (not only presumed, loss_presumed):
 * then it is forgotten at once, there is nothing of ours left to delete
 * (removing the current entry of a sequential scan of the table is allowed).
 */
void
rl_lt_drop_holds(RLHeld *e, RLScope scope, int k, RLHeld **out, int *nout)
{
	int		   *mine = scope == RL_SCOPE_XACT ? &e->xact_holds : &e->session_holds;

	Assert(k > 0 && k <= *mine);
	*mine -= k;
	if (RL_HOLDS(e) > 0)
	{
		e->unreachable = false; /* only for the release that is not made */
		rl_lt_registry_sync(e, false);
		return;
	}
	rl_lt_became_doubt(e);
	/* only presumed lost: the release's compare-and-delete tells */
	if (e->lost && !e->loss_presumed)
	{
		rl_lt_warn_lost(e);
		rl_lt_entry_remove(e);
		return;
	}
	out[(*nout)++] = e;
}

/*
 * Drop every hold of one scope (see rl_lt_drop_holds).  Returns how many entries
 * had holds of that scope.  out has room for the whole table, in the current
 * memory context.
 */
int
rl_lt_drop_scope(RLScope scope, RLHeld ***out, int *nout)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;
	int			count = 0;

	*nout = 0;
	*out = palloc(sizeof(RLHeld *) * Max(hash_get_num_entries(rl_lt_held), 1));
	hash_seq_init(&seq, rl_lt_held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		int			mine = scope == RL_SCOPE_XACT ? e->xact_holds : e->session_holds;

		if (mine == 0)
			continue;
		count++;
		rl_lt_drop_holds(e, scope, mine, *out, nout);
	}
	return count;
}

/*
 * Drop every session hold and release, in one round trip per node, the locks
 * left free.  Returns how many locks had session holds; raises after
 * settling the others if a release's outcome is unknown.
 */
int
rl_release_all_session(void)
{
	RLHeld	  **ents;
	RLLockOp   *ops;
	int			n;
	int			count;
	int		   *results;
	int			i;
	int			unknown = -1;

	rl_safe_point();
	count = rl_lt_drop_scope(RL_SCOPE_SESSION, &ents, &n);
	results = palloc(sizeof(int) * Max(n, 1));
	ops = rl_lt_release_entries(ents, n, RL_RUN_SOFT, results);
	for (i = 0; i < n; i++)
	{
		if (results[i] == RELEASE_UNKNOWN)
		{
			if (unknown < 0)
				unknown = i;
			continue;
		}
		if (results[i] == 0)
		{
			rl_lt_mark_lost(ents[i]);
			rl_lt_warn_lost(ents[i]);
		}
		else
			rl_stats_add(RL_STAT_RELEASED, 1);
		rl_lt_entry_remove(ents[i]);
	}
	if (unknown >= 0)
		rl_raise_undecided(RL_ACTION_RELEASE, ents[unknown]->name, &ops[unknown]);
	rl_lt_maybe_shrink();
	return count;
}

/*
 * DISCARD ALL: like advisory locks, every session-scoped lock goes.  It has
 * already done its work when this runs, so nothing here raises: a release
 * whose outcome is unknown is a WARNING and stays a doubt, settled by the
 * next call or at exit.
 */
void
rl_discard_session_locks(void)
{
	RLHeld	  **ents;
	int			n;
	MemoryContext old;

	if (rl_lt_held == NULL || hash_get_num_entries(rl_lt_held) == 0)
		return;
	old = MemoryContextSwitchTo(rl_lt_work_cxt);
	(void) rl_lt_drop_scope(RL_SCOPE_SESSION, &ents, &n);
	rl_lt_release_without_waiting(ents, n);
	MemoryContextSwitchTo(old);
	MemoryContextReset(rl_lt_work_cxt);
	rl_lt_maybe_shrink();
}

/*
 * Restart the lease of a held lock: ttl_ms > 0 is a fixed lease, otherwise
 * redis_lock.lease_time, renewed by the watchdog when it runs.  Returns false
 * with a WARNING when the lock is not held or was found lost.
 */
bool
rl_extend(RLLockMode mode, const char *name, int64 ttl_ms)
{
	RLHeld	   *e;
	int64		lease_ms;
	bool		watchdog;

	rl_safe_point();
	e = rl_lt_entry_find(mode, name);
	if (e == NULL || RL_HOLDS(e) == 0)
	{
		ereport(WARNING,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("you do not hold Redis lock \"%s\"", name)));
		return false;
	}
	lease_ms = ttl_ms > 0 ? ttl_ms : rl_lease_time_ms;
	watchdog = ttl_ms <= 0 && rl_watchdog_enabled();

	/*
	 * A renewal the worker has already taken out would put the old lease
	 * back after ours.  Give the registry the new lease first: the slot
	 * moves to a new generation, so that renewal is not sent (or, if it is
	 * under way, we wait for its answer before sending ours), and any later
	 * one carries the new lease, which our PEXPIRE sets anyway.  Should the
	 * round trip below fail, the lock is still renewed, with the lease the
	 * session now believes in.  So too for a loss the worker only presumed:
	 * should the round trip refute it, the worker renews again at once.
	 */
	if (e->watchdog && (!e->lost || e->loss_presumed) &&
		lease_ms != e->lease_ms)
	{
		e->lease_ms = lease_ms;
		rl_lt_registry_sync(e, false);
		rl_registry_wait_idle(e->registry_slot);
	}
	/* a loss the worker only presumed: Redis may refute it */
	if ((e->lost && !e->loss_presumed) ||
		!rl_lt_verify_and_refresh(e, lease_ms))
	{
		rl_lt_mark_lost(e);
		rl_lt_warn_lost(e);
		return false;
	}
	/* an explicit ttl is a fixed lease; NULL hands it (back) to the watchdog */
	e->lease_ms = lease_ms;
	e->watchdog = watchdog;
	rl_lt_registry_sync(e, true);
	return true;
}

/* ----------------------------------------------------------------
 * Several locks at once: their release (lockmany.c acquires them through
 * lockacquire.c)
 * ----------------------------------------------------------------
 */

/*
 * Drop one session hold of each exclusive lock in names (distinct) and
 * release, in one round trip per node however many, those left free.
 * Returns how many holds were dropped of locks still ours (what
 * rl_release would have returned true for); a name not held, held only at
 * transaction scope, or lost is a WARNING each, as rl_release.  Raises
 * after settling the others if a release's outcome is unknown.
 */
int
rl_release_many(const char *const *names, int n)
{
	RLHeld	  **ents = palloc(sizeof(RLHeld *) * Max(n, 1));
	int		   *results = palloc(sizeof(int) * Max(n, 1));
	RLLockOp   *ops;
	int			nents = 0;
	int			released = 0;
	int			unknown = -1;
	int			i;

	rl_safe_point();
	for (i = 0; i < n; i++)
	{
		RLHeld	   *e = rl_lt_entry_find(RL_MODE_EXCLUSIVE, names[i]);

		if (e == NULL || RL_HOLDS(e) == 0)
		{
			ereport(WARNING,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("you do not hold Redis lock \"%s\"", names[i])));
			continue;
		}
		if (e->session_holds == 0)
		{
			ereport(WARNING,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("Redis lock \"%s\" is held only at transaction scope", names[i]),
					 errdetail("It is released when the transaction ends.")));
			continue;
		}
		e->session_holds--;
		if (RL_HOLDS(e) > 0)
		{
			rl_lt_registry_sync(e, false);
			if (e->lost)
				rl_lt_warn_lost(e);
			else
				released++;
			continue;
		}
		rl_lt_became_doubt(e);
		if (e->lost)
		{
			rl_lt_warn_lost(e);
			rl_lt_entry_remove(e);
			continue;
		}
		ents[nents++] = e;
	}
	ops = rl_lt_release_entries(ents, nents, RL_RUN_SOFT, results);
	for (i = 0; i < nents; i++)
	{
		if (results[i] == RELEASE_UNKNOWN)
		{
			if (unknown < 0)
				unknown = i;
			continue;
		}
		if (results[i] == 0)
		{
			rl_lt_mark_lost(ents[i]);
			rl_lt_warn_lost(ents[i]);
		}
		else
		{
			rl_stats_add(RL_STAT_RELEASED, 1);
			released++;
		}
		rl_lt_entry_remove(ents[i]);
	}
	if (unknown >= 0)
		rl_raise_undecided(RL_ACTION_RELEASE, ents[unknown]->name, &ops[unknown]);
	return released;
}
