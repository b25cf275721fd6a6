/*-------------------------------------------------------------------------
 *
 * watchdog.c
 *	  Owns the background workers that renew watchdog leases and release
 *	  what exited backends left behind, working from the shared registry
 *	  (registry.c), and their registration at _PG_init.  There are two, one
 *	  per lane (RLLane): the targets that answer in time, and those that
 *	  failed or answered slowly last time, so that waiting for the latter
 *	  never holds up the former (worker_cycle).
 *
 *	  It exists only with shared_preload_libraries = 'redis_lock'.  The
 *	  worker only marks slots renewed or lost and frees orphans, always
 *	  checking the slot's generation so a result never lands on a reused
 *	  slot.  The worker talks to Redis only through lockop.c
 *	  (compare-and-PEXPIRE, compare-and-delete), so it can never re-create a
 *	  lock that vanished.
 *
 *	  Must not: touch a backend's local lock table, allocate registry slots
 *	  or targets (registry.c owns the layout and the free list), or raise
 *	  ERROR in the worker's loop for a Redis failure (those are retried next
 *	  cycle).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/worker/watchdog.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/ps_status.h"

#include "worker/worker_int.h"

PGDLLEXPORT void rl_watchdog_main(Datum arg);

/* Called from _PG_init: hooks and the workers, only when preloading */
void
rl_watchdog_init(void)
{
	BackgroundWorker worker;
	int			lane;

	if (!process_shared_preload_libraries_in_progress)
		return;
	rl_registry_init();

	for (lane = 0; lane < RL_NUM_LANES; lane++)
	{
		memset(&worker, 0, sizeof(worker));
		worker.bgw_flags = BGWORKER_SHMEM_ACCESS;
		worker.bgw_start_time = BgWorkerStart_PostmasterStart;
		worker.bgw_restart_time = 1;
		snprintf(worker.bgw_library_name, BGW_MAXLEN, "redis_lock");
		snprintf(worker.bgw_function_name, BGW_MAXLEN, "rl_watchdog_main");
		snprintf(worker.bgw_name, BGW_MAXLEN, "%s",
				 lane == RL_LANE_PROMPT ? "redis_lock watchdog" :
				 "redis_lock slow-target watchdog");
		snprintf(worker.bgw_type, BGW_MAXLEN, "redis_lock watchdog");
		worker.bgw_main_arg = Int32GetDatum(lane);
		RegisterBackgroundWorker(&worker);
	}
}

/* ----------------------------------------------------------------
 * The worker
 * ----------------------------------------------------------------
 */
typedef enum JobKind
{
	JOB_RENEW,
	JOB_RELEASE
} JobKind;

/*
 * One thing to do for a slot, copied out of the registry so that the
 * registry's lock is not held while names are built or Redis is asked.
 */
typedef struct Job
{
	JobKind		kind;
	int			slot;
	uint32		generation;
	int			target;
	RLProtocol	protocol;
	bool		script_free;
	int			permits;		/* a semaphore's */
	int64		lease_ms;
	TimestampTz due;			/* renew: last renewal + lease/3, the latest
								 * moment to send it; release: now */
	TimestampTz horizon;		/* the key cannot outlive this */
	bool		late_grant;		/* release: a grant may still land */
	bool		retry;			/* its last attempt failed */
	bool		failing;		/* its target's last attempts failed */
	bool		gave_up;		/* release: dropped, refused to the end */
	bool		lost_now;		/* renew: found lost by this round */
	int			holder_pid;		/* renew: its backend */
	uint8		on_lost;		/* renew: what its holder is made to do */
	uint8		lost_cause;		/* renew, lost_now: why */
	int			name_off;		/* the lock's name in key */
	char	   *key;
	char	   *owner;
	char	   *release_prefix; /* release: publish key on this + key ("":
								 * no) */
} Job;

/*
 * Ops per round trip.  All due renewals of a target are pipelined, but in
 * rounds of at most this many, so that a round's deadline (command_timeout)
 * bounds the time of RL_WATCHDOG_BATCH scripts rather than of however many
 * locks are due, and the memory of a round stays bounded.  A round of 1000
 * renewals takes a few ms against a Redis on loopback (bench/run, section
 * watchdog_scale).
 */
#define RL_WATCHDOG_BATCH	1000

/*
 * Jobs per cycle: when more are due, the most urgent go now and the rest in
 * the cycles that follow at once.  A cycle's duration is what the lookahead
 * below must cover, so bounding it keeps renewals close to lease/3 apart
 * instead of one whole pass ahead; each cycle scans the registry once, which
 * for 100 000 slots costs a few ms, a small share of 10 rounds.
 */
#define RL_WATCHDOG_CYCLE_JOBS	(10 * RL_WATCHDOG_BATCH)

/*
 * Renewals start ahead of their deadline by the duration of a cycle.  A
 * lock is due lease/3 after its last renewal, but when many locks are due
 * together the last of a cycle's jobs goes out only after every earlier
 * round.  So a lock's renewal starts at last renewal + lease/3 - lookahead,
 * and the cycle takes along every lock due within another lookahead, so that
 * locks due close together go in the same rounds (not one cycle, and one
 * scan of the registry, per lock).  The lookahead is the longest of the
 * last LOOKAHEAD_CYCLES cycles that did work, plus a margin for the
 * worker being descheduled on a busy machine (LOOKAHEAD_MARGIN_MS, or
 * lease/30 if less: renewing up to a tenth of a period early; with 100 ms,
 * 100 000 locks with a 6 s lease on a loaded 2-core machine were renewed up
 * to 15 ms late, bench/run watchdog_scale, 2026-11-23);
 * cycles are bounded by RL_WATCHDOG_CYCLE_JOBS, so it stays short.  Only
 * recent cycles count, so that one stall (the worker descheduled, a round
 * that timed out) does not make every lock renew early for long: that
 * doubled the renewals of 100 000 locks, and the worker could not keep up
 * with its own early renewals (bench/run, watchdog_scale).  It is at most
 * lease/6, and no
 * lock is renewed sooner than lease/6 after its last renewal, however slow
 * the cycles get; when they are slower than that, renewals are late and the
 * worker says so in the log.
 */
#define LOOKAHEAD_MARGIN_MS		250
#define LOOKAHEAD_CYCLES		16

static long cycle_ms[LOOKAHEAD_CYCLES];	/* the last cycles that did work */
static int	cycle_next = 0;
static long cycle_max_ms = 0;	/* the longest of them */

/* How far ahead of its deadline a renewal of a lease of lease_ms starts */
static long
lookahead_ms(int64 lease_ms)
{
	int64		margin = Min(LOOKAHEAD_MARGIN_MS, lease_ms / 30);

	return (long) Min(cycle_max_ms + margin, lease_ms / 6);
}

/* A cycle that did work took ms: remember it for the lookahead */
static void
note_pass(long ms)
{
	int			i;

	cycle_ms[cycle_next] = ms;
	cycle_next = (cycle_next + 1) % LOOKAHEAD_CYCLES;
	cycle_max_ms = 0;
	for (i = 0; i < LOOKAHEAD_CYCLES; i++)
		cycle_max_ms = Max(cycle_max_ms, cycle_ms[i]);
}

/* What one pass did, for the process title and the log */
typedef struct PassStats
{
	int			jobs;
	int			renewed;
	int			released;
	int			failed;
	int			rounds;
	int			late;			/* renewals sent after their deadline */
	long		late_ms;		/* by how much, at most */
} PassStats;

/*
 * What the worker remembers between cycles, in its own memory.  Per slot:
 * how many renewals or releases failed in a row and when to try again, so a
 * Redis that is down costs a few attempts per lease, not one per cycle.
 * (Per target, whether it is failing and when that was last logged, so the
 * log gets a line per target every LOG_EVERY_MS, not one per attempt, is
 * in RLSharedTarget: the lanes share it.)
 */
typedef struct SlotRetry
{
	uint32		generation;		/* of the slot when it failed */
	int			failures;
	int			answered;		/* late-grant watch: definite answers in a
								 * row (a refusal for good counts) */
	int			refusals;		/* release: refused for good, in a row */
	long		backoff_ms;
	TimestampTz retry_at;		/* not before this (failures, or watching) */
} SlotRetry;

#define RETRY_FIRST_MS	50
#define RETRY_MAX_MS	1000
#define LOG_EVERY_MS	10000

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

/*
 * The prompt lane waits at most this long for a connection (name resolution
 * included) and for the replies of a round, whatever connect_timeout and
 * command_timeout say: a round that fails within it moves its target to the
 * slow lane, whose worker waits the full timeouts (and retries at once what
 * failed here).  A round in the slow lane that answered every op within it
 * moves its target back.  So a target that stops answering holds up the
 * prompt lane once, for at most this long per connect and per round trip.
 */
#define RL_PROMPT_WAIT_MS	1000

/*
 * Whether this cycle bounds the prompt lane's waits: only while more than
 * one target is in use, since the bound protects the others.  A single busy
 * target whose rounds of 1000 renewals took over a second on a loaded
 * machine would otherwise time out and move between lanes (renewals late).
 * Set by run_job_groups.
 */
bool		rl_wd_prompt_bound = true;

RLLane		rl_wd_lane = RL_LANE_PROMPT;
SlotRetry  *rl_wd_retries = NULL;
static TimestampTz late_logged_at = 0;

/* What the cycle (watchdog.c) and the jobs (watchjobs.c) share */
extern RLLane rl_wd_lane;
extern bool rl_wd_prompt_bound;
extern SlotRetry *rl_wd_retries;
extern bool rl_wd_has_failed(int slot, uint32 generation);
extern bool rl_wd_not_yet(int slot, uint32 generation, TimestampTz now);
extern void rl_wd_note_outcome(Job *j, bool failed, TimestampTz now);
extern int	rl_wd_run_round(Job *jobs, int n, RLTarget *t,
							RLSharedTarget *target, PassStats *ps,
							char **problem, MemoryContext problem_cxt);

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

/* on_shmem_exit of the worker: unpublish its latch, nobody may set it now */
static void
redis_lock_worker_on_shmem_exit(int code, Datum arg)
{
	Latch	   *prompt;

	/* a FATAL (out of memory) may have come while the registry was locked */
	LWLockReleaseAll();
	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	if (rl_shared->worker_latch[rl_wd_lane] == MyLatch)
		rl_shared->worker_latch[rl_wd_lane] = NULL;
	prompt = rl_shared->worker_latch[RL_LANE_PROMPT];
	LWLockRelease(rl_shared->lock);
	/* the slow lane's targets are the prompt lane's until we are back */
	if (rl_wd_lane == RL_LANE_SLOW && prompt != NULL)
		SetLatch(prompt);
}

/*
 * Is the backend with this pid still there?  Asked once per pid and cycle
 * (alive caches the answers): BackendPidGetProc scans the whole ProcArray
 * under ProcArrayLock, and a backend may hold thousands of slots.
 */
typedef struct PidAlive
{
	int			pid;			/* hash key */
	bool		alive;
} PidAlive;

static bool
backend_alive(HTAB *alive, int pid)
{
	bool		found;
	PidAlive   *e = hash_search(alive, &pid, HASH_ENTER, &found);

	if (!found)
		e->alive = BackendPidGetProc(pid) != NULL;
	return e->alive;
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
 * After a target's rounds of a cycle: nfailed ops failed, and the slowest
 * round took slowest_ms.  Moves the target between lanes, and logs a line
 * per failing target per LOG_EVERY_MS and one when it recovers.
 */
static void
note_target(int tidx, const char *spec, int nfailed, long slowest_ms,
			const char *problem)
{
	RLSharedTarget *st = &rl_shared->targets[tidx];
	TimestampTz now = GetCurrentTimestamp();
	const char *where = strchr(spec, '|') ? strchr(spec, '|') + 1 : spec;
	bool		recovered = false;
	bool		report = false;
	int			unlogged = 0;
	RLLane		lane;
	Latch	   *wake = NULL;

	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	/* its slots went meanwhile, and the entry to another target */
	if (st->refs == 0 || strcmp(st->spec, spec) != 0)
	{
		LWLockRelease(rl_shared->lock);
		return;
	}
	lane = (nfailed > 0 || (rl_wd_prompt_bound && slowest_ms > RL_PROMPT_WAIT_MS)) ?
		RL_LANE_SLOW : RL_LANE_PROMPT;
	if (st->lane != lane)
	{
		/* its jobs are the other worker's from now on: tell it */
		st->lane = lane;
		wake = rl_shared->worker_latch[rl_serving_lane(st)];
	}
	if (nfailed == 0)
	{
		recovered = st->failing;
		st->failing = false;
		st->unlogged = 0;
	}
	else if (st->failing &&
			 now < TimestampTzPlusMilliseconds(st->logged_at, LOG_EVERY_MS))
		st->unlogged += nfailed;
	else
	{
		report = true;
		unlogged = st->unlogged;
		st->failing = true;
		st->logged_at = now;
		st->unlogged = 0;
	}
	LWLockRelease(rl_shared->lock);
	if (wake != NULL)
		SetLatch(wake);

	if (recovered)
		ereport(LOG,
				(errmsg("redis_lock watchdog reaches Redis at %s again", where)));
	else if (report && unlogged > 0)
		ereport(LOG,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("redis_lock watchdog could not renew or release %d lock(s) at %s; %d more attempt(s) failed since the last report",
						nfailed, where, unlogged),
				 errdetail_internal("%s", problem)));
	else if (report)
		ereport(LOG,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("redis_lock watchdog could not renew or release %d lock(s) at %s",
						nfailed, where),
				 errdetail_internal("%s", problem)));
}

/*
 * Read holds are renewed at least this often: a third of Redisson's default
 * lockWatchdogTimeout (30 s), to which its readers' renewals cut every
 * reader's timeout key, so such a cut is restored before it runs out even
 * before the watchdog has seen one (below).
 */
#define RL_READ_RENEW_MAX_MS	10000

/*
 * Renewal period of a slot: a third of its lease, or less for read holds,
 * or once another client was seen cutting the lease short
 */
static int64
renewal_period(RLSlot *s)
{
	int64		period = s->st.lease_ms / 3;

	/* a Redisson reader cuts every read hold to its lockWatchdogTimeout */
	if (s->st.protocol == RL_PROTOCOL_RW_READ)
		period = Min(period, RL_READ_RENEW_MAX_MS);
	return s->renew_every_ms > 0 ? Min(period, s->renew_every_ms) : period;
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

/*
 * Every job of one target (of one group, see worker_cycle), in rounds of at
 * most RL_WATCHDOG_BATCH.  Once a whole round failed, the target is taken
 * for down: the rest of its jobs count as failed attempts without being
 * sent, so that a Redis that does not answer costs one command_timeout per
 * cycle, as before rounds were bounded, not one per round.  Then the target
 * goes to the lane its rounds call for (note_target).
 */
static void
run_target(Job *jobs, int n, int tidx, RLSharedTarget *target, PassStats *ps)
{
	RLTarget   *t = rl_target_from_spec(target->spec);
	MemoryContext cycle_cxt = CurrentMemoryContext;
	MemoryContext round_cxt;
	char	   *problem = NULL;
	int			nfailed = 0;
	long		slowest_ms = 0;
	int			rounds = ps->rounds;
	bool		down = false;
	int			b;

	round_cxt = AllocSetContextCreate(cycle_cxt, "redis_lock watchdog round",
									  ALLOCSET_DEFAULT_SIZES);
	for (b = 0; b < n; b += RL_WATCHDOG_BATCH)
	{
		int			m = Min(RL_WATCHDOG_BATCH, n - b);
		TimestampTz start;
		int			f;

		if (down)
		{
			TimestampTz now = GetCurrentTimestamp();
			int			k;

			for (k = b; k < b + m; k++)
				rl_wd_note_outcome(&jobs[k], true, now);
			nfailed += m;
			continue;
		}
		MemoryContextSwitchTo(round_cxt);
		start = GetCurrentTimestamp();
		f = rl_wd_run_round(jobs + b, m, t, target, ps, &problem, cycle_cxt);
		slowest_ms = Max(slowest_ms,
						 (long) ((GetCurrentTimestamp() - start) / 1000));
		MemoryContextSwitchTo(cycle_cxt);
		MemoryContextReset(round_cxt);
		nfailed += f;
		down = (f == m);
	}
	MemoryContextDelete(round_cxt);
	ps->failed += nfailed;
	/* nothing was sent (the slots all changed meanwhile): nothing learnt */
	if (ps->rounds > rounds)
		note_target(tidx, target->spec, nfailed, slowest_ms, problem);
}

/*
 * Order of jobs: those of failing targets last (in the slow lane, a target
 * that was only slow goes before those that do not answer), then (when
 * grouping by target) by target, then retries last, then by deadline; see
 * worker_cycle.
 */
static int
job_order(const Job *x, const Job *y, bool by_target)
{
	if (x->failing != y->failing)
		return x->failing ? 1 : -1;
	if (by_target && x->target != y->target)
		return x->target < y->target ? -1 : 1;
	if (x->retry != y->retry)
		return x->retry ? 1 : -1;
	if (x->due != y->due)
		return x->due < y->due ? -1 : 1;
	return x->slot < y->slot ? -1 : x->slot > y->slot ? 1 : 0;
}

/* qsort order of the jobs taken, grouped by target for its rounds */
static int
job_cmp(const void *a, const void *b)
{
	return job_order((const Job *) a, (const Job *) b, true);
}

static bool
same_group(const Job *x, const Job *y)
{
	return x->target == y->target;
}

/* The process title (ps) says what the last pass did */
static void
report_pass(PassStats *ps, long pass_ms, long scan_ms)
{
	char		title[160];

	snprintf(title, sizeof(title),
			 "last pass: %d renewed, %d released, %d failed in %d rounds, %ld ms (scan %ld ms); %d late",
			 ps->renewed, ps->released, ps->failed, ps->rounds, pass_ms, scan_ms, ps->late);
	set_ps_display(title);
	if (ps->late > 0 &&
		GetCurrentTimestamp() >= TimestampTzPlusMilliseconds(late_logged_at, LOG_EVERY_MS))
	{
		ereport(LOG,
				(errmsg("redis_lock watchdog renewed %d lock(s) more than a third of their lease after the last renewal, by up to %ld ms",
						ps->late, ps->late_ms),
				 errdetail("The pass renewed %d and released %d lock(s) in %d round(s) and took %ld ms.",
						   ps->renewed, ps->released, ps->rounds, pass_ms),
				 errhint("The worker was held up, or cannot keep up with this many locks: consider a longer redis_lock.lease_time.")));
		late_logged_at = GetCurrentTimestamp();
	}
}

/* Urgency of the jobs of a cycle, to pick the RL_WATCHDOG_CYCLE_JOBS first */
static int
job_urgency_cmp(const void *a, const void *b)
{
	return job_order((const Job *) a, (const Job *) b, false);
}

/* What the scan of a cycle found: the jobs due, and when more fall due */
typedef struct CycleScan
{
	TimestampTz start;			/* when the cycle began */
	TimestampTz next_due;		/* when the next slot not taken falls due */
	Job		   *jobs;
	int			njobs;
	int			cap;
	HTAB	   *alive;			/* backend_alive's cache */
	int			last_pid;		/* the pid last asked about */
	bool		last_alive;
} CycleScan;

static void
scan_init(CycleScan *scan)
{
	HASHCTL		ctl;

	memset(scan, 0, sizeof(*scan));
	scan->start = GetCurrentTimestamp();
	scan->next_due = TimestampTzPlusMilliseconds(scan->start, 1000);
	scan->cap = 64;
	scan->jobs = palloc(sizeof(Job) * scan->cap);
	ctl.keysize = sizeof(int);
	ctl.entrysize = sizeof(PidAlive);
	ctl.hcxt = CurrentMemoryContext;
	scan->alive = hash_create("redis_lock watchdog backends", 64, &ctl,
							  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/*
 * What slot s (index i) needs now, if anything: a release when its backend
 * is gone or left it, a renewal when its renewal falls due soon enough.
 * Returns false when nothing is due yet (moving scan->next_due up to when
 * it will be).  Caller holds the registry's lock.
 */
static bool
slot_due(CycleScan *scan, RLSlot *s, int i, JobKind *kind, TimestampTz *due)
{
	*due = scan->start;
	if (s->state == SLOT_FREE)
		return false;
	/* the other lane's worker serves its target */
	if (rl_serving_lane(&rl_shared->targets[s->target]) != rl_wd_lane)
		return false;
	/* a backend's slots often come in runs: ask the cache less */
	if (s->st.pid != scan->last_pid)
	{
		scan->last_pid = s->st.pid;
		scan->last_alive = backend_alive(scan->alive, scan->last_pid);
	}
	if (s->state == SLOT_ORPHAN && scan->last_alive && s->not_before > scan->start)
	{
		/* its backend's release is on its way: wait for its deadline */
		scan->next_due = Min(scan->next_due, s->not_before);
		return false;
	}
	if (s->state == SLOT_ORPHAN || !scan->last_alive)
		*kind = JOB_RELEASE;
	else if (s->state == SLOT_HELD && s->st.watchdog && !s->st.lost &&
			 s->st.session_holds + s->st.xact_holds > 0)
	{
		long		ahead = lookahead_ms(s->st.lease_ms);
		TimestampTz take_at;

		*due = TimestampTzPlusMilliseconds(s->st.last_renewed_at, renewal_period(s));
		/* start by due - ahead; take along what is due within ahead more */
		take_at = Max(TimestampTzPlusMilliseconds(*due, -2 * ahead),
					  TimestampTzPlusMilliseconds(s->st.last_renewed_at,
												  renewal_period(s) / 2));
		/* a keyspace notification said its key is gone: now */
		if (take_at > scan->start && !s->check_now)
		{
			scan->next_due = Min(scan->next_due,
								 Max(take_at, TimestampTzPlusMilliseconds(*due, -ahead)));
			return false;
		}
		*kind = JOB_RENEW;
	}
	else
		return false;
	if (rl_wd_not_yet(i, s->generation, scan->start))
	{
		scan->next_due = Min(scan->next_due, rl_wd_retries[i].retry_at);
		return false;
	}
	return true;
}

/* Append the job of slot s (index i) to the scan.  Caller holds the lock. */
static void
add_job(CycleScan *scan, RLSlot *s, int i, JobKind kind, TimestampTz due)
{
	Job		   *j;

	if (scan->njobs == scan->cap)
	{
		scan->cap *= 2;
		scan->jobs = repalloc(scan->jobs, sizeof(Job) * scan->cap);
	}
	j = &scan->jobs[scan->njobs++];
	j->kind = kind;
	j->slot = i;
	j->generation = s->generation;
	j->target = s->target;
	j->protocol = s->st.protocol;
	j->script_free = s->st.script_free;
	j->permits = s->st.permits;
	j->lease_ms = s->st.lease_ms;
	j->due = due;
	j->horizon = s->horizon != 0 ? s->horizon :
		TimestampTzPlusMilliseconds(s->st.last_renewed_at,
									s->st.lease_ms + 2 * rl_command_timeout_ms +
									rl_connect_timeout_ms);
	j->late_grant = s->late_grant;
	j->lost_now = false;
	j->name_off = s->name_off;
	j->retry = rl_wd_has_failed(i, s->generation);
	j->failing = rl_shared->targets[s->target].failing;
}

/* Find what needs doing: one pass over the registry, its lock held shared */
static void
find_due_jobs(CycleScan *scan)
{
	int			i;

	LWLockAcquire(rl_shared->lock, LW_SHARED);
	for (i = 0; i < rl_shared->nslots; i++)
	{
		RLSlot	   *s = &rl_shared->slots[i];
		JobKind		kind;
		TimestampTz due;

		if (slot_due(scan, s, i, &kind, &due))
			add_job(scan, s, i, kind, due);
	}
	LWLockRelease(rl_shared->lock);
}

/* The most urgent first, and no more than a cycle's worth; returns how many */
static int
keep_most_urgent(Job *jobs, int njobs)
{
	if (njobs <= RL_WATCHDOG_CYCLE_JOBS)
		return njobs;
	qsort(jobs, njobs, sizeof(Job), job_urgency_cmp);
	return RL_WATCHDOG_CYCLE_JOBS;
}

/*
 * Copy the names and targets of the jobs taken; a slot that changed
 * meanwhile is left for the next cycle.  The targets are copied in the
 * same hold: an entry is reused only once no slot points at it.  Returns
 * how many jobs are left, at the front of jobs.
 */
static int
copy_job_names(Job *jobs, int njobs, RLSharedTarget *targets)
{
	int			ntaken = 0;
	int			i;

	LWLockAcquire(rl_shared->lock, LW_SHARED);
	memcpy(targets, rl_shared->targets, sizeof(RLSharedTarget) * RL_MAX_TARGETS);
	for (i = 0; i < njobs; i++)
	{
		RLSlot	   *s = &rl_shared->slots[jobs[i].slot];

		if (s->generation != jobs[i].generation || s->state == SLOT_FREE ||
			s->target != jobs[i].target)
			continue;
		jobs[ntaken] = jobs[i];
		jobs[ntaken].key = pstrdup(s->key);
		jobs[ntaken].owner = pstrdup(s->owner);
		jobs[ntaken].release_prefix = pstrdup(s->release_prefix);
		ntaken++;
	}
	LWLockRelease(rl_shared->lock);
	return ntaken;
}

/*
 * Run the jobs taken, a target at a time; within each, slots doing fine
 * first, those whose last attempt failed after them, each by deadline.
 */
static void
run_job_groups(Job *jobs, int ntaken, RLSharedTarget *targets, PassStats *ps)
{
	int			inuse = 0;
	int			g;

	for (g = 0; g < RL_MAX_TARGETS; g++)
		inuse += targets[g].refs > 0 ? 1 : 0;
	rl_wd_prompt_bound = inuse > 1;

	if (ntaken > 1)
		qsort(jobs, ntaken, sizeof(Job), job_cmp);
	for (g = 0; g < ntaken;)
	{
		int			e = g + 1;

		while (e < ntaken && same_group(&jobs[g], &jobs[e]))
			e++;
		run_target(jobs + g, e - g, jobs[g].target, &targets[jobs[g].target], ps);
		g = e;
	}
}

/*
 * One cycle of this lane: renew what is due, release what exited backends
 * left, on the targets this lane serves.  The registry's lock is held
 * (shared) to find what is due, again to copy the names of the jobs taken,
 * and (exclusive) per round to apply its results; never while names are
 * built, jobs sorted or Redis asked.  Targets are served one after another,
 * so a target that does not answer (or answers slowly) would hold up the
 * others for its connect and command timeouts.  The prompt lane waits for
 * none longer than RL_PROMPT_WAIT_MS; a target whose round failed or took
 * longer moves to the slow lane, whose own worker waits for it with the
 * full timeouts, and comes back when a round answers in time.  So a target
 * that goes silent delays the prompt lane's others once, by at most
 * RL_PROMPT_WAIT_MS per connect and per round trip; silent targets can
 * delay each other in the slow lane.  Within a target,
 * slots whose last attempt failed wait out their back-off and go after the
 * others, and jobs go by deadline, in rounds of RL_WATCHDOG_BATCH.  A cycle
 * takes the RL_WATCHDOG_CYCLE_JOBS most urgent jobs; the rest wait for the
 * next cycle, which follows at once.  Returns how long to sleep until
 * something else is due.
 */
static long
worker_cycle(void)
{
	CycleScan	scan;
	RLSharedTarget *targets;
	PassStats	ps;
	long		scan_ms;
	int			njobs;
	int			ntaken;
	TimestampTz now;

	memset(&ps, 0, sizeof(ps));
	targets = palloc(sizeof(RLSharedTarget) * RL_MAX_TARGETS);

	scan_init(&scan);
	find_due_jobs(&scan);
	scan_ms = (long) ((GetCurrentTimestamp() - scan.start) / 1000);

	njobs = keep_most_urgent(scan.jobs, scan.njobs);
	ntaken = copy_job_names(scan.jobs, njobs, targets);
	run_job_groups(scan.jobs, ntaken, targets, &ps);
	explicit_bzero(targets, sizeof(RLSharedTarget) * RL_MAX_TARGETS);

	now = GetCurrentTimestamp();
	if (njobs > 0)
	{
		long		pass_ms = (long) ((now - scan.start) / 1000);

		note_pass(pass_ms);
		report_pass(&ps, pass_ms, scan_ms);
		/* look again at once: the results moved the due times */
		return 1;
	}
	return Max(1, (long) ((scan.next_due - now + 999) / 1000));
}

/*
 * Entry point of a watchdog background worker (bgw_function_name), of the
 * lane given as its argument: renews watchdog leases and releases orphans
 * of that lane's targets every cycle, until SIGTERM.
 */
void
rl_watchdog_main(Datum arg)
{
	MemoryContext cxt;

	rl_wd_lane = (RLLane) DatumGetInt32(arg);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	/* the worker takes that work: nobody to hand it to */
	rl_held_work_to_worker = false;

	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	rl_shared->worker_latch[rl_wd_lane] = MyLatch;
	/* a predecessor that died in a round left its commands marked */
	for (int i = 0; i < rl_shared->nslots; i++)
		if (rl_shared->slots[i].in_flight == 1 + rl_wd_lane)
			rl_shared->slots[i].in_flight = 0;
	LWLockRelease(rl_shared->lock);
	on_shmem_exit(redis_lock_worker_on_shmem_exit, (Datum) 0);

	cxt = AllocSetContextCreate(TopMemoryContext, "redis_lock watchdog",
								ALLOCSET_DEFAULT_SIZES);
	rl_wd_retries = MemoryContextAllocZero(TopMemoryContext,
									 sizeof(SlotRetry) * Max(rl_shared->nslots, 1));
	ereport(LOG, (errmsg("redis_lock watchdog started"),
				  errdetail_internal("lane %s",
									 rl_wd_lane == RL_LANE_PROMPT ? "prompt" : "slow")));

	for (;;)
	{
		long		sleep_ms;
		TimestampTz wake_at;
		MemoryContext old = MemoryContextSwitchTo(cxt);

		/* busy: a lock registered during the cycle wakes it again */
		pg_atomic_write_u64(&rl_shared->worker_wakes_at[rl_wd_lane], (uint64) PG_INT64_MAX);
		sleep_ms = worker_cycle();
		wake_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), sleep_ms);
		/* keyspace notifications of the locks it renews, where sent */
		rl_watch_events_sync(rl_wd_lane);
		pg_atomic_write_u64(&rl_shared->worker_wakes_at[rl_wd_lane], (uint64) wake_at);

		/* what is due comes no later for the subscriptions' round trip */
		rl_watch_events_wait(Max(0, (long) ((wake_at - GetCurrentTimestamp() + 999) / 1000)));
		MemoryContextSwitchTo(old);
		MemoryContextReset(cxt);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
	}
}
