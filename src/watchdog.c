/*-------------------------------------------------------------------------
 *
 * watchdog.c
 *	  Owns the shared-memory registry of every backend's Redis locks and the
 *	  background worker that renews watchdog leases and releases what exited
 *	  backends left behind.
 *
 *	  All of it exists only with shared_preload_libraries = 'redis_lock';
 *	  otherwise every function here is a cheap no-op.  Backends write only
 *	  their own slots; the worker only marks slots renewed or lost and frees
 *	  orphans, always checking the slot's generation so a result never lands
 *	  on a reused slot.  The worker talks to Redis only through lockop.c
 *	  (compare-and-PEXPIRE, compare-and-delete), so it can never re-create a
 *	  lock that vanished.
 *
 *	  Must not: touch a backend's local lock table, or raise ERROR in the
 *	  worker's loop for a Redis failure (those are retried next cycle).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/watchdog.c
 *
 *-------------------------------------------------------------------------
 */
#include "watchdog.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "port/atomics.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#define RL_MAX_TARGETS		32
#define RL_TARGET_SPEC_LEN	1024
#define RL_SECRET_LEN		256

typedef enum RLSlotState
{
	SLOT_FREE,
	SLOT_RESERVED,				/* acquire in flight: outcome not known yet */
	SLOT_HELD,
	SLOT_ORPHAN					/* owner exited without releasing it */
} RLSlotState;

typedef struct RLSlot
{
	uint32		generation;		/* bumped at every allocation and free */
	RLSlotState state;
	int			target;			/* index into RLShared.targets */
	RLLockState st;
	char		name[RL_MAX_NAME_LEN + 1];
	char		key[RL_MAX_KEY_LEN + 1];
	char		owner[RL_OWNER_LEN + 1];
} RLSlot;

/*
 * Where and with which passwords the locks of some slots live.  An entry is
 * in use while slots point at it (refs > 0); the worker connects with the
 * passwords the acquiring backend used, wherever it set them.
 */
typedef struct RLSharedTarget
{
	int			refs;
	char		spec[RL_TARGET_SPEC_LEN];
	char		password[RL_SECRET_LEN];
	char		sentinel_password[RL_SECRET_LEN];
} RLSharedTarget;

typedef struct RLShared
{
	LWLock	   *lock;
	Latch	   *worker_latch;
	pg_atomic_uint32 lost_events;	/* bumped whenever a slot is marked lost */
	RLSharedTarget targets[RL_MAX_TARGETS];
	int			nslots;
	int			nfree;
	RLSlot		slots[FLEXIBLE_ARRAY_MEMBER];
	/* followed by int freelist[nslots] */
} RLShared;

static RLShared *shared = NULL;
static int *freelist = NULL;
static int	registry_capacity = 0;

#if PG_VERSION_NUM >= 150000
static shmem_request_hook_type prev_shmem_request_hook = NULL;
#endif
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

PGDLLEXPORT void rl_watchdog_main(Datum arg);

/* ----------------------------------------------------------------
 * Shared memory
 * ----------------------------------------------------------------
 */
static Size
shared_size(void)
{
	Size		sz = offsetof(RLShared, slots);

	sz = add_size(sz, mul_size(registry_capacity, sizeof(RLSlot)));
	sz = add_size(sz, mul_size(registry_capacity, sizeof(int)));
	return sz;
}

/* shmem_request_hook: room for the registry and its LWLock */
static void
redis_lock_registry_shmem_request(void)
{
#if PG_VERSION_NUM >= 150000
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
#endif
	RequestAddinShmemSpace(shared_size());
	RequestNamedLWLockTranche("redis_lock", 1);
}

/* shmem_startup_hook: create (empty) or attach the registry */
static void
redis_lock_registry_shmem_startup(void)
{
	bool		found;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	shared = ShmemInitStruct("redis_lock registry", shared_size(), &found);
	freelist = (int *) &shared->slots[registry_capacity];
	if (!found)
	{
		/* a fresh start, also after a crash: nothing is resurrected */
		memset(shared, 0, shared_size());
		shared->lock = &(GetNamedLWLockTranche("redis_lock"))->lock;
		pg_atomic_init_u32(&shared->lost_events, 0);
		shared->nslots = registry_capacity;
		shared->nfree = registry_capacity;
		for (i = 0; i < registry_capacity; i++)
			freelist[i] = registry_capacity - 1 - i;
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Is the shared registry there (loaded through shared_preload_libraries)? */
bool
rl_watchdog_enabled(void)
{
	return shared != NULL;
}

/* Called from _PG_init: hooks and the worker, only when preloading */
void
rl_watchdog_init(void)
{
	BackgroundWorker worker;

	if (!process_shared_preload_libraries_in_progress)
		return;
	registry_capacity = rl_max_locks;

#if PG_VERSION_NUM >= 150000
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = redis_lock_registry_shmem_request;
#else
	redis_lock_registry_shmem_request();
#endif
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = redis_lock_registry_shmem_startup;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS;
	worker.bgw_start_time = BgWorkerStart_PostmasterStart;
	worker.bgw_restart_time = 1;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "redis_lock");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "rl_watchdog_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "redis_lock watchdog");
	snprintf(worker.bgw_type, BGW_MAXLEN, "redis_lock watchdog");
	RegisterBackgroundWorker(&worker);
}

/* ----------------------------------------------------------------
 * Registry, backend side
 * ----------------------------------------------------------------
 */

static const char *
or_empty(const char *s)
{
	return s ? s : "";
}

#define TARGET_TABLE_FULL	(-1)
#define TARGET_TOO_LONG		(-2)

/*
 * Index of the entry for the target and the current passwords, taking a
 * reference to it; TARGET_TABLE_FULL or TARGET_TOO_LONG when there is none.
 * The caller holds the lock exclusively.
 */
static int
target_ref(RLTarget *t)
{
	const char *pw = or_empty(rl_password);
	const char *spw = or_empty(rl_sentinel_password);
	int			free_idx = -1;
	int			i;

	if (strlen(t->spec) >= RL_TARGET_SPEC_LEN || strlen(pw) >= RL_SECRET_LEN ||
		strlen(spw) >= RL_SECRET_LEN)
		return TARGET_TOO_LONG;
	for (i = 0; i < RL_MAX_TARGETS; i++)
	{
		RLSharedTarget *st = &shared->targets[i];

		if (st->refs == 0)
		{
			if (free_idx < 0)
				free_idx = i;
			continue;
		}
		if (strcmp(st->spec, t->spec) == 0 && strcmp(st->password, pw) == 0 &&
			strcmp(st->sentinel_password, spw) == 0)
		{
			st->refs++;
			return i;
		}
	}
	if (free_idx >= 0)
	{
		RLSharedTarget *st = &shared->targets[free_idx];

		strlcpy(st->spec, t->spec, RL_TARGET_SPEC_LEN);
		strlcpy(st->password, pw, RL_SECRET_LEN);
		strlcpy(st->sentinel_password, spw, RL_SECRET_LEN);
		st->refs = 1;
	}
	return free_idx >= 0 ? free_idx : TARGET_TABLE_FULL;
}

/* Free a slot and drop its target reference; caller holds the lock */
static void
slot_free(int idx)
{
	RLSlot	   *s = &shared->slots[idx];
	RLSharedTarget *st = &shared->targets[s->target];

	s->generation++;
	s->state = SLOT_FREE;
	s->st.pid = 0;
	if (--st->refs == 0)
	{
		explicit_bzero(st->password, RL_SECRET_LEN);
		explicit_bzero(st->sentinel_password, RL_SECRET_LEN);
	}
	freelist[shared->nfree++] = idx;
}

static void
wake_worker(void)
{
	Latch	   *latch = shared->worker_latch;

	if (latch != NULL)
		SetLatch(latch);
}

/*
 * Reserve a slot for a lock about to be acquired.  Capacity is checked
 * before Redis is asked, so a full registry is an error with nothing taken.
 */
int
rl_registry_add(const char *name, const RLLockNames *names, RLTarget *target,
				int64 lease_ms)
{
	RLSlot	   *s;
	int			idx;
	int			tidx;
	int			nfree;

	if (shared == NULL)
		return -1;
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	nfree = shared->nfree;
	tidx = nfree > 0 ? target_ref(target) : TARGET_TABLE_FULL;
	if (nfree == 0 || tidx < 0)
	{
		LWLockRelease(shared->lock);
		if (nfree == 0)
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("too many Redis locks held"),
					 errdetail("All backends together hold redis_lock.max_locks = %d locks.",
							   shared->nslots),
					 errhint("Release locks, or raise redis_lock.max_locks (takes effect at server restart).")));
		if (tidx == TARGET_TOO_LONG)
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("Redis location or password too long for the watchdog"),
					 errdetail("The watchdog keeps redis_lock.url / nodes / sentinels of at most %d bytes and passwords of at most %d bytes.",
							   RL_TARGET_SPEC_LEN - 1, RL_SECRET_LEN - 1)));
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("too many different Redis targets for the watchdog"),
				 errdetail("At most %d distinct combinations of redis_lock.url / nodes / sentinels and passwords can hold locks at once.",
						   RL_MAX_TARGETS)));
	}
	idx = freelist[--shared->nfree];
	s = &shared->slots[idx];
	s->generation++;
	s->state = SLOT_RESERVED;
	s->st.pid = MyProcPid;
	s->st.dbid = MyDatabaseId;
	s->target = tidx;
	s->st.protocol = names->protocol;
	s->st.watchdog = false;
	s->st.lost = false;
	s->st.session_holds = s->st.xact_holds = 0;
	s->st.fence = 0;
	s->st.lease_ms = lease_ms;
	s->st.acquired_at = s->st.last_renewed_at = GetCurrentTimestamp();
	strlcpy(s->name, name, sizeof(s->name));
	strlcpy(s->key, names->key, sizeof(s->key));
	strlcpy(s->owner, names->owner, sizeof(s->owner));
	LWLockRelease(shared->lock);
	return idx;
}

/*
 * Copy a lock's state (holds, fence, lease, watchdog, lost, acquired_at) and
 * owner to its slot.  refreshed: the backend just restarted the lease in
 * Redis itself, so renewal restarts from now.
 */
void
rl_registry_update(int slot, const RLLockState *st, const char *owner,
				   bool refreshed)
{
	RLSlot	   *s;
	int			holds = st->session_holds + st->xact_holds;

	if (shared == NULL || slot < 0)
		return;
	s = &shared->slots[slot];
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	if (s->state == SLOT_RESERVED && holds > 0)
		s->st.acquired_at = st->acquired_at;
	/* a renewal or loss the worker found for the old holds lands nowhere */
	if (s->state == SLOT_HELD && holds == 0)
		s->generation++;
	s->state = holds > 0 ? SLOT_HELD : SLOT_RESERVED;
	s->st.watchdog = st->watchdog;
	s->st.lost = s->st.lost || st->lost;
	s->st.session_holds = st->session_holds;
	s->st.xact_holds = st->xact_holds;
	s->st.fence = st->fence;
	s->st.lease_ms = st->lease_ms;
	strlcpy(s->owner, owner, sizeof(s->owner));
	if (refreshed)
		s->st.last_renewed_at = GetCurrentTimestamp();
	LWLockRelease(shared->lock);
}

/* Free this backend's registry slot (no-op without a registry or slot) */
void
rl_registry_remove(int slot)
{
	if (shared == NULL || slot < 0)
		return;
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	slot_free(slot);
	LWLockRelease(shared->lock);
}

/* The backend exits without having released this: the worker takes over */
void
rl_registry_orphan(int slot)
{
	if (shared == NULL || slot < 0)
		return;
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	shared->slots[slot].state = SLOT_ORPHAN;
	LWLockRelease(shared->lock);
	wake_worker();
}

/* Has the worker found this lock lost?  Only our own slot: no lock needed */
bool
rl_registry_lost(int slot)
{
	if (shared == NULL || slot < 0)
		return false;
	pg_read_barrier();
	return shared->slots[slot].st.lost;
}

/* Changes whenever the worker marks any lock lost */
uint32
rl_registry_lost_events(void)
{
	return shared != NULL ? pg_atomic_read_u32(&shared->lost_events) : 0;
}

/*
 * Every registered lock of every backend, for the redis_lock_locks view.
 * Returns false without preload.
 */
bool
rl_registry_snapshot(RLLockInfo **out, int *n)
{
	int			i;
	int			k = 0;

	*out = NULL;
	*n = 0;
	if (shared == NULL)
		return false;
	*out = palloc(sizeof(RLLockInfo) * Max(shared->nslots, 1));
	LWLockAcquire(shared->lock, LW_SHARED);
	for (i = 0; i < shared->nslots; i++)
	{
		RLSlot	   *s = &shared->slots[i];
		RLLockInfo *o;

		if (s->state != SLOT_HELD)
			continue;
		o = &(*out)[k++];
		o->st = s->st;
		o->name = pstrdup(s->name);
		o->key = pstrdup(s->key);
	}
	LWLockRelease(shared->lock);
	*n = k;
	return true;
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

typedef struct Job
{
	JobKind		kind;
	int			slot;
	uint32		generation;
	int			target;
	RLLockNames names;
	int64		lease_ms;
	TimestampTz horizon;		/* the key cannot outlive this */
	bool		retry;			/* its last attempt failed */
} Job;

/*
 * What the worker remembers between cycles, in its own memory.  Per slot:
 * how many renewals or releases failed in a row and when to try again, so a
 * Redis that is down costs a few attempts per lease, not one per cycle.
 * Per target: whether it is failing and when that was last logged, so the
 * log gets a line per target every LOG_EVERY_MS, not one per attempt.
 */
typedef struct SlotRetry
{
	uint32		generation;		/* of the slot when it failed */
	int			failures;
	long		backoff_ms;
	TimestampTz retry_at;
} SlotRetry;

typedef struct TargetLog
{
	bool		failing;
	TimestampTz logged_at;
	int			unlogged;		/* failures since the last line */
} TargetLog;

#define RETRY_FIRST_MS	50
#define RETRY_MAX_MS	1000
#define LOG_EVERY_MS	10000

static SlotRetry *retries = NULL;
static TargetLog target_logs[RL_MAX_TARGETS];

/* The longest back-off for a lease: well below lease/3, the renewal period */
static long
retry_cap(int64 lease_ms)
{
	return (long) Max(10, Min(RETRY_MAX_MS, lease_ms / 12));
}

static bool
has_failed(int slot, uint32 generation)
{
	return retries[slot].generation == generation && retries[slot].failures > 0;
}

static void
note_outcome(Job *j, bool failed, TimestampTz now)
{
	SlotRetry  *r = &retries[j->slot];

	if (!failed)
	{
		r->failures = 0;
		return;
	}
	if (r->generation != j->generation || r->failures == 0)
	{
		r->generation = j->generation;
		r->failures = 0;
		r->backoff_ms = RETRY_FIRST_MS;
	}
	else
		r->backoff_ms = r->backoff_ms * 2;
	r->backoff_ms = Min(r->backoff_ms, retry_cap(j->lease_ms));
	r->failures++;
	r->retry_at = TimestampTzPlusMilliseconds(now, r->backoff_ms);
}

/* on_shmem_exit of the worker: unpublish its latch, nobody may set it now */
static void
redis_lock_worker_on_shmem_exit(int code, Datum arg)
{
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	if (shared->worker_latch == MyLatch)
		shared->worker_latch = NULL;
	LWLockRelease(shared->lock);
}

static bool
backend_alive(int pid)
{
	return BackendPidGetProc(pid) != NULL;
}


/* What went wrong with a failed op, for the watchdog's LOG line */
static char *
watchdog_problem(RLLockOp *op)
{
	if (op->failure != NULL)
		return rl_call_problem(op->failure);
	return pstrdup(_("No majority of the Redis masters answered."));
}

/* One line per failing target per LOG_EVERY_MS, and one when it recovers */
static void
log_target(int tidx, const char *spec, int nfailed, RLLockOp *failed_op)
{
	TargetLog  *l = &target_logs[tidx];
	TimestampTz now = GetCurrentTimestamp();
	const char *where = strchr(spec, '|') ? strchr(spec, '|') + 1 : spec;

	if (nfailed == 0)
	{
		if (l->failing)
			ereport(LOG,
					(errmsg("redis_lock watchdog reaches Redis at %s again", where)));
		l->failing = false;
		l->unlogged = 0;
		return;
	}
	if (l->failing &&
		now < TimestampTzPlusMilliseconds(l->logged_at, LOG_EVERY_MS))
	{
		l->unlogged += nfailed;
		return;
	}
	if (l->unlogged > 0)
		ereport(LOG,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("redis_lock watchdog could not renew or release %d lock(s) at %s; %d more attempt(s) failed since the last report",
						nfailed, where, l->unlogged),
				 errdetail_internal("%s", watchdog_problem(failed_op))));
	else
		ereport(LOG,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("redis_lock watchdog could not renew or release %d lock(s) at %s",
						nfailed, where),
				 errdetail_internal("%s", watchdog_problem(failed_op))));
	l->failing = true;
	l->logged_at = now;
	l->unlogged = 0;
}

/*
 * One round for some jobs of one target, with the passwords the backends
 * used, then apply the results unless the slot changed hands meanwhile.
 */
static void
run_jobs(Job *jobs, int *idx, int n, int tidx, RLSharedTarget *target)
{
	RLLockOp   *ops = palloc0(sizeof(RLLockOp) * n);
	RLTarget   *t = rl_target_from_spec(target->spec);
	RLLockOp   *failed_op = NULL;
	int			nfailed = 0;
	TimestampTz now;
	int			k;

	for (k = 0; k < n; k++)
	{
		Job		   *j = &jobs[idx[k]];

		ops[k].kind = j->kind == JOB_RENEW ? RL_OP_EXTEND : RL_OP_RELEASE;
		ops[k].target = t;
		ops[k].names = &j->names;
		ops[k].lease_ms = j->lease_ms;
	}
	rl_use_credentials(target->password[0] ? target->password : NULL,
					   target->sentinel_password[0] ? target->sentinel_password : NULL);
	rl_lock_ops_run(ops, n, RL_RUN_SOFT);
	rl_use_settings_credentials();

	now = GetCurrentTimestamp();
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	for (k = 0; k < n; k++)
	{
		Job		   *j = &jobs[idx[k]];
		RLSlot	   *s = &shared->slots[j->slot];
		RLLockOp   *op = &ops[k];
		int			f = RL_OP_YES(op) ? 1 : RL_OP_NO(op) ? 0 : -1;

		if (f < 0)
		{
			nfailed++;
			if (failed_op == NULL)
				failed_op = op;
		}
		if (s->generation != j->generation || s->state == SLOT_FREE)
			continue;
		note_outcome(j, f < 0, now);
		if (j->kind == JOB_RENEW)
		{
			/* released meanwhile (perhaps with its outcome unknown) */
			if (s->state != SLOT_HELD)
				continue;
			if (f == 1)
			{
				s->st.last_renewed_at = now;
				rl_stats_add(RL_STAT_RENEWALS, 1);
			}
			else if (f == 0)
			{
				/* token gone or changed: lost for good, never renewed again */
				s->st.lost = true;
				rl_stats_add(RL_STAT_LOST, 1);
				pg_atomic_fetch_add_u32(&shared->lost_events, 1);
			}
		}
		else if (f >= 0 || now > j->horizon)
		{
			/* released, or surely expired: the slot is free again */
			if (f == 1)
				rl_stats_add(RL_STAT_RELEASED, 1);
			slot_free(j->slot);
		}
	}
	LWLockRelease(shared->lock);
	log_target(tidx, target->spec, nfailed, failed_op);
}

/*
 * One pass: renew what is due, release what exited backends left.  Slots
 * whose last attempt failed wait out their back-off; the others go first,
 * one round per target, so that a target that is down (or slow to answer)
 * delays the healthy ones at most once, when it starts failing.  Returns
 * how long to sleep until something else is due.
 */
static long
worker_cycle(void)
{
	Job		   *jobs;
	int		   *idx;
	int			njobs = 0;
	int			i;
	int			pass;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz next_due = TimestampTzPlusMilliseconds(now, 1000);
	RLSharedTarget *targets;

	jobs = palloc(sizeof(Job) * Max(shared->nslots, 1));
	idx = palloc(sizeof(int) * Max(shared->nslots, 1));
	targets = palloc(sizeof(RLSharedTarget) * RL_MAX_TARGETS);

	/* snapshot what needs doing */
	LWLockAcquire(shared->lock, LW_SHARED);
	memcpy(targets, shared->targets, sizeof(RLSharedTarget) * RL_MAX_TARGETS);
	for (i = 0; i < shared->nslots; i++)
	{
		RLSlot	   *s = &shared->slots[i];
		Job		   *j = &jobs[njobs];
		TimestampTz due;

		if (s->state == SLOT_FREE)
			continue;
		j->horizon = TimestampTzPlusMilliseconds(s->st.last_renewed_at,
												 s->st.lease_ms + 2 * rl_command_timeout_ms +
												 rl_connect_timeout_ms);
		if (s->state == SLOT_ORPHAN || !backend_alive(s->st.pid))
			j->kind = JOB_RELEASE;
		else if (s->state == SLOT_HELD && s->st.watchdog && !s->st.lost &&
				 s->st.session_holds + s->st.xact_holds > 0)
		{
			due = TimestampTzPlusMilliseconds(s->st.last_renewed_at, s->st.lease_ms / 3);
			if (due > now)
			{
				next_due = Min(next_due, due);
				continue;
			}
			j->kind = JOB_RENEW;
		}
		else
			continue;
		j->retry = has_failed(i, s->generation);
		if (j->retry && retries[i].retry_at > now)
		{
			next_due = Min(next_due, retries[i].retry_at);
			continue;
		}
		j->slot = i;
		j->generation = s->generation;
		j->target = s->target;
		j->lease_ms = s->st.lease_ms;
		/* the fence counter is not touched by renew or release */
		memset(&j->names, 0, sizeof(j->names));
		rl_names_from_key(&j->names, s->st.protocol, "", s->key, CurrentMemoryContext);
		strlcpy(j->names.owner, s->owner, sizeof(j->names.owner));
		njobs++;
	}
	LWLockRelease(shared->lock);

	/*
	 * pass 0: slots doing fine, on targets that answered last time first;
	 * pass 1: slots whose last attempt failed
	 */
	for (pass = 0; pass < 2 && njobs > 0; pass++)
	{
		int			k;

		for (k = 0; k < 2 * RL_MAX_TARGETS; k++)
		{
			int			t = k % RL_MAX_TARGETS;
			int			n = 0;

			if (target_logs[t].failing != (k >= RL_MAX_TARGETS))
				continue;

			for (i = 0; i < njobs; i++)
				if (jobs[i].target == t && jobs[i].retry == (pass == 1))
					idx[n++] = i;
			if (n > 0)
				run_jobs(jobs, idx, n, t, &targets[t]);
		}
	}
	explicit_bzero(targets, sizeof(RLSharedTarget) * RL_MAX_TARGETS);

	/* with work done, look again at once: its results moved the due times */
	if (njobs > 0)
		return 1;
	return Max(1, (long) ((next_due - now + 999) / 1000));
}

/*
 * Entry point of the watchdog background worker (bgw_function_name): renews
 * watchdog leases and releases orphans every cycle, until SIGTERM.
 */
void
rl_watchdog_main(Datum arg)
{
	MemoryContext cxt;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	shared->worker_latch = MyLatch;
	LWLockRelease(shared->lock);
	on_shmem_exit(redis_lock_worker_on_shmem_exit, (Datum) 0);

	cxt = AllocSetContextCreate(TopMemoryContext, "redis_lock watchdog",
								ALLOCSET_DEFAULT_SIZES);
	retries = MemoryContextAllocZero(TopMemoryContext,
									 sizeof(SlotRetry) * Max(shared->nslots, 1));
	ereport(LOG, (errmsg("redis_lock watchdog started")));

	for (;;)
	{
		long		sleep_ms;
		MemoryContext old = MemoryContextSwitchTo(cxt);

		sleep_ms = worker_cycle();
		MemoryContextSwitchTo(old);
		MemoryContextReset(cxt);

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep_ms, rl_wait_event(RL_WAIT_WATCHDOG));
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
	}
}
