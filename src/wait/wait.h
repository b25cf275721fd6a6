/*-------------------------------------------------------------------------
 *
 * wait.h
 *	  The waiting subsystem: server-local queues of backends waiting for
 *	  the same lock (waitqueue.c), deadlocks through Redis locks and
 *	  PostgreSQL locks (deadlock.c, deadlock_graph.c; what these two share
 *	  is wait_int.h), and the waits redis_lock_waits shows (waiters.c).
 *
 *	  Owns: the wait queues and published waits in shared memory.  Must not:
 *	  send to Redis itself (a confirmation is asked by the caller).
 *	  Calls worker/ (the registry's holds) and base/.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/wait/wait.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_WAIT_H
#define RL_WAIT_H

#include "base/base.h"

/* ----------------------------------------------------------------
 * From waitqueue:
 *	  Server-local queues of the backends waiting for the same Redis lock
 *	  (waitqueue.c): one of them contends in Redis, the others sleep.
 * ----------------------------------------------------------------
 */
struct LWLock;

extern Size rl_waitq_shmem_size(int nseats);
extern void rl_waitq_shmem_init(void *area, int nseats, struct LWLock *lock,
								bool found);
extern uint64 rl_waitq_id(const char *target_spec, const char *key);
extern bool rl_waitq_any(void);
extern bool rl_waitq_has_waiters(uint64 lock_id);
extern bool rl_waitq_join(uint64 lock_id);
extern bool rl_waitq_wait_turn(TimestampTz deadline);
extern void rl_waitq_leave(void);

/* ----------------------------------------------------------------
 * From deadlock:
 *	  Deadlocks across Redis locks and PostgreSQL locks among the backends
 *	  of one server (deadlock.c).
 * ----------------------------------------------------------------
 */
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
 * One hold on a cycle a check found, for the caller to ask Redis about:
 * is owner still the holder (or one of the holders) of key there?  Only
 * then does the hold close the cycle: the registry learns that a hold was
 * lost only at the worker's next renewal.
 */
typedef struct RLDeadlockHold
{
	const char *target_spec;	/* where the lock lives (rl_target_from_spec) */
	const char *key;			/* its Redis key */
	const char *owner;			/* the holding backend's owner value */
	RLProtocol	protocol;		/* the hold's layout */
	bool		script_free;	/* it was taken without Lua scripts */
	bool		in_redis;		/* out: Redis answered, and owner holds it */
} RLDeadlockHold;

/*
 * A wait goes: rl_deadlock_wait_begin(keys), then, in the wait's loop,
 * rl_deadlock_check_due(now, ...) wherever the wait may raise, and sleeps
 * that end by rl_deadlock_wake_at(deadline); then rl_deadlock_wait_end().
 * The keys (and their strings) must stay valid until the wait ends or
 * rl_deadlock_wait_keys() replaces them.  An ERROR ending the wait needs no
 * call: (sub)transaction abort and backend exit end it.
 *
 * A check that finds a cycle returns true with the holds on it: the caller
 * asks Redis about each (one round trip; this file never talks to Redis),
 * sets in_redis, and calls rl_deadlock_confirm(), which raises 40P01 when
 * the cycle is real.  A hold Redis was not asked about, or did not answer
 * for, stays !in_redis: no deadlock is reported for it.
 */
extern Size rl_deadlock_shmem_size(int nrecords);
extern void rl_deadlock_shmem_init(void *area, int nrecords,
								   struct LWLock *records_lock,
								   struct LWLock *victim_lock, bool found);
extern void rl_deadlock_wait_begin(const RLWaitKey *keys, int nkeys);
extern void rl_deadlock_wait_keys(const RLWaitKey *keys, int nkeys);
extern TimestampTz rl_deadlock_wake_at(TimestampTz deadline);
extern bool rl_deadlock_check_due(TimestampTz now, RLDeadlockHold **holds,
								  int *nholds);
extern void rl_deadlock_confirm(void);
extern void rl_deadlock_wait_end(void);

/* ----------------------------------------------------------------
 * From waiters:
 *	  What every backend of this server waits for, published from the start
 *	  of its wait for redis_lock_waits (waiters.c).
 * ----------------------------------------------------------------
 */
/* Keys a wait for a set of locks shows at most */
#define RL_WAITERS_MAX_KEYS	8

/* One key a backend waits for, as rl_waiters_snapshot() copies it */
typedef struct RLWaiter
{
	int			pid;
	TimestampTz since;			/* when its wait began */
	const char *target_spec;	/* RLTarget.spec of where it lives */
	const char *name;			/* the lock's SQL name */
	const char *key;			/* its Redis key */
	const char *owner;			/* the owner value its grant will have */
	RLProtocol	protocol;		/* the hold waited for (RLWaitKey) */
} RLWaiter;

/*
 * A wait goes: rl_waiters_begin(keys, names, owners, n) as it starts, then
 * rl_waiters_end(); an ERROR ending the wait needs no call.  Every key of
 * one wait is on keys[0].target_spec; names[i] is the SQL name of keys[i],
 * owners[i] the owner value its grant will have (so that a grant Redis
 * shows before the wait ends is not taken for another holder).
 */
extern Size rl_waiters_shmem_size(int nslots);
extern void rl_waiters_shmem_init(void *area, int nslots, bool found);
extern void rl_waiters_begin(const RLWaitKey *keys, const char *const *names,
							 const char *const *owners, int nkeys);
extern void rl_waiters_end(void);
extern int	rl_waiters_snapshot(RLWaiter **out);

#endif							/* RL_WAIT_H */
