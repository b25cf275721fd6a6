/*-------------------------------------------------------------------------
 *
 * lockmany.h
 *	  Several Redis locks taken at once, all or nothing (lockmany.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/lock/lockmany.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_LOCKMANY_H
#define RL_LOCKMANY_H

#include "locktable.h"

extern int64 *rl_acquire_many(const char *const *names, int n, int64 ttl_ms,
							  int64 wait_ms, RLScope scope, bool *obtained,
							  int *busy);

#endif							/* RL_LOCKMANY_H */
