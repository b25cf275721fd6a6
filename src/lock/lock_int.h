/*-------------------------------------------------------------------------
 *
 * lock_int.h
 *	  What the files of lock/ share, and no other subsystem sees
 *	  (its public header is lock/lock.h).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/lock/lock_int.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_LOCK_INT_H
#define RL_LOCK_INT_H

#include "lock/lock.h"
#include "access/xact.h"
#include "utils/hsearch.h"

/* ----------------------------------------------------------------
 * From locktable_int:
 *	  What the files of the lock table share among themselves: the table
 *	  and its counters, the entries' operations (locktable.c), doubts and
 *	  releases on their way (lockdoubts.c), dropping holds (lockrelease.c),
 *	  the transaction callbacks locktable.c registers (lockxact.c), and
 *	  the entries' state (lockstate.c).  Only the files of lock/ but
 *	  lockmany.c include this; the rest of the extension uses lock.h.
 * ----------------------------------------------------------------
 */
extern void redis_lock_locktable_xact_callback(XactEvent event, void *arg);
extern void redis_lock_locktable_subxact_callback(SubXactEvent event,
												  SubTransactionId mySubid,
												  SubTransactionId parentSubid,
												  void *arg);
extern void redis_lock_locktable_before_shmem_exit(int code, Datum arg);

/*
 * Transaction-scoped holds in the order taken, each tagged with the
 * subtransaction that owns it, so that ROLLBACK TO SAVEPOINT drops the holds
 * taken since the savepoint, as it does for pg_advisory_xact_lock.  The holds
 * of the current subtransaction are always the tail.  Names, not entry
 * pointers: an entry can be removed and its memory reused while a record of
 * it remains (a lock found lost and taken anew); a record whose entry has no
 * transaction hold left is skipped.
 */
typedef struct XactHold
{
	SubTransactionId subid;
	char	   *hkey;			/* the entry's hash key */
} XactHold;

/* rl_lt_release_entries' result for a release no majority answered */
#define RELEASE_UNKNOWN (-1)

/* locktable.c: the table, its entries and the operations on them */
extern HTAB *rl_lt_held;
extern int	rl_lt_ndoubts;		/* kept by rl_lt_set_state */
extern int	rl_lt_nhanded;		/* kept by rl_lt_set_state */
extern int	rl_lt_nqueued;
extern MemoryContext rl_lt_work_cxt;
extern XactHold *rl_lt_xact_log;
extern int	rl_lt_xact_log_len;
extern uint64 rl_lt_call_seq;

extern void rl_lt_ensure_table(void);
extern void rl_lt_maybe_shrink(void);
extern RLHeld *rl_lt_entry_find(RLLockMode mode, const char *name);
extern RLProtocol rl_lt_mode_protocol(RLLockMode mode);
extern void rl_lt_ensure_room(int more);
extern RLHeld *rl_lt_entry_create(RLLockMode mode, const char *name);
extern void rl_lt_registry_sync(RLHeld *e, bool refreshed);
extern void rl_lt_registry_drop(RLHeld *e);
extern void rl_lt_hand_to_worker(RLHeld *e);
extern void rl_lt_entry_leave_to_worker(RLHeld *e);
extern bool rl_lt_take_back_from_worker(RLHeld *e);
extern void rl_lt_renew_owner(RLHeld *e, bool settle);
extern bool rl_lt_take_worker_loss(RLHeld *e);
extern bool rl_lt_found_ours(RLHeld *e, TimestampTz sent);
extern void rl_lt_entry_remove(RLHeld *e);
extern void rl_lt_xact_log_reset(void);
extern void rl_lt_add_hold(RLHeld *e, RLScope scope);
extern TimestampTz rl_lt_doubt_horizon(int64 lease_ms);
extern void rl_lt_became_doubt(RLHeld *e);
extern void rl_lt_report_call(int elevel, RLLockAction action,
							  const char *name, RLCall *call);
extern void rl_lt_warn_lost(RLHeld *e);
extern void rl_lt_mark_lost(RLHeld *e);
extern void rl_lt_op_init(RLLockOp *op, RLOpKind kind, RLHeld *e,
						  int64 lease_ms);
extern RLLockOp *rl_lt_release_entries(RLHeld **ents, int n, RLRunMode mode,
										int *results);
extern void rl_lt_release_soft(RLHeld **ents, int n, const bool *warn,
							   bool interruptible);
extern bool *rl_lt_warn_for_all(int n);
extern bool rl_lt_verify_and_refresh(RLHeld *e, int64 lease_ms);

/* lockstate.c: an entry's state, and what follows from it */
extern void rl_lt_set_state(RLHeld *e, RLHeldState to);
extern void rl_lt_set_lost(RLHeld *e);
extern void rl_lt_set_found_ours(RLHeld *e);

/* lockdoubts.c: releases on their way, doubts, safe points */
extern int	rl_lt_npending;
extern RLConn *rl_lt_dirty_subs[64];
extern int	rl_lt_ndirty_subs;

extern int	rl_lt_release_later(RLHeld **ents, int n);
extern void rl_lt_settle_pending(bool interruptible, bool send_again);
extern void rl_lt_reclaim_releasing(RLHeld *e);
extern void rl_lt_hand_doubts_to_worker(void);
extern int	rl_lt_hand_unsent_to_worker(RLHeld **ents, int n);
extern void rl_lt_release_without_waiting(RLHeld **ents, int n);
extern void rl_lt_clean_dirty_subs(void);
extern void rl_lt_leave_queues(void);

/* lockrelease.c: dropping holds */
extern void rl_lt_drop_holds(RLHeld *e, RLScope scope, int k, RLHeld **out,
							 int *nout);
extern int	rl_lt_drop_scope(RLScope scope, RLHeld ***out, int *nout);

#endif							/* RL_LOCK_INT_H */
