/*-------------------------------------------------------------------------
 *
 * locktable.h
 *	  This backend's table of Redis locks (locktable.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/locktable.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_LOCKTABLE_H
#define RL_LOCKTABLE_H

#include "watchdog.h"

typedef enum RLScope
{
	RL_SCOPE_SESSION,
	RL_SCOPE_XACT
} RLScope;

/* One lock this backend holds (or may hold, when holds are zero) */
typedef struct RLHeld
{
	char		name[RL_MAX_NAME_LEN + 1];	/* hash key */
	RLTarget   *target;
	RLLockNames names;			/* strings live in TopMemoryContext */
	int64		fence;
	int			session_holds;
	int			xact_holds;
	int64		lease_ms;
	bool		watchdog;		/* renewed by the background worker */
	bool		lost;			/* Redis no longer has our token */
	bool		unreachable;	/* its verify at COMMIT failed: the abort
								 * that follows leaves it as a doubt */
	uint64		lost_reported_at;	/* call that last warned about it */
	TimestampTz acquired_at;
	TimestampTz expires_at;		/* doubt: nothing can exist after this */
	int			registry_slot;	/* watchdog registry slot, -1 if none */
} RLHeld;

#define RL_HOLDS(e) ((e)->session_holds + (e)->xact_holds)

extern int64 rl_acquire(const char *name, int64 ttl_ms, int64 wait_ms,
						RLScope scope, bool *obtained);
extern bool rl_release(const char *name);
extern int	rl_release_all_session(void);
extern bool rl_extend(const char *name, int64 ttl_ms);
extern RLHeld *rl_lookup(const char *name);
extern void rl_forget(const char *name);
extern void rl_safe_point(void);
extern int	rl_held_snapshot(RLHeld **out);
extern void rl_release_one_error_safe(const char *name);
/* What an operation on a lock was for, in messages */
typedef enum RLLockAction
{
	RL_ACTION_ACQUIRE,
	RL_ACTION_RELEASE,
	RL_ACTION_VERIFY,
	RL_ACTION_FORCE_RELEASE,
	RL_ACTION_INSPECT
} RLLockAction;

extern void rl_raise_undecided(RLLockAction action, const char *name, RLLockOp *op)
			pg_attribute_noreturn();
extern void rl_raise_wrong_type(const char *name, const RLLockNames *n, const char *type)
			pg_attribute_noreturn();

#endif							/* RL_LOCKTABLE_H */
