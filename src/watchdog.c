/*-------------------------------------------------------------------------
 *
 * watchdog.c
 *	  Owns the shared-memory registry of every backend's Redis locks, the
 *	  counters of redis_lock_stats(), and the background worker that renews
 *	  watchdog leases and releases what exited backends left behind.
 *
 *	  All of it exists only with shared_preload_libraries = 'redis_lock';
 *	  otherwise every function here is a cheap no-op and counters are kept
 *	  per backend.  Backends write only their own slots; the worker only
 *	  marks slots renewed or lost and frees orphans, always checking the
 *	  slot's generation so a result never lands on a reused slot.  The
 *	  worker talks to Redis only through scripts.c (compare-and-PEXPIRE,
 *	  compare-and-delete), so it can never re-create a lock that vanished.
 *
 *	  Must not: touch a backend's local lock table, or raise ERROR in the
 *	  worker's loop for a Redis failure (those are retried next cycle).
 *
 *-------------------------------------------------------------------------
 */
#include "redis_lock.h"

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

typedef struct RLShared
{
	LWLock	   *lock;
	Latch	   *worker_latch;
	pg_atomic_uint64 stats[RL_STAT_COUNT];
	pg_atomic_uint32 lost_events;	/* bumped whenever a slot is marked lost */
	int			ntargets;
	char		targets[RL_MAX_TARGETS][RL_TARGET_SPEC_LEN];
	int			nslots;
	int			nfree;
	RLSlot		slots[FLEXIBLE_ARRAY_MEMBER];
	/* followed by int freelist[nslots] */
} RLShared;

static RLShared *shared = NULL;
static int *freelist = NULL;
static uint64 local_stats[RL_STAT_COUNT];
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

static void
request_shmem(void)
{
	RequestAddinShmemSpace(shared_size());
	RequestNamedLWLockTranche("redis_lock", 1);
}

#if PG_VERSION_NUM >= 150000
static void
shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	request_shmem();
}
#endif

static void
shmem_startup(void)
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
		for (i = 0; i < RL_STAT_COUNT; i++)
			pg_atomic_init_u64(&shared->stats[i], 0);
		pg_atomic_init_u32(&shared->lost_events, 0);
		shared->nslots = registry_capacity;
		shared->nfree = registry_capacity;
		for (i = 0; i < registry_capacity; i++)
			freelist[i] = registry_capacity - 1 - i;
	}
	LWLockRelease(AddinShmemInitLock);
}

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
	shmem_request_hook = shmem_request;
#else
	request_shmem();
#endif
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = shmem_startup;

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
 * Counters
 * ----------------------------------------------------------------
 */
void
rl_stats_add(int field, uint64 n)
{
	if (shared != NULL)
		pg_atomic_fetch_add_u64(&shared->stats[field], n);
	else
		local_stats[field] += n;
}

void
rl_stats_read(RLStats *out)
{
	uint64		v[RL_STAT_COUNT];
	int			i;

	for (i = 0; i < RL_STAT_COUNT; i++)
		v[i] = shared != NULL ? pg_atomic_read_u64(&shared->stats[i]) : local_stats[i];
	out->acquired = v[RL_STAT_ACQUIRED];
	out->failed = v[RL_STAT_FAILED];
	out->timed_out = v[RL_STAT_TIMED_OUT];
	out->waits = v[RL_STAT_WAITS];
	out->wait_time_us = v[RL_STAT_WAIT_US];
	out->renewals = v[RL_STAT_RENEWALS];
	out->lost = v[RL_STAT_LOST];
	out->reconnects = v[RL_STAT_RECONNECTS];
	out->released = v[RL_STAT_RELEASED];
}

/* ----------------------------------------------------------------
 * Registry, backend side
 * ----------------------------------------------------------------
 */

/* Index of the target's spec in the shared table; caller holds the lock */
static int
target_index(RLTarget *t)
{
	int			i;

	for (i = 0; i < shared->ntargets; i++)
		if (strcmp(shared->targets[i], t->spec) == 0)
			return i;
	if (shared->ntargets >= RL_MAX_TARGETS || strlen(t->spec) >= RL_TARGET_SPEC_LEN)
		return -1;
	strlcpy(shared->targets[shared->ntargets], t->spec, RL_TARGET_SPEC_LEN);
	return shared->ntargets++;
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
rl_registry_add(RLHeld *e)
{
	RLSlot	   *s;
	int			idx;
	int			tidx;

	if (shared == NULL)
		return -1;
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	tidx = target_index(e->target);
	if (shared->nfree == 0 || tidx < 0)
	{
		LWLockRelease(shared->lock);
		if (tidx < 0)
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("too many different Redis targets for the watchdog"),
					 errdetail("At most %d distinct values of redis_lock.url / nodes / sentinels of at most %d bytes can be in use at once.",
							   RL_MAX_TARGETS, RL_TARGET_SPEC_LEN - 1)));
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("too many Redis locks held"),
				 errdetail("All backends together hold redis_lock.max_locks = %d locks.",
						   shared->nslots),
				 errhint("Release locks, or raise redis_lock.max_locks (takes effect at server restart).")));
	}
	idx = freelist[--shared->nfree];
	s = &shared->slots[idx];
	s->generation++;
	s->state = SLOT_RESERVED;
	s->st.pid = MyProcPid;
	s->st.dbid = MyDatabaseId;
	s->target = tidx;
	s->st.protocol = e->names.protocol;
	s->st.watchdog = false;
	s->st.lost = false;
	s->st.session_holds = s->st.xact_holds = 0;
	s->st.fence = 0;
	s->st.lease_ms = e->lease_ms;
	s->st.acquired_at = s->st.last_renewed_at = GetCurrentTimestamp();
	strlcpy(s->name, e->name, sizeof(s->name));
	strlcpy(s->key, e->names.key, sizeof(s->key));
	strlcpy(s->owner, e->names.owner, sizeof(s->owner));
	LWLockRelease(shared->lock);
	return idx;
}

/*
 * Copy the entry's state to its slot.  refreshed: the backend just
 * restarted the lease in Redis itself, so renewal restarts from now.
 */
void
rl_registry_update(RLHeld *e, bool refreshed)
{
	RLSlot	   *s;

	if (shared == NULL || e->registry_slot < 0)
		return;
	s = &shared->slots[e->registry_slot];
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	if (s->state == SLOT_RESERVED && RL_HOLDS(e) > 0)
		s->st.acquired_at = e->acquired_at;
	s->state = RL_HOLDS(e) > 0 ? SLOT_HELD : SLOT_RESERVED;
	s->st.watchdog = e->watchdog;
	s->st.lost = s->st.lost || e->lost;
	s->st.session_holds = e->session_holds;
	s->st.xact_holds = e->xact_holds;
	s->st.fence = e->fence;
	s->st.lease_ms = e->lease_ms;
	strlcpy(s->owner, e->names.owner, sizeof(s->owner));
	if (refreshed)
		s->st.last_renewed_at = GetCurrentTimestamp();
	LWLockRelease(shared->lock);
}

void
rl_registry_remove(RLHeld *e)
{
	RLSlot	   *s;

	if (shared == NULL || e->registry_slot < 0)
		return;
	s = &shared->slots[e->registry_slot];
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	s->generation++;
	s->state = SLOT_FREE;
	s->st.pid = 0;
	freelist[shared->nfree++] = e->registry_slot;
	LWLockRelease(shared->lock);
	e->registry_slot = -1;
}

/* The backend exits without having released this: the worker takes over */
void
rl_registry_orphan(RLHeld *e)
{
	if (shared == NULL || e->registry_slot < 0)
		return;
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	shared->slots[e->registry_slot].state = SLOT_ORPHAN;
	LWLockRelease(shared->lock);
	e->registry_slot = -1;
	wake_worker();
}

/* Has the worker found this lock lost?  Only our own slot: no lock needed */
bool
rl_registry_lost(RLHeld *e)
{
	if (shared == NULL || e->registry_slot < 0)
		return false;
	pg_read_barrier();
	return shared->slots[e->registry_slot].st.lost;
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
} Job;

static void
worker_detach(int code, Datum arg)
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

/*
 * One pass: renew what is due, release what exited backends left.  Returns
 * how long to sleep until something else is due.
 */
static long
worker_cycle(void)
{
	Job		   *jobs;
	RLLockOp   *ops;
	int			njobs = 0;
	int			i;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz next_due = TimestampTzPlusMilliseconds(now, 1000);
	char		specs[RL_MAX_TARGETS][RL_TARGET_SPEC_LEN];
	int			ntargets;

	jobs = palloc(sizeof(Job) * Max(shared->nslots, 1));

	/* snapshot what needs doing */
	LWLockAcquire(shared->lock, LW_SHARED);
	ntargets = shared->ntargets;
	memcpy(specs, shared->targets, sizeof(specs[0]) * ntargets);
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
		else if (s->state == SLOT_HELD && s->st.watchdog && !s->st.lost)
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

	if (njobs == 0)
		return Max(1, (long) ((next_due - now) / 1000));

	/* one round over all targets, soft: failures are retried next cycle */
	ops = palloc0(sizeof(RLLockOp) * njobs);
	for (i = 0; i < njobs; i++)
	{
		Job		   *j = &jobs[i];

		ops[i].kind = j->kind == JOB_RENEW ? RL_OP_EXTEND : RL_OP_RELEASE;
		ops[i].target = rl_target_from_spec(specs[j->target]);
		ops[i].names = &j->names;
		ops[i].lease_ms = j->lease_ms;
	}
	rl_lock_ops_run(ops, njobs, true);

	/* apply, unless the slot changed hands meanwhile */
	now = GetCurrentTimestamp();
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < njobs; i++)
	{
		Job		   *j = &jobs[i];
		RLSlot	   *s = &shared->slots[j->slot];
		RLLockOp   *op = &ops[i];
		int			f = RL_OP_YES(op) ? 1 : RL_OP_NO(op) ? 0 : -1;

		if (s->generation != j->generation || s->state == SLOT_FREE)
			continue;
		if (j->kind == JOB_RENEW)
		{
			if (f == 1)
			{
				s->st.last_renewed_at = now;
				pg_atomic_fetch_add_u64(&shared->stats[RL_STAT_RENEWALS], 1);
			}
			else if (f == 0)
			{
				/* token gone or changed: lost for good, never renewed again */
				s->st.lost = true;
				pg_atomic_fetch_add_u64(&shared->stats[RL_STAT_LOST], 1);
				pg_atomic_fetch_add_u32(&shared->lost_events, 1);
			}
			else
				ereport(LOG,
						(errmsg("redis_lock watchdog could not renew lock \"%s\": %s",
								s->name, op->failure && op->failure->error ?
								op->failure->error : "no majority answered")));
		}
		else if (f >= 0 || now > j->horizon)
		{
			/* released, or surely expired: the slot is free again */
			if (f == 1)
				pg_atomic_fetch_add_u64(&shared->stats[RL_STAT_RELEASED], 1);
			s->generation++;
			s->state = SLOT_FREE;
			s->st.pid = 0;
			freelist[shared->nfree++] = j->slot;
		}
	}
	LWLockRelease(shared->lock);
	return 1;
}

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
	on_shmem_exit(worker_detach, (Datum) 0);

	cxt = AllocSetContextCreate(TopMemoryContext, "redis_lock watchdog",
								ALLOCSET_DEFAULT_SIZES);
	ereport(LOG, (errmsg("redis_lock watchdog started")));

	for (;;)
	{
		long		sleep_ms;
		MemoryContext old = MemoryContextSwitchTo(cxt);

		sleep_ms = worker_cycle();
		MemoryContextSwitchTo(old);
		MemoryContextReset(cxt);

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
	}
}
