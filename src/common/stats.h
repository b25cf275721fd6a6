/*-------------------------------------------------------------------------
 *
 * stats.h
 *	  The counters behind redis_lock_stats() and the wait events shown in
 *	  pg_stat_activity (stats.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/common/stats.h
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
	RL_STAT_INTERRUPTED,		/* statements failed because a lock was lost */
	RL_STAT_COUNT
} RLStatId;

typedef struct RLStats
{
	uint64		value[RL_STAT_COUNT];
} RLStats;

/*
 * What a wait of ours is for.  On PostgreSQL 17 and later each kind is a
 * named wait event of its own (RedisLockConnect, ...); before 17 all of
 * them show as the generic "Extension".
 */
typedef enum RLWaitKind
{
	RL_WAIT_CONNECT,			/* TCP connect and TLS handshake to Redis */
	RL_WAIT_REPLY,				/* a round trip: replies to sent commands */
	RL_WAIT_RELEASE,			/* a held lock's release message, or a poll */
	RL_WAIT_RETRY,				/* pause before resending (cluster TRYAGAIN) */
	RL_WAIT_WATCHDOG,			/* the watchdog worker between cycles */
	RL_WAIT_QUEUE,				/* behind another local waiter for the lock */
	RL_WAIT_KIND_COUNT
} RLWaitKind;

extern void rl_stats_init(void);
extern void rl_stats_add(RLStatId id, uint64 n);
extern void rl_stats_read(RLStats *out);
extern uint32 rl_wait_event(RLWaitKind kind);

#endif							/* RL_STATS_H */
