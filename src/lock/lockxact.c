/*-------------------------------------------------------------------------
 *
 * lockxact.c
 *	  Owns the lock table's transaction, subtransaction and backend-exit
 *	  callbacks: verify-on-commit, PREPARE refusal, the release of
 *	  transaction-scoped holds at COMMIT and ABORT and of the holds taken
 *	  since a savepoint at ROLLBACK TO SAVEPOINT (sent without waiting), and
 *	  the bounded release of everything at backend exit.  PostgreSQL calls
 *	  them; locktable.c registers them.
 *
 *	  Must not: call hiredis, know script bodies (scripts.c does), define
 *	  SQL-callable functions (functions.c does), raise ERROR at COMMIT or ABORT
 *	  (interrupts are held: failures are WARNINGs), or wait unbounded.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/lock/lockxact.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/memutils.h"

#include "net/net.h"
#include "redis/redis.h"
#include "worker/worker.h"
#include "wait/wait.h"
#include "lock/lock_int.h"

/* Bound of the release round trip at backend exit */
#define RL_EXIT_TIMEOUT_MS	500

/* ----------------------------------------------------------------
 * Transaction and exit callbacks
 * ----------------------------------------------------------------
 */
static bool
any_xact_holds(void)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;

	/* every transaction hold has its record in the log (rl_lt_add_hold) */
	if (rl_lt_held == NULL || rl_lt_xact_log_len == 0)
		return false;
	hash_seq_init(&seq, rl_lt_held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (e->xact_holds > 0)
		{
			hash_seq_term(&seq);
			return true;
		}
	}
	return false;
}

/*
 * Before COMMIT: check with Redis, in one round trip per node however many
 * locks, that every transaction-scoped lock is still ours (and restart its
 * lease).  A lost one fails the COMMIT: the transaction rolls back.  A loss
 * the worker only presumed (no renewal answered for a lease), whether or not
 * a call of the session has reported it since, stands unless Redis now
 * finds the lock ours: then its renewals ran and only their answers were
 * missed, and it is withdrawn (issue 43).
 */
static void
verify_xact_locks(void)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;
	RLHeld	  **ents;
	RLLockOp   *ops;
	TimestampTz sent;
	int			n = 0;
	int			i;
	MemoryContext old;

	/* no transaction hold taken: nothing to verify, and no scan */
	if (!rl_verify_on_commit || rl_lt_held == NULL || rl_lt_xact_log_len == 0)
		return;
	old = MemoryContextSwitchTo(rl_lt_work_cxt);
	ents = palloc(sizeof(RLHeld *) * Max(hash_get_num_entries(rl_lt_held), 1));
	hash_seq_init(&seq, rl_lt_held);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (e->xact_holds > 0)
			ents[n++] = e;
	if (n == 0)
	{
		MemoryContextSwitchTo(old);
		return;
	}
	ops = palloc(sizeof(RLLockOp) * n);
	for (i = 0; i < n; i++)
		rl_lt_op_init(&ops[i], RL_OP_EXTEND, ents[i], ents[i]->lease_ms);
	sent = GetCurrentTimestamp();

	/*
	 * What the worker found is made the entries' only after the round trip:
	 * until then its cancel, should it land while we wait, is the loss
	 * (locklost.c takes only a loss the entry has not taken yet).
	 */
	rl_lock_ops_run(ops, n, RL_RUN_HARD);
	for (i = 0; i < n; i++)
	{
		if (!RL_OP_YES(&ops[i]) && !RL_OP_NO(&ops[i]))
			ents[i]->unreachable = true;
		if (RL_OP_YES(&ops[i]))
			(void) rl_lt_found_ours(ents[i], sent);
		else
			(void) rl_lt_take_worker_loss(ents[i]);
	}
	for (i = 0; i < n; i++)
	{
		e = ents[i];
		if (!RL_OP_YES(&ops[i]) && !RL_OP_NO(&ops[i]))
			rl_raise_undecided(RL_ACTION_VERIFY, e->name, &ops[i]);
		if (RL_OP_NO(&ops[i]) || e->lost)
		{
			rl_lt_mark_lost(e);
			e->lost_reported_at = rl_lt_call_seq;
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("Redis lock \"%s\" was lost before COMMIT", e->name),
					 errdetail("Its lease expired or another client took key \"%s\"; the transaction is rolled back.",
							   e->names.key),
					 errhint("Retry the transaction; use a longer ttl or ttl NULL with the watchdog.")));
		}
	}
	MemoryContextSwitchTo(old);
	MemoryContextReset(rl_lt_work_cxt);
}

/*
 * Of the entries about to be released, keep those Redis did not answer for
 * at the COMMIT verify as doubts (the next call settles them); returns how
 * many are left to release, compacted at the front.
 */
static int
keep_unreachable_as_doubts(RLHeld **ents, int n)
{
	int			i;
	int			k = 0;

	for (i = 0; i < n; i++)
	{
		if (ents[i]->unreachable)
			ents[i]->unreachable = false;
		else
			ents[k++] = ents[i];
	}
	return k;
}

/*
 * What a call cut short by an ERROR left in the work context (every user
 * resets it when done, which an ERROR skips) goes at the end of the
 * (sub)transaction the ERROR aborts: no call is under way then.  Without
 * this, a session whose calls kept failing grew it by a few hundred bytes
 * per call until one succeeded.
 */
static void
drop_unfinished_work(void)
{
	if (rl_lt_work_cxt != NULL)
		MemoryContextReset(rl_lt_work_cxt);
}

/*
 * At COMMIT or ABORT: drop transaction holds and release what is free,
 * without waiting (rl_lt_release_without_waiting).
 */
static void
end_of_xact(void)
{
	RLHeld	  **ents;
	int			n;
	MemoryContext old;

	drop_unfinished_work();
	if (rl_lt_held == NULL)
		return;

	/*
	 * Every transaction hold has its record in the log (rl_lt_add_hold), so an
	 * empty log means there is none to drop: skip the scan of the table,
	 * which every transaction of a session that ever used a lock would pay.
	 */
	if (rl_lt_xact_log_len == 0 && rl_lt_ndirty_subs == 0 && rl_lt_nqueued <= 0)
	{
		rl_lt_xact_log_reset();
		rl_lt_maybe_shrink();
		return;
	}
	rl_lt_xact_log_reset();
	old = MemoryContextSwitchTo(rl_lt_work_cxt);
	(void) rl_lt_drop_scope(RL_SCOPE_XACT, &ents, &n);

	/*
	 * Older doubts wait for the next redis_lock call: the failure that made
	 * them is often still going on, and an abort should not wait for it
	 * twice.  So do the locks whose verify at COMMIT just failed.
	 */
	n = keep_unreachable_as_doubts(ents, n);
	rl_lt_release_without_waiting(ents, n);
	if (rl_lt_ndirty_subs > 0)
		rl_lt_clean_dirty_subs();
	/* a wait cut short by an error leaves its fair queue now */
	rl_lt_leave_queues();
	MemoryContextSwitchTo(old);
	MemoryContextReset(rl_lt_work_cxt);
	rl_lt_maybe_shrink();
}

/*
 * Transaction callback: verify transaction-scoped locks before COMMIT,
 * refuse PREPARE while any is held, release them at COMMIT or ABORT.
 */
void
redis_lock_locktable_xact_callback(XactEvent event, void *arg)
{
	ErrorContextCallback loss_context;

	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			/*
			 * the worker's cancel for a lost lock that lands while the
			 * verify waits (an implicit COMMIT, outside the statement's
			 * hooks) is that loss too (rl_lost_push_context)
			 */
			rl_lost_push_context(&loss_context);
			verify_xact_locks();
			rl_lost_pop_context(&loss_context);
			break;
		case XACT_EVENT_PRE_PREPARE:
			if (any_xact_holds())
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that holds transaction-scoped Redis locks"),
						 errhint("Use session-scoped locks (xact => false) in transactions that are prepared.")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
			/* a wait cut short by an error gives up its local seat */
			rl_waitq_leave();
			end_of_xact();
			/* a call cut short left a doubt: the worker settles it now */
			rl_lt_hand_doubts_to_worker();
			break;
		case XACT_EVENT_PREPARE:
			rl_lt_xact_log_reset();	/* only records of holds found lost */
			break;
		default:
			break;
	}
}

/* ROLLBACK TO SAVEPOINT: drop the holds the subtransaction took */
static void
release_subxact_holds(SubTransactionId mySubid)
{
	RLHeld	  **ents;
	int			n = 0;
	MemoryContext old = MemoryContextSwitchTo(rl_lt_work_cxt);

	ents = palloc(sizeof(RLHeld *) * rl_lt_xact_log_len);
	while (rl_lt_xact_log_len > 0 && rl_lt_xact_log[rl_lt_xact_log_len - 1].subid == mySubid)
	{
		XactHold   *h = &rl_lt_xact_log[--rl_lt_xact_log_len];
		RLHeld	   *e = hash_search(rl_lt_held, h->hkey, HASH_FIND, NULL);

		pfree(h->hkey);
		if (e != NULL && e->xact_holds > 0)
			rl_lt_drop_holds(e, RL_SCOPE_XACT, 1, ents, &n);
	}
	rl_lt_release_without_waiting(ents, n);
	MemoryContextSwitchTo(old);
	MemoryContextReset(rl_lt_work_cxt);
}

/*
 * ROLLBACK TO SAVEPOINT (and a failed PL/pgSQL exception block): drop the
 * transaction holds the subtransaction took and send the releases of the
 * locks that are free now, in one pipelined round trip not waited for where
 * the connection is open and in step (a failure is a WARNING from the next
 * call); the others are released by release_soft, waited for within the
 * timeouts with interrupts held, failures WARNINGs at once.  RELEASE SAVEPOINT hands the
 * holds to the parent.  Nothing to do, and O(1), when no transaction hold
 * was taken.  Doubts that an interrupted call left go to the worker.
 */
void
redis_lock_locktable_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
									  SubTransactionId parentSubid, void *arg)
{
	int			i;

	if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		for (i = rl_lt_xact_log_len - 1; i >= 0 && rl_lt_xact_log[i].subid == mySubid; i--)
			rl_lt_xact_log[i].subid = parentSubid;
		return;
	}
	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;
	drop_unfinished_work();
	rl_waitq_leave();
	/* a wait cut short (a cancel a PL/pgSQL block caught) stops listening */
	if (rl_lt_ndirty_subs > 0)
		rl_lt_clean_dirty_subs();
	if (rl_lt_nqueued > 0)
	{
		MemoryContext old = MemoryContextSwitchTo(rl_lt_work_cxt);

		rl_lt_leave_queues();
		MemoryContextSwitchTo(old);
		MemoryContextReset(rl_lt_work_cxt);
	}
	if (rl_lt_xact_log_len > 0 && rl_lt_held != NULL)
		release_subxact_holds(mySubid);
	/* a call cut short (a cancel caught by PL/pgSQL) left a doubt */
	rl_lt_hand_doubts_to_worker();
}

/*
 * What is left of the exit's bound (exit_by) becomes the timeouts of what
 * it does next; false when nothing worth a round trip is left.
 */
static bool
exit_time_left(TimestampTz exit_by)
{
	long		left = (long) ((exit_by - GetCurrentTimestamp()) / 1000);

	rl_command_timeout_ms = Min(rl_command_timeout_ms, (int) Max(left, 1));
	rl_connect_timeout_ms = Min(rl_connect_timeout_ms, (int) Max(left, 1));
	return left >= 10;
}

/*
 * Backend exit: release everything this session holds, bounded by the
 * command timeout.  What cannot be released here goes to the watchdog
 * worker, or expires with its lease.
 */
void
redis_lock_locktable_before_shmem_exit(int code, Datum arg)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;
	RLHeld	  **ents;
	int			n = 0;
	TimestampTz exit_by = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													  RL_EXIT_TIMEOUT_MS);

	if (rl_lt_held == NULL || hash_get_num_entries(rl_lt_held) == 0)
		return;

	/*
	 * Soft and with interrupts held: this neither raises nor is cut short,
	 * so it is bounded more tightly than a statement's round trip.  A
	 * terminated backend must be gone promptly, and what it cannot release
	 * now goes to the watchdog worker (or expires with its lease).  The
	 * process is exiting: nothing else reads these settings any more.
	 */
	rl_command_timeout_ms = Min(rl_command_timeout_ms, RL_EXIT_TIMEOUT_MS);
	rl_connect_timeout_ms = Min(rl_connect_timeout_ms, RL_EXIT_TIMEOUT_MS);

	/*
	 * Releases still on their way: their answers, within the same bound
	 * (what has not come by then fails, leaving a doubt for the worker).
	 * With preloading the worker has them already (release_later): only
	 * what came is read, the rest is the worker's at once.  What is left of
	 * the bound is all the releases below get: one bound for the exit.
	 */
	if (rl_lt_npending > 0)
	{
		HOLD_INTERRUPTS();
		rl_wait_owed(rl_watchdog_enabled() ? 0 : RL_EXIT_TIMEOUT_MS);
		rl_lt_settle_pending(false, true);
		RESUME_INTERRUPTS();
		(void) exit_time_left(exit_by);
	}
	MemoryContextSwitchTo(rl_lt_work_cxt);
	ents = palloc(sizeof(RLHeld *) * hash_get_num_entries(rl_lt_held));
	hash_seq_init(&seq, rl_lt_held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (RL_HOLDS(e) > 0)
		{
			e->session_holds = e->xact_holds = 0;
			rl_lt_became_doubt(e);
		}
		/*
		 * a handed doubt is the worker's already; one only presumed lost
		 * may still be ours
		 */
		if ((!e->lost || e->loss_presumed) && !RL_HANDED(e))
			ents[n++] = e;
	}
	rl_lt_leave_queues();
	/* one bound for the exit: what it leaves goes to the worker below */
	if (!exit_time_left(exit_by))
		n = 0;
	rl_lt_release_soft(ents, n, NULL, false);

	/* what could not be released goes to the watchdog worker */
	hash_seq_init(&seq, rl_lt_held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		/* a handed one is the worker's, lost or not: its slot too */
		if (RL_HANDED(e) || e->registry_slot < 0)
			continue;
		if (e->lost && !e->loss_presumed)
			rl_lt_registry_drop(e);
		else
			rl_lt_hand_to_worker(e);
	}
	rl_close_all();
}
