/*-------------------------------------------------------------------------
 *
 * net.h
 *	  The network subsystem: host names to addresses (resolve.c), the
 *	  bytes of one connection with TLS and the RESP codec (stream.c,
 *	  tls.c), the connection cache and latch waits (connection.c),
 *	  pipelined round trips and each connection's handshake (transport.c,
 *	  handshake.c), calls sent without waiting (owed.c), subscriber
 *	  connections (pubsub.c), and where a key lives (topology.c).
 *
 *	  Owns: sockets, TLS sessions, hiredis readers and replies, the
 *	  connection cache.  Must not: know what a lock is, read a reply's
 *	  meaning (redis/ does, through rl_reply_fits), or touch shared memory.
 *	  Calls only base/.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/net.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_NET_H
#define RL_NET_H

#include "base/base.h"
#include <sys/socket.h>

/* ----------------------------------------------------------------
 * From resolve:
 *	  Host names to addresses, waited for on the latch (resolve.c).
 * ----------------------------------------------------------------
 */
/* One address to connect to */
typedef struct RLAddr
{
	int			family;
	socklen_t	len;
	struct sockaddr_storage sa;
} RLAddr;

/* One name to resolve (rl_resolve_all), and what came of it */
typedef struct RLResolution
{
	const char *host;
	int			port;
	RLAddr	   *addrs;			/* IPv4 first, then IPv6; palloc'd */
	int			naddrs;			/* 0: not resolved, why says why */
	char	   *why;
	int64		took_ms;		/* how long its answer took (0: numeric) */
} RLResolution;

extern void rl_resolve_all(RLResolution *names, int n, TimestampTz deadline);

/* ----------------------------------------------------------------
 * From stream:
 *	  One non-blocking byte stream to one Redis server, plain TCP or TLS,
 *	  with hiredis as its RESP codec (stream.c).
 * ----------------------------------------------------------------
 */

/* How a stream operation ended */
typedef enum RLStreamStatus
{
	RL_STREAM_DONE,				/* finished */
	RL_STREAM_WAIT,				/* wait for rl_stream_events(), then call again */
	RL_STREAM_FAILED			/* *reason says why; close the stream */
} RLStreamStatus;

/* What a failure was, for the caller's message */
typedef enum RLStreamFailure
{
	RL_STREAM_FAIL_CONNECT,		/* TCP */
	RL_STREAM_FAIL_TLS,			/* handshake or certificate */
	RL_STREAM_FAIL_IO,			/* read or write after connecting */
	RL_STREAM_FAIL_EOF,			/* the server closed the connection */
	RL_STREAM_FAIL_PARSE,		/* not RESP */
	RL_STREAM_FAIL_TOO_LARGE,	/* a reply past the limits of stream.c */
	RL_STREAM_FAIL_LOCAL		/* out of file descriptors or memory here */
} RLStreamFailure;

extern RLStream *rl_stream_open(const RLEndpoint *ep,
								const RLResolution *resolved,
								RLStreamFailure *failure, char **reason);
extern bool rl_stream_next_address(RLStream *s);
extern int	rl_stream_addresses_left(const RLStream *s);
extern RLStreamStatus rl_stream_connect(RLStream *s, RLStreamFailure *failure,
										char **reason);
extern void rl_stream_close(RLStream *s);
extern pgsocket rl_stream_socket(const RLStream *s);
extern uint32 rl_stream_events(const RLStream *s);
extern bool rl_stream_is_tls(const RLStream *s);
extern bool rl_stream_in_handshake(const RLStream *s);

extern void rl_stream_append(RLStream *s, int argc, const char **argv,
							 const size_t *argvlen);
extern bool rl_stream_has_unsent(const RLStream *s);
extern RLStreamStatus rl_stream_write(RLStream *s, bool *progress,
									  RLStreamFailure *failure, char **reason);
extern RLStreamStatus rl_stream_read(RLStream *s, RLStreamFailure *failure,
									 char **reason);
extern bool rl_stream_next_reply(RLStream *s, void **reply,
								 RLStreamFailure *failure, char **reason);
extern bool rl_stream_has_unasked(RLStream *s);
extern bool rl_stream_has_partial_reply(const RLStream *s);

/* ----------------------------------------------------------------
 * From transport:
 *	  Connections to Redis servers, round trips and pub/sub (connection.c,
 *	  transport.c, handshake.c, owed.c, pubsub.c).
 * ----------------------------------------------------------------
 */
/* A Redis reply, copied out of hiredis into palloc'd memory */
struct RLReply
{
	int			type;			/* REDIS_REPLY_* */
	long long	integer;
	char	   *str;			/* string, status or error text */
	size_t		len;
	size_t		elements;
	struct RLReply **element;
};


/* Defined below (topology); a call only carries it for the layer above */

#define RL_MAX_ARGS 16

/*
 * Why a call got no reply.  Each kind has one fixed message naming the
 * server (or, for RL_FAIL_ROUTE, the key); the reason -- the operating
 * system's, hiredis' or Redis' own text -- is kept apart, for a detail.
 */
typedef enum RLFailure
{
	RL_FAIL_NONE,
	RL_FAIL_CONNECT,			/* TCP connect failed or timed out */
	RL_FAIL_TLS,				/* TLS handshake or certificate refused */
	RL_FAIL_PASSWORD,			/* AUTH: wrong user or password */
	RL_FAIL_NOAUTH,				/* the server wants AUTH we did not send */
	RL_FAIL_AUTH,				/* AUTH refused otherwise */
	RL_FAIL_SETUP,				/* SELECT or CLIENT SETNAME refused */
	RL_FAIL_SEND,				/* could not write */
	RL_FAIL_RECEIVE,			/* connection lost before the reply */
	RL_FAIL_TIMEOUT,			/* no reply in time */
	RL_FAIL_PARSE,				/* a reply that is not RESP */
	RL_FAIL_TOO_LARGE,			/* a reply past the limits (stream.c) */
	RL_FAIL_LOCAL,				/* out of memory or sockets here */
	RL_FAIL_ROUTE,				/* no node known for the key */
	RL_FAIL_UNSUPPORTED			/* the server lacks commands we need: not
								 * sent (the layer above decides) */
} RLFailure;

/*
 * One command for one connection.  Arguments are borrowed (not copied) until
 * the round trip ends.  After rl_run, exactly one of reply / error is set.
 */
struct RLCall
{
	RLConn	   *conn;
	RLTarget   *target;			/* for redirections; NULL: none */
	const char *key;			/* the key it is about, to re-route it when
								 * its node fails; NULL: not re-routed */
	size_t		keylen;
	bool		follows;		/* belongs with the call before it: a group
								 * (one call and those that follow it) is
								 * sent, redirected and sent again whole,
								 * e.g. MULTI ... EXEC, or WAIT after a
								 * script */
	bool		probe;			/* asks which of the probed commands the
								 * server knows (rl_call_probe) */
	bool		asking;			/* send ASKING first (cluster slot migration) */
	int			extra_ms;		/* the command itself waits this long (WAIT) */
	int			argc;
	const char *argv[RL_MAX_ARGS];
	size_t		argvlen[RL_MAX_ARGS];
	/* arguments past RL_MAX_ARGS (a multi-key script), palloc'd; or NULL */
	const char **more_argv;
	size_t	   *more_argvlen;
	int			more_cap;
	RLReply    *reply;
	RLFailure	failure;		/* why there is no reply; RL_FAIL_NONE: there is */
	char	   *error;			/* the failure's reason; NULL iff no failure */
	int			sqlstate;		/* ERRCODE_* of that failure */
	bool		sent;			/* some bytes reached the socket: on failure
								 * the outcome is unknown, else it is "not run" */
	bool		resent;			/* sent again on a fresh connection after
								 * bytes of a first send went out and its
								 * reply was lost: the reply is the second
								 * send's, and the first may have run too */
	bool		owed;			/* sent by rl_send, its reply not yet in */
};


extern RLConn *rl_conn_for(const RLEndpoint *ep, bool subscriber);
extern const char *rl_conn_label(RLConn *conn);
extern uint32 rl_conn_open_id(RLConn *conn);
extern void rl_use_credentials(const char *password,
							   const char *sentinel_password);
extern void rl_use_settings_credentials(void);
extern void rl_conn_close(RLConn *conn);
extern void rl_call_set(RLCall *call, RLConn *conn, int argc, const char **argv,
						const size_t *argvlen);
extern void rl_call_arg(RLCall *call, const char *arg, size_t len);
extern void rl_run(RLCall *calls, int ncalls, RLRunMode mode, int timeout_ms);
extern void rl_call_fail(RLCall *call, RLFailure failure, int sqlstate, char *reason);
extern char *rl_call_problem(const RLCall *call);
pg_noreturn extern void rl_raise_call_error(RLCall *call);
extern void rl_close_all(void);

/*
 * The rule for waits while interrupts are held (connection.c): none for a
 * reply or for the worker where the worker can take the work
 * (rl_held_work_to_worker: a backend of a preloaded server).  The entry
 * points that wait (rl_wait_owed_at, redis/'s rl_lock_ops_run_at and
 * rl_many_op_run_at) take their caller's name and keep it in rl_wait_site,
 * so that a breach names the call site.
 */
extern const char *rl_wait_site;
extern bool rl_held_work_to_worker;
extern void rl_assert_may_wait(const char *what);

/* calls sent without waiting for their replies (owed.c) */
extern MemoryContext rl_owed_context(void);
extern int	rl_owed_count(void);
extern void rl_owed_reset(void);
extern bool rl_conn_ready_to_send(RLConn *conn);
extern void rl_send(RLCall **calls, int ncalls, int timeout_ms);
extern void rl_poll_owed(void);
extern void rl_wait_owed_at(int timeout_ms, const char *site);
#define rl_wait_owed(timeout_ms) rl_wait_owed_at((timeout_ms), __func__)

/* pub/sub on a subscriber connection */
extern void rl_subscribe(RLConn **subs, int n, const char *cmd,
						 const char *channel, const char *key, int timeout_ms);
extern void rl_unsubscribe_async(RLConn **subs, int n, const char *cmd,
								 const char *channel, const char *key);
extern bool rl_wait_for_message(RLConn **subs, int n, const char *channel,
								const char *key, long timeout_ms);
extern void rl_subscribe_each(RLConn **subs, int n, const char *cmd,
							  const char **channels, const char **keys,
							  int timeout_ms);
extern void rl_unsubscribe_each_async(RLConn **subs, int n, const char *cmd,
									  const char **channels, const char **keys);
extern bool rl_wait_for_any_message(RLConn **subs, int n,
									const char **channels, const char **keys,
									long timeout_ms);
extern char *rl_subscribe_keyspace(RLConn **subs, const char **keys, int n,
								   int timeout_ms, bool *refused);
extern void rl_unsubscribe_keyspace_async(RLConn **subs, const char **keys,
										  int n);
typedef void (*RLKeyGoneCallback) (const char *key, void *arg);
extern bool rl_wait_keyspace_gone(RLConn **conns, int n, long timeout_ms,
								  RLKeyGoneCallback gone, void *arg);

extern bool rl_reply_is_error(RLReply *r, const char *prefix);
extern bool rl_reply_fits(const RLReply *r, const char *shape);

/* Calls in the group that starts at calls[i] (see RLCall.follows) */
static inline int
rl_group_len(const RLCall *calls, int ncalls, int i)
{
	int			n = 1;

	while (i + n < ncalls && calls[i + n].follows)
		n++;
	return n;
}

/*
 * What the server behind a connection offers, learnt with COMMAND INFO:
 * which of the names given to rl_probe_commands it knows, bit i for
 * names[i].  Every connection made once names are set asks in its
 * handshake (no round trip of its own); rl_call_probe asks on one that
 * never did.  A connection keeps what it learnt until its next handshake.
 */
#define RL_COMMANDS_UNKNOWN		(-1)	/* never learnt for this connection */
#define RL_COMMANDS_REFUSED		(-2)	/* COMMAND INFO got an error */
#define RL_MAX_PROBED			8

extern void rl_probe_commands(const char *const *names, int n);
extern void rl_call_probe(RLCall *call, RLConn *conn);
extern int	rl_conn_commands(RLConn *conn, const char **refusal);

/* ----------------------------------------------------------------
 * From topology:
 *	  Where a key lives: targets, their nodes and slot maps (topology.c).
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

extern int	rl_target_nodes(RLTarget *t, const char *key, size_t keylen,
							RLConn **conns, bool subscriber, char **error);
extern int	rl_target_nodes_or_raise(RLTarget *t, const char *key, size_t keylen,
									 RLConn **conns, bool subscriber);
extern void rl_target_run(RLCall *calls, int ncalls, RLRunMode mode);
extern int	rl_target_max_nodes(RLTarget *t);
extern int	rl_target_timeout(RLTarget *t);
extern bool rl_reply_goes_again(RLReply *r);

#endif							/* RL_NET_H */
