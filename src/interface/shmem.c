/*-------------------------------------------------------------------------
 *
 * shmem.c
 *	  Owns the extension's shared memory, which exists only when it is
 *	  loaded through shared_preload_libraries: one area ("redis_lock" in
 *	  pg_shmem_allocations), its one pair of hooks (shmem_request_hook on
 *	  PostgreSQL 15 and later, RequestAddinShmemSpace from _PG_init before;
 *	  shmem_startup_hook), the extension's LWLock tranches, and the number
 *	  of processes that can run SQL (max_sql_processes).  The area holds,
 *	  one after another, the parts each subsystem lays out and sets up
 *	  itself (rl_X_shmem_size, rl_X_shmem_init): the counters (base/
 *	  stats.c), the registry (worker/registry.c), the wait queues, the
 *	  waits the deadlock check publishes and those redis_lock_waits shows
 *	  (wait/waitqueue.c, wait/deadlock.c, wait/waiters.c).  The registry's
 *	  hash of slots per role is a shared hash table, so it is an allocation
 *	  of its own ("redis_lock slots per role"), asked for here too.
 *
 *	  Lock order.  The extension's LWLocks, each taken only inside the
 *	  function that releases it:
 *
 *	  1. the deadlock victim lock (tranche "redis_lock deadlock",
 *		 RLDeadlockShared.victim_lock): held while a waiter confirms a
 *		 cycle (rl_deadlock_confirm); under it the registry lock, then the
 *		 records lock, are each taken and released again, and PostgreSQL's
 *		 ProcArrayLock and lock-manager partition locks (pg_blocking_pids(),
 *		 BackendPidGetProc()).
 *	  2. the registry lock (tranche "redis_lock", RLShared.lock), the
 *		 wait-queue lock (tranche "redis_lock wait queues",
 *		 RLWaitQueues.lock) and the deadlock records lock (tranche
 *		 "redis_lock deadlock", RLDeadlockShared.records_lock): never two of
 *		 them at once.  Under the registry lock, only ProcArrayLock (the
 *		 watchdog: whether a backend is alive, signalling a lost lock's
 *		 holder).  Under the other two, nothing.
 *	  3. PostgreSQL's own locks, last.
 *
 *	  The counters are atomics, taken under any of these; the extension
 *	  has no spinlock.  AddinShmemInitLock is held only here, at start,
 *	  while no other is.
 *
 *	  Must not: lay out or touch a subsystem's part (its own file does), or
 *	  take any lock but AddinShmemInitLock.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/interface/shmem.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "postmaster/autovacuum.h"
#include "replication/walsender.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

#include "worker/worker.h"
#include "wait/wait.h"
#include "interface/interface.h"

/* The LWLock tranches: their names show in pg_stat_activity.wait_event */
#define RL_TRANCHE_REGISTRY		"redis_lock"
#define RL_TRANCHE_QUEUES		"redis_lock wait queues"
#define RL_TRANCHE_DEADLOCK		"redis_lock deadlock"	/* records, victim */

/* Where each subsystem's part starts in the area, and the area's size */
typedef struct RLAreaLayout
{
	Size		stats;
	Size		registry;
	Size		queues;
	Size		deadlock;
	Size		waiters;
	Size		total;
} RLAreaLayout;

#if PG_VERSION_NUM >= 150000
static shmem_request_hook_type prev_shmem_request_hook = NULL;
#endif
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Processes that can run SQL (backends, autovacuum, bgworkers, walsenders) */
static int
max_sql_processes(void)
{
#if PG_VERSION_NUM >= 150000
	return MaxBackends;
#else
	/* MaxBackends is not computed yet when _PG_init requests shared memory */
	return MaxConnections + autovacuum_max_workers + 1 + max_worker_processes +
		max_wal_senders;
#endif
}

/* Start of the next part after one of size at off, MAXALIGNed */
static Size
after(Size off, Size size)
{
	return add_size(off, MAXALIGN(size));
}

static void
area_layout(RLAreaLayout *l, int nprocs)
{
	l->stats = 0;
	l->registry = after(l->stats, rl_stats_shmem_size());
	l->queues = after(l->registry, rl_registry_shmem_size());
	l->deadlock = after(l->queues, rl_waitq_shmem_size(nprocs));
	l->waiters = after(l->deadlock, rl_deadlock_shmem_size(nprocs));
	l->total = after(l->waiters, rl_waiters_shmem_size(nprocs));
}

/* shmem_request_hook: room for the area and the hash, and the LWLocks */
static void
redis_lock_shmem_request(void)
{
	RLAreaLayout l;

#if PG_VERSION_NUM >= 150000
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
#endif
	area_layout(&l, max_sql_processes());
	RequestAddinShmemSpace(add_size(l.total, rl_registry_hash_size()));
	RequestNamedLWLockTranche(RL_TRANCHE_REGISTRY, 1);
	RequestNamedLWLockTranche(RL_TRANCHE_QUEUES, 1);
	RequestNamedLWLockTranche(RL_TRANCHE_DEADLOCK, 2);
}

/* Lock i of a tranche, for a part being created (NULL when it was found) */
static LWLock *
tranche_lock(const char *tranche, int i, bool found)
{
	return found ? NULL : &GetNamedLWLockTranche(tranche)[i].lock;
}

/* shmem_startup_hook: create (each part empty) or attach the area */
static void
redis_lock_shmem_startup(void)
{
	RLAreaLayout l;
	int			nprocs = max_sql_processes();
	char	   *area;
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	area_layout(&l, nprocs);
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	area = ShmemInitStruct("redis_lock", l.total, &found);
	rl_stats_shmem_init(area + l.stats, found);
	rl_registry_shmem_init(area + l.registry,
						   tranche_lock(RL_TRANCHE_REGISTRY, 0, found), found);
	rl_waitq_shmem_init(area + l.queues, nprocs,
						tranche_lock(RL_TRANCHE_QUEUES, 0, found), found);
	rl_deadlock_shmem_init(area + l.deadlock, nprocs,
						   tranche_lock(RL_TRANCHE_DEADLOCK, 0, found),
						   tranche_lock(RL_TRANCHE_DEADLOCK, 1, found), found);
	rl_waiters_shmem_init(area + l.waiters, nprocs, found);
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Called from _PG_init, after the settings and rl_watchdog_init (the
 * registry's size depends on them): the hooks, only when preloading
 */
void
rl_shmem_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
#if PG_VERSION_NUM >= 150000
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = redis_lock_shmem_request;
#else
	redis_lock_shmem_request();
#endif
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = redis_lock_shmem_startup;
}
