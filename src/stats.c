/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Owns the counters of redis_lock_stats(): in shared memory, summed over
 *	  every backend and the watchdog worker, when loaded through
 *	  shared_preload_libraries; otherwise per backend.
 *
 *	  The bottom of the stack: every layer may count, and nothing here calls
 *	  into another file of the extension.
 *
 *-------------------------------------------------------------------------
 */
#include "stats.h"

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

typedef struct RLSharedStats
{
	pg_atomic_uint64 value[RL_STAT_COUNT];
} RLSharedStats;

static RLSharedStats *shared_stats = NULL;
static uint64 local_stats[RL_STAT_COUNT];

#if PG_VERSION_NUM >= 150000
static shmem_request_hook_type prev_shmem_request_hook = NULL;
#endif
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
stats_request_shmem(void)
{
#if PG_VERSION_NUM >= 150000
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
#endif
	RequestAddinShmemSpace(sizeof(RLSharedStats));
}

static void
stats_attach_shmem(void)
{
	bool		found;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	shared_stats = ShmemInitStruct("redis_lock stats", sizeof(RLSharedStats), &found);
	if (!found)
		for (i = 0; i < RL_STAT_COUNT; i++)
			pg_atomic_init_u64(&shared_stats->value[i], 0);
	LWLockRelease(AddinShmemInitLock);
}

/* Called from _PG_init: shared counters only when preloading */
void
rl_stats_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
#if PG_VERSION_NUM >= 150000
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = stats_request_shmem;
#else
	stats_request_shmem();
#endif
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = stats_attach_shmem;
}

void
rl_stats_add(RLStatId id, uint64 n)
{
	if (shared_stats != NULL)
		pg_atomic_fetch_add_u64(&shared_stats->value[id], n);
	else
		local_stats[id] += n;
}

void
rl_stats_read(RLStats *out)
{
	int			i;

	for (i = 0; i < RL_STAT_COUNT; i++)
		out->value[i] = shared_stats != NULL ?
			pg_atomic_read_u64(&shared_stats->value[i]) : local_stats[i];
}
