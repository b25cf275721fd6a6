/*-------------------------------------------------------------------------
 *
 * locklost.c
 *	  Owns what the holder does once the watchdog worker finds one of its
 *	  locks lost (redis_lock.on_lost): the cancel the worker sent is
 *	  raised as the loss (40001, naming the lock and why) instead of as a
 *	  user's cancel, by an error-context callback the statement hooks put on
 *	  the stack (rl_lost_push_context); a session idle in a transaction when
 *	  the loss came fails its next statement; redis_lock_check() raises the
 *	  same error without a round trip.  The worker decides and signals
 *	  (watchjobs.c).
 *
 *	  Must not: call hiredis or Redis (everything here reads what the
 *	  worker last saw), raise from the error-context callback, define
 *	  SQL-callable functions (functions.c does), change holds (lockrelease.c
 *	  does).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/lock/locklost.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/elog.h"

#include "redis/redis.h"
#include "worker/worker.h"
#include "lock/lock_int.h"

/* The cause of a loss, for the error's detail */
static const char *
cause_text(uint8 cause)
{
	return cause == RL_LOST_UNREACHABLE ?
		"No renewal was answered before its lease ran out; Redis has expired it or will as soon as it runs again." :
		"Redis no longer holds its owner value: it expired, was deleted, or another client took it.";
}

/*
 * Whom a loss counts for (unreported_loss): the cancel being reported, or
 * a statement in the transaction that was idle when it came.
 */
typedef enum LossFor
{
	LOSS_FOR_CANCEL,			/* the worker's signal came in this statement */
	LOSS_FOR_TRANSACTION		/* found since the transaction began */
} LossFor;

/*
 * Did the loss (found at lost_at, its holder signalled at cancelled_at)
 * come within what began at since?  For a cancel: only one the worker had
 * recorded before it signalled (cancelled_at is RL_CANCEL_UNDER_WAY from
 * before kill() until it returned, then when it returned), so that a
 * user's cancel in the window between the finding and the signal stays a
 * cancel; and not one recorded before the statement began, which was
 * served before it (ignored while the session idled), so that a cancel
 * now is someone else's.  Comparing when the loss was found instead would
 * take the worker's cancel for a user's whenever the holder began its next
 * statement between the finding and the signal.
 */
static bool
loss_within(LossFor what, TimestampTz since, TimestampTz lost_at,
			TimestampTz cancelled_at)
{
	if (what == LOSS_FOR_CANCEL)
		return cancelled_at >= since;	/* 0: not signalled */
	return lost_at >= since;
}

/*
 * A held lock of this session with on_lost = error that the worker found
 * lost and that was not reported yet, with what the worker recorded; only
 * a loss within what began at since (loss_within).  NULL when there is
 * none.  Locks with another on_lost are passed over: neither caller acts on
 * them, and a warn lock, never signalled, has no cancelled_at and would
 * pass for this statement's cancel, hiding the error lock it was for.
 */
static RLHeld *
unreported_loss(LossFor what, TimestampTz since, uint8 *cause,
				TimestampTz *lost_at)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;
	TimestampTz cancelled_at;

	if (rl_lt_held == NULL || !rl_watchdog_enabled())
		return NULL;
	hash_seq_init(&seq, rl_lt_held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (RL_HOLDS(e) == 0 || e->lost || e->registry_slot < 0)
			continue;
		if (!rl_registry_loss(e->registry_slot, cause, lost_at, &cancelled_at))
			continue;
		if (e->on_lost != RL_ON_LOST_ERROR ||
			!loss_within(what, since, *lost_at, cancelled_at))
			continue;
		hash_seq_term(&seq);
		return e;
	}
	return NULL;
}

/*
 * The loss (its cause as the worker found it) is reported now: no WARNING
 * about it at the next call.  One the worker only presumed stays one (a
 * round trip that finds the lock ours refutes it, rl_lt_found_ours).
 */
static void
mark_reported(RLHeld *e, uint8 cause)
{
	rl_lt_set_lost(e);
	e->loss_presumed = cause == RL_LOST_UNREACHABLE;
	e->lost_reported_at = rl_lt_call_seq;
	rl_stats_add(RL_STAT_INTERRUPTED, 1);
}

/*
 * An error-context callback, run by errfinish() for every error raised
 * while it is on error_context_stack, before the error goes to any
 * handler: a cancel (57014) that the worker sent because a lock of ours
 * with on_lost = error was lost becomes the loss where it is raised, with
 * its SQLSTATE (40001, a retryable conflict, as the COMMIT check's) and
 * message, so that a PL/pgSQL handler for serialization_failure catches it
 * and the client and server log get it whatever the logging settings; the
 * time from the worker's finding to the cancel goes to the detail.  Any
 * other cancel (the user's, statement_timeout) stays as it is.  Never
 * raises: it only reads the table and shared memory and sets the error's
 * fields.
 */
static void
loss_for_cancel(void *arg)
{
	RLHeld	   *e;
	uint8		cause;
	TimestampTz lost_at;
	long		ms;

	if (geterrcode() != ERRCODE_QUERY_CANCELED)
		return;
	e = unreported_loss(LOSS_FOR_CANCEL, GetCurrentStatementStartTimestamp(),
						&cause, &lost_at);
	if (e == NULL)
		return;
	mark_reported(e, cause);
	ms = (long) ((GetCurrentTimestamp() - lost_at) / 1000);
	errcode(ERRCODE_T_R_SERIALIZATION_FAILURE);
	if (e->mode == RL_MODE_PERMIT)
		errmsg("permits of Redis semaphore \"%s\" were lost", e->name);
	else
		errmsg("Redis lock \"%s\" was lost", e->name);
	errdetail("%s The statement was cancelled %ld ms after the watchdog found it lost.",
			  cause_text(cause), Max(ms, 0));
	errhint("The work the lock protected is no longer protected: retry it once the lock is taken again, or set redis_lock.on_lost to warn to be only warned.");
}

/*
 * Put loss_for_cancel on error_context_stack, in cb (the caller's frame),
 * for what the caller runs until rl_lost_pop_context: the hooks that run a
 * statement (module.c) wrap it in one.  An error unwinds it with the
 * frame, as every handler restores the stack it found.
 */
void
rl_lost_push_context(ErrorContextCallback *cb)
{
	cb->callback = loss_for_cancel;
	cb->arg = NULL;
	cb->previous = error_context_stack;
	error_context_stack = cb;
}

/* Take cb, pushed by rl_lost_push_context, off error_context_stack */
void
rl_lost_pop_context(ErrorContextCallback *cb)
{
	error_context_stack = cb->previous;
}

/*
 * loss_for_cancel at the bottom of error_context_stack, between the
 * statements' hooks too: a cancel that lands while a statement is planned,
 * in ExecutorStart or ExecutorEnd, or in the commit of a statement outside
 * its verify (a few CHECK_FOR_INTERRUPTS each, hit under load: about 1 in
 * 50 cancels in
 * t/test_lost_edges.py::test_the_workers_cancel_never_lands_as_a_users_cancel,
 * raised from the planner's add_path and from exec_simple_query) is the
 * loss as well.  Only an empty stack gets it, so it is always the bottom.
 * It must be put there outside every PG_TRY block: PG_END_TRY restores the
 * stack it found even when nothing was raised, so an entry put inside one
 * (ExecutorStart runs inside PortalStart's) is gone when the block ends.
 * The post-parse-analysis hook is outside them (module.c); from there it
 * stays until an error's recovery empties the stack, and the next
 * statement's analysis puts it back.  The callback does nothing for
 * anything but a cancel, and nothing twice: it runs again for a cancel a
 * hook's own entry made the loss already, and sees 40001.
 */
static ErrorContextCallback loss_bottom;

void
rl_lost_keep_context(void)
{
	if (error_context_stack != NULL)
		return;
	loss_bottom.callback = loss_for_cancel;
	loss_bottom.arg = NULL;
	loss_bottom.previous = NULL;
	error_context_stack = &loss_bottom;
}

/* The loss of e, as an ERROR */
pg_noreturn static void
raise_loss(RLHeld *e, uint8 cause, const char *when)
{
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 e->mode == RL_MODE_PERMIT ?
			 errmsg("permits of Redis semaphore \"%s\" were lost", e->name) :
			 errmsg("Redis lock \"%s\" was lost", e->name),
			 errdetail("%s It was found lost %s.", cause_text(cause), when),
			 errhint("The work the lock protected is no longer protected: retry it once the lock is taken again.")));
}

/*
 * Before every statement (ExecutorStart, and utility statements other than
 * ending a transaction, module.c): a lock with on_lost = error lost while
 * this session was idle in its transaction fails the transaction now; the
 * worker's cancel found nothing running.  A loss from before the
 * transaction began is only warned about, at the next redis_lock call.
 * O(1) while no lock of the server was found lost since the last look.
 */
void
rl_lost_check_statement(void)
{
	static uint32 seen_events = 0;
	uint32		events;
	RLHeld	   *e;
	uint8		cause;
	TimestampTz lost_at;

	if (!rl_watchdog_enabled() || rl_lt_held == NULL || !IsTransactionState())
		return;
	events = rl_registry_lost_events();
	if (events == seen_events)
		return;
	e = unreported_loss(LOSS_FOR_TRANSACTION,
						GetCurrentTransactionStartTimestamp(), &cause,
						&lost_at);
	if (e == NULL)
	{
		seen_events = events;
		return;
	}
	mark_reported(e, cause);
	raise_loss(e, cause, "while this session was idle in its transaction");
}

/*
 * redis_lock_check(): true when the session holds name (in any mode) and
 * the worker has not found it lost; the loss as an ERROR when it has,
 * whatever redis_lock.on_lost says; false when it is not held.  No round
 * trip: what the worker last saw (without preloading, what the session's
 * own calls last saw).
 */
bool
rl_check_lock(const char *name)
{
	static const RLLockMode modes[] = {RL_MODE_EXCLUSIVE, RL_MODE_READ, RL_MODE_WRITE};
	bool		held = false;
	int			i;

	rl_lt_ensure_table();
	for (i = 0; i < (int) lengthof(modes); i++)
	{
		RLHeld	   *e = rl_lt_entry_find(modes[i], name);
		uint8		cause;
		TimestampTz lost_at;
		TimestampTz cancelled_at;

		if (e == NULL || RL_HOLDS(e) == 0)
			continue;
		cause = e->loss_presumed ? RL_LOST_UNREACHABLE : RL_LOST_NOT_OURS;
		if (e->lost ||
			(e->registry_slot >= 0 &&
			 rl_registry_loss(e->registry_slot, &cause, &lost_at, &cancelled_at)))
		{
			if (!e->lost)
				mark_reported(e, cause);
			raise_loss(e, cause, "by the watchdog or by a call of this session");
		}
		held = true;
	}
	return held;
}
