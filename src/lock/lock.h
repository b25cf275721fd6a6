/*-------------------------------------------------------------------------
 *
 * lock.h
 *	  The lock subsystem: the per-backend table of held locks and their
 *	  holds (locktable.c), acquire (lockacquire.c, lockmany.c), release and
 *	  extend (lockrelease.c), transactions (lockxact.c), doubts and releases
 *	  sent without waiting (lockdoubts.c), and losses (locklost.c).
 *
 *	  Owns: RLHeld entries and every change of their state.  Must not: define
 *	  SQL functions or parse their arguments.
 *	  Calls wait/, worker/, redis/, net/ and base/.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/lock/lock.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_LOCK_H
#define RL_LOCK_H

#include "base/base.h"

/* ----------------------------------------------------------------
 * From locktable:
 *	  This backend's table of Redis locks (locktable.c, lockacquire.c,
 *	  lockrelease.c, lockdoubts.c, lockxact.c).
 * ----------------------------------------------------------------
 */
typedef enum RLScope
{
	RL_SCOPE_SESSION,
	RL_SCOPE_XACT
} RLScope;

/*
 * Which lock object of a name: the exclusive lock, the read or the write
 * hold of the read-write lock of that name, or the permits of the
 * semaphore of that name.  The four are separate entries.  A permit entry
 * has one hold, however many permits it took (RLLockNames.permits).
 */
typedef enum RLLockMode
{
	RL_MODE_EXCLUSIVE,
	RL_MODE_READ,
	RL_MODE_WRITE,
	RL_MODE_PERMIT
} RLLockMode;

/*
 * Where an entry is in its life (lockstate.c has the transitions, which
 * fields are valid in each state, and its diagram is in
 * doc/architecture.md).  Changed only by rl_lt_set_state.
 */
typedef enum RLHeldState
{
	RL_ENTRY_FREE = 0,			/* not in the table: not made yet, or removed */
	RL_ENTRY_DOUBT,				/* no holds, ours to settle: never tried, an
								 * attempt under way or not granted, or an
								 * outcome not known */
	RL_ENTRY_HELD,				/* holds > 0 */
	RL_ENTRY_LOST,				/* holds > 0, known not ours in Redis */
	RL_ENTRY_RELEASING,			/* no holds; its release sent, answer owed */
	RL_ENTRY_RELEASING_HANDED,	/* the same, and the worker releases it if
								 * the answer is not read in time */
	RL_ENTRY_HANDED				/* no holds; a doubt the worker settles */
} RLHeldState;

/* One lock this backend holds (or may hold, when holds are zero) */
struct RLHeld
{
	char		hkey[RL_MAX_NAME_LEN + 2];	/* hash key: mode letter + name */
	char		name[RL_MAX_NAME_LEN + 1];
	RLHeldState state;			/* rl_lt_set_state changes it */
	RLLockMode	mode;
	RLTarget   *target;
	RLLockNames names;			/* strings live in TopMemoryContext */
	int64		fence;
	int			session_holds;
	int			xact_holds;
	int64		lease_ms;
	bool		watchdog;		/* renewed by the background worker */
	bool		was_renewed;	/* doubt: renewed by the worker while held,
								 * so a renewal may have run unanswered */
	bool		lost;			/* Redis no longer has our token (state
								 * LOST; kept when its holds go) */
	bool		loss_presumed;	/* lost only as the worker presumed it (no
								 * renewal answered for a lease): a COMMIT's
								 * verify that finds it ours withdraws it */
	bool		loss_unsure;	/* its release, sent again, found it gone
								 * where its own first send may have
								 * deleted it (RL_OP_SURELY_NO) */
	uint8		on_lost;		/* RLOnLost, as set when it was taken */
	bool		unreachable;	/* its verify at COMMIT failed: the abort
								 * that follows leaves it as a doubt */
	uint64		lost_reported_at;	/* call that last warned about it */
	TimestampTz acquired_at;
	TimestampTz lease_from;		/* when the round trip that last started
								 * our lease in Redis was sent: it lasts at
								 * least lease_ms from then (or from the
								 * worker's renewal since); 0: unknown */
	TimestampTz expires_at;		/* doubt: nothing can exist after this */
	int64		queued_ms;		/* redisson_fair: may be in the lock's wait
								 * queue, joined with this wait; 0: not */
	int			registry_slot;	/* watchdog registry slot, -1 if none */
	bool		late_grant;		/* doubt: an acquire whose grant may still
								 * land in Redis */
	uint32		handed_gen;		/* the slot's generation when handed */
	bool		release_handed; /* handed: the release of a lock it held,
								 * not made at an abort
								 * (rl_lt_hand_unsent_to_worker) */
	uint64		serial;			/* tells this entry from a later one of the
								 * same name */
};

#define RL_HOLDS(e) ((e)->session_holds + (e)->xact_holds)

/*
 * What follows from the state (lockstate.c): the entry is handed to the
 * watchdog worker, whose registry_slot it is until taken back (HANDED,
 * RELEASING_HANDED); its release was sent and the answer is still to come
 * (RELEASING, RELEASING_HANDED: a PendingRelease, lockdoubts.c).
 */
#define RL_HANDED(e) \
	((e)->state == RL_ENTRY_HANDED || (e)->state == RL_ENTRY_RELEASING_HANDED)
#define RL_RELEASING(e) \
	((e)->state == RL_ENTRY_RELEASING || (e)->state == RL_ENTRY_RELEASING_HANDED)

extern int64 rl_acquire(RLLockMode mode, const char *name, int64 ttl_ms,
						int64 wait_ms, RLScope scope, bool *obtained);
extern void rl_refuse_unsupported_layout(RLLockMode mode, const char *name);
extern bool rl_acquire_permits(const char *name, int permits, int max_permits,
							   int64 ttl_ms, int64 wait_ms, RLScope scope);
extern bool rl_release(RLLockMode mode, const char *name);
extern void rl_release_nowait(const char *name);
extern bool rl_holds_read_only(const char *name);
extern int	rl_release_all_session(void);
extern void rl_discard_session_locks(void);
extern bool rl_extend(RLLockMode mode, const char *name, int64 ttl_ms);
extern RLHeld *rl_lookup(const char *name);
extern RLHeld *rl_lookup_mode(RLLockMode mode, const char *name);
extern RLHeld *rl_lookup_any(const char *name);
extern void rl_forget(const char *name);
extern void rl_safe_point(void);
extern int	rl_held_snapshot(RLHeld **out);
extern void rl_release_one_error_safe(const char *name);

/* locklost.c: what the holder does once the worker finds a lock lost */
extern void rl_lost_push_context(ErrorContextCallback *cb);
extern void rl_lost_pop_context(ErrorContextCallback *cb);
extern void rl_lost_keep_context(void);
extern void rl_lost_check_statement(void);
extern bool rl_check_lock(const char *name);
extern int	rl_release_many(const char *const *names, int n);
/* What an operation on a lock was for, in messages */
typedef enum RLLockAction
{
	RL_ACTION_ACQUIRE,
	RL_ACTION_RELEASE,
	RL_ACTION_VERIFY,
	RL_ACTION_FORCE_RELEASE,
	RL_ACTION_INSPECT
} RLLockAction;

pg_noreturn extern void rl_raise_undecided(RLLockAction action, const char *name, RLLockOp *op);
pg_noreturn extern void rl_raise_wrong_type(const char *name, const RLLockNames *n, const char *type);

/*
 * The interface lockmany.c (several locks at once) uses to keep this table:
 * the same entries, holds, doubts and watchdog slots as a single acquire,
 * one entry per name.  Exclusive locks only.
 */
extern void rl_many_check_layout(const char *name);
extern void rl_many_check_room(const char *const *names, int n);
extern RLProtocol rl_many_layout(const char *name);
extern RLHeld *rl_many_entry(const char *name, int64 lease_ms, bool *held);
extern void rl_many_sending(RLHeld *e, int64 lease_ms);
extern void rl_many_answered(RLHeld *e, bool late_grant);
extern void rl_many_discard_lost(RLHeld *e);
extern void rl_many_give_back(RLHeld **ents, int n, bool *settled);
extern void rl_many_grant(RLHeld *e, bool held, int64 fence, int64 lease_ms,
						  TimestampTz sent_at, bool watchdog, RLScope scope);
extern void rl_many_forget(RLHeld *e);
extern void rl_many_doubts_to_worker(void);
extern void rl_many_subscribed(RLConn **subs, int n);
extern void rl_many_unsubscribed(void);
extern void rl_many_check_deadlock(TimestampTz now);
extern long rl_retry_sleep_ms(bool busy_publishes, int64 pttl, bool redlock,
							  long *backoff, TimestampTz now,
							  TimestampTz deadline);

/* ----------------------------------------------------------------
 * From lockmany:
 *	  Several Redis locks taken at once, all or nothing (lockmany.c).
 * ----------------------------------------------------------------
 */
extern int64 *rl_acquire_many(const char *const *names, int n, int64 ttl_ms,
							  int64 wait_ms, RLScope scope, bool *obtained,
							  int *busy);

#endif							/* RL_LOCK_H */
