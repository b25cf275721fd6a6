/*-------------------------------------------------------------------------
 *
 * lockop.h
 *	  One lock operation over every node of a target (lockop.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/lockop.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_LOCKOP_H
#define RL_LOCKOP_H

#include "protocol.h"

/*
 * One lock operation (RLOpKind, protocol.h) on every node its target puts
 * the key on, with the per-node answers counted.  Decisions go by majority
 * (one node: its answer): yes >= quorum, or no > nodes - quorum.
 */
typedef struct RLLockOp
{
	/* in */
	RLOpKind	kind;
	RLTarget   *target;
	const RLLockNames *names;
	int64		lease_ms;
	bool		fence;			/* acquire: count a fencing token */
	int64		queue_wait_ms;	/* redisson_fair acquire: join the queue with
								 * this wait when busy (0: do not); dequeue:
								 * the wait it joined with */
	TimestampTz ours_until;		/* release: our lease surely lasts until
								 * then, by this backend's clock (0: not
								 * known); see count_answer */
	bool		may_outlive;	/* release: the key may outlive ours_until
								 * (a renewal may have run unanswered, or
								 * the release goes before then) */
	/* out */
	int			nodes;
	int			yes;
	int			no;
	int			failed;
	int			no_unsure;		/* release: "no" answers of a resend that
								 * may have found our own first send's
								 * delete (count_answer) */
	int			refused;		/* failed nodes that refused it in a way that
								 * would come again (rl_reply_is_permanent) */
	bool		maybe_ran;		/* a failed call may have run in Redis */
	RLCall	   *failure;		/* first failed call */
	RLCall	   *calls;			/* stride per node, its unit first */
	char	   *wrongtype;		/* some node holds a foreign type */
	int64		fence_value;
	int64		pttl;			/* acquire, busy: smallest holder TTL seen */
	bool		holder_publishes;
	int64		elapsed_ms;
	int			unit_calls;		/* calls of one node's unit (protocol.h) */
	int			stride;			/* calls per node: the unit, and WAIT after
								 * an acquire when redis_lock.wait_replicas
								 * > 0, or PUBLISH after a release with a
								 * release_channel */
	int			replicas_short; /* nodes where WAIT saw too few replicas */
	bool		goes_again;		/* sent without waiting: a node did not run
								 * it, and would be asked again (see
								 * rl_lock_op_answered) */
} RLLockOp;

#define RL_OP_YES(op) ((op)->yes >= rl_target_quorum((op)->target))
#define RL_OP_NO(op) ((op)->no > (op)->nodes - rl_target_quorum((op)->target))
/* no, and not only by answers that may have found our own delete */
#define RL_OP_SURELY_NO(op) \
	((op)->no - (op)->no_unsure > (op)->nodes - rl_target_quorum((op)->target))
/* the same tests, for an RLManyOp */
#define RL_MANY_YES(op) ((op)->yes >= rl_target_quorum((op)->target))
#define RL_MANY_NO(op) ((op)->no > (op)->nodes - rl_target_quorum((op)->target))

/*
 * Several locks taken at once with one multi-key acquire script per node
 * (every Redlock master, or the one node all the keys live on, in one hash
 * slot), answers counted by majority as for RLLockOp: a node grants every
 * lock or none.
 */
typedef struct RLManyOp
{
	/* in */
	RLTarget   *target;
	int			nlocks;
	const RLLockNames *const *names;	/* the same layout; one slot in a
										 * Cluster */
	const int64 *lease_ms;		/* per lock */
	const bool *held;			/* per lock: the session holds it */
	bool		fence;
	/* out */
	int			nodes;
	int			yes;
	int			no;
	int			failed;
	bool		maybe_ran;		/* a failed call may have run in Redis */
	RLCall	   *failure;		/* first failed call */
	RLCall	   *calls;
	int			stride;			/* calls per node: 2 when WAIT follows */
	int			replicas_short;
	int64	   *fences;			/* granted: a granting node's tokens */
	int			busy_index;		/* first lock a node found busy (or lost,
								 * or of a foreign type), -1: none */
	bool		lost;			/* busy_index is a held lock not ours */
	int64		pttl;			/* its holder's remaining ms */
	bool		holder_publishes;
	char	   *wrongtype;		/* busy_index holds a foreign type */
	int64		elapsed_ms;
} RLManyOp;

extern void rl_lock_ops_run(RLLockOp *ops, int nops, RLRunMode mode);
/* the caller is named where a wait breaks the rule (rl_assert_may_wait) */
#define rl_lock_ops_run(ops, nops, mode) \
	((void) (rl_wait_site = __func__), rl_lock_ops_run((ops), (nops), (mode)))
extern void rl_lock_ops_send(RLLockOp *ops, int nops, bool *sent);
extern bool rl_lock_op_answered(RLLockOp *op);
extern void rl_many_op_run(RLManyOp *op, RLRunMode mode);
#define rl_many_op_run(op, mode) \
	((void) (rl_wait_site = __func__), rl_many_op_run((op), (mode)))
extern bool rl_many_op_granted(RLManyOp *op);
extern bool rl_op_granted(RLLockOp *op);
extern int64 rl_op_found_ttl(RLLockOp *op);
extern RLReply *rl_op_inspect_reply(RLLockOp *op, int node);
extern bool rl_op_held_by(RLLockOp *op, const char *owner);

#endif							/* RL_LOCKOP_H */
