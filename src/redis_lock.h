/*-------------------------------------------------------------------------
 *
 * redis_lock.h
 *	  Declarations shared by the files of the redis_lock extension.
 *
 * Layering, top to bottom; a file may call only into the layers below it:
 *
 *	functions.c   SQL-callable functions: argument checks, result shaping
 *	locktable.c   per-backend table of held locks, reentrancy, transaction
 *				  and session-exit callbacks, acquire/wait/release logic
 *	watchdog.c    shared-memory registry of every backend's locks and the
 *				  background worker that renews and cleans them up
 *	scripts.c     the Lua scripts of each wire protocol, key/channel names,
 *				  EVALSHA with NOSCRIPT recovery, reply decoding
 *	topology.c    where a key lives: single node, Redlock masters, Sentinel,
 *				  Cluster slot map
 *	transport.c   hiredis connections: non-blocking connect, handshake,
 *				  pipelined round trips and pub/sub, all waits on the latch
 *	settings.c    GUCs and parsing of redis_lock.url
 *
 *-------------------------------------------------------------------------
 */
#ifndef REDIS_LOCK_H
#define REDIS_LOCK_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "pgstat.h"
#include "utils/timestamp.h"

/* Longest lock name accepted, in bytes (API.md) */
#define RL_MAX_NAME_LEN		512
/* Longest key_prefix accepted, in bytes */
#define RL_MAX_PREFIX_LEN	256
/* Largest Redis key we build: prefix + name */
#define RL_MAX_KEY_LEN		(RL_MAX_PREFIX_LEN + RL_MAX_NAME_LEN)
/* Owner identity: simple = 32 hex chars; redisson = "<uuid>:<pid>" */
#define RL_OWNER_LEN		64
/* Largest lease or wait, in milliseconds (fits a signed 32-bit int) */
#define RL_MAX_MS			((int64) PG_INT32_MAX)

/* The wait event shown in pg_stat_activity while we wait on Redis */
#define RL_WAIT_EVENT		PG_WAIT_EXTENSION

/* ----------------------------------------------------------------
 * settings.c
 * ----------------------------------------------------------------
 */
typedef enum RLProtocol
{
	RL_PROTOCOL_SIMPLE,
	RL_PROTOCOL_REDISSON
} RLProtocol;

extern char *rl_url;
extern char *rl_password;
extern char *rl_key_prefix;
extern int	rl_lease_time_ms;
extern int	rl_wait_timeout_ms;
extern int	rl_connect_timeout_ms;
extern int	rl_command_timeout_ms;
extern int	rl_protocol;
extern bool rl_verify_on_commit;
extern int	rl_max_locks;
extern char *rl_nodes;
extern char *rl_sentinels;
extern char *rl_sentinel_master;
extern bool rl_cluster;
extern int	rl_wait_replicas;
extern int	rl_wait_replicas_timeout_ms;
extern bool rl_sharded_pubsub;
extern int	rl_node_timeout_ms;
extern char *rl_sentinel_password;

/* Bumped whenever a setting that changes where or how we connect changes */
extern uint64 rl_settings_generation;

/* One Redis server address, as parsed from a redis:// URL */
typedef struct RLEndpoint
{
	char		host[256];
	int			port;
	int			db;
	char		user[128];		/* ACL user, "" for none */
	bool		sentinel;		/* a Sentinel: its own password, no SELECT */
} RLEndpoint;

extern void rl_define_settings(void);
extern bool rl_parse_url(const char *url, RLEndpoint *ep, char **errmsg);
extern char *rl_endpoint_label(const RLEndpoint *ep);
extern const char *rl_protocol_name(RLProtocol p);

/* ----------------------------------------------------------------
 * transport.c
 * ----------------------------------------------------------------
 */

/* A Redis reply, copied out of hiredis into palloc'd memory */
typedef struct RLReply
{
	int			type;			/* REDIS_REPLY_* */
	long long	integer;
	char	   *str;			/* string, status or error text */
	size_t		len;
	size_t		elements;
	struct RLReply **element;
} RLReply;

typedef struct RLConn RLConn;
typedef struct RLTarget RLTarget;

#define RL_MAX_ARGS 12

/*
 * One command for one connection.  Arguments are borrowed (not copied) until
 * the round trip ends.  After rl_run, exactly one of reply / error is set.
 */
typedef struct RLCall
{
	RLConn	   *conn;
	RLTarget   *target;			/* for redirections; NULL: none */
	const char *key;			/* the key it is about, to re-route it when
								 * its node fails; NULL: not re-routed */
	size_t		keylen;
	bool		follows;		/* sent again whenever the call before it is
								 * (WAIT after a script) */
	bool		asking;			/* send ASKING first (cluster slot migration) */
	int			extra_ms;		/* the command itself waits this long (WAIT) */
	int			argc;
	const char *argv[RL_MAX_ARGS];
	size_t		argvlen[RL_MAX_ARGS];
	RLReply    *reply;
	char	   *error;			/* transport failure text (soft mode) */
	int			sqlstate;		/* ERRCODE_* of that failure */
	bool		sent;			/* some bytes reached the socket: on failure
								 * the outcome is unknown, else it is "not run" */
} RLCall;

/* rl_run modes */
#define RL_RUN_HARD		0		/* first transport failure is an ERROR */
#define RL_RUN_SOFT		1		/* failures are recorded in each RLCall */

extern RLConn *rl_conn_for(const RLEndpoint *ep, bool subscriber);
extern const char *rl_conn_label(RLConn *conn);
extern void rl_use_credentials(const char *password,
							   const char *sentinel_password);
extern void rl_use_settings_credentials(void);
extern void rl_conn_close(RLConn *conn);
extern void rl_call_set(RLCall *call, RLConn *conn, int argc, const char **argv,
						const size_t *argvlen);
extern void rl_call_arg(RLCall *call, const char *arg, size_t len);
extern void rl_run(RLCall *calls, int ncalls, int mode, int timeout_ms);
extern void rl_raise_call_error(RLCall *call) pg_attribute_noreturn();
extern void rl_close_all(void);

/* pub/sub on a subscriber connection */
extern void rl_subscribe(RLConn **subs, int n, const char *cmd,
						 const char *channel, int timeout_ms);
extern void rl_unsubscribe_async(RLConn **subs, int n, const char *cmd,
								 const char *channel);
extern bool rl_wait_for_message(RLConn **subs, int n, const char *channel,
								long timeout_ms);

extern bool rl_reply_is_error(RLReply *r, const char *prefix);

/* ----------------------------------------------------------------
 * topology.c
 * ----------------------------------------------------------------
 */
typedef enum RLTopologyKind
{
	RL_TOPO_SINGLE,
	RL_TOPO_REDLOCK,
	RL_TOPO_SENTINEL,
	RL_TOPO_CLUSTER
} RLTopologyKind;

/* Redis Cluster slot map of a target */
typedef struct RLSlotMap
{
	int			nnodes;
	int			capacity;
	RLEndpoint *nodes;
	int16		owner[16384];	/* index into nodes, -1 unknown */
	bool		loaded;
} RLSlotMap;

/*
 * Where locks live.  Built from a spec text (see rl_target_from_spec),
 * cached for good; a held lock keeps pointing at the target it was taken on.
 */
struct RLTarget
{
	char	   *spec;			/* text it was built from */
	RLTopologyKind kind;
	int			nendpoints;
	RLEndpoint *endpoints;		/* single/redlock: the masters; sentinel: the
								 * sentinels; cluster: the seed */
	char	   *master_name;	/* sentinel: monitored master's name */
	RLEndpoint	data;			/* sentinel: user/db for the master */
	RLEndpoint	master;			/* sentinel: last discovered master */
	bool		master_known;
	RLSlotMap  *slots;			/* cluster */
	RLTarget   *next;
};

extern RLTarget *rl_current_target(void);
extern RLTarget *rl_target_from_spec(const char *spec);
extern int	rl_target_quorum(RLTarget *t);
extern uint16 rl_key_slot(const char *key, size_t len);

#define RL_MAX_NODES 16

extern int	rl_target_nodes(RLTarget *t, const char *key, size_t keylen,
							RLConn **conns, bool subscriber, char **error);
extern int	rl_target_nodes_or_raise(RLTarget *t, const char *key, size_t keylen,
									 RLConn **conns, bool subscriber);
extern void rl_target_run(RLCall *calls, int ncalls, int mode);
extern int	rl_target_max_nodes(RLTarget *t);
extern int	rl_target_timeout(RLTarget *t);

/* ----------------------------------------------------------------
 * scripts.c
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
	RL_SCRIPT_FORCE,
	RL_SCRIPT_INSPECT,
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
extern void rl_script_run(RLCall *calls, int ncalls, int mode);

extern void rl_call_acquire(RLCall *call, RLConn *conn, const RLLockNames *n,
							int64 lease_ms, bool fence);
extern void rl_call_release(RLCall *call, RLConn *conn, const RLLockNames *n);
extern void rl_call_extend(RLCall *call, RLConn *conn, const RLLockNames *n,
						   int64 lease_ms);
extern void rl_call_force(RLCall *call, RLConn *conn, const RLLockNames *n);
extern void rl_call_inspect(RLCall *call, RLConn *conn, const RLLockNames *n);
extern void rl_parse_acquire(RLCall *call, RLAcquireResult *res);
extern bool rl_inspect_reply_valid(const RLReply *r);

/*
 * One lock operation on every node its target puts the key on, with the
 * per-node answers counted.  Decisions go by majority (one node: its
 * answer): yes >= quorum, or no > nodes - quorum.
 */
typedef enum RLOpKind
{
	RL_OP_ACQUIRE,
	RL_OP_EXTEND,				/* also verify and renew */
	RL_OP_RELEASE,
	RL_OP_FORCE,
	RL_OP_INSPECT
} RLOpKind;

typedef struct RLLockOp
{
	/* in */
	RLOpKind	kind;
	RLTarget   *target;
	const RLLockNames *names;
	int64		lease_ms;
	bool		fence;			/* acquire: count a fencing token */
	/* out */
	int			nodes;
	int			yes;
	int			no;
	int			failed;
	bool		maybe_ran;		/* a failed call may have reached Redis */
	RLCall	   *failure;		/* first failed call */
	RLCall	   *calls;			/* one per node */
	char	   *wrongtype;		/* some node holds a foreign type */
	int64		fence_value;
	int64		pttl;			/* acquire, busy: smallest holder TTL seen */
	bool		holder_publishes;
	int64		elapsed_ms;
	int			stride;			/* calls per node: 2 when WAIT follows */
	int			replicas_short; /* nodes where WAIT saw too few replicas */
} RLLockOp;

#define RL_OP_YES(op) ((op)->yes >= rl_target_quorum((op)->target))
#define RL_OP_NO(op) ((op)->no > (op)->nodes - rl_target_quorum((op)->target))

extern void rl_lock_ops_run(RLLockOp *ops, int nops, bool soft);
extern bool rl_op_granted(RLLockOp *op);
extern int	rl_parse_flag(RLCall *call, char **error);
extern const char *rl_pubsub_subscribe_cmd(void);
extern const char *rl_pubsub_unsubscribe_cmd(void);

/* ----------------------------------------------------------------
 * locktable.c
 * ----------------------------------------------------------------
 */
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
extern void rl_raise_undecided(const char *verb, const char *name, RLLockOp *op)
			pg_attribute_noreturn();

/* counters exported by redis_lock_stats() */
typedef struct RLStats
{
	uint64		acquired;
	uint64		failed;
	uint64		timed_out;
	uint64		waits;
	uint64		wait_time_us;
	uint64		renewals;
	uint64		lost;
	uint64		reconnects;
	uint64		released;
} RLStats;

/* ----------------------------------------------------------------
 * watchdog.c
 * ----------------------------------------------------------------
 */
/* What the shared registry records of one lock, and the view shows */
typedef struct RLLockState
{
	int			pid;
	Oid			dbid;
	RLProtocol	protocol;
	bool		watchdog;
	bool		lost;
	int			session_holds;
	int			xact_holds;
	int64		fence;
	int64		lease_ms;
	TimestampTz acquired_at;
	TimestampTz last_renewed_at;
} RLLockState;

/* One row of the redis_lock_locks view */
typedef struct RLLockInfo
{
	RLLockState st;
	char	   *name;
	char	   *key;
} RLLockInfo;

extern bool rl_watchdog_enabled(void);
extern void rl_watchdog_init(void);
extern int	rl_registry_add(RLHeld *e);
extern void rl_registry_update(RLHeld *e, bool refreshed);
extern void rl_registry_remove(RLHeld *e);
extern void rl_registry_orphan(RLHeld *e);
extern bool rl_registry_lost(RLHeld *e);
extern uint32 rl_registry_lost_events(void);
extern bool rl_registry_snapshot(RLLockInfo **out, int *n);
extern void rl_stats_add(int field, uint64 n);
extern void rl_stats_read(RLStats *out);

#define RL_STAT_ACQUIRED	0
#define RL_STAT_FAILED		1
#define RL_STAT_TIMED_OUT	2
#define RL_STAT_WAITS		3
#define RL_STAT_WAIT_US		4
#define RL_STAT_RENEWALS	5
#define RL_STAT_LOST		6
#define RL_STAT_RECONNECTS	7
#define RL_STAT_RELEASED	8
#define RL_STAT_COUNT		9

/* ----------------------------------------------------------------
 * small helpers (functions.c)
 * ----------------------------------------------------------------
 */
extern char *rl_format_ms(int64 ms);

#endif							/* REDIS_LOCK_H */
