/*-------------------------------------------------------------------------
 *
 * lockdoubts.c
 *	  Owns what the lock table settles later: the releases after COMMIT and
 *	  ABORT, at ROLLBACK TO SAVEPOINT and at the end of redis_lock_with_lock,
 *	  sent without waiting for their answers (rl_lt_release_later), whose entries
 *	  stay, with no holds and marked releasing, until the answers are read
 *	  (at the connection's next use or a safe point) and settled
 *	  (rl_lt_settle_pending) as a waited-for release would have been, a failure
 *	  there becoming a doubt; doubts, settled here or handed to the
 *	  watchdog worker; fair-lock queues left; subscriptions an interrupted
 *	  wait left; lost locks the worker found.  rl_safe_point, at the start
 *	  of every SQL-callable function, does all of it.
 *
 *	  Must not: call hiredis, know script bodies (scripts.c does), define
 *	  SQL-callable functions (functions.c does), acquire or drop holds
 *	  (lockacquire.c, lockrelease.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/lock/lockdoubts.c
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
#include "lock/lock_int.h"

/*
 * A release sent without waiting for its answer (after COMMIT or ABORT, at
 * the end of redis_lock_with_lock): the entry stays, with no holds and
 * marked releasing, until the answer is in; then it is settled as
 * rl_lt_release_soft settles one (rl_lt_settle_pending).  Lives in rl_owed_context(),
 * with its op and a copy of the entry's names, so that the answer can be
 * reported even when the entry is gone or was taken again (superseded).
 */
typedef struct PendingRelease
{
	char		hkey[RL_MAX_NAME_LEN + 2];	/* the entry's: mode letter + name */
	uint64		serial;			/* of the entry it releases */
	bool		superseded;		/* the same entry was acquired again */
	RLLockOp   *op;
	RLLockNames names;
	struct PendingRelease *next;
} PendingRelease;

static PendingRelease *pending = NULL;
int			rl_lt_npending = 0;

/* an interrupted wait may have left these subscribed */
RLConn	   *rl_lt_dirty_subs[64];
int			rl_lt_ndirty_subs = 0;

/* ----------------------------------------------------------------
 * Releases sent without waiting for their answers
 * ----------------------------------------------------------------
 */

/* A copy of an entry's names in the owed context (see PendingRelease) */
static void
copy_names(RLLockNames *to, const RLLockNames *from)
{
	MemoryContext cxt = rl_owed_context();

	*to = *from;
	to->key = from->key ? MemoryContextStrdup(cxt, from->key) : NULL;
	to->fence_key = from->fence_key ? MemoryContextStrdup(cxt, from->fence_key) : NULL;
	to->channel = from->channel ? MemoryContextStrdup(cxt, from->channel) : NULL;
	/* its answer may be read after the entry (and its names) went */
	to->release_channel = from->release_channel ?
		MemoryContextStrdup(cxt, from->release_channel) : NULL;
}

/* Nothing owed and nothing pending any more: free what they used */
static void
owed_memory_reset(void)
{
	if (rl_lt_npending == 0 && rl_owed_count() == 0)
		rl_owed_reset();
}

/*
 * Send the release of every entry in ents (holds already zero, out of
 * renewal: rl_lt_became_doubt) without waiting for the answers, which nothing the
 * session does depends on: the lock is free for waiters as soon as Redis
 * runs it, and the answer is read at the connection's next use or the next
 * safe point (rl_lt_settle_pending), where a lost lock or a failure is reported as
 * a synchronous release would have.  An entry whose connection could not
 * take it at once (closed, out of step, a script-free server whose commands
 * are not known yet) is not sent: those are moved to the front of ents and
 * their number returned, for the caller to release as before.  Interrupts
 * are held: only the write is waited for, bounded by command_timeout (cut to
 * RL_HELD_WAIT_CUT_MS by a cancel).
 */
int
rl_lt_release_later(RLHeld **ents, int n)
{
	MemoryContext old;
	RLLockOp   *ops;
	PendingRelease *recs;
	bool	   *sent;
	int			left = 0;
	int			i;

	if (n == 0)
		return 0;
	old = MemoryContextSwitchTo(rl_owed_context());
	ops = palloc(sizeof(RLLockOp) * n);
	recs = palloc0(sizeof(PendingRelease) * n);
	sent = palloc(sizeof(bool) * n);
	for (i = 0; i < n; i++)
	{
		RLHeld	   *e = ents[i];
		PendingRelease *p = &recs[i];

		strlcpy(p->hkey, e->hkey, sizeof(p->hkey));
		p->serial = e->serial;
		copy_names(&p->names, &e->names);
		rl_lt_op_init(&ops[i], RL_OP_RELEASE, e, e->lease_ms);
		ops[i].names = &p->names;
		p->op = &ops[i];
	}
	MemoryContextSwitchTo(old);

	HOLD_INTERRUPTS();
	rl_lock_ops_send(ops, n, sent);
	RESUME_INTERRUPTS();

	for (i = 0; i < n; i++)
	{
		RLHeld	   *e = ents[i];

		if (!sent[i])
		{
			ents[left++] = e;
			continue;
		}
		/* out of the doubt set until its answer is in */
		Assert(RL_HOLDS(e) == 0 && !RL_HANDED(e) && !RL_RELEASING(e));

		/*
		 * Its registry slot goes to the worker, which releases the lock if
		 * the answer is not read by its deadline and as long again (the
		 * session idles, or the connection died): no slot stays taken, and
		 * no doubt unsettled, by a session that does not call again.  The
		 * margin leaves a session that does call the answer's reading.
		 * Counted as handed only.
		 */
		if (e->registry_slot >= 0 && rl_watchdog_enabled())
		{
			e->handed_gen = rl_registry_hand_off(e->registry_slot, e->expires_at, false,
												 TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
																			 2 * rl_command_timeout_ms));
			rl_lt_set_state(e, RL_ENTRY_RELEASING_HANDED);
		}
		else
			rl_lt_set_state(e, RL_ENTRY_RELEASING);
		recs[i].next = pending;
		pending = &recs[i];
		rl_lt_npending++;
	}
	owed_memory_reset();
	return left;
}

/*
 * A release still on its way whose answer no longer decides the entry's
 * fate (its lock was acquired again, see rl_lt_reclaim_releasing, or the
 * worker keeps the entry): say only what a synchronous release would have
 * said.
 */
static void
report_superseded(PendingRelease *p, int result)
{
	if (result == 0)
		ereport(WARNING,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("Redis lock \"%s\" was lost", p->hkey + 1),
				 errdetail("Its lease expired or another client deleted or took over key \"%s\".",
						   p->names.key)));
	else if (result == RELEASE_UNKNOWN && !p->op->goes_again)
		rl_lt_report_call(WARNING, RL_ACTION_RELEASE, p->hkey + 1, p->op->failure);
}

/*
 * Settle every release sent without waiting whose answers are in (those
 * already read, and what a look at the sockets finds, without waiting), as
 * rl_lt_release_soft settles a release of a lock the session held: released, the
 * entry goes; not ours, it is reported lost (WARNING) and goes; no majority
 * answered, the failure is a WARNING and the entry stays as a doubt, for the
 * worker or settle_doubts.  A node that did not run it and would have been
 * asked again (a redirection, NOSCRIPT after a restart) has it run again
 * here, synchronously: interruptible when the caller is (a cancel leaves
 * those entries doubts), else bounded as rl_lt_release_soft; without send_again
 * those stay pending for the next safe point.
 */
void
rl_lt_settle_pending(bool interruptible, bool send_again)
{
	PendingRelease **pp;
	PendingRelease *p;
	RLHeld	  **again = NULL;
	int			nagain = 0;
	RLHeld	  **quiet;
	int			nquiet = 0;

	if (rl_lt_npending == 0)
		return;
	again = palloc(sizeof(RLHeld *) * rl_lt_npending);
	quiet = palloc(sizeof(RLHeld *) * rl_lt_npending);
	rl_poll_owed();
	pp = &pending;
	while ((p = *pp) != NULL)
	{
		RLLockOp   *op = p->op;
		RLHeld	   *e;
		int			result;

		if (!rl_lock_op_answered(op) ||
			(!send_again && op->goes_again && !p->superseded))
		{
			/* not in yet, or to be sent again at the next safe point */
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		rl_lt_npending--;
		result = RL_OP_YES(op) ? 1 : RL_OP_NO(op) ? 0 : RELEASE_UNKNOWN;
		e = rl_lt_held != NULL ? hash_search(rl_lt_held, p->hkey, HASH_FIND, NULL) : NULL;
		/* superseded first: a later release of the same entry may be on its way */
		if (p->superseded || e == NULL || e->serial != p->serial || !RL_RELEASING(e))
		{
			/* forgotten meanwhile (force release, new settings): nothing */
			if (p->superseded && !proc_exit_inprogress)
				report_superseded(p, result);
			continue;
		}
		/* a doubt again until settled below */
		rl_lt_set_state(e, RL_HANDED(e) ? RL_ENTRY_HANDED : RL_ENTRY_DOUBT);
		if (RL_HANDED(e) && proc_exit_inprogress)
		{
			/*
			 * Exiting: the worker has it and keeps it.  Taking it back would
			 * wait out a command of the worker's with interrupts held, and
			 * the worker makes the release the entry would be left for.
			 */
			continue;
		}
		if (RL_HANDED(e))
		{
			bool		ours;

			/*
			 * Not interruptible (after a grant): a command of the worker's
			 * under way is not waited for, the worker keeps the entry.
			 */
			if (!interruptible)
				HOLD_INTERRUPTS();
			ours = rl_lt_take_back_from_worker(e);
			if (!interruptible)
				RESUME_INTERRUPTS();
			if (!ours)
			{
				/*
				 * The worker released it (its answer being overdue), or is
				 * sending its release now: what our own release found is
				 * still said, and the entry is the worker's to settle.
				 */
				report_superseded(p, result);
				if (result == 1)
					rl_stats_add(RL_STAT_RELEASED, 1);
				rl_lt_entry_remove(e);
				continue;
			}
		}
		if (result == RELEASE_UNKNOWN && op->goes_again)
		{
			again[nagain++] = e;
			continue;
		}
		if (result == RELEASE_UNKNOWN)
		{
			/* stays a doubt: the worker (or settle_doubts) releases it */
			if (!proc_exit_inprogress)	/* exit is quiet, as release_soft's */
				rl_lt_report_call(WARNING, RL_ACTION_RELEASE, e->name, op->failure);
			if (e->registry_slot >= 0 && rl_watchdog_enabled())
				rl_lt_hand_to_worker(e);
			continue;
		}
		if (result == 0 && !e->lost)
		{
			rl_lt_mark_lost(e);
			if (!proc_exit_inprogress)
				rl_lt_warn_lost(e);
		}
		if (result == 1)
			rl_stats_add(RL_STAT_RELEASED, 1);
		/* decided, but a master did not run it (NOSCRIPT): there again */
		if (op->goes_again)
		{
			quiet[nquiet++] = e;
			continue;
		}
		rl_lt_entry_remove(e);
	}
	owed_memory_reset();
	if (nagain > 0)
		rl_lt_release_soft(again, nagain, rl_lt_warn_for_all(nagain), interruptible);
	if (nquiet > 0)
		rl_lt_release_soft(quiet, nquiet, NULL, interruptible);
	pfree(again);
	pfree(quiet);
}

/*
 * The lock of an entry whose release is on its way is acquired again: the
 * entry becomes a doubt, which the acquire reuses with a fresh owner value
 * (rl_lt_renew_owner), so it needs no wait for the answer: whenever the
 * release lands, it cannot match the new grant.  Its answer is then only
 * reported; its registry slot, handed to the worker, stays the worker's,
 * which deletes the old value if the release did not run (a redirection,
 * NOSCRIPT, a lost reply).
 */
void
rl_lt_reclaim_releasing(RLHeld *e)
{
	PendingRelease *p;

	Assert(RL_RELEASING(e));
	for (p = pending; p != NULL; p = p->next)
		if (p->serial == e->serial)
			p->superseded = true;
	/* a handed one: the acquire takes it back first */
	rl_lt_set_state(e, RL_HANDED(e) ? RL_ENTRY_HANDED : RL_ENTRY_DOUBT);
}

/* ----------------------------------------------------------------
 * Safe points
 * ----------------------------------------------------------------
 */

/*
 * Settle doubts here (without preloading, or those without a registry
 * slot): forget those never tried and those whose lease has surely run
 * out, send an idempotent compare-and-delete for the rest.  Cancel interrupts it like any call: the
 * doubts stay as they were.
 */
static void
settle_doubts(void)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;
	RLHeld	  **ents;
	int			n = 0;
	int			cap = rl_lt_ndoubts;
	TimestampTz now = GetCurrentTimestamp();
	MemoryContext old;

	if (rl_lt_ndoubts <= 0 || rl_lt_held == NULL)
		return;
	old = MemoryContextSwitchTo(rl_lt_work_cxt);
	ents = palloc(sizeof(RLHeld *) * cap);
	hash_seq_init(&seq, rl_lt_held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (RL_HOLDS(e) != 0 || RL_HANDED(e) || RL_RELEASING(e))
			continue;
		/* never tried (0), or its lease surely ran out: nothing to delete */
		if (e->expires_at == 0 || now > e->expires_at)
			rl_lt_entry_remove(e);
		else if (n < cap)
			ents[n++] = e;
	}
	rl_lt_release_soft(ents, n, NULL, true);
	MemoryContextSwitchTo(old);
	MemoryContextReset(rl_lt_work_cxt);
}

/*
 * Hand every doubt to the watchdog worker (with preloading): no round trip
 * here, and none that a cancel would have to wait for.  A doubt without a
 * registry slot stays for settle_doubts; one of an entry never tried is
 * dropped, nothing of it can be in Redis.
 */
void
rl_lt_hand_doubts_to_worker(void)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;

	if (rl_lt_ndoubts <= 0 || rl_lt_held == NULL || !rl_watchdog_enabled())
		return;
	hash_seq_init(&seq, rl_lt_held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (RL_HOLDS(e) != 0 || RL_HANDED(e) || RL_RELEASING(e))
			continue;
		if (e->expires_at == 0)
			rl_lt_entry_remove(e);
		else if (e->registry_slot >= 0)
			rl_lt_hand_to_worker(e);
	}
}

/*
 * At an abort (with preloading), the releases rl_lt_release_later could not
 * send on a connection ready for them (doubts already, rl_lt_drop_holds)
 * go to the watchdog worker instead of being made here: their round trip
 * would open a connection with interrupts held, for up to connect_timeout,
 * right after the cancel that caused the abort was served (nothing pending
 * is left to cut it short).  The worker deletes each (if still ours) as soon as Redis
 * answers.  Returns how many entries are left for the caller, compacted at
 * the front: all of them without preloading, those without a registry slot.
 */
int
rl_lt_hand_unsent_to_worker(RLHeld **ents, int n)
{
	int			left = 0;
	int			i;

	if (!rl_watchdog_enabled())
		return n;
	for (i = 0; i < n; i++)
	{
		RLHeld	   *e = ents[i];

		if (e->registry_slot < 0)
		{
			ents[left++] = e;
			continue;
		}
		rl_lt_hand_to_worker(e);
		e->release_handed = true;
	}
	return left;
}

/*
 * Release entries (holds already zero) from a path that must neither raise
 * nor wait for Redis with interrupts held: COMMIT, ABORT, ROLLBACK TO
 * SAVEPOINT, redis_lock_with_lock's error path, DISCARD.  Each release is
 * sent without waiting where its connection can take it (rl_lt_release_later,
 * the answer read later); the rest go to the watchdog worker with
 * preloading, or, with no registry slot, stay doubts for the next call's
 * safe point.  Without preloading they are made here, bounded by
 * RL_HELD_WAIT_CUT_MS (rl_lt_release_soft with interrupts held).
 */
void
rl_lt_release_without_waiting(RLHeld **ents, int n)
{
	n = rl_lt_release_later(ents, n);
	n = rl_lt_hand_unsent_to_worker(ents, n);
	if (n > 0 && !rl_held_work_to_worker)
		rl_lt_release_soft(ents, n, rl_lt_warn_for_all(n), false);
}

/*
 * Forget the handed doubts the worker has settled.  Scanning the table only
 * when the shared settled-event counter moved keeps this O(1) per call.
 */
static void
forget_settled_doubts(void)
{
	static uint32 seen_events = 0;
	uint32		events;
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;

	events = rl_registry_settled_events();
	if (events == seen_events)
		return;
	seen_events = events;
	hash_seq_init(&seq, rl_lt_held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		/* (one whose release is owed a reply: settle_pending forgets it) */
		if (RL_HANDED(e) && !RL_RELEASING(e) &&
			!rl_registry_handed(e->registry_slot, e->handed_gen))
		{
			rl_lt_set_state(e, RL_ENTRY_DOUBT);
			e->registry_slot = -1;
			rl_lt_entry_remove(e);
		}
	}
}

void
rl_lt_clean_dirty_subs(void)
{
	int			i;

	/* an interrupted wait may have left a subscription: drop it */
	for (i = 0; i < rl_lt_ndirty_subs; i++)
		rl_conn_close(rl_lt_dirty_subs[i]);
	rl_lt_ndirty_subs = 0;
}

/*
 * Take every queued entry out of its fair lock's queue, never raising (it
 * also runs at transaction abort and backend exit, after a cancelled wait).
 * The leaves are sent without waiting for their answers, which nothing
 * depends on: an entry left behind in Redis ends at its queue time, and
 * waiters behind it go on.  One whose connection cannot take it at once is
 * made here as a round trip, interruptibly when interrupts are not held,
 * else bounded (RL_HELD_WAIT_CUT_MS, or the exit's bound) where no worker
 * could take the work; with interrupts held in a backend of a preloaded
 * server it stays queued, for the next call's safe point or the exit: no
 * round trip is waited for there.
 */
void
rl_lt_leave_queues(void)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;
	RLHeld	  **ents;
	RLLockOp   *ops;
	RLLockNames *names;
	bool	   *sent;
	int			n = 0;
	int			nrun = 0;
	int			i;
	bool		may_wait;
	MemoryContext old;

	if (rl_lt_nqueued <= 0 || rl_lt_held == NULL)
		return;
	may_wait = InterruptHoldoffCount == 0 || proc_exit_inprogress ||
		!rl_held_work_to_worker;
	ents = palloc(sizeof(RLHeld *) * rl_lt_nqueued);
	sent = palloc(sizeof(bool) * rl_lt_nqueued);
	old = MemoryContextSwitchTo(rl_owed_context());
	ops = palloc(sizeof(RLLockOp) * rl_lt_nqueued);
	hash_seq_init(&seq, rl_lt_held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (e->queued_ms == 0 || n >= rl_lt_nqueued)
			continue;
		rl_lt_op_init(&ops[n], RL_OP_DEQUEUE, e, e->lease_ms);
		ops[n].queue_wait_ms = e->queued_ms;
		/* the op's names are the entry's: copied, the entry may go first */
		names = palloc(sizeof(RLLockNames));
		copy_names(names, &e->names);
		ops[n].names = names;
		ents[n++] = e;
	}
	MemoryContextSwitchTo(old);
	/*
	 * At exit a round trip, within the exit's bound: the connection is
	 * closed right after (abortively), and a leave sent without waiting
	 * would hold up the releases' round trip behind its reply.
	 */
	if (proc_exit_inprogress)
		memset(sent, 0, sizeof(bool) * n);
	else
	{
		HOLD_INTERRUPTS();
		rl_lock_ops_send(ops, n, sent);
		RESUME_INTERRUPTS();
	}
	for (i = 0; i < n; i++)
	{
		if (!sent[i] && !may_wait)
			continue;			/* stays queued: left at the next safe point */
		ents[i]->queued_ms = 0;
		rl_lt_nqueued--;
		if (!sent[i])
			ops[nrun++] = ops[i];
	}
	/* counted out already: a cancel that cuts this short loses nothing */
	if (nrun > 0)
		rl_lock_ops_run(ops, nrun, RL_RUN_SOFT);
	pfree(ents);
	pfree(sent);
	owed_memory_reset();
}

/*
 * Report lost locks the watchdog found since the last call.  Scanning the
 * table only when the shared lost-event counter moved keeps this O(1) per
 * call however many locks the session holds.
 */
static void
report_lost(void)
{
	static uint32 seen_events = 0;
	uint32		events;
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;

	if (!rl_watchdog_enabled() || rl_lt_held == NULL)
		return;
	events = rl_registry_lost_events();
	if (events == seen_events)
		return;
	seen_events = events;
	hash_seq_init(&seq, rl_lt_held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (RL_HOLDS(e) > 0 && rl_lt_take_worker_loss(e))
			rl_lt_warn_lost(e);
	}
}

/* Called at the start of every SQL-callable function */
void
rl_safe_point(void)
{
	rl_lt_call_seq++;
	rl_lt_ensure_table();
	if (rl_lt_npending > 0)
		rl_lt_settle_pending(true, true);
	if (rl_lt_ndirty_subs > 0)
		rl_lt_clean_dirty_subs();
	if (rl_lt_nqueued > 0)
		rl_lt_leave_queues();
	if (rl_lt_nhanded > 0)
		forget_settled_doubts();
	if (rl_lt_ndoubts > 0)
		rl_lt_hand_doubts_to_worker();
	if (rl_lt_ndoubts > 0)
		settle_doubts();
	report_lost();
}
