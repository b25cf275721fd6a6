/*-------------------------------------------------------------------------
 *
 * worker_int.h
 *	  What the files of worker/ share, and no other subsystem sees
 *	  (its public header is worker/worker.h).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/worker/worker_int.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_WORKER_INT_H
#define RL_WORKER_INT_H

#include "worker/worker.h"
#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/lwlock.h"

/* ----------------------------------------------------------------
 * From registry_int:
 *	  The layout of the shared registry, for registry.c, which owns it, and
 *	  the watchdog worker (watchdog.c, watchjobs.c), which renews and frees
 *	  its slots, and its keyspace watch (watchevents.c).  Nothing else includes this:
 *	  backends use the calls of worker.h.
 * ----------------------------------------------------------------
 */
#define RL_MAX_TARGETS		32
#define RL_TARGET_SPEC_LEN	1024
#define RL_SECRET_LEN		256

typedef enum RLSlotState
{
	SLOT_FREE,
	SLOT_RESERVED,				/* acquire in flight: outcome not known yet */
	SLOT_HELD,
	SLOT_ORPHAN					/* the worker releases it: its owner exited
								 * without releasing it, or handed it over as
								 * a doubt (rl_registry_hand_off) */
} RLSlotState;

/*
 * One held lock.  The lock's name is not stored apart: the Redis key is
 * always key_prefix + name (rl_names_build), so the name is the key's tail
 * from name_off on.  That keeps a slot at about 0.9 kB instead of 1.4 kB;
 * shared memory is sized for max_locks of them (see settings.c).
 */
typedef struct RLSlot
{
	uint32		generation;		/* bumped at every allocation and free */
	RLSlotState state;
	int			target;			/* index into RLShared.targets */
	uint16		name_off;		/* the name starts at key + name_off */
	uint8		in_flight;		/* 0, or 1 + the lane whose worker has a
								 * command for it under way */
	bool		late_grant;		/* orphan: an acquire whose reply was lost may
								 * still be run by Redis */
	bool		check_now;		/* held: a keyspace notification said its
								 * key is gone: renew it at once
								 * (watchevents.c) */
	TimestampTz horizon;		/* orphan: the key cannot outlive this, bar a
								 * late grant (0: last renewal + lease) */
	TimestampTz not_before;		/* orphan: the worker starts no release before
								 * (its backend's own is owed a reply) */
	Oid			roleid;			/* the role charged for it (rl_registry_add):
								 * counted against its
								 * redis_lock.max_locks_per_role until freed */
	int64		renew_every_ms; /* renewal period when another client cuts
								 * the lease short (0: lease/3) */
	RLLockState st;
	char		key[RL_MAX_KEY_LEN + 1];
	char		owner[RL_OWNER_LEN + 1];
	/* where a release publishes the key: release_channel less it ("": no) */
	char		release_prefix[RL_MAX_PREFIX_LEN + 1];
} RLSlot;

StaticAssertDecl(RL_MAX_PREFIX_LEN <= PG_UINT16_MAX,
				 "RLSlot.name_off must hold any key prefix length");

/*
 * The watchdog runs as two workers, one per lane: targets that answer in
 * time are served by the first, those that failed or answered slowly last
 * time by the second, so that waiting for the latter never holds up the
 * former.  A target moves between lanes after each round (watchdog.c).
 */
typedef enum RLLane
{
	RL_LANE_PROMPT,
	RL_LANE_SLOW,
	RL_NUM_LANES
} RLLane;

/*
 * Where and with which passwords the locks of some slots live.  An entry is
 * in use while slots point at it (refs > 0); the worker connects with the
 * passwords the acquiring backend used, wherever it set them.  The rest is
 * the workers' (under the registry lock): the lane that serves it, and its
 * failure log, shared so that a target moving lanes is logged once.
 */
typedef struct RLSharedTarget
{
	int			refs;
	char		spec[RL_TARGET_SPEC_LEN];
	char		password[RL_SECRET_LEN];
	char		sentinel_password[RL_SECRET_LEN];
	RLLane		lane;
	bool		failing;		/* its last attempts failed (and were logged) */
	TimestampTz logged_at;		/* when that was last logged */
	int			unlogged;		/* failures since that line */
} RLSharedTarget;

typedef struct RLShared
{
	LWLock	   *lock;			/* the registry lock: after deadlock.c's
								 * victim lock, before ProcArrayLock; no
								 * other lock of the extension is taken while
								 * it is held (interface/shmem.c) */
	Latch	   *worker_latch[RL_NUM_LANES];
	pg_atomic_uint32 lost_events;	/* bumped whenever a slot is marked lost */
	pg_atomic_uint32 settled_events;	/* bumped whenever an orphan is freed */
	pg_atomic_uint64 worker_wakes_at[RL_NUM_LANES]; /* TimestampTz each lane's
													 * worker sleeps until */
	RLSharedTarget targets[RL_MAX_TARGETS];
	int			nslots;
	int			nfree;
	RLSlot		slots[FLEXIBLE_ARRAY_MEMBER];
	/* followed by int freelist[nslots] */
} RLShared;

/* The registry in shared memory; NULL without preloading */
extern RLShared *rl_shared;

/*
 * The lane whose worker serves target st now: a slow-lane target goes to the
 * prompt lane's worker (with the full timeouts) while the slow lane has no
 * worker: not started yet, restarting, or no background worker slot left
 * for it (max_worker_processes).  Caller holds the registry lock.
 */
static inline RLLane
rl_serving_lane(const RLSharedTarget *st)
{
	if (st->lane == RL_LANE_SLOW && rl_shared->worker_latch[RL_LANE_SLOW] != NULL)
		return RL_LANE_SLOW;
	return RL_LANE_PROMPT;
}

extern void rl_registry_init(void);
extern void rl_slot_free(int idx);

/* watchevents.c: the worker's keyspace watch of the locks it renews */
extern void rl_watch_events_sync(RLLane lane, TimestampTz due);
extern void rl_watch_events_wait(long sleep_ms);

/* ----------------------------------------------------------------
 * From watchdog:
 *	  What the workers' cycle (watchdog.c) and their jobs (watchjobs.c)
 *	  share.
 * ----------------------------------------------------------------
 */
typedef enum JobKind
{
	JOB_RENEW,
	JOB_RELEASE
} JobKind;

/*
 * One thing to do for a slot, copied out of the registry so that the
 * registry's lock is not held while names are built or Redis is asked.
 */
typedef struct Job
{
	JobKind		kind;
	int			slot;
	uint32		generation;
	int			target;
	RLProtocol	protocol;
	bool		script_free;
	int			permits;		/* a semaphore's */
	int64		lease_ms;
	TimestampTz due;			/* renew: last renewal + lease/3, the latest
								 * moment to send it; release: now */
	TimestampTz horizon;		/* the key cannot outlive this */
	bool		late_grant;		/* release: a grant may still land */
	bool		retry;			/* its last attempt failed */
	bool		failing;		/* its target's last attempts failed */
	bool		gave_up;		/* release: dropped, refused to the end */
	bool		lost_now;		/* renew: found lost by this round */
	int			holder_pid;		/* renew: its backend */
	uint8		on_lost;		/* renew: what its holder is made to do */
	uint8		lost_cause;		/* renew, lost_now: why */
	int			name_off;		/* the lock's name in key */
	char	   *key;
	char	   *owner;
	char	   *release_prefix; /* release: publish key on this + key ("":
								 * no) */
} Job;

/* What one pass did, for the process title and the log */
typedef struct PassStats
{
	int			jobs;
	int			renewed;
	int			released;
	int			failed;
	int			rounds;
	int			late;			/* renewals sent after their deadline */
	long		late_ms;		/* by how much, at most */
} PassStats;

/*
 * What the worker remembers between cycles, in its own memory.  Per slot:
 * how many renewals or releases failed in a row and when to try again, so a
 * Redis that is down costs a few attempts per lease, not one per cycle.
 * (Per target, whether it is failing and when that was last logged, so the
 * log gets a line per target every LOG_EVERY_MS, not one per attempt, is
 * in RLSharedTarget: the lanes share it.)
 */
typedef struct SlotRetry
{
	uint32		generation;		/* of the slot when it failed */
	int			failures;
	int			answered;		/* late-grant watch: definite answers in a
								 * row (a refusal for good counts) */
	int			refusals;		/* release: refused for good, in a row */
	long		backoff_ms;
	TimestampTz retry_at;		/* not before this (failures, or watching) */
} SlotRetry;

/*
 * The prompt lane waits at most this long for a connection (name resolution
 * included) and for the replies of a round, whatever connect_timeout and
 * command_timeout say: a round that fails within it moves its target to the
 * slow lane, whose worker waits the full timeouts (and retries at once what
 * failed here).  A round in the slow lane that answered every op within it
 * moves its target back.  So a target that stops answering holds up the
 * prompt lane once, for at most this long per connect and per round trip.
 */
#define RL_PROMPT_WAIT_MS	1000

/* What the cycle (watchdog.c) and the jobs (watchjobs.c) share */
extern RLLane rl_wd_lane;
extern bool rl_wd_prompt_bound;
extern SlotRetry *rl_wd_retries;
extern bool rl_wd_has_failed(int slot, uint32 generation);
extern bool rl_wd_not_yet(int slot, uint32 generation, TimestampTz now);
extern void rl_wd_note_outcome(Job *j, bool failed, TimestampTz now);
extern int	rl_wd_run_round(Job *jobs, int n, RLTarget *t,
							RLSharedTarget *target, PassStats *ps,
							char **problem, MemoryContext problem_cxt);

#endif							/* RL_WORKER_INT_H */
