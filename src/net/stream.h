/*-------------------------------------------------------------------------
 *
 * stream.h
 *	  One non-blocking byte stream to one Redis server, plain TCP or TLS,
 *	  with hiredis as its RESP codec (stream.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/stream.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_STREAM_H
#define RL_STREAM_H

#include "resolve.h"

typedef struct RLStream RLStream;

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

#endif							/* RL_STREAM_H */
