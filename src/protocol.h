/*-------------------------------------------------------------------------
 *
 * protocol.h
 *	  The wire layouts: scripts, names, owner tokens, replies (protocol.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/protocol.h
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
	char		owner[RL_OWNER_LEN + 1];	/* token or hash field */
} RLLockNames;

/* Outcome of one acquire script on one node */
typedef enum RLAcquireOutcome
{
	RL_ACQ_GRANTED,
	RL_ACQ_BUSY,				/* held by someone else */
	RL_ACQ_WRONGTYPE,			/* key is not a lock of this protocol */
	RL_ACQ_FAILED				/* transport or script failure */
} RLAcquireOutcome;

typedef struct RLAcquireResult
{
	RLAcquireOutcome outcome;
	int64		fence;			/* when granted; 0: no fencing (Redlock) */
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
extern void rl_new_owner(RLProtocol protocol, char *owner);
extern void rl_script_call(RLCall *call, RLConn *conn, RLScriptId id,
						   int nkeys, const char **keys, int nargs,
						   const char **args);
extern void rl_script_run(RLCall *calls, int ncalls, RLRunMode mode);
extern char *rl_call_command_name(RLCall *call);

extern void rl_call_acquire(RLCall *call, RLConn *conn, const RLLockNames *n,
							int64 lease_ms, bool fence, int64 queue_wait_ms);
extern void rl_call_dequeue(RLCall *call, RLConn *conn, const RLLockNames *n,
							int64 queue_wait_ms);
extern char *rl_wait_channel(const RLLockNames *n);
extern bool rl_key_splits_slots(RLProtocol protocol, const char *key);
extern void rl_call_release(RLCall *call, RLConn *conn, const RLLockNames *n);
extern void rl_call_extend(RLCall *call, RLConn *conn, const RLLockNames *n,
						   int64 lease_ms, bool renew);
extern int64 rl_extend_found_ttl(RLCall *call);
extern void rl_call_force(RLCall *call, RLConn *conn, const RLLockNames *n);
extern void rl_call_inspect(RLCall *call, RLConn *conn, const RLLockNames *n);
extern void rl_parse_acquire(RLCall *call, RLAcquireResult *res);
extern bool rl_protocol_has_many(RLProtocol protocol);
extern void rl_call_acquire_many(RLCall *call, RLConn *conn,
								 const RLLockNames *const *names, int n,
								 const int64 *lease_ms, const bool *held,
								 bool fence);
extern void rl_parse_acquire_many(RLCall *call, int n, RLAcquireManyResult *res);
extern bool rl_inspect_reply_valid(const RLReply *r);
/* Answer of a release, extend or force script on one node */
typedef enum RLFlag
{
	RL_FLAG_NO,					/* not ours / not there */
	RL_FLAG_YES,				/* done */
	RL_FLAG_WRONGTYPE,			/* the key holds a foreign type */
	RL_FLAG_FAILED				/* no usable answer */
} RLFlag;

extern RLFlag rl_parse_flag(RLCall *call, char **type);
extern const char *rl_pubsub_subscribe_cmd(void);
extern const char *rl_pubsub_unsubscribe_cmd(void);

#endif							/* RL_PROTOCOL_H */
