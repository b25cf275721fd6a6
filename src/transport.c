/*-------------------------------------------------------------------------
 *
 * transport.c
 *	  Owns connections to Redis servers (each over a stream, stream.c),
 *	  their handshake (AUTH, SELECT, CLIENT SETNAME), pipelined round trips
 *	  over one or many sockets at once, calls sent without waiting whose
 *	  replies are owed on their connection (rl_send), and pub/sub
 *	  subscriber connections.
 *
 *	  Every wait goes through a WaitEventSet on the process latch plus the
 *	  sockets, so query cancel, statement_timeout, backend termination and
 *	  postmaster death end it; every wait has a deadline.  hiredis replies
 *	  are copied into palloc'd RLReply trees before anything can throw, so
 *	  nothing malloc'd by hiredis or OpenSSL outlives an ERROR except the
 *	  cached connections' streams, which only rl_conn_close() frees.
 *
 *	  This file knows nothing about locks, scripts or topologies, nor about
 *	  sockets or TLS (stream.c does).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/transport.c
 *
 *-------------------------------------------------------------------------
 */
#include "transport.h"

#include <errno.h>
#include <limits.h>
#include <sys/socket.h>

#include <hiredis/hiredis.h>

#include "miscadmin.h"
#include "pgstat.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/memutils.h"

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

static RLConn *conn_list = NULL;

/* Owed replies on every connection, and the context they are copied into */
static int	total_owed = 0;
static MemoryContext owed_cxt = NULL;

static void owed_fail_all(RLConn *conn, RLFailure failure, int errcode,
						  const char *reason);
static bool owed_drain(RLConn *conn);
static void poll_conn(RLConn *conn, TimestampTz now);
static void finish_owed_reply(RLConn *conn);

/* Commands every handshake asks about (rl_probe_commands); 0: none */
static const char *const *probe_names = NULL;
static int	probe_n = 0;

/* Credentials that replace the settings' (the watchdog worker's per target) */
static bool credentials_set = false;
static const char *cred_password = NULL;
static const char *cred_sentinel_password = NULL;

/* Per-run state of one connection */
typedef struct RunConn
{
	RLConn	   *conn;
	RLCall	  **sinks;			/* calls awaiting a reply, in send order */
	int			nsinks;
	int			sinkcap;
	int			next;			/* next sink to receive a reply */
	int			handshake;		/* handshake replies still expected */
	bool		connecting;		/* TCP connect not finished */
	bool		reused;			/* connection was open before this run */
	bool		wrote;			/* some bytes were written this run */
	bool		asked;			/* the next call's ASKING reply was consumed */
	bool		probing;		/* the handshake's last command is the probe */
	bool		owed_retried;	/* sent again once: owed replies were overdue */
	bool		failed;
	RLFailure	failure;
	char	   *reason;			/* detail of the failure */
	int			errcode;
	TimestampTz connect_deadline;	/* of the address being tried */
	TimestampTz connect_end;	/* of the whole connect: connect_timeout */
	TimestampTz deadline;		/* for the replies; starts once connected */
	int			timeout_ms;
} RunConn;

/* ----------------------------------------------------------------
 * Wait sets.  Creating one costs an epoll instance and a few syscalls, so
 * the last few are kept, keyed by the sockets they watch; any connect or
 * close invalidates them (a reused fd number is a different socket).
 * ----------------------------------------------------------------
 */
#define RL_WES_CACHE	2
#define RL_WES_MAXSOCK	64

typedef struct CachedWes
{
	WaitEventSet *set;
	int			nsock;
	pgsocket	fds[RL_WES_MAXSOCK];
	uint32		events[RL_WES_MAXSOCK];
	uint64		used;
} CachedWes;

static CachedWes wes_cache[RL_WES_CACHE];
static uint64 wes_clock = 0;

static void
wes_invalidate(void)
{
	int			i;

	for (i = 0; i < RL_WES_CACHE; i++)
	{
		if (wes_cache[i].set != NULL)
			FreeWaitEventSet(wes_cache[i].set);
		wes_cache[i].set = NULL;
		wes_cache[i].nsock = 0;
	}
}

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

static void
sock_add(SockWait *sw, pgsocket fd, uint32 events, int owner)
{
	if (sw->nsock >= RL_WES_MAXSOCK)
		elog(ERROR, "too many sockets to wait on");	/* rl_run batches */
	sw->fds[sw->nsock] = fd;
	sw->events[sw->nsock] = events;
	sw->owner[sw->nsock++] = owner;
}

/*
 * Wait until one of the sockets is ready for what it asks, the latch is set
 * or the timeout passes; pg_stat_activity shows the wait event of kind.
 * Fills sw->ready / sw->ready_ev and returns sw->nready; -1 when the
 * postmaster died while we are already exiting.  The latch is reset and
 * interrupts are checked here (no-op while they are held).
 */
static int
wait_sockets(SockWait *sw, long timeout_ms, RLWaitKind kind)
{
	CachedWes  *cw = NULL;
	WaitEvent	occurred[RL_WES_MAXSOCK + 2];
	int			nsock = sw->nsock;
	const pgsocket *fds = sw->fds;
	const uint32 *events = sw->events;
	int			i;
	int			n;

	for (i = 0; i < RL_WES_CACHE && cw == NULL; i++)
	{
		CachedWes  *c = &wes_cache[i];

		if (c->set != NULL && c->nsock == nsock &&
			memcmp(c->fds, fds, nsock * sizeof(pgsocket)) == 0)
			cw = c;
	}
	if (cw == NULL)
	{
		/* evict the least recently used */
		cw = &wes_cache[0];
		for (i = 1; i < RL_WES_CACHE; i++)
			if (wes_cache[i].used < cw->used)
				cw = &wes_cache[i];
		if (cw->set != NULL)
			FreeWaitEventSet(cw->set);
		cw->set = NULL;
#if PG_VERSION_NUM >= 170000
		cw->set = CreateWaitEventSet(NULL, nsock + 2);
#else
		cw->set = CreateWaitEventSet(TopMemoryContext, nsock + 2);
#endif
		AddWaitEventToSet(cw->set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
		AddWaitEventToSet(cw->set, WL_POSTMASTER_DEATH, PGINVALID_SOCKET, NULL, NULL);
		for (i = 0; i < nsock; i++)
		{
			AddWaitEventToSet(cw->set, events[i], fds[i], NULL, NULL);
			cw->fds[i] = fds[i];
			cw->events[i] = events[i];
		}
		cw->nsock = nsock;
	}
	else
	{
		for (i = 0; i < nsock; i++)
		{
			if (cw->events[i] != events[i])
			{
				ModifyWaitEvent(cw->set, i + 2, events[i], NULL);
				cw->events[i] = events[i];
			}
		}
	}
	cw->used = ++wes_clock;

	/*
	 * An interrupt that came while they were held had its latch wake-up
	 * consumed then: look at the flags now, not only when the latch is set.
	 */
	CHECK_FOR_INTERRUPTS();
	sw->nready = 0;
	n = WaitEventSetWait(cw->set, timeout_ms, occurred, lengthof(occurred),
						 rl_wait_event(kind));
	for (i = 0; i < n; i++)
	{
		if (occurred[i].events & WL_LATCH_SET)
		{
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
		else if (occurred[i].events & WL_POSTMASTER_DEATH)
		{
			if (!proc_exit_inprogress)
				proc_exit(1);
			/* already exiting: report the sockets as failed */
			return -1;
		}
		else if (occurred[i].pos >= 2)
		{
			sw->ready[sw->nready] = sw->owner[occurred[i].pos - 2];
			sw->ready_ev[sw->nready] = occurred[i].events;
			sw->nready++;
		}
	}
	return sw->nready;
}

/* ----------------------------------------------------------------
 * Replies
 * ----------------------------------------------------------------
 */

static RLReply *
copy_reply(redisReply *r)
{
	RLReply    *out = palloc0(sizeof(RLReply));

	out->type = r->type;
	out->integer = r->integer;
	if (r->str != NULL)
	{
		out->str = palloc(r->len + 1);
		memcpy(out->str, r->str, r->len);
		out->str[r->len] = '\0';
		out->len = r->len;
	}
	if (r->type == REDIS_REPLY_ARRAY && r->elements > 0)
	{
		size_t		i;

		out->elements = r->elements;
		out->element = palloc(sizeof(RLReply *) * r->elements);
		for (i = 0; i < r->elements; i++)
			out->element[i] = copy_reply(r->element[i]);
	}
	return out;
}

/* Take the next complete reply out of hiredis' buffer as a palloc'd copy */
static bool
next_reply(RLConn *conn, RLReply **out, char **errmsg)
{
	void	   *raw = NULL;

	*out = NULL;
	if (!rl_stream_next_reply(conn->stream, &raw, errmsg))
		return false;
	if (raw == NULL)
		return true;
	PG_TRY();
	{
		*out = copy_reply((redisReply *) raw);
	}
	PG_FINALLY();
	{
		freeReplyObject(raw);
	}
	PG_END_TRY();
	return true;
}

/* Is r an error reply, starting with prefix if one is given? */
bool
rl_reply_is_error(RLReply *r, const char *prefix)
{
	return r != NULL && r->type == REDIS_REPLY_ERROR &&
		(prefix == NULL || strncmp(r->str, prefix, strlen(prefix)) == 0);
}

/* ----------------------------------------------------------------
 * Connections
 * ----------------------------------------------------------------
 */
/*
 * Authenticate the connections asked for from now on with these passwords
 * instead of redis_lock.password / sentinel_password (NULL: no password);
 * rl_use_settings_credentials() goes back to the settings.  The watchdog
 * worker renews locks for backends that may have set other passwords.
 */
void
rl_use_credentials(const char *password, const char *sentinel_password)
{
	credentials_set = true;
	cred_password = password;
	cred_sentinel_password = sentinel_password;
}

/* Go back to the passwords of the settings (see rl_use_credentials) */
void
rl_use_settings_credentials(void)
{
	credentials_set = false;
}

/* The password a connection to ep uses now; "" for none */
static const char *
password_for(const RLEndpoint *ep)
{
	const char *pw;

	if (credentials_set)
		pw = ep->sentinel ? cred_sentinel_password : cred_password;
	else
		pw = ep->sentinel ? rl_sentinel_password : rl_password;
	return pw ? pw : "";
}

static bool
same_endpoint(const RLConn *c, const RLEndpoint *ep, bool subscriber)
{
	return c->subscriber == subscriber && c->ep.port == ep->port &&
		c->ep.tls == ep->tls &&
		c->ep.db == ep->db && c->ep.sentinel == ep->sentinel &&
		strcmp(c->ep.host, ep->host) == 0 &&
		strcmp(c->ep.user, ep->user) == 0;
}

/*
 * The cached connection to ep with the current password, created (closed)
 * if there is none.  One made under settings that changed since is closed
 * here: it will not be asked for again.
 */
RLConn *
rl_conn_for(const RLEndpoint *ep, bool subscriber)
{
	RLConn	   *c;
	MemoryContext old;
	const char *secret = password_for(ep);

	for (c = conn_list; c != NULL; c = c->next)
	{
		if (!same_endpoint(c, ep, subscriber))
			continue;
		if (strcmp(c->secret, secret) == 0)
			return c;
		if (c->stream != NULL && c->generation != rl_settings_generation)
			rl_conn_close(c);
	}
	old = MemoryContextSwitchTo(TopMemoryContext);
	c = palloc0(sizeof(RLConn));
	c->ep = *ep;
	c->secret = pstrdup(secret);
	c->label = rl_endpoint_label(ep);
	c->subscriber = subscriber;
	c->commands = RL_COMMANDS_UNKNOWN;
	c->next = conn_list;
	conn_list = c;
	MemoryContextSwitchTo(old);
	return c;
}

/* "host:port" of the connection, for messages */
const char *
rl_conn_label(RLConn *conn)
{
	return conn->label;
}

/*
 * The only place a connection is closed.  The close is abortive (see
 * rl_stream_close): a command we gave up on (timed out, say, under packet
 * loss) must not reach Redis seconds later and re-create a lock after its
 * doubt was settled.
 */
void
rl_conn_close(RLConn *conn)
{
	/* what it owes will never come: nobody knows whether those ran */
	if (conn->nowed > 0)
		owed_fail_all(conn, RL_FAIL_RECEIVE, ERRCODE_CONNECTION_FAILURE,
					  "the connection was closed before the reply came");
	if (conn->stream != NULL)
	{
		rl_stream_close(conn->stream);
		conn->stream = NULL;
		wes_invalidate();
	}
	conn->busy = false;
	/* the next connection may reach another server: it asks again */
	conn->commands = RL_COMMANDS_UNKNOWN;
	if (conn->commands_refusal != NULL)
	{
		pfree(conn->commands_refusal);
		conn->commands_refusal = NULL;
	}
}

/* Close every cached connection, command and subscriber (at backend exit) */
void
rl_close_all(void)
{
	RLConn	   *c;

	for (c = conn_list; c != NULL; c = c->next)
		rl_conn_close(c);
}

/*
 * Has an idle connection bytes (or an EOF) that no command asked for?  On a
 * command connection its replies and our commands are then out of step: a
 * reply read next would be taken for the answer to the next command.  With
 * TLS the waiting records are read first (rl_stream_has_unasked): a TLS 1.3
 * session ticket or KeyUpdate is not data.  The one rule for an idle socket,
 * before reuse and while other runs of a batch go on.
 */
static bool
has_unasked_bytes(RLConn *conn)
{
	return rl_stream_has_unasked(conn->stream);
}

static void
run_fail(RunConn *rc, RLFailure failure, int errcode, char *reason)
{
	if (rc->failed)
		return;
	rc->failed = true;
	rc->failure = failure;
	rc->errcode = errcode;
	rc->reason = reason;
	/* replies owed from before the run are lost with it */
	if (rc->conn->nowed > 0)
		owed_fail_all(rc->conn, failure, errcode, reason);
	/* its state is unknown: never reuse it */
	rl_conn_close(rc->conn);
}

/* What a stream failure is, as a call failure */
static RLFailure
stream_failure(RLStreamFailure f)
{
	switch (f)
	{
		case RL_STREAM_FAIL_CONNECT:
			return RL_FAIL_CONNECT;
		case RL_STREAM_FAIL_TLS:
			return RL_FAIL_TLS;
		case RL_STREAM_FAIL_IO:
		case RL_STREAM_FAIL_EOF:
			return RL_FAIL_RECEIVE;
		case RL_STREAM_FAIL_PARSE:
			return RL_FAIL_PARSE;
		case RL_STREAM_FAIL_LOCAL:
			break;
	}
	return RL_FAIL_LOCAL;
}

static void
append_argv(RunConn *rc, int argc, const char **argv, const size_t *argvlen)
{
	if (rc->failed)
		return;
	rl_stream_append(rc->conn->stream, argc, argv, argvlen);
}

/*
 * Queue one call's command on a stream: its inline arguments, then those
 * past RL_MAX_ARGS (a multi-key script) in the same command.
 */
static void
stream_append_call(RLStream *stream, RLCall *call)
{
	const char **argv;
	size_t	   *argvlen;
	int			n = call->argc - RL_MAX_ARGS;

	if (n <= 0 || call->more_argv == NULL)
	{
		rl_stream_append(stream, call->argc, call->argv, call->argvlen);
		return;
	}
	argv = palloc(sizeof(char *) * call->argc);
	argvlen = palloc(sizeof(size_t) * call->argc);
	memcpy(argv, call->argv, sizeof(char *) * RL_MAX_ARGS);
	memcpy(argvlen, call->argvlen, sizeof(size_t) * RL_MAX_ARGS);
	memcpy(argv + RL_MAX_ARGS, call->more_argv, sizeof(char *) * n);
	memcpy(argvlen + RL_MAX_ARGS, call->more_argvlen, sizeof(size_t) * n);
	rl_stream_append(stream, call->argc, argv, argvlen);
	pfree(argv);
	pfree(argvlen);
}

static void
append_call(RunConn *rc, RLCall *call)
{
	if (rc->failed)
		return;
	stream_append_call(rc->conn->stream, call);
}

/*
 * When the connect to the address being tried gives up: each address left
 * gets an equal share of what remains of connect_timeout (libpq and
 * redis-py move on to the next address after a timeout too).
 */
static TimestampTz
address_deadline(RunConn *rc, TimestampTz now)
{
	int			tries = 1 + rl_stream_addresses_left(rc->conn->stream);

	if (now >= rc->connect_end)
		return rc->connect_end;
	return now + (rc->connect_end - now) / tries;
}

/*
 * Start a non-blocking connect and queue the handshake in front of whatever
 * the caller sends: the whole handshake costs no extra round trip.
 */
static void
start_connect(RunConn *rc, TimestampTz now)
{
	RLConn	   *conn = rc->conn;
	const char *argv[4];
	size_t		argvlen[4];
	char		buf[64];
	const char *password;
	RLStreamFailure failure;
	char	   *reason;

	rc->connect_end = TimestampTzPlusMilliseconds(now, rl_connect_timeout_ms);
	conn->stream = rl_stream_open(&conn->ep, rc->connect_end, &failure, &reason);
	if (conn->stream == NULL)
	{
		rc->failed = true;
		rc->failure = stream_failure(failure);
		rc->errcode = ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION;
		rc->reason = reason;
		return;
	}
	wes_invalidate();
	if (conn->ever_connected)
	{
		rl_stats_add(RL_STAT_RECONNECTS, 1);
	}
	conn->ever_connected = true;
	conn->generation = rl_settings_generation;
	rc->connecting = true;
	rc->connect_deadline = address_deadline(rc, GetCurrentTimestamp());
	rc->handshake = 0;

	password = conn->secret;
	if (password[0] != '\0' || conn->ep.user[0] != '\0')
	{
		int			argc = 0;

		argv[argc] = "AUTH";
		argvlen[argc++] = 4;
		if (conn->ep.user[0] != '\0')
		{
			argv[argc] = conn->ep.user;
			argvlen[argc++] = strlen(conn->ep.user);
		}
		argv[argc] = password;
		argvlen[argc++] = strlen(password);
		append_argv(rc, argc, argv, argvlen);
		rc->handshake++;
	}
	if (conn->ep.db != 0 && !conn->subscriber && !conn->ep.sentinel)
	{
		snprintf(buf, sizeof(buf), "%d", conn->ep.db);
		argv[0] = "SELECT";
		argvlen[0] = 6;
		argv[1] = buf;
		argvlen[1] = strlen(buf);
		append_argv(rc, 2, argv, argvlen);
		rc->handshake++;
	}
	snprintf(buf, sizeof(buf), "redis_lock:%d%s%s", MyProcPid,
			 MyBackendType == B_BG_WORKER ? ":worker" : "",
			 conn->subscriber ? ":sub" : "");
	argv[0] = "CLIENT";
	argvlen[0] = 6;
	argv[1] = "SETNAME";
	argvlen[1] = 7;
	argv[2] = buf;
	argvlen[2] = strlen(buf);
	append_argv(rc, 3, argv, argvlen);
	rc->handshake++;

	/*
	 * What the server offers, asked last (its reply is told apart by that),
	 * unless the run itself starts with that question
	 */
	rc->probing = false;
	if (probe_n > 0 && !conn->subscriber && !conn->ep.sentinel &&
		!(rc->nsinks > 0 && rc->sinks[0]->probe))
	{
		const char *pargv[2 + RL_MAX_PROBED];
		size_t		pargvlen[2 + RL_MAX_PROBED];
		int			i;

		pargv[0] = "COMMAND";
		pargv[1] = "INFO";
		for (i = 0; i < probe_n; i++)
			pargv[2 + i] = probe_names[i];
		for (i = 0; i < 2 + probe_n; i++)
			pargvlen[i] = strlen(pargv[i]);
		append_argv(rc, 2 + probe_n, pargv, pargvlen);
		rc->handshake++;
		rc->probing = true;
	}
}

/*
 * Remember what a COMMAND INFO probe answered about the server behind conn:
 * an array with one entry per name, nil for a command it does not know.
 */
static void
note_commands(RLConn *conn, RLReply *r)
{
	const char *refusal = NULL;
	int			known = 0;

	if (conn->commands_refusal != NULL)
	{
		pfree(conn->commands_refusal);
		conn->commands_refusal = NULL;
	}
	if (r->type == REDIS_REPLY_ERROR)
		refusal = r->str;
	else if (r->type != REDIS_REPLY_ARRAY || r->elements != (size_t) probe_n)
		refusal = "unexpected reply to COMMAND INFO";
	else
	{
		int			i;

		for (i = 0; i < probe_n; i++)
			if (r->element[i]->type == REDIS_REPLY_ARRAY &&
				r->element[i]->elements > 0)
				known |= 1 << i;
	}
	if (refusal != NULL)
	{
		conn->commands = RL_COMMANDS_REFUSED;
		conn->commands_refusal = MemoryContextStrdup(TopMemoryContext, refusal);
	}
	else
		conn->commands = known;
}

/*
 * From now on, ask every new connection in its handshake which of these
 * commands its server knows (names must live for good; n = 0: stop asking).
 */
void
rl_probe_commands(const char *const *names, int n)
{
	Assert(n <= RL_MAX_PROBED);
	probe_names = names;
	probe_n = n;
}

/* Make call the probe question (COMMAND INFO of the probed names) for conn */
void
rl_call_probe(RLCall *call, RLConn *conn)
{
	int			i;

	Assert(probe_n > 0);
	rl_call_set(call, conn, 0, NULL, NULL);
	rl_call_arg(call, "COMMAND", 7);
	rl_call_arg(call, "INFO", 4);
	for (i = 0; i < probe_n; i++)
		rl_call_arg(call, probe_names[i], strlen(probe_names[i]));
	call->probe = true;
}

/*
 * Which probed commands the server behind conn knows (bit i: names[i]), or
 * RL_COMMANDS_UNKNOWN, or RL_COMMANDS_REFUSED with *refusal set to why.
 * What a connection learnt holds while it lives: one that the next round
 * trip would not reuse (broken meanwhile -- the server restarted, maybe as
 * another version --, left mid-reply, or made under old settings) is
 * closed here, and knows nothing.
 */
int
rl_conn_commands(RLConn *conn, const char **refusal)
{
	if (conn->stream != NULL && !conn->subscriber && conn->nowed > 0)
		poll_conn(conn, GetCurrentTimestamp());
	if (conn->stream != NULL && !conn->subscriber &&
		(conn->busy || conn->generation != rl_settings_generation ||
		 rl_stream_has_unsent(conn->stream) ||
		 (conn->nowed == 0 && has_unasked_bytes(conn))))
		rl_conn_close(conn);
	if (refusal != NULL)
		*refusal = conn->commands_refusal;
	return conn->commands;
}

/* Check one handshake reply; the error never shows the password */
static void
check_handshake(RunConn *rc, RLReply *r)
{
	if (r->type != REDIS_REPLY_ERROR)
		return;
	if (strncmp(r->str, "WRONGPASS", 9) == 0 ||
		strstr(r->str, "invalid password") != NULL ||
		strstr(r->str, "invalid username-password") != NULL)
		run_fail(rc, RL_FAIL_PASSWORD, ERRCODE_INVALID_PASSWORD, pstrdup(r->str));
	else if (strncmp(r->str, "NOAUTH", 6) == 0)
		run_fail(rc, RL_FAIL_NOAUTH, ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
				 pstrdup(r->str));
	else if (strstr(r->str, "AUTH") != NULL)
		run_fail(rc, RL_FAIL_AUTH, ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
				 pstrdup(r->str));
	else
		run_fail(rc, RL_FAIL_SETUP, ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
				 pstrdup(r->str));
}

/* A NOAUTH reply to a normal command also means our credentials are off */
static bool
is_auth_reply(RLReply *r)
{
	return r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOAUTH", 6) == 0;
}

/* Is this pub/sub push the confirmation a call waits for? */
static bool
push_matches(RLCall *call, RLReply *r)
{
	const char *cmd = call->argv[0];
	const char *kind;

	if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
		r->element[0]->type != REDIS_REPLY_STRING ||
		r->element[1]->type != REDIS_REPLY_STRING)
		return false;
	kind = r->element[0]->str;
	if (pg_strcasecmp(kind, cmd) != 0)
		return false;
	return r->element[1]->len == call->argvlen[1] &&
		memcmp(r->element[1]->str, call->argv[1], call->argvlen[1]) == 0;
}

/* Hand out every complete reply sitting in hiredis' buffer */
static void
drain_replies(RunConn *rc)
{
	while (!rc->failed && (rc->handshake > 0 || rc->next < rc->nsinks))
	{
		RLReply    *r;
		char	   *err;

		/* replies owed to earlier sends come first: Redis answers in order */
		if (rc->conn->nowed > 0)
		{
			if (!owed_drain(rc->conn))
			{
				run_fail(rc, RL_FAIL_PARSE, ERRCODE_PROTOCOL_VIOLATION,
						 pstrdup("a reply owed to an earlier command could not be parsed"));
				return;
			}
			if (rc->conn->nowed > 0)
				return;			/* our own replies come after them */
		}
		if (!next_reply(rc->conn, &r, &err))
		{
			run_fail(rc, RL_FAIL_PARSE, ERRCODE_PROTOCOL_VIOLATION, err);
			return;
		}
		if (r == NULL)
			return;
		if (rc->handshake > 0)
		{
			rc->handshake--;
			/* the probe comes last; a refusal of it is only noted */
			if (rc->handshake == 0 && rc->probing)
				note_commands(rc->conn, r);
			else
				check_handshake(rc, r);
			continue;
		}
		else
		{
			RLCall	   *call = rc->sinks[rc->next];

			if (call->asking && !rc->asked)
			{
				/* the reply to ASKING that precedes this call */
				rc->asked = true;
				continue;
			}
			rc->asked = false;
			if (rc->conn->subscriber)
			{
				/* skip stale messages until the awaited confirmation */
				if (!push_matches(call, r))
				{
					if (r->type == REDIS_REPLY_ERROR)
					{
						call->reply = r;
						rc->next++;
					}
					continue;
				}
			}
			else if (is_auth_reply(r))
			{
				run_fail(rc, RL_FAIL_NOAUTH, ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
						 pstrdup(r->str));
				return;
			}
			if (call->probe)
				note_commands(rc->conn, r);
			call->reply = r;
			rc->next++;
		}
	}
}

static bool
has_unsent(const RLConn *conn)
{
	return rl_stream_has_unsent(conn->stream);
}

/*
 * Write what the socket takes now; remembers that something went out.  A
 * failure fails the run (the caller may retry it on a fresh connection).
 */
static bool
flush_some(RunConn *rc)
{
	bool		progress;
	RLStreamFailure failure;
	char	   *reason;

	if (rl_stream_write(rc->conn->stream, &progress, &failure, &reason) == RL_STREAM_FAILED)
	{
		run_fail(rc, RL_FAIL_SEND, ERRCODE_CONNECTION_FAILURE, reason);
		return false;
	}
	if (progress)
		rc->wrote = true;
	return true;
}

/* The socket moved while connecting: TCP, then the TLS handshake */
static void
finish_connect(RunConn *rc)
{
	RLStreamFailure failure;
	char	   *reason;

	switch (rl_stream_connect(rc->conn->stream, &failure, &reason))
	{
		case RL_STREAM_WAIT:
			return;
		case RL_STREAM_FAILED:
			run_fail(rc, stream_failure(failure),
					 ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION, reason);
			return;
		case RL_STREAM_DONE:
			break;
	}
	rc->connecting = false;
	rc->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), rc->timeout_ms);
}

static bool
run_done(RunConn *rc)
{
	return rc->failed ||
		(!rc->connecting && rc->handshake == 0 && rc->next >= rc->nsinks);
}

/* ----------------------------------------------------------------
 * Failures: one fixed message per kind, the reason apart.  Each message
 * is a literal at its errmsg or _() so that gettext finds it; the two
 * switches below must say the same.
 * ----------------------------------------------------------------
 */

/* What a failure names: the server, or for RL_FAIL_ROUTE the key */
static const char *
failure_subject(const RLCall *call)
{
	if (call->failure == RL_FAIL_ROUTE)
		return call->key ? call->key : "";
	return call->conn ? call->conn->label : "";
}

/* The primary message of call's failure, translated, for a detail line */
static char *
failure_text(const RLCall *call)
{
	const char *s = failure_subject(call);

	switch (call->failure)
	{
		case RL_FAIL_NONE:
			break;
		case RL_FAIL_CONNECT:
			return psprintf(_("could not connect to Redis at %s"), s);
		case RL_FAIL_TLS:
			return psprintf(_("could not establish a TLS connection to Redis at %s"), s);
		case RL_FAIL_PASSWORD:
			return psprintf(_("password authentication failed for Redis at %s"), s);
		case RL_FAIL_NOAUTH:
			return psprintf(_("Redis at %s requires authentication"), s);
		case RL_FAIL_AUTH:
			return psprintf(_("Redis at %s refused authentication"), s);
		case RL_FAIL_SETUP:
			return psprintf(_("Redis at %s refused the connection setup"), s);
		case RL_FAIL_SEND:
			return psprintf(_("could not send to Redis at %s"), s);
		case RL_FAIL_RECEIVE:
			return psprintf(_("lost connection to Redis at %s"), s);
		case RL_FAIL_TIMEOUT:
			return psprintf(_("Redis at %s did not reply in time"), s);
		case RL_FAIL_PARSE:
			return psprintf(_("could not parse a reply from Redis at %s"), s);
		case RL_FAIL_LOCAL:
			return psprintf(_("could not talk to Redis at %s"), s);
		case RL_FAIL_ROUTE:
			return psprintf(_("could not find the Redis node for key \"%s\""), s);
		case RL_FAIL_UNSUPPORTED:
			return psprintf(_("Redis at %s does not offer the commands of locks without Lua scripts"), s);
	}
	elog(ERROR, "unexpected Redis call failure kind %d", (int) call->failure);
	pg_unreachable();
}

/* errmsg and errhint (if any) of call's failure, inside an ereport */
static int
failure_message_and_hint(const RLCall *call)
{
	const char *s = failure_subject(call);

	switch (call->failure)
	{
		case RL_FAIL_NONE:
			break;
		case RL_FAIL_CONNECT:
			errhint("Check redis_lock.url and that Redis is running.");
			return errmsg("could not connect to Redis at %s", s);
		case RL_FAIL_TLS:
			errhint("Check redis_lock.tls_ca_file, redis_lock.tls_cert_file, redis_lock.tls_verify and that the port speaks TLS.");
			return errmsg("could not establish a TLS connection to Redis at %s", s);
		case RL_FAIL_PASSWORD:
			errhint("Check redis_lock.password and the user in redis_lock.url.");
			return errmsg("password authentication failed for Redis at %s", s);
		case RL_FAIL_NOAUTH:
			errhint("Check redis_lock.password and the user in redis_lock.url.");
			return errmsg("Redis at %s requires authentication", s);
		case RL_FAIL_AUTH:
			errhint("Check redis_lock.password and the user in redis_lock.url.");
			return errmsg("Redis at %s refused authentication", s);
		case RL_FAIL_SETUP:
			errhint("Check the database number in redis_lock.url.");
			return errmsg("Redis at %s refused the connection setup", s);
		case RL_FAIL_SEND:
			errhint("Check that Redis is running.");
			return errmsg("could not send to Redis at %s", s);
		case RL_FAIL_RECEIVE:
			errhint("Check that Redis is running.");
			return errmsg("lost connection to Redis at %s", s);
		case RL_FAIL_TIMEOUT:
			errhint("Check redis_lock.command_timeout and that Redis is running.");
			return errmsg("Redis at %s did not reply in time", s);
		case RL_FAIL_PARSE:
			return errmsg("could not parse a reply from Redis at %s", s);
		case RL_FAIL_LOCAL:
			return errmsg("could not talk to Redis at %s", s);
		case RL_FAIL_ROUTE:
			errhint("Check redis_lock.url, redis_lock.sentinels and redis_lock.sentinel_master, or redis_lock.cluster.");
			return errmsg("could not find the Redis node for key \"%s\"", s);
		case RL_FAIL_UNSUPPORTED:
			errhint("Use Valkey 9.0 or Redis 8.4 or later there, or set redis_lock.scripting = on.");
			return errmsg("Redis at %s does not offer the commands of locks without Lua scripts", s);
	}
	elog(ERROR, "unexpected Redis call failure kind %d", (int) call->failure);
	pg_unreachable();
}

/* Record that call got no reply, and why */
void
rl_call_fail(RLCall *call, RLFailure failure, int sqlstate, char *reason)
{
	Assert(failure != RL_FAIL_NONE && reason != NULL);
	call->reply = NULL;
	call->failure = failure;
	call->sqlstate = sqlstate;
	call->error = reason;
}

/*
 * One line saying what went wrong with call, for a detail or a LOG: its
 * failure and reason, Redis' error reply, or an unexpected reply.
 */
char *
rl_call_problem(const RLCall *call)
{
	if (call->error != NULL)
		return psprintf("%s: %s", failure_text(call), call->error);
	if (call->reply == NULL)
		return psprintf(_("no reply from Redis at %s"), failure_subject(call));
	if (call->reply->type == REDIS_REPLY_ERROR)
		return psprintf(_("Redis at %s replied: %s"), failure_subject(call), call->reply->str);
	return psprintf(_("unexpected reply from Redis at %s (type %d)"),
					failure_subject(call), call->reply->type);
}

/*
 * errcontext naming the command of a failed call as sent (its first
 * argument, e.g. EVALSHA: what the layers above call it is theirs to say),
 * its key and its server, as far as the call has them.  None for a call
 * without a command (a key no node is known for: the message names it).
 */
static int
raw_call_context(const RLCall *call)
{
	int			cmdlen;
	const char *cmd;

	if (call->argc == 0)
		return 0;
	cmd = call->argv[0];
	cmdlen = (int) call->argvlen[0];
	if (call->key != NULL && call->conn != NULL)
		return errcontext("Redis command %.*s on key \"%.*s\" at %s",
						  cmdlen, cmd, (int) call->keylen, call->key,
						  call->conn->label);
	if (call->key != NULL)
		return errcontext("Redis command %.*s on key \"%.*s\"",
						  cmdlen, cmd, (int) call->keylen, call->key);
	if (call->conn != NULL)
		return errcontext("Redis command %.*s at %s",
						  cmdlen, cmd, call->conn->label);
	return errcontext("Redis command %.*s", cmdlen, cmd);
}

/*
 * Raise the failure of a call that got no reply as the ERROR a caller sees,
 * with a context naming the command, its key and its server.
 */
void
rl_raise_call_error(RLCall *call)
{
	Assert(call->error != NULL);
	ereport(ERROR,
			(errcode(call->sqlstate ? call->sqlstate : ERRCODE_CONNECTION_FAILURE),
			 failure_message_and_hint(call),
			 errdetail_internal("%s", call->error),
			 raw_call_context(call)));
	pg_unreachable();
}

/* (Re)connect rc's connection if needed and queue all its calls */
static void
queue_run(RunConn *rc, TimestampTz now)
{
	RLConn	   *conn = rc->conn;
	int			i;

	rc->next = 0;
	rc->handshake = 0;
	rc->connecting = false;
	rc->failed = false;
	rc->asked = false;
	rc->probing = false;
	rc->reused = conn->stream != NULL;
	rc->deadline = TimestampTzPlusMilliseconds(now, rc->timeout_ms);
	if (conn->stream == NULL)
		start_connect(rc, now);
	for (i = 0; i < rc->nsinks; i++)
	{
		RLCall	   *call = rc->sinks[i];

		if (call->asking)
		{
			/* its +OK is consumed as part of this call's reply, see drain */
			static const char *asking[1] = {"ASKING"};
			static const size_t askinglen[1] = {6};

			append_argv(rc, 1, asking, askinglen);
		}
		append_call(rc, call);
	}
	if (!rc->failed)
		conn->busy = true;
}

/*
 * A connection that sat idle in our cache may have died meanwhile (Redis
 * restarted, CLIENT KILL, idle timeout).  When it fails with an I/O error
 * before giving any reply, try once more on a fresh connection.  Callers
 * only send commands that are safe to repeat (our scripts are idempotent
 * for a given token).
 */
static bool
retry_stale(RunConn *rc, TimestampTz now)
{
	if (!rc->reused || rc->next > 0 ||
		(rc->failure != RL_FAIL_SEND && rc->failure != RL_FAIL_RECEIVE))
		return false;
	queue_run(rc, now);
	rc->reused = false;
	if (!rc->failed && !rc->connecting)
		(void) flush_some(rc);
	return true;
}

/* A write failed the run: retry it once on a fresh connection if it may */
static void
fail_write(RunConn *rc, TimestampTz now)
{
	retry_stale(rc, now);
}

/*
 * One batch of rl_run: connects run in parallel, commands on one connection
 * are pipelined, and the wait is one latch wait over all sockets.  The whole
 * round trip is bounded by timeout_ms (plus connect_timeout where a connect
 * is needed).
 *
 * RL_RUN_HARD: the first failure closes that connection and raises ERROR.
 * RL_RUN_SOFT: failures are recorded in the calls; nothing is raised except
 * by interrupts (hold them if that matters).
 */
static void run_batch(RLCall *calls, int ncalls, RLRunMode mode, int timeout_ms);

/*
 * Send every call and collect every reply, over all the connections they
 * name at once (see run_batch).  One latch wait watches at most
 * RL_WES_MAXSOCK sockets, so calls over more connections than that (a
 * release_all across a very large cluster) go in consecutive batches, all
 * calls of one connection in the same batch.
 */
void
rl_run(RLCall *calls, int ncalls, RLRunMode mode, int timeout_ms)
{
	RLConn	  **conns;
	int			nconns = 0;
	int		   *batch_of;
	int			nbatches;
	int			b;
	int			i;

	if (ncalls <= RL_WES_MAXSOCK)
	{
		run_batch(calls, ncalls, mode, timeout_ms);
		return;
	}
	conns = palloc(sizeof(RLConn *) * ncalls);
	batch_of = palloc(sizeof(int) * ncalls);
	for (i = 0; i < ncalls; i++)
	{
		int			j;

		for (j = 0; j < nconns && conns[j] != calls[i].conn; j++)
			;
		if (j == nconns)
			conns[nconns++] = calls[i].conn;
		batch_of[i] = j / RL_WES_MAXSOCK;
	}
	nbatches = (nconns + RL_WES_MAXSOCK - 1) / RL_WES_MAXSOCK;
	if (nbatches <= 1)
		run_batch(calls, ncalls, mode, timeout_ms);
	else
	{
		RLCall	   *part = palloc(sizeof(RLCall) * ncalls);

		for (b = 0; b < nbatches; b++)
		{
			int			n = 0;

			for (i = 0; i < ncalls; i++)
				if (batch_of[i] == b)
					part[n++] = calls[i];
			run_batch(part, n, mode, timeout_ms);
			n = 0;
			for (i = 0; i < ncalls; i++)
				if (batch_of[i] == b)
					calls[i] = part[n++];
		}
		pfree(part);
	}
	pfree(conns);
	pfree(batch_of);
}

/*
 * Phase 1: one RunConn per connection the calls name, holding its calls in
 * order.  Calls without a connection keep their preset error.
 */
static RunConn *
group_by_connection(RLCall *calls, int ncalls, int timeout_ms, int *nruns)
{
	RunConn    *runs = palloc0(sizeof(RunConn) * ncalls);
	int			i;

	*nruns = 0;
	for (i = 0; i < ncalls; i++)
	{
		RLCall	   *call = &calls[i];
		RunConn    *rc = NULL;
		int			j;

		call->reply = NULL;
		call->sent = false;
		if (call->conn == NULL)
		{
			/* no node to send it to (topology unknown): error preset */
			if (call->error == NULL)
				rl_call_fail(call, RL_FAIL_ROUTE, ERRCODE_CONNECTION_FAILURE,
							 pstrdup("no Redis node is known for it"));
			continue;
		}
		call->failure = RL_FAIL_NONE;
		call->error = NULL;
		call->sqlstate = 0;
		for (j = 0; j < *nruns && rc == NULL; j++)
			if (runs[j].conn == call->conn)
				rc = &runs[j];
		if (rc == NULL)
		{
			rc = &runs[(*nruns)++];
			rc->conn = call->conn;
			rc->timeout_ms = timeout_ms;
			rc->sinkcap = 4;
			rc->sinks = palloc(sizeof(RLCall *) * rc->sinkcap);
		}
		if (rc->nsinks == rc->sinkcap)
		{
			rc->sinkcap *= 2;
			rc->sinks = repalloc(rc->sinks, sizeof(RLCall *) * rc->sinkcap);
		}
		rc->sinks[rc->nsinks++] = call;
	}
	return runs;
}

/*
 * Phase 2: (re)connect where needed, queue every command and write what the
 * sockets take at once (usually everything).
 */
static void
write_runs(RunConn *runs, int nruns, TimestampTz now)
{
	int			i;

	for (i = 0; i < nruns; i++)
	{
		RunConn    *rc = &runs[i];
		RLConn	   *conn = rc->conn;

		/*
		 * A connection left mid-reply, set up with old settings, or holding
		 * bytes nobody asked for (they would be taken for the next reply)
		 */
		/* what already came for earlier sends is theirs, whatever follows */
		if (conn->stream != NULL && conn->nowed > 0)
			poll_conn(conn, now);
		if (conn->stream != NULL && conn->nowed > 0 &&
			rl_stream_has_partial_reply(conn->stream))
			finish_owed_reply(conn);
		/* (replies owed to earlier sends are bytes asked for) */
		if (conn->stream != NULL &&
			(conn->busy || conn->generation != rl_settings_generation ||
			 /* subscriber connections get pushes by design */
			 (!conn->subscriber && (has_unsent(conn) ||
									(conn->nowed == 0 && has_unasked_bytes(conn))))))
			rl_conn_close(conn);
		queue_run(rc, now);
		if (!rc->failed && !rc->connecting && !flush_some(rc))
			fail_write(rc, now);
	}
}

/*
 * Phase 3a: the sockets still to wait on, with the events each needs; runs
 * past their deadline fail here.  Returns how many runs are pending.
 */
static int
pending_sockets(RunConn *runs, int nruns, SockWait *sw, TimestampTz now)
{
	int			npending = 0;
	int			i;

	sw->nsock = 0;
	for (i = 0; i < nruns; i++)
	{
		RunConn    *rc = &runs[i];

		if (run_done(rc))
		{
			/*
			 * Keep finished sockets in the set: the set then stays the same
			 * for the whole run (and across runs on the same nodes), instead
			 * of a new epoll instance every time one of several masters
			 * answers.
			 */
			if (!rc->failed && rc->conn->stream != NULL && sw->nsock < RL_WES_MAXSOCK)
				sock_add(sw, rl_stream_socket(rc->conn->stream), WL_SOCKET_READABLE, i);
			continue;
		}
		if (rc->connecting && now >= rc->connect_deadline &&
			now < rc->connect_end && !rl_stream_in_handshake(rc->conn->stream) &&
			rl_stream_next_address(rc->conn->stream))
		{
			/* that address never answered: the next one, in a new wait set */
			wes_invalidate();
			rc->connect_deadline = address_deadline(rc, now);
		}
		if (rc->connecting && now >= rc->connect_deadline)
		{
			if (rl_stream_in_handshake(rc->conn->stream))
				run_fail(rc, RL_FAIL_TLS, ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
						 psprintf("TLS handshake timed out after %s",
								  rl_format_ms(rl_connect_timeout_ms)));
			else
				run_fail(rc, RL_FAIL_CONNECT, ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
						 psprintf("timed out after %s", rl_format_ms(rl_connect_timeout_ms)));
			continue;
		}
		if (!rc->connecting && rc->conn->nowed > 0 &&
			now >= rc->conn->owed[0].deadline && !rc->owed_retried)
		{
			/*
			 * Replies owed to earlier sends, which ours queue behind, are
			 * overdue: they fail (outcome unknown), and our calls go again
			 * once on a fresh connection, with a deadline of their own.
			 */
			owed_fail_all(rc->conn, RL_FAIL_TIMEOUT, ERRCODE_CONNECTION_FAILURE,
						  psprintf("no reply within %s",
								   rl_format_ms(rc->conn->owed[0].timeout_ms)));
			rl_conn_close(rc->conn);
			rc->owed_retried = true;
			queue_run(rc, now);
			if (rc->failed)
				continue;
			if (!rc->connecting && !flush_some(rc))
				continue;
		}
		if (!rc->connecting && now >= rc->deadline)
		{
			run_fail(rc, RL_FAIL_TIMEOUT, ERRCODE_CONNECTION_FAILURE,
					 psprintf("no reply within %s", rl_format_ms(rc->timeout_ms)));
			continue;
		}
		sock_add(sw, rl_stream_socket(rc->conn->stream),
				 rl_stream_events(rc->conn->stream), i);
		npending++;
	}
	return npending;
}

/* Phase 3b: how long to wait: until the nearest deadline of a pending run */
static long
next_deadline_ms(RunConn *runs, const SockWait *sw, TimestampTz now)
{
	long		wait_ms = LONG_MAX;
	int			i;

	for (i = 0; i < sw->nsock; i++)
	{
		RunConn    *rc = &runs[sw->owner[i]];
		TimestampTz until = rc->connecting ? rc->connect_deadline : rc->deadline;

		/* replies owed before ours may be given up on sooner */
		if (!rc->connecting && rc->conn->nowed > 0 && !rc->owed_retried)
			until = Min(until, rc->conn->owed[0].deadline);
		if (!run_done(rc))
			wait_ms = Min(wait_ms, (long) ((until - now + 999) / 1000));
	}
	return Max(wait_ms, 1);
}

/*
 * Phase 3c: what the wait is for, in pg_stat_activity: a connect while any
 * pending run is still connecting, else the replies.
 */
static RLWaitKind
wait_kind(RunConn *runs, const SockWait *sw)
{
	int			i;

	for (i = 0; i < sw->nsock; i++)
	{
		RunConn    *rc = &runs[sw->owner[i]];

		if (rc->connecting && !run_done(rc))
			return RL_WAIT_CONNECT;
	}
	return RL_WAIT_REPLY;
}

/* Phase 3d: finish connects, write more, read and hand out replies */
static void
serve_ready(RunConn *runs, const SockWait *sw, TimestampTz now)
{
	RLStreamFailure failure;
	char	   *reason;
	int			i;

	for (i = 0; i < sw->nready; i++)
	{
		RunConn    *rc = &runs[sw->ready[i]];

		if (rc->failed)
			continue;
		if (run_done(rc))
		{
			/*
			 * Data or EOF nobody asked for: its state is unknown (a
			 * subscriber's push counts too, as before).  A TLS record that
			 * is not data (a session ticket) is only read.
			 */
			if (rc->conn->stream != NULL && has_unasked_bytes(rc->conn))
				rl_conn_close(rc->conn);
			continue;
		}
		if (rc->connecting)
		{
			finish_connect(rc);
			if (rc->failed || rc->connecting)
				continue;
		}
		if (has_unsent(rc->conn) && !flush_some(rc))
		{
			fail_write(rc, now);
			continue;
		}
		/* TLS may need to read to go on writing: read on any event */
		if (!(sw->ready_ev[i] & WL_SOCKET_READABLE) && !rl_stream_is_tls(rc->conn->stream))
			continue;
		if (rl_stream_read(rc->conn->stream, &failure, &reason) == RL_STREAM_FAILED)
		{
			/* hand out what arrived before the failure */
			drain_replies(rc);
			if (!run_done(rc))
			{
				/* a TLS failure here is a server refusing our certificate */
				run_fail(rc, stream_failure(failure),
						 failure == RL_STREAM_FAIL_TLS ?
						 ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION :
						 ERRCODE_CONNECTION_FAILURE, reason);
				retry_stale(rc, now);
			}
			continue;
		}
		drain_replies(rc);
	}
}

/*
 * Phase 4: finished connections become reusable; each call learns whether
 * its bytes went out and, if its connection failed, why.
 */
static void
settle_runs(RunConn *runs, int nruns)
{
	int			i;

	for (i = 0; i < nruns; i++)
	{
		RunConn    *rc = &runs[i];
		int			j;

		if (!rc->failed)
			rc->conn->busy = false;
		for (j = 0; j < rc->nsinks; j++)
		{
			RLCall	   *call = rc->sinks[j];

			call->sent = rc->wrote || call->reply != NULL;
			if (rc->failed && call->reply == NULL)
				rl_call_fail(call, rc->failure, rc->errcode, rc->reason);
		}
	}
}

/*
 * A cancel or terminate came while interrupts are held (a release at
 * COMMIT, ABORT, backend exit or on an error path): it is served once they
 * are resumed, so the wait must not hold it off for long, whatever
 * command_timeout says.
 */
static bool
held_wait_interrupted(void)
{
	return InterruptHoldoffCount > 0 && (QueryCancelPending || ProcDiePending);
}

/* Every pending run of a held wait gets at most RL_HELD_WAIT_CUT_MS more */
static void
cut_deadlines(RunConn *runs, int nruns, TimestampTz now)
{
	TimestampTz cut = TimestampTzPlusMilliseconds(now, RL_HELD_WAIT_CUT_MS);
	int			i;

	for (i = 0; i < nruns; i++)
	{
		runs[i].connect_deadline = Min(runs[i].connect_deadline, cut);
		runs[i].connect_end = Min(runs[i].connect_end, cut);
		runs[i].deadline = Min(runs[i].deadline, cut);
		/* a connect that completes after this gets as long for the reply */
		runs[i].timeout_ms = Min(runs[i].timeout_ms, RL_HELD_WAIT_CUT_MS);
	}
}

static void
run_batch(RLCall *calls, int ncalls, RLRunMode mode, int timeout_ms)
{
	RunConn    *runs;
	int			nruns;
	int			i;
	bool		cut = false;

	runs = group_by_connection(calls, ncalls, timeout_ms, &nruns);
	write_runs(runs, nruns, GetCurrentTimestamp());
	for (;;)
	{
		SockWait	sw;
		TimestampTz now = GetCurrentTimestamp();

		if (!cut && held_wait_interrupted())
		{
			cut_deadlines(runs, nruns, now);
			cut = true;
		}
		if (pending_sockets(runs, nruns, &sw, now) == 0)
			break;
		if (wait_sockets(&sw, next_deadline_ms(runs, &sw, now),
						 wait_kind(runs, &sw)) < 0)
		{
			for (i = 0; i < sw.nsock; i++)
				if (!run_done(&runs[sw.owner[i]]))
					run_fail(&runs[sw.owner[i]], RL_FAIL_LOCAL, ERRCODE_CONNECTION_FAILURE,
							 pstrdup("postmaster exited"));
			break;
		}
		serve_ready(runs, &sw, GetCurrentTimestamp());
	}
	settle_runs(runs, nruns);
	if (mode == RL_RUN_HARD)
	{
		for (i = 0; i < ncalls; i++)
			if (calls[i].error != NULL)
				rl_raise_call_error(&calls[i]);
	}
	for (i = 0; i < nruns; i++)
		pfree(runs[i].sinks);
	pfree(runs);
}

/* ----------------------------------------------------------------
 * Calls sent without waiting for their replies.  rl_send writes the
 * commands and records each call as owed on its connection; Redis answers
 * in order, so whichever reads that connection next -- a later round trip
 * on it, rl_poll_owed, rl_wait_owed -- hands the next replies to the owed
 * calls first.  Closing the connection, for whatever reason, fails the calls
 * it still owes: their outcome is then unknown (RLCall.sent is true).
 * ----------------------------------------------------------------
 */

/*
 * The memory context owed calls live in: the caller builds them there, and
 * their replies and failures are copied there.  The caller resets it (with
 * rl_owed_reset) once nothing is owed any more.
 */
MemoryContext
rl_owed_context(void)
{
	if (owed_cxt == NULL)
		owed_cxt = AllocSetContextCreate(TopMemoryContext,
										 "redis_lock owed replies",
										 ALLOCSET_SMALL_SIZES);
	return owed_cxt;
}

/* How many calls still wait for their replies, over every connection */
int
rl_owed_count(void)
{
	return total_owed;
}

/* Free what owed calls used, once none is left (else nothing) */
void
rl_owed_reset(void)
{
	if (total_owed == 0 && owed_cxt != NULL)
		MemoryContextReset(owed_cxt);
}

/* The oldest owed call of conn got reply r (in the owed context) */
static void
owed_answer(RLConn *conn, RLReply *r)
{
	RLCall	   *call = conn->owed[0].call;

	call->reply = r;
	call->owed = false;
	call->sent = true;
	conn->nowed--;
	total_owed--;
	if (conn->nowed > 0)
		memmove(conn->owed, conn->owed + 1, sizeof(OwedReply) * conn->nowed);
}

/* Every call conn owes gets this failure: their outcome is unknown */
static void
owed_fail_all(RLConn *conn, RLFailure failure, int errcode, const char *reason)
{
	int			i;

	for (i = 0; i < conn->nowed; i++)
	{
		RLCall	   *call = conn->owed[i].call;

		rl_call_fail(call, failure, errcode,
					 MemoryContextStrdup(rl_owed_context(), reason));
		call->owed = false;
		call->sent = true;
	}
	total_owed -= conn->nowed;
	conn->nowed = 0;
}

/*
 * Hand the complete replies in conn's buffer to the calls it owes, no more
 * than it owes.  False when a reply could not be parsed.
 */
static bool
owed_drain(RLConn *conn)
{
	while (conn->nowed > 0 && conn->stream != NULL)
	{
		RLReply    *r;
		char	   *err;
		bool		ok;
		MemoryContext old = MemoryContextSwitchTo(rl_owed_context());

		ok = next_reply(conn, &r, &err);
		MemoryContextSwitchTo(old);
		if (!ok)
			return false;
		if (r == NULL)
			break;
		owed_answer(conn, r);
	}
	return true;
}

/*
 * Read, without waiting, what came on a connection that owes replies and
 * hand it out; a connection that broke, or whose oldest owed reply is past
 * its deadline, is closed (its owed calls fail).
 */
static void
poll_conn(RLConn *conn, TimestampTz now)
{
	RLStreamFailure failure;
	char	   *reason;

	if (conn->nowed == 0)
		return;
	if (conn->stream == NULL)
	{
		owed_fail_all(conn, RL_FAIL_RECEIVE, ERRCODE_CONNECTION_FAILURE,
					  "the connection was closed before the reply came");
		return;
	}
	if (rl_stream_read(conn->stream, &failure, &reason) == RL_STREAM_FAILED)
	{
		/* what came before the failure still counts */
		if (owed_drain(conn) && conn->nowed == 0)
		{
			rl_conn_close(conn);
			return;
		}
		owed_fail_all(conn, stream_failure(failure), ERRCODE_CONNECTION_FAILURE,
					  reason);
		rl_conn_close(conn);
		return;
	}
	if (!owed_drain(conn))
	{
		owed_fail_all(conn, RL_FAIL_PARSE, ERRCODE_PROTOCOL_VIOLATION,
					  "a reply could not be parsed");
		rl_conn_close(conn);
		return;
	}
	if (conn->nowed > 0 && now >= conn->owed[0].deadline)
	{
		owed_fail_all(conn, RL_FAIL_TIMEOUT, ERRCODE_CONNECTION_FAILURE,
					  psprintf("no reply within %s", rl_format_ms(conn->owed[0].timeout_ms)));
		rl_conn_close(conn);
	}
}

/*
 * An owed reply has begun to come on conn but is not whole: wait for its
 * end (up to its deadline) before anything more is sent there.  A server
 * that stops mid-reply and then answers the next command would otherwise
 * complete the owed frame with that command's reply, out of step for good.
 * Rare: a release's reply is a few bytes.  What does not end in time fails,
 * the connection closed.
 */
static void
finish_owed_reply(RLConn *conn)
{
	bool		cut = false;
	TimestampTz deadline = conn->owed[0].deadline;

	while (conn->stream != NULL && conn->nowed > 0 &&
		   rl_stream_has_partial_reply(conn->stream))
	{
		SockWait	sw;
		TimestampTz now = GetCurrentTimestamp();

		if (!cut && held_wait_interrupted())
		{
			deadline = Min(deadline, TimestampTzPlusMilliseconds(now, RL_HELD_WAIT_CUT_MS));
			cut = true;
		}
		if (now >= deadline)
		{
			owed_fail_all(conn, RL_FAIL_TIMEOUT, ERRCODE_CONNECTION_FAILURE,
						  psprintf("no whole reply within %s",
								   rl_format_ms(conn->owed[0].timeout_ms)));
			rl_conn_close(conn);
			return;
		}
		sw.nsock = 0;
		sock_add(&sw, rl_stream_socket(conn->stream), rl_stream_events(conn->stream), 0);
		if (wait_sockets(&sw, Max((long) ((deadline - now + 999) / 1000), 1),
						 RL_WAIT_REPLY) < 0)
		{
			owed_fail_all(conn, RL_FAIL_LOCAL, ERRCODE_CONNECTION_FAILURE,
						  "postmaster exited");
			rl_conn_close(conn);
			return;
		}
		/* (no deadline check here: poll_conn's is the owed call's own) */
		poll_conn(conn, GetCurrentTimestamp());
	}
}

/*
 * Can calls be sent on conn without waiting for anything first?  It must be
 * open, set up under the settings of now, not left mid-reply, with nothing
 * unsent and nothing come that nobody asked for.  Never a subscriber.
 */
bool
rl_conn_ready_to_send(RLConn *conn)
{
	if (conn == NULL || conn->stream == NULL || conn->subscriber ||
		conn->busy || conn->generation != rl_settings_generation ||
		rl_stream_in_handshake(conn->stream) || has_unsent(conn))
		return false;
	if (conn->nowed > 0)
	{
		poll_conn(conn, GetCurrentTimestamp());
		/* not behind a reply that has begun and not ended (see write_runs) */
		return conn->stream != NULL &&
			(conn->nowed == 0 || !rl_stream_has_partial_reply(conn->stream));
	}
	/* a connection the server closed meanwhile shows its EOF here */
	return !has_unasked_bytes(conn);
}

/*
 * Send every call (its connection ready, see rl_conn_ready_to_send) without
 * waiting for the replies: each becomes owed (RLCall.owed) until its reply
 * or failure is recorded in it; the calls must live in rl_owed_context()
 * until then.  Only the writes are waited for (they usually go at once),
 * through the latch and within timeout_ms, which also bounds how long each
 * reply may take.  With interrupts held (COMMIT, ABORT), a cancel or
 * terminate cuts the wait to RL_HELD_WAIT_CUT_MS; otherwise it raises, and
 * the connection, left with bytes unsent, is closed at its next use (its
 * owed calls fail).  Never raises for a network failure: a connection that
 * fails closes, failing what it owes.
 */
void
rl_send(RLCall **calls, int ncalls, int timeout_ms)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz deadline = TimestampTzPlusMilliseconds(now, timeout_ms);
	bool		cut = false;
	int			i;

	for (i = 0; i < ncalls; i++)
	{
		RLCall	   *call = calls[i];
		RLConn	   *conn = call->conn;

		Assert(conn != NULL && conn->stream != NULL && !conn->subscriber);
		call->reply = NULL;
		call->failure = RL_FAIL_NONE;
		call->error = NULL;
		call->sqlstate = 0;
		call->sent = false;
		call->owed = true;
		if (conn->nowed == conn->owedcap)
		{
			conn->owedcap = Max(8, conn->owedcap * 2);
			conn->owed = conn->owed == NULL ?
				MemoryContextAlloc(TopMemoryContext, sizeof(OwedReply) * conn->owedcap) :
				repalloc(conn->owed, sizeof(OwedReply) * conn->owedcap);
		}
		stream_append_call(conn->stream, call);
		conn->owed[conn->nowed].call = call;
		conn->owed[conn->nowed].deadline = deadline;
		conn->owed[conn->nowed].timeout_ms = timeout_ms;
		conn->nowed++;
		total_owed++;
	}

	/* write everything out; wait only while a socket does not take it all */
	for (;;)
	{
		SockWait	sw;

		sw.nsock = 0;
		for (i = 0; i < ncalls; i++)
		{
			RLConn	   *conn = calls[i]->conn;
			bool		progress;
			RLStreamFailure failure;
			char	   *reason;
			int			j;

			if (conn->stream == NULL || !has_unsent(conn))
				continue;
			for (j = 0; j < sw.nsock && calls[sw.owner[j]]->conn != conn; j++)
				;
			if (j < sw.nsock)
				continue;		/* already written in this pass */
			if (rl_stream_write(conn->stream, &progress, &failure, &reason) == RL_STREAM_FAILED)
			{
				owed_fail_all(conn, RL_FAIL_SEND, ERRCODE_CONNECTION_FAILURE, reason);
				rl_conn_close(conn);
				continue;
			}
			/* TLS may have read on the way: hand out what came */
			if (conn->nowed > 0 && rl_stream_is_tls(conn->stream) && !owed_drain(conn))
			{
				owed_fail_all(conn, RL_FAIL_PARSE, ERRCODE_PROTOCOL_VIOLATION,
							  "a reply could not be parsed");
				rl_conn_close(conn);
				continue;
			}
			if (has_unsent(conn))
				sock_add(&sw, rl_stream_socket(conn->stream),
						 rl_stream_events(conn->stream), i);
		}
		if (sw.nsock == 0)
			break;
		now = GetCurrentTimestamp();
		if (!cut && held_wait_interrupted())
		{
			deadline = Min(deadline, TimestampTzPlusMilliseconds(now, RL_HELD_WAIT_CUT_MS));
			cut = true;
		}
		if (now >= deadline ||
			wait_sockets(&sw, Max((long) ((deadline - now + 999) / 1000), 1),
						 RL_WAIT_REPLY) < 0)
		{
			for (i = 0; i < sw.nsock; i++)
			{
				RLConn	   *conn = calls[sw.owner[i]]->conn;

				if (conn->stream == NULL)
					continue;
				owed_fail_all(conn, RL_FAIL_TIMEOUT, ERRCODE_CONNECTION_FAILURE,
							  psprintf("could not send within %s", rl_format_ms(timeout_ms)));
				rl_conn_close(conn);
			}
			break;
		}
		/* TLS may need to read to go on writing */
		for (i = 0; i < sw.nready; i++)
		{
			RLConn	   *conn = calls[sw.ready[i]]->conn;
			RLStreamFailure failure;
			char	   *reason;

			if (conn->stream == NULL || !rl_stream_is_tls(conn->stream))
				continue;
			if (rl_stream_read(conn->stream, &failure, &reason) == RL_STREAM_FAILED)
			{
				owed_fail_all(conn, stream_failure(failure), ERRCODE_CONNECTION_FAILURE, reason);
				rl_conn_close(conn);
			}
		}
	}
}

/*
 * Read, without waiting, whatever came for owed calls on every connection,
 * and close those whose oldest owed reply is overdue (failing what they
 * owe).  Raises nothing.
 */
void
rl_poll_owed(void)
{
	RLConn	   *c;
	TimestampTz now;

	if (total_owed == 0)
		return;
	now = GetCurrentTimestamp();
	for (c = conn_list; c != NULL; c = c->next)
		if (c->nowed > 0)
			poll_conn(c, now);
}

/*
 * Wait up to timeout_ms (and no longer than each reply's own deadline) for
 * every owed reply; what has not come by then fails, its connection closed.
 * Through the latch: interrupts raise unless held, and a cancel or
 * terminate while they are held cuts the wait to RL_HELD_WAIT_CUT_MS.
 */
void
rl_wait_owed(int timeout_ms)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   timeout_ms);
	bool		cut = false;

	for (;;)
	{
		SockWait	sw;
		RLConn	   *c;
		RLConn	   *owner[RL_WES_MAXSOCK];
		TimestampTz now;
		TimestampTz until;
		int			i;

		rl_poll_owed();
		if (total_owed == 0)
			return;
		now = GetCurrentTimestamp();
		if (!cut && held_wait_interrupted())
		{
			deadline = Min(deadline, TimestampTzPlusMilliseconds(now, RL_HELD_WAIT_CUT_MS));
			cut = true;
		}
		until = deadline;
		sw.nsock = 0;
		for (c = conn_list; c != NULL; c = c->next)
		{
			if (c->nowed == 0)
				continue;
			if (now >= deadline || sw.nsock >= RL_WES_MAXSOCK)
			{
				owed_fail_all(c, RL_FAIL_TIMEOUT, ERRCODE_CONNECTION_FAILURE,
							  psprintf("no reply within %s", rl_format_ms(timeout_ms)));
				rl_conn_close(c);
				continue;
			}
			until = Min(until, c->owed[0].deadline);
			owner[sw.nsock] = c;
			sock_add(&sw, rl_stream_socket(c->stream), rl_stream_events(c->stream),
					 sw.nsock);
		}
		if (sw.nsock == 0)
			return;
		if (wait_sockets(&sw, Max((long) ((until - now + 999) / 1000), 1),
						 RL_WAIT_REPLY) < 0)
		{
			for (i = 0; i < sw.nsock; i++)
			{
				owed_fail_all(owner[i], RL_FAIL_LOCAL, ERRCODE_CONNECTION_FAILURE,
							  "postmaster exited");
				rl_conn_close(owner[i]);
			}
			return;
		}
	}
}

/*
 * Make call a fresh command for conn with these arguments (borrowed, not
 * copied; argvlen NULL: NUL-terminated), with no key, target or result.
 */
void
rl_call_set(RLCall *call, RLConn *conn, int argc, const char **argv,
			const size_t *argvlen)
{
	int			i;

	Assert(argc <= RL_MAX_ARGS);
	call->conn = conn;
	call->target = NULL;
	call->key = NULL;
	call->keylen = 0;
	call->follows = false;
	call->probe = false;
	call->asking = false;
	call->extra_ms = 0;
	call->argc = argc;
	for (i = 0; i < argc; i++)
	{
		call->argv[i] = argv[i];
		call->argvlen[i] = argvlen ? argvlen[i] : strlen(argv[i]);
	}
	call->more_argv = NULL;
	call->more_argvlen = NULL;
	call->more_cap = 0;
	call->reply = NULL;
	call->failure = RL_FAIL_NONE;
	call->error = NULL;
	call->sqlstate = 0;
	call->sent = false;
	call->owed = false;
}

/*
 * Append one borrowed argument to call.  Past RL_MAX_ARGS (a multi-key
 * script) they go to arrays palloc'd in the current memory context, which
 * must live as long as the call.
 */
void
rl_call_arg(RLCall *call, const char *arg, size_t len)
{
	int			k = call->argc - RL_MAX_ARGS;

	if (k < 0)
	{
		call->argv[call->argc] = arg;
		call->argvlen[call->argc] = len;
		call->argc++;
		return;
	}
	if (k >= call->more_cap)
	{
		int			cap = Max(16, call->more_cap * 2);

		if (call->more_argv == NULL)
		{
			call->more_argv = palloc(sizeof(char *) * cap);
			call->more_argvlen = palloc(sizeof(size_t) * cap);
		}
		else
		{
			call->more_argv = repalloc(call->more_argv, sizeof(char *) * cap);
			call->more_argvlen = repalloc(call->more_argvlen, sizeof(size_t) * cap);
		}
		call->more_cap = cap;
	}
	call->more_argv[k] = arg;
	call->more_argvlen[k] = len;
	call->argc++;
}

/* ----------------------------------------------------------------
 * Pub/sub.  A subscriber connection carries only (S)SUBSCRIBE,
 * (S)UNSUBSCRIBE and pushed messages.  Unsubscribing does not wait for its
 * confirmation; the next subscribe skips whatever stale pushes precede its
 * own confirmation.
 * ----------------------------------------------------------------
 */
/*
 * The keyspace-notification channel of key on conn's database: Redis
 * publishes the name of each event on it (a "del", "expired", ...) where
 * notify-keyspace-events has K and the event's class.  Node-local, like the
 * key, in a Cluster.
 */
static char *
keyspace_channel(const RLConn *conn, const char *key)
{
	return psprintf("__keyspace@%d__:%s", conn->ep.db, key);
}

/*
 * Send cmd (a subscribe) for channel on each subscriber connection and,
 * when key is not NULL, SUBSCRIBE to that key's keyspace notifications in
 * the same round trip; wait up to timeout_ms for the confirmations.
 * Failures are not raised: a refused subscription closes that connection
 * and the caller polls instead.
 */
void
rl_subscribe(RLConn **subs, int n, const char *cmd, const char *channel,
			 const char *key, int timeout_ms)
{
	int			per = key != NULL ? 2 : 1;
	RLCall	   *calls = palloc0(sizeof(RLCall) * n * per);
	int			i;

	for (i = 0; i < n; i++)
	{
		const char *argv[2] = {cmd, channel};

		rl_call_set(&calls[i * per], subs[i], 2, argv, NULL);
		if (key != NULL)
		{
			const char *kargv[2] = {"SUBSCRIBE", keyspace_channel(subs[i], key)};

			rl_call_set(&calls[i * per + 1], subs[i], 2, kargv, NULL);
		}
	}
	/* a failed subscription only costs promptness; the poll still runs */
	rl_run(calls, n * per, RL_RUN_SOFT, timeout_ms);
	for (i = 0; i < n * per; i++)
		if (calls[i].reply != NULL && calls[i].reply->type == REDIS_REPLY_ERROR)
			rl_conn_close(subs[i / per]);
	pfree(calls);
}

/*
 * Send cmd (an unsubscribe) for channel on each subscriber connection
 * without waiting for the confirmation; a connection that cannot take it is
 * closed.  Never raises for a network failure.
 */
void
rl_unsubscribe_async(RLConn **subs, int n, const char *cmd, const char *channel,
					 const char *key)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		RLConn	   *c = subs[i];
		const char *argv[2] = {cmd, channel};
		size_t		argvlen[2] = {strlen(cmd), strlen(channel)};
		bool		progress;
		RLStreamFailure failure;
		char	   *reason;

		if (c->stream == NULL)
			continue;
		rl_stream_append(c->stream, 2, argv, argvlen);
		if (key != NULL)
		{
			const char *kargv[2] = {"UNSUBSCRIBE", keyspace_channel(c, key)};
			size_t		kargvlen[2] = {11, strlen(kargv[1])};

			rl_stream_append(c->stream, 2, kargv, kargvlen);
		}
		if (rl_stream_write(c->stream, &progress, &failure, &reason) == RL_STREAM_FAILED)
			rl_conn_close(c);
	}
}

/* Is this push a message on our channel? */
static bool
is_message_for(RLReply *r, const char *channel)
{
	const char *kind;

	if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
		r->element[0]->type != REDIS_REPLY_STRING ||
		r->element[1]->type != REDIS_REPLY_STRING)
		return false;
	kind = r->element[0]->str;
	if (strcmp(kind, "message") != 0 && strcmp(kind, "smessage") != 0)
		return false;
	return strcmp(r->element[1]->str, channel) == 0;
}

/*
 * Is this push a keyspace notification that the key is gone (deleted,
 * expired, evicted)?  Other events on it (a renewal's "expire", "hset") are
 * not a reason to try again.
 */
static bool
is_key_gone(RLReply *r, const char *kchannel)
{
	const char *event;

	if (kchannel == NULL || !is_message_for(r, kchannel) ||
		r->element[2]->type != REDIS_REPLY_STRING)
		return false;
	event = r->element[2]->str;
	return strcmp(event, "del") == 0 || strcmp(event, "expired") == 0 ||
		strcmp(event, "evicted") == 0;
}

/*
 * Wait up to timeout_ms for a message on channel, or (key not NULL) a
 * keyspace notification that key is gone, on any of the subscriber
 * connections.  Returns true when woken by one, or when a subscriber
 * connection broke (the caller then retries at once and resubscribes);
 * false on timeout.
 */
bool
rl_wait_for_message(RLConn **subs, int n, const char *channel, const char *key,
					long timeout_ms)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   timeout_ms);
	char	  **kchannels = palloc0(sizeof(char *) * Max(n, 1));
	int			k;

	for (k = 0; k < n && key != NULL; k++)
		kchannels[k] = keyspace_channel(subs[k], key);

	for (;;)
	{
		SockWait	sw;
		int			i;
		bool		woken = false;
		TimestampTz now;
		long		wait_ms;

		/* anything already buffered? */
		for (i = 0; i < n; i++)
		{
			RLConn	   *c = subs[i];
			RLReply    *r;
			char	   *err;

			if (c->stream == NULL)
				continue;
			for (;;)
			{
				if (!next_reply(c, &r, &err))
				{
					rl_conn_close(c);
					return true;
				}
				if (r == NULL)
					break;
				if (is_message_for(r, channel) || is_key_gone(r, kchannels[i]))
					woken = true;
			}
		}
		if (woken)
			return true;

		now = GetCurrentTimestamp();
		if (now >= deadline)
			return false;
		sw.nsock = 0;
		for (i = 0; i < n; i++)
		{
			if (subs[i]->stream == NULL)
				continue;
			sock_add(&sw, rl_stream_socket(subs[i]->stream),
					 rl_stream_events(subs[i]->stream), i);
		}
		wait_ms = (long) ((deadline - now + 999) / 1000);
		if (sw.nsock == 0)
		{
			/* no subscription: plain latch sleep, the caller polls */
			int			rc;

			CHECK_FOR_INTERRUPTS();
			rc = WaitLatch(MyLatch,
						   WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						   wait_ms, rl_wait_event(RL_WAIT_RELEASE));

			if (rc & WL_LATCH_SET)
			{
				ResetLatch(MyLatch);
				CHECK_FOR_INTERRUPTS();
			}
			continue;
		}
		if (wait_sockets(&sw, wait_ms, RL_WAIT_RELEASE) < 0)
			return true;
		for (i = 0; i < sw.nready; i++)
		{
			RLConn	   *c = subs[sw.ready[i]];
			bool		progress;
			RLStreamFailure failure;
			char	   *reason;

			if (c->stream == NULL)
				continue;
			if ((has_unsent(c) &&
				 rl_stream_write(c->stream, &progress, &failure, &reason) == RL_STREAM_FAILED) ||
				(((sw.ready_ev[i] & WL_SOCKET_READABLE) || rl_stream_is_tls(c->stream)) &&
				 rl_stream_read(c->stream, &failure, &reason) == RL_STREAM_FAILED))
			{
				rl_conn_close(c);
				return true;
			}
		}
	}
}

/* ----------------------------------------------------------------
 * Pub/sub for several locks at once (lockmany.c): entry i is channel i,
 * and (keys[i] not NULL) the keyspace notifications of key i, on
 * subscriber connection subs[i]; one connection may carry many entries.
 * ----------------------------------------------------------------
 */

/*
 * Subscribe every entry, all in one round trip (a command per channel,
 * pipelined per connection); failures as in rl_subscribe.
 */
void
rl_subscribe_each(RLConn **subs, int n, const char *cmd, const char **channels,
				  const char **keys, int timeout_ms)
{
	RLCall	   *calls = palloc0(sizeof(RLCall) * Max(n * 2, 1));
	int		   *owner = palloc(sizeof(int) * Max(n * 2, 1));
	int			k = 0;
	int			i;

	for (i = 0; i < n; i++)
	{
		const char *argv[2] = {cmd, channels[i]};

		owner[k] = i;
		rl_call_set(&calls[k++], subs[i], 2, argv, NULL);
		if (keys[i] != NULL)
		{
			const char *kargv[2] = {"SUBSCRIBE", keyspace_channel(subs[i], keys[i])};

			owner[k] = i;
			rl_call_set(&calls[k++], subs[i], 2, kargv, NULL);
		}
	}
	rl_run(calls, k, RL_RUN_SOFT, timeout_ms);
	for (i = 0; i < k; i++)
		if (calls[i].reply != NULL && calls[i].reply->type == REDIS_REPLY_ERROR)
			rl_conn_close(subs[owner[i]]);
	pfree(calls);
	pfree(owner);
}

/* Unsubscribe every entry without waiting, as rl_unsubscribe_async */
void
rl_unsubscribe_each_async(RLConn **subs, int n, const char *cmd,
						  const char **channels, const char **keys)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		RLConn	   *c = subs[i];
		const char *argv[2] = {cmd, channels[i]};
		size_t		argvlen[2] = {strlen(cmd), strlen(channels[i])};

		if (c->stream == NULL)
			continue;
		rl_stream_append(c->stream, 2, argv, argvlen);
		if (keys[i] != NULL)
		{
			const char *kargv[2] = {"UNSUBSCRIBE", keyspace_channel(c, keys[i])};
			size_t		kargvlen[2] = {11, strlen(kargv[1])};

			rl_stream_append(c->stream, 2, kargv, kargvlen);
		}
	}
	/* one write per connection carries all of its unsubscribes */
	for (i = 0; i < n; i++)
	{
		RLConn	   *c = subs[i];
		bool		progress;
		RLStreamFailure failure;
		char	   *reason;

		if (c->stream == NULL || !has_unsent(c))
			continue;
		if (rl_stream_write(c->stream, &progress, &failure, &reason) == RL_STREAM_FAILED)
			rl_conn_close(c);
	}
}

/* Does push r on conn wake any entry: its channel, or its key gone? */
static bool
wakes_any(RLReply *r, RLConn *conn, RLConn **subs, int n,
		  const char **channels, char **kchannels)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		if (subs[i] != conn)
			continue;
		if (is_message_for(r, channels[i]) || is_key_gone(r, kchannels[i]))
			return true;
	}
	return false;
}

/*
 * Wait up to timeout_ms for a message on any entry's channel, or a keyspace
 * notification that any entry's key is gone.  Returns true when woken, or
 * when a subscriber connection broke (the caller retries at once and
 * subscribes again); false on timeout.  Cancel and terminate end it at
 * once, as rl_wait_for_message.
 */
bool
rl_wait_for_any_message(RLConn **subs, int n, const char **channels,
						const char **keys, long timeout_ms)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   timeout_ms);
	char	  **kchannels = palloc0(sizeof(char *) * Max(n, 1));
	RLConn	  **conns = palloc(sizeof(RLConn *) * Max(n, 1));
	int			nconns = 0;
	int			i;

	for (i = 0; i < n; i++)
	{
		int			j;

		if (keys[i] != NULL)
			kchannels[i] = keyspace_channel(subs[i], keys[i]);
		for (j = 0; j < nconns && conns[j] != subs[i]; j++)
			;
		if (j == nconns)
			conns[nconns++] = subs[i];
	}

	for (;;)
	{
		SockWait	sw;
		bool		woken = false;
		TimestampTz now;
		long		wait_ms;

		/* anything already buffered? */
		for (i = 0; i < nconns; i++)
		{
			RLConn	   *c = conns[i];
			RLReply    *r;
			char	   *err;

			if (c->stream == NULL)
				continue;
			for (;;)
			{
				if (!next_reply(c, &r, &err))
				{
					rl_conn_close(c);
					return true;
				}
				if (r == NULL)
					break;
				if (wakes_any(r, c, subs, n, channels, kchannels))
					woken = true;
			}
		}
		if (woken)
			return true;

		now = GetCurrentTimestamp();
		if (now >= deadline)
			return false;
		sw.nsock = 0;
		for (i = 0; i < nconns; i++)
		{
			if (conns[i]->stream == NULL)
				continue;
			sock_add(&sw, rl_stream_socket(conns[i]->stream),
					 rl_stream_events(conns[i]->stream), i);
		}
		wait_ms = (long) ((deadline - now + 999) / 1000);
		if (sw.nsock == 0)
		{
			/* no subscription: plain latch sleep, the caller polls */
			int			rc;

			CHECK_FOR_INTERRUPTS();
			rc = WaitLatch(MyLatch,
						   WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						   wait_ms, rl_wait_event(RL_WAIT_RELEASE));

			if (rc & WL_LATCH_SET)
			{
				ResetLatch(MyLatch);
				CHECK_FOR_INTERRUPTS();
			}
			continue;
		}
		if (wait_sockets(&sw, wait_ms, RL_WAIT_RELEASE) < 0)
			return true;
		for (i = 0; i < sw.nready; i++)
		{
			RLConn	   *c = conns[sw.ready[i]];
			bool		progress;
			RLStreamFailure failure;
			char	   *reason;

			if (c->stream == NULL)
				continue;
			if ((has_unsent(c) &&
				 rl_stream_write(c->stream, &progress, &failure, &reason) == RL_STREAM_FAILED) ||
				(((sw.ready_ev[i] & WL_SOCKET_READABLE) || rl_stream_is_tls(c->stream)) &&
				 rl_stream_read(c->stream, &failure, &reason) == RL_STREAM_FAILED))
			{
				rl_conn_close(c);
				return true;
			}
		}
	}
}
