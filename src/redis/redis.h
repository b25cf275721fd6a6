/*-------------------------------------------------------------------------
 *
 * redis.h
 *	  The Redis operations subsystem: key and channel names, owner values
 *	  (protocol.c), the wire layouts' Lua scripts and their script-free forms
 *	  (scripts.c, lockscripts.c, semscripts.c, scriptfree.c), decoding
 *	  replies by declared shape (replies.c), and one lock operation over
 *	  every node of a target, counted by majority (lockop.c).
 *
 *	  Owns: what is sent for each operation and how each reply is read.
 *	  Must not: keep any lock's state between calls, or touch shared memory.
 *	  Calls net/ and base/.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/redis/redis.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_REDIS_H
#define RL_REDIS_H

#include "base/base.h"

/* ----------------------------------------------------------------
 * From protocol:
 *	  The wire layouts: scripts, names, owner tokens, replies (protocol.c,
 *	  scripts.c, lockscripts.c, semscripts.c, scriptfree.c, replies.c).
 * ----------------------------------------------------------------
 */
typedef enum RLScriptId
{
	RL_SCRIPT_SIMPLE_ACQUIRE,
	RL_SCRIPT_SIMPLE_RELEASE,
	RL_SCRIPT_SIMPLE_EXTEND,
	RL_SCRIPT_REDISSON_ACQUIRE,
	RL_SCRIPT_REDISSON_RELEASE,
	RL_SCRIPT_REDISSON_EXTEND,
	RL_SCRIPT_FAIR_ACQUIRE,
	RL_SCRIPT_FAIR_RELEASE,
	RL_SCRIPT_FAIR_DEQUEUE,
	RL_SCRIPT_RW_READ_ACQUIRE,
	RL_SCRIPT_RW_READ_RELEASE,
	RL_SCRIPT_RW_READ_EXTEND,
	RL_SCRIPT_RW_WRITE_ACQUIRE,
	RL_SCRIPT_RW_WRITE_RELEASE,
	RL_SCRIPT_RW_WRITE_EXTEND,
	RL_SCRIPT_FORCE,
	RL_SCRIPT_INSPECT,
	RL_SCRIPT_SIMPLE_ACQUIRE_MANY,
	RL_SCRIPT_REDISSON_ACQUIRE_MANY,
	RL_SCRIPT_SEM_ACQUIRE,
	RL_SCRIPT_SEM_RELEASE,
	RL_SCRIPT_SEM_EXTEND,
	RL_SCRIPT_SEM_STATUS,
	RL_SCRIPT_SEM_SETUP,
	RL_SCRIPT_NPM_ACQUIRE,
	RL_SCRIPT_NPM_RELEASE,
	RL_SCRIPT_NPM_EXTEND,
	RL_SCRIPT_NPM_STATUS,
	RL_SCRIPT_COUNT
} RLScriptId;


/*
 * What one lock operation does to a lock on one node (lockop.c runs it over
 * every node of a target)
 */
typedef enum RLOpKind
{
	RL_OP_ACQUIRE,
	RL_OP_EXTEND,				/* also verify */
	RL_OP_RENEW,				/* the watchdog's: never shortens a lease */
	RL_OP_RELEASE,
	RL_OP_FORCE,
	RL_OP_INSPECT,
	RL_OP_DEQUEUE,				/* leave a fair lock's queue */
	RL_OP_SEM_STATUS,			/* a semaphore's permits, read only */
	RL_OP_SEM_SETUP				/* set a semaphore's permits if it has none
								 * (RLLockNames.permits) */
} RLOpKind;

/*
 * The calls of one operation on one node, its "unit": one EVALSHA, or the
 * commands of the script-free form (RLLockNames.script_free), which go as a
 * group (RLCall.follows) in one round trip.  At most this many.
 */
#define RL_UNIT_MAX_CALLS	7

/* Outcome of one acquire script on one node */
typedef enum RLAcquireOutcome
{
	RL_ACQ_GRANTED,
	RL_ACQ_OURS,				/* script-free: our token was there already
								 * (a retry); granted once its lease is
								 * restarted (an RL_OP_EXTEND unit) */
	RL_ACQ_BUSY,				/* held by someone else */
	RL_ACQ_WRONGTYPE,			/* key is not a lock of this protocol */
	RL_ACQ_FAILED				/* transport or script failure */
} RLAcquireOutcome;

typedef struct RLAcquireResult
{
	RLAcquireOutcome outcome;
	int64		fence;			/* when granted (or ours); 0: no fencing
								 * (Redlock) */
	int64		pttl;			/* when busy: holder's remaining ms, -1 none */
	bool		holder_publishes;	/* when busy: holder wakes us on release */
	char	   *type;			/* when wrong type: Redis type name */
	RLCall	   *failure;		/* when failed: a failed call */
	int			answered;		/* nodes that answered */
	int			nodes;			/* nodes asked */
} RLAcquireResult;

/*
 * Outcome of one multi-key acquire script on one node: every lock granted,
 * or none.  Busy, wrong type and lost name the first lock (0-based index)
 * that stopped it; lost: a lock the session holds is not ours there any more.
 */
typedef struct RLAcquireManyResult
{
	RLAcquireOutcome outcome;	/* GRANTED, BUSY (also lost), WRONGTYPE, FAILED */
	int			index;
	bool		lost;
	int64	   *fences;			/* when granted: one per lock, 0 for a lock
								 * the session held and without fencing */
	int64		pttl;			/* when busy: the holder's remaining ms */
	bool		holder_publishes;
	char	   *type;			/* when wrong type: Redis type name */
} RLAcquireManyResult;

extern void rl_scripts_init(void);
extern void rl_names_build(RLLockNames *names, RLProtocol protocol,
						   const char *prefix, const char *lock_name,
						   MemoryContext cxt);
extern void rl_names_from_key(RLLockNames *names, RLProtocol protocol,
							  const char *prefix, const char *key,
							  MemoryContext cxt);
extern void rl_mint_owner(RLProtocol protocol, char *owner);
extern const char *rl_reserved_mark(const char *prefix, const char *name);
extern void rl_script_call(RLCall *call, RLConn *conn, RLScriptId id,
						   int nkeys, const char **keys, int nargs,
						   const char **args);
extern void rl_script_run(RLCall *calls, int ncalls, RLRunMode mode);
extern char *rl_call_command_name(RLCall *call);

extern char *rl_wait_channel(const RLLockNames *n);
extern bool rl_key_splits_slots(RLProtocol protocol, const char *key);

extern int	rl_unit_calls(RLOpKind kind, const RLLockNames *n, bool fence);
extern void rl_build_unit(RLCall *unit, RLConn *conn, RLOpKind kind,
						  const RLLockNames *n, int64 lease_ms, bool fence,
						  int64 queue_wait_ms);
extern int	rl_build_force_delete(RLCall *unit, RLConn *conn,
								  const RLLockNames *n, const char *token);
extern void rl_learn_offers(RLConn **conns, int n, RLTarget *target,
							const char *key, size_t keylen, RLRunMode mode,
							bool ask, RLCall **why);
extern RLCall *rl_unit_failure(RLOpKind kind, RLCall *unit, int n);
extern bool rl_unit_may_have_run(RLCall *unit, int n);
extern bool rl_unit_refused_for_good(RLOpKind kind, RLCall *unit, int n);
extern bool rl_reply_proves_not_run(const RLReply *r);
extern bool rl_reply_is_permanent(const RLReply *r);
extern int	rl_error_reply_sqlstate(const RLReply *r);
extern int64 rl_extend_found_ttl(RLOpKind kind, RLCall *unit, int n);
extern void rl_parse_acquire(RLCall *unit, int n, RLAcquireResult *res);
extern RLReply *rl_inspect_reply(RLCall *unit, int n);
extern RLReply *rl_sem_reply(RLOpKind kind, RLCall *unit, char **type);
extern bool rl_protocol_has_many(RLProtocol protocol);
extern void rl_call_acquire_many(RLCall *call, RLConn *conn,
								 const RLLockNames *const *names, int n,
								 const int64 *lease_ms, const bool *held,
								 bool fence);
extern void rl_parse_acquire_many(RLCall *call, int n, RLAcquireManyResult *res);
extern bool rl_inspect_reply_valid(const RLReply *r);
/* Answer of a release, extend or force unit on one node */
typedef enum RLFlag
{
	RL_FLAG_NO,					/* not ours / not there */
	RL_FLAG_YES,				/* done */
	RL_FLAG_WRONGTYPE,			/* the key holds a foreign type */
	RL_FLAG_SEEN,				/* script-free force: a string lock with this
								 * token, to delete if it still holds it
								 * (rl_build_force_delete) */
	RL_FLAG_FAILED				/* no usable answer */
} RLFlag;

extern RLFlag rl_parse_flag(RLOpKind kind, RLCall *unit, int n, char **text);
extern const char *rl_pubsub_subscribe_cmd(void);
extern const char *rl_pubsub_unsubscribe_cmd(void);

/* ----------------------------------------------------------------
 * From lockop:
 *	  One lock operation over every node of a target (lockop.c).
 * ----------------------------------------------------------------
 */
/*
 * One lock operation (RLOpKind, above) on every node its target puts
 * the key on, with the per-node answers counted.  Decisions go by majority
 * (one node: its answer): yes >= quorum, or no > nodes - quorum.
 */
struct RLLockOp
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
	bool		routed;			/* rl_lock_ops_route asked what its servers
								 * offer: the run does not ask again */
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
	int			unit_calls;		/* calls of one node's unit (above) */
	int			stride;			/* calls per node: the unit, and WAIT after
								 * an acquire when redis_lock.wait_replicas
								 * > 0, or PUBLISH after a release with a
								 * release_channel */
	int			replicas_short; /* nodes where WAIT saw too few replicas */
	bool		goes_again;		/* sent without waiting: a node did not run
								 * it, and would be asked again (see
								 * rl_lock_op_answered) */
};

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
struct RLManyOp
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
};

extern void rl_lock_ops_run_at(RLLockOp *ops, int nops, RLRunMode mode,
							   const char *site);
/* the caller is named where a wait breaks the rule (rl_assert_may_wait) */
#define rl_lock_ops_run(ops, nops, mode) \
	rl_lock_ops_run_at((ops), (nops), (mode), __func__)
extern void rl_lock_ops_route(RLLockOp *ops, int nops);
extern void rl_lock_ops_send(RLLockOp *ops, int nops, bool *sent);
extern bool rl_lock_op_answered(RLLockOp *op);
extern void rl_many_op_run_at(RLManyOp *op, RLRunMode mode, const char *site);
#define rl_many_op_run(op, mode) rl_many_op_run_at((op), (mode), __func__)
extern void rl_many_op_route(RLManyOp *op);
extern bool rl_many_op_granted(RLManyOp *op);
extern bool rl_op_granted(RLLockOp *op);
extern int64 rl_op_found_ttl(RLLockOp *op);
extern RLReply *rl_op_inspect_reply(RLLockOp *op, int node);
extern int	rl_op_inspect_holders(RLLockOp *op, int node, const char **holders,
								  int64 *pttl);
extern bool rl_op_held_by(RLLockOp *op, const char *owner);

#endif							/* RL_REDIS_H */
