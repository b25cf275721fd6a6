/*-------------------------------------------------------------------------
 *
 * protocol.h
 *	  The wire layouts: scripts, names, owner tokens, replies (protocol.c,
 *	  scripts.c, scriptfree.c, replies.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/redis/protocol.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_PROTOCOL_H
#define RL_PROTOCOL_H

#include "topology.h"

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

/* Names of everything one lock touches in Redis */
typedef struct RLLockNames
{
	RLProtocol	protocol;
	char	   *key;
	size_t		keylen;
	char	   *fence_key;
	char	   *channel;
	char	   *release_channel;	/* simple layout: where a release also
									 * publishes the key (the
									 * redis_lock.release_channel_prefix of
									 * when it was built, then the key), or
									 * NULL */
	/* token or hash field of this grant, made by rl_mint_owner */
	char		owner[RL_OWNER_LEN + 1];

	/*
	 * a read hold's: the owner value of the session's write hold of the lock
	 * when the read was tried (its field lets the read in), or ""
	 */
	char		writer[RL_OWNER_LEN + 1];
	bool		script_free;	/* simple layout without Lua scripts
								 * (redis_lock.scripting off when built) */
	int			permits;		/* semaphores: how many permits the holder
								 * takes; their ids are named from owner */
	int			max_permits;	/* redis_semaphore: the limit each client
								 * passes (none is stored in Redis) */
	bool		name_counter;	/* redisson layouts: fencing tokens also
								 * count Redisson's per-name counter
								 * (redis_lock.redisson_token_counter on
								 * when built) */
} RLLockNames;

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
							RLCall **why);
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

#endif							/* RL_PROTOCOL_H */
