/*-------------------------------------------------------------------------
 *
 * net_int.h
 *	  What the files of net/ share, and no other subsystem sees
 *	  (its public header is net/net.h).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/net_int.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_NET_INT_H
#define RL_NET_INT_H

#include "net/net.h"
#include "storage/latch.h"

/* ----------------------------------------------------------------
 * From transport_int:
 *	  What the files of the transport share among themselves: a connection
 *	  (struct RLConn) and the replies it owes, latch waits on sockets, and
 *	  the helpers of connection.c and owed.c the others call.  Only the
 *	  files of net/ include this (stream.c for its TLS part alone); the
 *	  rest of the extension uses net.h.
 * ----------------------------------------------------------------
 */
/* Most sockets one latch wait watches */
#define RL_WES_MAXSOCK	64

struct RLConn
{
	RLEndpoint	ep;
	char	   *secret;			/* the password it authenticates with */
	char	   *label;			/* "host:port" for messages */
	bool		subscriber;		/* used only for (S)SUBSCRIBE */
	RLStream   *stream;			/* NULL while closed */
	uint64		generation;		/* settings generation at connect */
	bool		busy;			/* replies outstanding from a cut-short run */
	bool		ever_connected;
	uint32		connects;		/* connections made so far: a subscriber's
								 * subscriptions stand while this stays */
	int			commands;		/* probed commands it knows (bit mask), or
								 * RL_COMMANDS_UNKNOWN / _REFUSED */
	char	   *commands_refusal;	/* when refused: the error, for messages */
	struct OwedReply *owed;		/* calls sent by rl_send whose replies are
								 * still to come, in send order */
	int			nowed;
	int			owedcap;
	struct RLConn *next;
};

/* A call sent by rl_send, and when its reply is overdue */
typedef struct OwedReply
{
	RLCall	   *call;
	TimestampTz deadline;
	int			timeout_ms;		/* what the deadline allowed, for messages */
} OwedReply;

/* The sockets of one latch wait, and what came of it */
typedef struct SockWait
{
	int			nsock;
	pgsocket	fds[RL_WES_MAXSOCK];
	uint32		events[RL_WES_MAXSOCK];
	int			owner[RL_WES_MAXSOCK];	/* the caller's index of each socket */
	int			nready;
	int			ready[RL_WES_MAXSOCK];	/* owners of the ready sockets */
	uint32		ready_ev[RL_WES_MAXSOCK];
} SockWait;

/* connection.c: the cache of connections and the replies they owe */
extern RLConn *rl_conn_list;
extern int	rl_total_owed;

extern void rl_wes_invalidate(void);
extern void rl_sock_add(SockWait *sw, pgsocket fd, uint32 events, int owner);
extern int	rl_wait_sockets(SockWait *sw, long timeout_ms, RLWaitKind kind);
extern bool rl_next_reply(RLConn *conn, RLReply **out, RLFailure *failure,
						  char **errmsg);
extern bool rl_has_unasked_bytes(RLConn *conn);
extern RLFailure rl_stream_failure(RLStreamFailure f);
extern void rl_stream_append_call(RLStream *stream, RLCall *call);
extern bool rl_has_unsent(const RLConn *conn);
extern void rl_owed_answer(RLConn *conn, RLReply *r);
extern void rl_owed_fail_all(RLConn *conn, RLFailure failure, int errcode,
							 const char *reason);

/* owed.c: reading the replies a connection owes */
extern bool rl_owed_drain(RLConn *conn, RLFailure *failure, char **reason);
extern void rl_poll_conn(RLConn *conn, TimestampTz now);
extern void rl_finish_owed(RLConn *conn, bool every);

/* handshake.c: what a new connection sends first, and what it learns */
extern int	rl_handshake_queue(RLConn *conn, bool run_asks, bool *probing);
extern bool rl_handshake_refused(RLReply *r, RLFailure *failure, int *errcode);
extern void rl_note_commands(RLConn *conn, RLReply *r);

/*
 * tls.c: the TLS context and the start of a session, for stream.c (which
 * reads and writes through it).  OpenSSL's SSL is struct ssl_st.
 */
struct ssl_st;
extern char *rl_tls_start(struct ssl_st **ssl, pgsocket sock,
						  const RLEndpoint *ep);
extern char *rl_tls_reason(struct ssl_st *ssl, const char *what);
extern bool rl_tls_alert_received(void);

#endif							/* RL_NET_INT_H */
