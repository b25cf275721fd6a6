/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  The worker subsystem: the shared-memory registry of every backend's
 *	  locks (registry.c), the background worker that renews them and cleans
 *	  up what exited backends left (watchdog.c, watchjobs.c), and its
 *	  keyspace-event subscriptions (watchevents.c).
 *
 *	  Owns: the registry and the worker process.  Must not: know a backend's
 *	  lock table; a backend reaches the registry only through these calls.
 *	  Calls redis/, net/ and base/.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/worker/worker.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_WORKER_H
#define RL_WORKER_H

#include "base/base.h"

/* ----------------------------------------------------------------
 * From watchdog:
 *	  The shared registry of every backend's locks and the worker that
 *	  renews and cleans them up (registry.c, watchdog.c).
 * ----------------------------------------------------------------
 */
/* What the shared registry records of one lock, and the view shows */
typedef struct RLLockState
{
	int			pid;
	Oid			dbid;
	RLProtocol	protocol;
	bool		script_free;	/* taken without Lua scripts: renewed and
								 * released without them too */
	int			permits;		/* a semaphore's: how many its owner value
								 * names (RLLockNames.permits) */
	bool		watchdog;
	bool		lost;
	uint8		on_lost;		/* RLOnLost, as set when it was taken */
	uint8		lost_cause;		/* RLLostCause, once lost */
	TimestampTz lost_at;		/* when the worker found it lost */
	TimestampTz cancelled_at;	/* when its holder had been signalled for
								 * the loss (0: not yet, or never;
								 * RL_CANCEL_UNDER_WAY: being signalled) */
	int			session_holds;
	int			xact_holds;
	int64		fence;
	int64		lease_ms;
	TimestampTz acquired_at;
	TimestampTz last_renewed_at;
} RLLockState;

/* cancelled_at while the worker sends its signal: after any statement start */
#define RL_CANCEL_UNDER_WAY DT_NOEND

/* Why the worker found a lock lost */
typedef enum RLLostCause
{
	RL_LOST_NOT_OURS,			/* Redis no longer holds our owner value */
	RL_LOST_UNREACHABLE			/* no renewal answered before the lease ran
								 * out: presumed lost */
} RLLostCause;

/* What taking back a slot handed to the worker came to (rl_registry_reclaim) */
typedef enum RLReclaim
{
	RL_RECLAIMED,				/* ours again */
	RL_RECLAIM_SETTLED,			/* the worker settled it: no longer ours */
	RL_RECLAIM_BUSY				/* the worker has a command under way and
								 * keeps it (interrupts were held) */
} RLReclaim;

/* One row of the redis_lock_locks view */
typedef struct RLLockInfo
{
	RLLockState st;
	char	   *name;
	char	   *key;
} RLLockInfo;

/*
 * One hold, in this server, of a lock some backend waits for (deadlock.c):
 * what the registry knows of it, and what asking Redis whether it is still
 * there takes (rl_registry_hold_target gives where it lives).
 */
struct RLRegistryHold
{
	uint64		key_id;			/* rl_registry_key_id() of its lock */
	int			pid;			/* the backend holding it */
	RLProtocol	protocol;		/* its layout: which mode it holds */
	bool		script_free;	/* taken without Lua scripts */
	int			slot;			/* its registry slot */
	uint16		name_off;		/* the lock's name is key + name_off */
	char		key[RL_MAX_KEY_LEN + 1];	/* its Redis key */
	char		owner[RL_OWNER_LEN + 1];	/* the holder's owner value */
};

extern bool rl_watchdog_enabled(void);
extern void rl_watchdog_init(void);
struct LWLock;

extern Size rl_registry_shmem_size(void);
extern Size rl_registry_hash_size(void);
extern void rl_registry_shmem_init(void *area, struct LWLock *lock,
								   bool found);
extern int	rl_registry_add(const char *name, const RLLockNames *names,
							RLTarget *target, int64 lease_ms);
extern void rl_registry_update(int slot, const RLLockState *st, const char *owner,
							   TimestampTz refreshed_at);
extern void rl_registry_remove(int slot);
extern uint32 rl_registry_hand_off(int slot, TimestampTz horizon, bool late_grant,
								   TimestampTz not_before);
extern RLReclaim rl_registry_reclaim(int slot, uint32 generation);
extern bool rl_registry_handed(int slot, uint32 generation);
extern uint32 rl_registry_settled_events(void);
extern void rl_registry_wait_idle(int slot);
extern bool rl_registry_found_ours(int slot, TimestampTz refreshed_at);
extern bool rl_registry_loss(int slot, uint8 *cause, TimestampTz *lost_at,
							 TimestampTz *cancelled_at);
extern TimestampTz rl_registry_renewed_at(int slot);
extern uint32 rl_registry_lost_events(void);
extern bool rl_registry_snapshot(RLLockInfo **out, int *n);
extern uint64 rl_registry_key_id(const char *target_spec, const char *key);
extern int	rl_registry_holders(const uint64 *ids, int nids, const int *pids,
								int npids, RLRegistryHold *out, int cap);
extern char *rl_registry_hold_target(const RLRegistryHold *hold);

#endif							/* RL_WORKER_H */
