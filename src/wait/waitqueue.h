/*-------------------------------------------------------------------------
 *
 * waitqueue.h
 *	  Server-local queues of the backends waiting for the same Redis lock
 *	  (waitqueue.c): one of them contends in Redis, the others sleep.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/wait/waitqueue.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_WAITQUEUE_H
#define RL_WAITQUEUE_H

#include "watchdog.h"

extern void rl_waitq_init(void);
extern uint64 rl_waitq_id(const char *target_spec, const char *key);
extern bool rl_waitq_any(void);
extern bool rl_waitq_has_waiters(uint64 lock_id);
extern bool rl_waitq_join(uint64 lock_id);
extern bool rl_waitq_wait_turn(TimestampTz deadline);
extern void rl_waitq_leave(void);

#endif							/* RL_WAITQUEUE_H */
