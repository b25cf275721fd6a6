/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Owns the counters of redis_lock_stats(): in shared memory, summed over
 *	  every backend and the watchdog worker, when loaded through
 *	  shared_preload_libraries; otherwise per backend.  Also owns the wait
 *	  events our latch waits report in pg_stat_activity.
 *
 *	  The bottom of the stack: every layer may count, and nothing here calls
 *	  into another file of the extension.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/base/stats.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

#include "base/base.h"

#if PG_VERSION_NUM >= 140000
#include "utils/wait_event.h"	/* before 14: in pgstat.h (base.h) */
#endif

typedef struct RLSharedStats
{
	pg_atomic_uint64 value[RL_STAT_COUNT];
} RLSharedStats;

static RLSharedStats *shared_stats = NULL;
static uint64 local_stats[RL_STAT_COUNT];

/* Room for the shared counters in the extension's area (interface/shmem.c) */
Size
rl_stats_shmem_size(void)
{
	return sizeof(RLSharedStats);
}

/* The shared counters at area: zeroed when just created (!found) */
void
rl_stats_shmem_init(void *area, bool found)
{
	int			i;

	shared_stats = (RLSharedStats *) area;
	if (!found)
		for (i = 0; i < RL_STAT_COUNT; i++)
			pg_atomic_init_u64(&shared_stats->value[i], 0);
}

/* Add n to one counter: shared when preloaded, else this backend's */
void
rl_stats_add(RLStatId id, uint64 n)
{
	if (shared_stats != NULL)
		pg_atomic_fetch_add_u64(&shared_stats->value[id], n);
	else
		local_stats[id] += n;
}

/* Copy every counter into *out (shared when preloaded, else this backend's) */
void
rl_stats_read(RLStats *out)
{
	int			i;

	for (i = 0; i < RL_STAT_COUNT; i++)
		out->value[i] = shared_stats != NULL ?
			pg_atomic_read_u64(&shared_stats->value[i]) : local_stats[i];
}

/*
 * The wait event to report for a wait of this kind.  PostgreSQL 17 and later
 * give each kind a name of its own, registered on first use in each process
 * (WaitEventExtensionNew needs shared memory, so not from _PG_init; the same
 * name gives the same id in every process).  Earlier versions have only
 * PG_WAIT_EXTENSION.  Never raises before 17; from 17 on, only when
 * PostgreSQL's table of custom wait events is full.
 *
 * The PostgreSQL 17+ branch is built and tested by CI on Debian 13's 17 and
 * on 18 (scripts/matrix; t/test_versions.py checks the names).
 */
uint32
rl_wait_event(RLWaitKind kind)
{
#if PG_VERSION_NUM >= 170000
	static const char *const names[RL_WAIT_KIND_COUNT] = {
		[RL_WAIT_CONNECT] = "RedisLockConnect",
		[RL_WAIT_REPLY] = "RedisLockReply",
		[RL_WAIT_RELEASE] = "RedisLockRelease",
		[RL_WAIT_RETRY] = "RedisLockRetry",
		[RL_WAIT_WATCHDOG] = "RedisLockWatchdog",
		[RL_WAIT_QUEUE] = "RedisLockQueue",
	};
	static uint32 ids[RL_WAIT_KIND_COUNT];	/* 0: not registered yet */

	Assert((int) kind >= 0 && (int) kind < RL_WAIT_KIND_COUNT);
	if (ids[kind] == 0)
		ids[kind] = WaitEventExtensionNew(names[kind]);
	return ids[kind];
#else
	return PG_WAIT_EXTENSION;
#endif
}
