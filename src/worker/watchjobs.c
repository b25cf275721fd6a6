/*-------------------------------------------------------------------------
 *
 * watchjobs.c
 *	  Owns the watchdog workers' jobs, once their cycle (watchdog.c) has
 *	  picked them: one round trip for a batch of one target's renewals and
 *	  releases (marked in flight, built, sent with the passwords the
 *	  backends used), and their outcomes applied to the registry: a renewal
 *	  done, a lease another client cut short, a lock found lost and its
 *	  holder signalled, an orphan released or watched for a late grant, a
 *	  release refused for good until its horizon; and each slot's retries
 *	  with back-off (rl_wd_retries).
 *
 *	  Must not: touch a backend's local lock table, allocate registry
 *	  slots or targets, raise ERROR for a Redis failure (those are
 *	  retried), or log or signal while the registry is locked (but for
 *	  the holder's signal, sent with the registry lock and ProcArrayLock
 *	  held, in that order: interface/shmem.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/worker/watchjobs.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "miscadmin.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "utils/memutils.h"

#include "net/net.h"
#include "redis/redis.h"
#include "worker/worker_int.h"

#define RETRY_FIRST_MS	50
#define RETRY_MAX_MS	1000

/*
 * A doubt handed over by a backend (rl_registry_hand_off) is retried at
 * most this far apart while its Redis fails, so that it is settled soon
 * after that Redis answers again; one whose grant may still land is checked
 * again every retry_cap(lease) until its horizon has passed and its Redis
 * answered twice in a row since (a command queued before those answers has
 * been run by then).  Past the horizon by DOUBT_GIVE_UP_MS without an
 * answer, it is dropped: its Redis is gone, or so long frozen that a grant
 * it still runs is beyond what the worker can watch for.
 */
#define DOUBT_RETRY_MAX_MS	100
#define DOUBT_GIVE_UP_MS	(10 * 60 * 1000)

/*
 * A release Redis refuses in a way that would come again (an ACL that
 * denies the script or the key, a command the server does not know:
 * rl_reply_is_permanent) cannot delete the lock: only its lease ends it.
 * Redis answers, so its target is not failing; the release is asked again
 * (an administrator may mend the ACL) after a back-off doubled from
 * RETRY_FIRST_MS up to this, never past its horizon, and dropped there,
 * with one LOG line.
 */
#define REFUSED_RETRY_MAX_MS	10000

SlotRetry  *rl_wd_retries = NULL;

/* The longest back-off for a lease: well below lease/3, the renewal period */
static long
retry_cap(int64 lease_ms)
{
	return (long) Max(10, Min(RETRY_MAX_MS, lease_ms / 12));
}

bool
rl_wd_has_failed(int slot, uint32 generation)
{
	return rl_wd_retries[slot].generation == generation &&
		rl_wd_retries[slot].failures > 0;
}

/* Is the slot's next attempt scheduled after now (back-off or watch)? */
bool
rl_wd_not_yet(int slot, uint32 generation, TimestampTz now)
{
	return rl_wd_retries[slot].generation == generation &&
		rl_wd_retries[slot].retry_at > now;
}

static SlotRetry *
slot_retry(Job *j)
{
	SlotRetry  *r = &rl_wd_retries[j->slot];

	if (r->generation != j->generation)
	{
		memset(r, 0, sizeof(*r));
		r->generation = j->generation;
	}
	return r;
}

void
rl_wd_note_outcome(Job *j, bool failed, TimestampTz now)
{
	SlotRetry  *r = slot_retry(j);

	if (!failed)
	{
		r->failures = 0;
		r->retry_at = 0;
		return;
	}
	if (r->failures == 0)
		r->backoff_ms = RETRY_FIRST_MS;
	else
		r->backoff_ms = r->backoff_ms * 2;
	r->backoff_ms = Min(r->backoff_ms, retry_cap(j->lease_ms));
	if (j->kind == JOB_RELEASE)
		r->backoff_ms = Min(r->backoff_ms, DOUBT_RETRY_MAX_MS);
	r->failures++;
	r->answered = 0;
	r->refusals = 0;
	r->retry_at = TimestampTzPlusMilliseconds(now, r->backoff_ms);
}

/*
 * A release job's op was refused for good by every node that failed (see
 * REFUSED_RETRY_MAX_MS): back off, up to the horizon; Redis answered.
 */
static void
note_refused(Job *j, TimestampTz now)
{
	SlotRetry  *r = slot_retry(j);
	TimestampTz at;

	if (r->refusals == 0)
		r->backoff_ms = RETRY_FIRST_MS;
	else
		r->backoff_ms = Min(r->backoff_ms * 2, REFUSED_RETRY_MAX_MS);
	r->refusals++;
	r->failures++;
	r->answered++;
	at = TimestampTzPlusMilliseconds(now, r->backoff_ms);
	/* once more just past the horizon, where release_done drops it */
	if (j->horizon >= now && at > j->horizon)
		at = TimestampTzPlusMilliseconds(j->horizon, 1);
	r->retry_at = at;
}

/*
 * A release job's op got answer f (1 released, 0 not ours, -1 unknown;
 * refused: -1 from refusals for good only, counted by note_refused): is
 * the slot done with?  A release that found nothing of ours, or deleted
 * it, is, unless a late grant may still land: then only deleting it on the
 * one Redis it can land on, or a horizon passed with two answers in a row
 * (a refusal is an answer), or DOUBT_GIVE_UP_MS past it.
 */
static bool
release_done(Job *j, RLLockOp *op, int f, bool refused, TimestampTz now)
{
	SlotRetry  *r;

	if (!j->late_grant)
		return f >= 0 || now > j->horizon;
	if (f == 1 && op->nodes == 1)
		return true;
	r = slot_retry(j);
	if (op->failed == 0)
		r->answered++;
	if (now > j->horizon && r->answered >= 2)
		return true;
	if (refused)
		return false;
	return now > TimestampTzPlusMilliseconds(j->horizon, DOUBT_GIVE_UP_MS);
}

/* A late grant may still land: look again in a while */
static void
watch_again(Job *j, TimestampTz now)
{
	SlotRetry  *r = slot_retry(j);

	r->failures = 0;
	r->retry_at = TimestampTzPlusMilliseconds(now, retry_cap(j->lease_ms));
}

/* What went wrong with a failed op, for the watchdog's LOG line */
static char *
watchdog_problem(RLLockOp *op)
{
	if (op->failure != NULL)
		return rl_call_problem(op->failure);
	return pstrdup(_("No majority of the Redis masters answered."));
}

/*
 * A renewal found less of the lease left than our last renewal can have
 * left it (allowing for the clocks): another client cut it short.  Redis
 * ran our last renewal no earlier than it was sent (last_renewed_at) and
 * this one no later than its answer came (answered), so at most the time
 * between those two had passed: a slow round trip, which delays when Redis
 * runs a renewal, is not taken for a cut.  A Redisson reader's renewal sets
 * every reader's timeout key to its own lockWatchdogTimeout, and does so
 * again every third of it: from now on this lock is renewed every third of
 * what was found, so a cut is always restored before it runs out.  Caller
 * holds the registry lock.
 */
static void
note_cut_lease(RLSlot *s, Job *j, RLLockOp *op, TimestampTz answered)
{
	int64		found = rl_op_found_ttl(op);
	int64		left = j->lease_ms - (int64) ((answered - s->st.last_renewed_at) / 1000);
	int64		every;

	if (found < 0 || found >= left - Max(50, j->lease_ms / 20))
		return;
	every = Max(found / 3, 10);
	if (s->renew_every_ms > 0 && s->renew_every_ms <= every)
		return;
	s->renew_every_ms = every;
	ereport(LOG,
			(errmsg("redis_lock watchdog found the lease of Redis lock \"%s\" cut to %lld ms by another client; renewing it every %lld ms",
					s->key + s->name_off, (long long) found, (long long) every)));
}

/*
 * Up to a cycle has passed since the jobs were taken: a slot whose
 * generation moved on meanwhile (released, handed to another lock, out of
 * the watchdog or given another lease), or that the other lane's worker
 * took meanwhile (its target changed lanes), is not sent.  The others are
 * marked in flight and kept at the front of jobs; returns how many.
 */
static int
mark_jobs_in_flight(Job *jobs, int n)
{
	int			k;
	int			m = 0;

	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	for (k = 0; k < n; k++)
	{
		RLSlot	   *s = &rl_shared->slots[jobs[k].slot];

		if (s->generation == jobs[k].generation && s->state != SLOT_FREE &&
			s->in_flight == 0)
		{
			/* its backend waits for this before acting on it again */
			s->in_flight = 1 + rl_wd_lane;
			s->check_now = false;
			jobs[m++] = jobs[k];
		}
	}
	LWLockRelease(rl_shared->lock);
	return m;
}

/* The ops of a round, one per job, on target t */
static RLLockOp *
build_round_ops(Job *jobs, int n, RLTarget *t)
{
	RLLockOp   *ops = palloc0(sizeof(RLLockOp) * n);
	RLLockNames *names = palloc0(sizeof(RLLockNames) * n);
	int			k;

	for (k = 0; k < n; k++)
	{
		Job		   *j = &jobs[k];

		/* the fence counter is not touched by renew or release */
		rl_names_from_key(&names[k], j->protocol, "", j->key, CurrentMemoryContext);
		names[k].script_free = j->script_free;
		names[k].permits = j->permits;
		strlcpy(names[k].owner, j->owner, sizeof(names[k].owner));
		/* a release publishes as the session's own would have */
		if (j->kind == JOB_RELEASE && j->release_prefix[0] != '\0')
			names[k].release_channel = psprintf("%s%s", j->release_prefix,
												j->key);
		ops[k].kind = j->kind == JOB_RENEW ? RL_OP_RENEW : RL_OP_RELEASE;
		ops[k].target = t;
		ops[k].names = &names[k];
		ops[k].lease_ms = j->lease_ms;
	}
	return ops;
}

/*
 * A held lock is lost for good: never renewed again, counted, and its
 * holder made to act on it after the round (stop_holders).  Caller holds
 * the registry's lock.
 */
static void
mark_lost(Job *j, RLSlot *s, RLLostCause cause, TimestampTz now)
{
	s->st.lost_cause = (uint8) cause;
	s->st.lost_at = now;
	pg_write_barrier();			/* its backend reads lost first, unlocked */
	s->st.lost = true;
	rl_stats_add(RL_STAT_LOST, 1);
	pg_atomic_fetch_add_u32(&rl_shared->lost_events, 1);
	j->lost_now = true;
	j->holder_pid = s->st.pid;
	j->on_lost = s->st.on_lost;
	j->lost_cause = (uint8) cause;
}

#ifdef USE_ASSERT_CHECKING
/*
 * Assert-enabled builds only: RL_TEST_STOP_BEFORE_SIGNAL=1 in the server's
 * environment makes the worker stop itself (SIGSTOP) when it is about to
 * signal the holder of a lock it found lost, so that t/test_security.py can
 * let the holder release or take the lock again in that window, which is
 * otherwise a few instructions wide, and then resume the worker (SIGCONT).
 */
static void
stop_before_signal(void)
{
	const char *stop = getenv("RL_TEST_STOP_BEFORE_SIGNAL");

	if (stop != NULL && strcmp(stop, "1") == 0)
		raise(SIGSTOP);
}
#endif

/*
 * Signal the holder of lock j, found lost: SIGINT, or SIGTERM for on_lost
 * = terminate.  Only while it still holds the grant found lost: the slot
 * is held, of the same generation (a release or a new grant bumps it) and
 * of the same process, which is still in the ProcArray.  Checked and sent
 * with the registry's lock and ProcArrayLock held, as PostgreSQL signals a
 * virtual transaction's backend (SignalVirtualTransaction): the holder
 * cannot let the grant go meanwhile, nor leave the ProcArray, before which
 * its pid cannot be reused (a backend that crashed keeps its entry, but
 * then the postmaster at once ends every process, this one too).
 * cancelled_at records the signal in the grant's slot: RL_CANCEL_UNDER_WAY
 * before kill(), so that the holder, which reads it unlocked when its
 * cancel is raised, never takes the worker's signal for a user's; when it
 * had been sent once kill() returned, so that a later statement's cancel is
 * not taken for it (loss_within, locklost.c); 0 again if it was not sent.
 * Returns whether it was sent.
 */
static bool
signal_holder(Job *j)
{
	RLSlot	   *s = &rl_shared->slots[j->slot];
	bool		holds;
	bool		sent = false;

	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	/* still lost: a COMMIT may have withdrawn a presumed loss meanwhile */
	holds = s->generation == j->generation && s->state == SLOT_HELD &&
		s->st.pid == j->holder_pid && s->st.lost;
	if (holds)
	{
		LWLockAcquire(ProcArrayLock, LW_SHARED);
		if (BackendPidGetProcWithLock(j->holder_pid) != NULL)
		{
			s->st.cancelled_at = RL_CANCEL_UNDER_WAY;
			pg_write_barrier();
			sent = kill(j->holder_pid, j->on_lost == RL_ON_LOST_TERMINATE ?
						SIGTERM : SIGINT) == 0;
			s->st.cancelled_at = sent ? GetCurrentTimestamp() : 0;
		}
		LWLockRelease(ProcArrayLock);
	}
	LWLockRelease(rl_shared->lock);
	return sent;
}

/*
 * One LOG line per lock found lost, and its holder made to act on it as it
 * asked when it took the lock (redis_lock.on_lost): error cancels its
 * running statement, which the backend raises as the loss (40001, see
 * rl_lost_push_context); terminate ends the backend.  A backend that is idle
 * ignores the cancel; one idle in a transaction fails its next statement
 * (rl_lost_check_statement).  A holder that let the lock go since the loss
 * was found (or exited) is not signalled (signal_holder).
 */
static void
stop_holders(Job *jobs, int n)
{
	int			k;

	for (k = 0; k < n; k++)
	{
		Job		   *j = &jobs[k];
		const char *action;

		if (!j->lost_now)
			continue;
		j->lost_now = false;
		if (j->on_lost == RL_ON_LOST_WARN)
			action = "it is warned at its next call";
		else
		{
#ifdef USE_ASSERT_CHECKING
			stop_before_signal();
#endif
			if (j->holder_pid <= 0 || !signal_holder(j))
				action = "not signalled: it no longer holds it";
			else if (j->on_lost == RL_ON_LOST_TERMINATE)
				action = "terminating it";
			else
				action = "cancelling its statement";
		}
		ereport(LOG,
				(errmsg("Redis lock \"%s\" of process %d was lost: %s; %s",
						j->key + j->name_off, j->holder_pid,
						j->lost_cause == RL_LOST_UNREACHABLE ?
						"no renewal was answered before its lease ran out" :
						"Redis no longer holds its owner value (expired, deleted or taken by another client)",
						action)));
	}
}

/*
 * Apply a renewal's outcome f (1 renewed, 0 not ours, -1 unknown) sent at
 * sent, its answer in by now.  Caller holds the registry's lock.
 */
static void
apply_renewal(Job *j, RLSlot *s, RLLockOp *op, int f, TimestampTz sent,
			  TimestampTz now, PassStats *ps)
{
	/* released meanwhile (perhaps with its outcome unknown) */
	if (s->state != SLOT_HELD)
		return;
	if (f == 1)
	{
		note_cut_lease(s, j, op, now);
		s->st.last_renewed_at = sent;
		rl_stats_add(RL_STAT_RENEWALS, 1);
		ps->renewed++;
		/* late: a retry was late already, and is logged as failing */
		if (sent > j->due && !j->retry)
		{
			ps->late++;
			ps->late_ms = Max(ps->late_ms, (long) ((sent - j->due) / 1000));
		}
	}
	else if (f == 0)
		mark_lost(j, s, RL_LOST_NOT_OURS, now);	/* token gone or changed */
	else if (now >= TimestampTzPlusMilliseconds(s->st.last_renewed_at, s->st.lease_ms))
	{
		/*
		 * No renewal answered before the lease ran out (counted from when
		 * the last one that did was sent): Redis expired it, or will as
		 * soon as it runs again.  Presumed lost, not only once Redis
		 * answers again.
		 */
		mark_lost(j, s, RL_LOST_UNREACHABLE, now);
	}
}

/*
 * Apply a release's outcome f (refused: see release_done).  Caller holds
 * the registry's lock.
 */
static void
apply_release(Job *j, RLLockOp *op, int f, bool refused, TimestampTz now,
			  PassStats *ps)
{
	if (release_done(j, op, f, refused, now))
	{
		/* released, or surely expired: the slot is free again */
		if (f == 1)
			rl_stats_add(RL_STAT_RELEASED, 1);
		ps->released++;
		rl_slot_free(j->slot);
		j->gave_up = refused;
	}
	else if (f >= 0)
		watch_again(j, now);
}

/*
 * The one line for a release refused for good until its lock's lease had
 * surely run out (REFUSED_RETRY_MAX_MS), naming the lock, the server and
 * the refusal.
 */
static void
report_gave_up(Job *j, RLLockOp *op)
{
	RLCall	   *c = op->failure;

	Assert(c != NULL && c->conn != NULL && c->reply != NULL);
	ereport(LOG,
			(errcode(rl_error_reply_sqlstate(c->reply)),
			 errmsg("redis_lock watchdog gave up releasing Redis lock \"%s\" at %s: Redis refused it %d time(s) until its lease had run out",
					j->key + j->name_off, rl_conn_label(c->conn),
					rl_wd_retries[j->slot].refusals),
			 errdetail_internal("%s", rl_call_problem(c)),
			 errhint("Check the permissions of the Redis user redis_lock connects as.")));
}

/*
 * Apply the outcomes of a round sent at sent, unless the slot changed hands
 * meanwhile.  Returns how many ops failed; *problem gets (in problem_cxt)
 * what went wrong with the first failed op, if it has nothing yet.
 */
static int
apply_round(Job *jobs, RLLockOp *ops, int n, TimestampTz sent, PassStats *ps,
			char **problem, MemoryContext problem_cxt)
{
	TimestampTz now = GetCurrentTimestamp();
	int			nfailed = 0;
	bool	   *refused = palloc(sizeof(bool) * n);
	int			k;

	/*
	 * A release every failing node refused for good (REFUSED_RETRY_MAX_MS)
	 * is no failure of the target's: it answered.
	 */
	for (k = 0; k < n; k++)
	{
		RLLockOp   *op = &ops[k];

		refused[k] = jobs[k].kind == JOB_RELEASE && !RL_OP_YES(op) &&
			!RL_OP_NO(op) && op->failed > 0 && op->refused == op->failed;
		jobs[k].gave_up = false;
	}
	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	for (k = 0; k < n; k++)
	{
		Job		   *j = &jobs[k];
		RLSlot	   *s = &rl_shared->slots[j->slot];
		RLLockOp   *op = &ops[k];
		int			f = RL_OP_YES(op) ? 1 : RL_OP_NO(op) ? 0 : -1;

		/*
		 * Set by us above, whatever happened to the slot since (a slot
		 * freed and allocated again meanwhile starts without it, and the
		 * other lane may have taken it since)
		 */
		if (s->in_flight == 1 + rl_wd_lane)
			s->in_flight = 0;
		if (f < 0 && !refused[k])
		{
			if (nfailed++ == 0 && *problem == NULL)
			{
				MemoryContext old = MemoryContextSwitchTo(problem_cxt);

				*problem = watchdog_problem(op);
				MemoryContextSwitchTo(old);
			}
		}
		if (s->generation != j->generation || s->state == SLOT_FREE)
			continue;
		if (refused[k])
			note_refused(j, now);
		else if (j->kind == JOB_RENEW || !j->late_grant || f < 0)
			rl_wd_note_outcome(j, f < 0, now);
		if (j->kind == JOB_RENEW)
			apply_renewal(j, s, op, f, sent, now, ps);
		else
			apply_release(j, op, f, refused[k], now, ps);
	}
	LWLockRelease(rl_shared->lock);
	/* (not while the registry is locked) */
	for (k = 0; k < n; k++)
		if (jobs[k].gave_up)
			report_gave_up(&jobs[k], &ops[k]);
	stop_holders(jobs, n);
	pfree(refused);
	return nfailed;
}

/*
 * One round trip for at most RL_WATCHDOG_BATCH jobs of one target, with the
 * passwords the backends used (and, for a target of the prompt lane, waits
 * bounded by RL_PROMPT_WAIT_MS), then apply the results unless the slot
 * changed hands meanwhile.  A renewed lock counts as renewed when the round
 * was sent: Redis restarted its lease no earlier than that.  Returns how
 * many ops failed; *problem gets (in problem_cxt) what went wrong with the
 * first failed op, if it has nothing yet.
 */
int
rl_wd_run_round(Job *jobs, int n, RLTarget *t, RLSharedTarget *target,
				PassStats *ps, char **problem, MemoryContext problem_cxt)
{
	RLLockOp   *ops;
	TimestampTz sent;
	int			saved_connect_ms;
	int			saved_command_ms;

	n = mark_jobs_in_flight(jobs, n);
	if (n == 0)
		return 0;

	ops = build_round_ops(jobs, n, t);
	rl_use_credentials(target->password[0] ? target->password : NULL,
					   target->sentinel_password[0] ? target->sentinel_password : NULL);
	saved_connect_ms = rl_connect_timeout_ms;
	saved_command_ms = rl_command_timeout_ms;
	if (target->lane == RL_LANE_PROMPT && rl_wd_prompt_bound)
	{
		/* not the settings: the worker's own bound, for this round only */
		rl_connect_timeout_ms = Min(rl_connect_timeout_ms, RL_PROMPT_WAIT_MS);
		rl_command_timeout_ms = Min(rl_command_timeout_ms, RL_PROMPT_WAIT_MS);
	}
	sent = GetCurrentTimestamp();
	rl_lock_ops_run(ops, n, RL_RUN_SOFT);
	rl_connect_timeout_ms = saved_connect_ms;
	rl_command_timeout_ms = saved_command_ms;
	rl_use_settings_credentials();
	ps->rounds++;

	return apply_round(jobs, ops, n, sent, ps, problem, problem_cxt);
}
