/*-------------------------------------------------------------------------
 *
 * deadlock.h
 *	  Deadlocks across Redis locks and PostgreSQL locks among the backends
 *	  of one server (deadlock.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/deadlock.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_DEADLOCK_H
#define RL_DEADLOCK_H

#include "waitqueue.h"

/*
 * Keys a published wait keeps in its record in shared memory; a wait for
 * more (a multi-key acquire) puts all of them in a dynamic shared memory
 * segment of its own, which the other waiters' checks read.
 */
#define RL_DEADLOCK_INLINE_KEYS	16

/* One Redis lock a backend waits for */
typedef struct RLWaitKey
{
	const char *target_spec;	/* RLTarget.spec of where it lives */
	const char *key;			/* its Redis key */
	RLProtocol	protocol;		/* its layout: RL_PROTOCOL_RW_READ waits for a
								 * read hold (blocked by writers only); every
								 * other layout for an exclusive hold */
} RLWaitKey;

/*
 * A wait goes: rl_deadlock_wait_begin(keys), then, in the wait's loop,
 * rl_deadlock_check_due(now) wherever the wait may raise, and sleeps that
 * end by rl_deadlock_wake_at(deadline); then rl_deadlock_wait_end().  The
 * keys (and their strings) must stay valid until the wait ends or
 * rl_deadlock_wait_keys() replaces them.  An ERROR ending the wait needs no
 * call: (sub)transaction abort and backend exit end it.
 */
extern void rl_deadlock_init(void);
extern void rl_deadlock_wait_begin(const RLWaitKey *keys, int nkeys);
extern void rl_deadlock_wait_keys(const RLWaitKey *keys, int nkeys);
extern TimestampTz rl_deadlock_wake_at(TimestampTz deadline);
extern void rl_deadlock_check_due(TimestampTz now);
extern void rl_deadlock_wait_end(void);

#endif							/* RL_DEADLOCK_H */
