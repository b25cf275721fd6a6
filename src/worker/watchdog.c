/*-------------------------------------------------------------------------
 *
 * watchdog.c
 *	  Owns the background workers that renew watchdog leases and release
 *	  what exited backends left behind, working from the shared registry
 *	  (registry.c), and their registration at _PG_init.  There are two, one
 *	  per lane (RLLane): the targets that answer in time, and those that
 *	  failed or answered slowly last time, so that waiting for the latter
 *	  never holds up the former (worker_cycle).  This file owns their
 *	  registration, their main loop and their cycle: what is due, the most
 *	  urgent kept, each target's jobs run in rounds and its lane judged
 *	  (note_target); one round and its outcomes are watchjobs.c's.
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

#include "net/net.h"
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

#define LOG_EVERY_MS	10000

/*
 * Whether this cycle bounds the prompt lane's waits: only while more than
 * one target is in use, since the bound protects the others.  A single busy
 * target whose rounds of 1000 renewals took over a second on a loaded
 * machine would otherwise time out and move between lanes (renewals late).
 * Set by run_job_groups.
 */
bool		rl_wd_prompt_bound = true;

RLLane		rl_wd_lane = RL_LANE_PROMPT;
static TimestampTz late_logged_at = 0;

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
		rl_watch_events_sync(rl_wd_lane, wake_at);
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
