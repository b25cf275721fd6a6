/*-------------------------------------------------------------------------
 *
 * stats.h
 *	  The counters behind redis_lock_stats() (stats.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_STATS_H
#define RL_STATS_H

#include "common.h"

typedef enum RLStatId
{
	RL_STAT_ACQUIRED,
	RL_STAT_FAILED,
	RL_STAT_TIMED_OUT,
	RL_STAT_WAITS,
	RL_STAT_WAIT_US,
	RL_STAT_RENEWALS,
	RL_STAT_LOST,
	RL_STAT_RECONNECTS,
	RL_STAT_RELEASED,
	RL_STAT_COUNT
} RLStatId;

typedef struct RLStats
{
	uint64		value[RL_STAT_COUNT];
} RLStats;

extern void rl_stats_init(void);
extern void rl_stats_add(RLStatId id, uint64 n);
extern void rl_stats_read(RLStats *out);

#endif							/* RL_STATS_H */
