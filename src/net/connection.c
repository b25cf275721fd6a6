/*-------------------------------------------------------------------------
 *
 * connection.c
 *	  Owns connections to Redis servers (each over a stream, stream.c): the
 *	  cache of them by endpoint and credentials, closing them (failing the
 *	  replies they still owe), the latch waits on their sockets, the copy of
 *	  hiredis replies into palloc'd RLReply trees and the one check of a
 *	  reply's shape (rl_reply_fits) that every reader makes before it reads
 *	  an element, a string or an integer, the building of calls, and the
 *	  messages of failed calls.
 *
 *	  Every wait goes through a WaitEventSet on the process latch plus the
 *	  sockets, so query cancel, statement_timeout, backend termination and
 *	  postmaster death end it; every wait has a deadline.  hiredis replies
 *	  are copied before anything can throw, so nothing malloc'd by hiredis
 *	  or OpenSSL outlives an ERROR except the cached connections' streams,
 *	  which only rl_conn_close() frees.
 *
 *	  Must not: run round trips or handshakes (transport.c), send without
 *	  waiting (owed.c) or subscribe (pubsub.c); know about locks, scripts,
 *	  topologies, sockets or TLS.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/connection.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>
#include <limits.h>
#include <sys/socket.h>
#include <hiredis/hiredis.h>

#include "miscadmin.h"
#include "pgstat.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "utils/memutils.h"

#include "net/net_int.h"

RLConn	   *rl_conn_list = NULL;

/* Owed replies on every connection, and the context they are copied into */
int			rl_total_owed = 0;
static MemoryContext owed_cxt = NULL;

/* Credentials that replace the settings' (the watchdog worker's per target) */
static bool credentials_set = false;
static const char *cred_password = NULL;
static const char *cred_sentinel_password = NULL;

/* ----------------------------------------------------------------
 * Wait sets.  Creating one costs an epoll instance and a few syscalls, so
 * the last few are kept, keyed by the sockets they watch; any connect or
 * close invalidates them (a reused fd number is a different socket).
 * ----------------------------------------------------------------
 */
#define RL_WES_CACHE	2

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

void
rl_wes_invalidate(void)
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

void
rl_sock_add(SockWait *sw, pgsocket fd, uint32 events, int owner)
{
	if (sw->nsock >= RL_WES_MAXSOCK)
		elog(ERROR, "too many sockets to wait on");	/* rl_run batches */
	sw->fds[sw->nsock] = fd;
	sw->events[sw->nsock] = events;
	sw->owner[sw->nsock++] = owner;
}

/*
 * Where the wait being made was asked for, and whether the watchdog worker
 * could take the work of a path that holds interrupts (set in a backend of
 * a preloaded server).  See rl_assert_may_wait.
 */
const char *rl_wait_site = NULL;
bool		rl_held_work_to_worker = false;

/*
 * No path waits for Redis (a reply, or the worker's command) with
 * interrupts held where the worker could take the work: a cancel or
 * terminate, pending or already served, would be held off for the wait.
 * Backend exit is the exception (one bound for all of it, lockxact.c);
 * without preloading such waits are cut to RL_HELD_WAIT_CUT_MS
 * (rl_held_wait_bounded).  In assert-enabled builds a breach stops the
 * server naming the call site, so that a new one is found by any test that
 * passes there; in others it is only bounded.
 */
void
rl_assert_may_wait(const char *what)
{
#ifdef USE_ASSERT_CHECKING
	if (InterruptHoldoffCount > 0 && !proc_exit_inprogress &&
		rl_held_work_to_worker)
		elog(PANIC, "redis_lock: %s with interrupts held, called from %s",
			 what, rl_wait_site != NULL ? rl_wait_site : "(unknown)");
#endif
}

/*
 * Wait until one of the sockets is ready for what it asks, the latch is set
 * or the timeout passes; pg_stat_activity shows the wait event of kind.
 * Fills sw->ready / sw->ready_ev and returns sw->nready; -1 when the
 * postmaster died while we are already exiting.  The latch is reset and
 * interrupts are checked here (no-op while they are held).
 */
int
rl_wait_sockets(SockWait *sw, long timeout_ms, RLWaitKind kind)
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

/*
 * A palloc'd copy of r.  Each element is freed from r once copied (its
 * slot set to NULL, which freeReplyObject skips), so a large reply does
 * not live twice at once: malloc can give its memory to the copy.
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
		{
			out->element[i] = copy_reply(r->element[i]);
			freeReplyObject(r->element[i]);
			r->element[i] = NULL;
		}
	}
	return out;
}

/*
 * Take the next complete reply out of hiredis' buffer as a palloc'd copy.
 * False when the bytes are not RESP or the reply is too large (*failure
 * says which, *errmsg why; both are protocol violations): the caller
 * closes the connection.
 */
bool
rl_next_reply(RLConn *conn, RLReply **out, RLFailure *failure, char **errmsg)
{
	void	   *raw = NULL;
	RLStreamFailure why;

	*out = NULL;
	if (!rl_stream_next_reply(conn->stream, &raw, &why, errmsg))
	{
		*failure = rl_stream_failure(why);
		return false;
	}
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

/*
 * Reply shapes.  Every reader of a reply declares the shapes it accepts and
 * checks the reply against them with rl_reply_fits before it reads an
 * element, a string or an integer of it: a reply of any other shape, from a
 * server that is not what it seems, is never read.  A shape is one of
 *
 *	i	an integer			s	a bulk string		t	a bulk string or status
 *	n	nil					e	an error			?	any reply (its reader
 *														checks its type first)
 *	[a b ...]	an array of exactly these elements; the last may be
 *				followed by '*': zero or more of it
 *	a|b		either; (a|b) groups alternatives inside an array
 *
 * so "[i i]|[i t]" is a two-element array of integers, or of an integer and
 * a text.  Shapes are constants of the code: a malformed one is a bug.
 */
static bool shape_alternatives(const char **p, const RLReply *r);

static bool
shape_is_type(const RLReply *r, int type)
{
	return r != NULL && r->type == type;
}

/*
 * Does the array r (NULL, or not an array: only step over the shape) have
 * exactly the elements the shape at *p lists, up to its ']'?
 */
static bool
shape_array(const char **p, const RLReply *r)
{
	bool		fits = shape_is_type(r, REDIS_REPLY_ARRAY);
	size_t		i = 0;

	for (;;)
	{
		const char *item;

		while (**p == ' ')
			(*p)++;
		if (**p == ']')
			break;
		item = *p;
		(void) shape_alternatives(p, NULL);
		if (**p == '*')
		{
			(*p)++;
			for (; fits && i < r->elements; i++)
			{
				const char *q = item;

				fits = shape_alternatives(&q, r->element[i]);
			}
			continue;
		}
		if (fits && i < r->elements)
		{
			const char *q = item;

			fits = shape_alternatives(&q, r->element[i++]);
		}
		else
			fits = false;
	}
	(*p)++;
	return fits && i == r->elements;
}

/* Does r fit the one shape at *p (a letter, a group or an array)? */
static bool
shape_term(const char **p, const RLReply *r)
{
	char		c = *(*p)++;
	bool		fits;

	switch (c)
	{
		case 'i':
			return shape_is_type(r, REDIS_REPLY_INTEGER);
		case 's':
			return shape_is_type(r, REDIS_REPLY_STRING);
		case 't':
			return shape_is_type(r, REDIS_REPLY_STRING) ||
				shape_is_type(r, REDIS_REPLY_STATUS);
		case 'n':
			return shape_is_type(r, REDIS_REPLY_NIL);
		case 'e':
			return shape_is_type(r, REDIS_REPLY_ERROR);
		case '?':
			return r != NULL;
		case '[':
			return shape_array(p, r);
		case '(':
			fits = shape_alternatives(p, r);
			if (*(*p)++ != ')')
				elog(ERROR, "malformed reply shape");
			return fits;
		default:
			elog(ERROR, "malformed reply shape");
	}
	return false;				/* keep the compiler quiet */
}

/* Does r fit one of the alternatives at *p?  Steps over all of them. */
static bool
shape_alternatives(const char **p, const RLReply *r)
{
	bool		fits = shape_term(p, r);

	while (**p == '|')
	{
		(*p)++;
		fits |= shape_term(p, r);
	}
	return fits;
}

/* Does reply r (NULL: no reply) fit shape (see above)? */
bool
rl_reply_fits(const RLReply *r, const char *shape)
{
	const char *p = shape;
	bool		fits = shape_alternatives(&p, r);

	if (*p != '\0')
		elog(ERROR, "malformed reply shape \"%s\"", shape);
	return fits;
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

	for (c = rl_conn_list; c != NULL; c = c->next)
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
	c->next = rl_conn_list;
	rl_conn_list = c;
	MemoryContextSwitchTo(old);
	return c;
}

/*
 * Which connection conn is: 0 while closed, otherwise a number that changes
 * whenever it is made again (a subscriber's subscriptions are gone then)
 */
uint32
rl_conn_open_id(RLConn *conn)
{
	return conn->stream != NULL ? conn->connects : 0;
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
		rl_owed_fail_all(conn, RL_FAIL_RECEIVE, ERRCODE_CONNECTION_FAILURE,
						 "the connection was closed before the reply came");
	if (conn->stream != NULL)
	{
		rl_stream_close(conn->stream);
		conn->stream = NULL;
		rl_wes_invalidate();
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

	for (c = rl_conn_list; c != NULL; c = c->next)
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
bool
rl_has_unasked_bytes(RLConn *conn)
{
	return rl_stream_has_unasked(conn->stream);
}

/* What a stream failure is, as a call failure */
RLFailure
rl_stream_failure(RLStreamFailure f)
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
		case RL_STREAM_FAIL_TOO_LARGE:
			return RL_FAIL_TOO_LARGE;
		case RL_STREAM_FAIL_LOCAL:
			break;
	}
	return RL_FAIL_LOCAL;
}

/*
 * Queue one call's command on a stream: its inline arguments, then those
 * past RL_MAX_ARGS (a multi-key script) in the same command.
 */
void
rl_stream_append_call(RLStream *stream, RLCall *call)
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

bool
rl_has_unsent(const RLConn *conn)
{
	return rl_stream_has_unsent(conn->stream);
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
		case RL_FAIL_TOO_LARGE:
			return psprintf(_("Redis at %s sent a reply that is too large"), s);
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
			errhint("Check redis_lock.password or redis_lock.password_file, and the user in redis_lock.url.");
			return errmsg("password authentication failed for Redis at %s", s);
		case RL_FAIL_NOAUTH:
			errhint("Check redis_lock.password or redis_lock.password_file, and the user in redis_lock.url.");
			return errmsg("Redis at %s requires authentication", s);
		case RL_FAIL_AUTH:
			errhint("Check redis_lock.password or redis_lock.password_file, and the user in redis_lock.url.");
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
		case RL_FAIL_TOO_LARGE:
			errhint("Check that the server at that address is the Redis server meant: Redis sends no reply this large to redis_lock's commands.");
			return errmsg("Redis at %s sent a reply that is too large", s);
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

/* ----------------------------------------------------------------
 * The replies each connection owes (owed.c sends the calls and reads
 * the replies): their memory, and failing them when the connection goes
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
	return rl_total_owed;
}

/* Free what owed calls used, once none is left (else nothing) */
void
rl_owed_reset(void)
{
	if (rl_total_owed == 0 && owed_cxt != NULL)
		MemoryContextReset(owed_cxt);
}

/* The oldest owed call of conn got reply r (in the owed context) */
void
rl_owed_answer(RLConn *conn, RLReply *r)
{
	RLCall	   *call = conn->owed[0].call;

	call->reply = r;
	call->owed = false;
	call->sent = true;
	conn->nowed--;
	rl_total_owed--;
	if (conn->nowed > 0)
		memmove(conn->owed, conn->owed + 1, sizeof(OwedReply) * conn->nowed);
}

/* Every call conn owes gets this failure: their outcome is unknown */
void
rl_owed_fail_all(RLConn *conn, RLFailure failure, int errcode, const char *reason)
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
	rl_total_owed -= conn->nowed;
	conn->nowed = 0;
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
