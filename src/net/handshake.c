/*-------------------------------------------------------------------------
 *
 * handshake.c
 *	  Owns what a new connection sends before the caller's commands, in the
 *	  same round trip (AUTH with the settings' password or the password
 *	  file's, SELECT, CLIENT SETNAME, COMMAND INFO of the commands the
 *	  layers above ask about: rl_probe_commands), what an error reply to
 *	  them means, and what the connection learnt of its server's commands
 *	  (rl_conn_commands).
 *
 *	  transport.c connects, sends and reads the replies; this file only
 *	  queues commands on a stream and judges replies.  Must not: wait, run
 *	  round trips, raise for a refusal (it is returned), or show a password
 *	  in a message.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/handshake.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <hiredis/hiredis.h>

#include "miscadmin.h"
#include "utils/memutils.h"

#include "net/net_int.h"

/* Commands every handshake asks about (rl_probe_commands); 0: none */
static const char *const *probe_names = NULL;
static int	probe_n = 0;

/*
 * The handshake's AUTH, with the settings' password (or the worker's
 * target's), else the password file's, read now: once per connection, by
 * whichever process connects.  Its copy is zeroed once the command is
 * queued.  Returns how many commands were queued (0 or 1).
 */
static int
queue_auth(RLConn *conn)
{
	const char *argv[3];
	size_t		argvlen[3];
	int			argc = 0;
	const char *password = conn->secret;
	char	   *file_password;

	file_password = password[0] == '\0' ? rl_password_file_lookup(&conn->ep) : NULL;
	if (file_password != NULL)
		password = file_password;
	if (password[0] != '\0' || conn->ep.user[0] != '\0')
	{
		argv[argc] = "AUTH";
		argvlen[argc++] = 4;
		if (conn->ep.user[0] != '\0')
		{
			argv[argc] = conn->ep.user;
			argvlen[argc++] = strlen(conn->ep.user);
		}
		argv[argc] = password;
		argvlen[argc++] = strlen(password);
		rl_stream_append(conn->stream, argc, argv, argvlen);
	}
	if (file_password != NULL)
	{
		explicit_bzero(file_password, strlen(file_password));
		pfree(file_password);
	}
	return argc > 0 ? 1 : 0;
}

/* The handshake's SELECT of the URL's database, if not 0; returns 0 or 1 */
static int
queue_select(RLConn *conn)
{
	const char *argv[2];
	size_t		argvlen[2];
	char		buf[64];

	if (conn->ep.db == 0 || conn->subscriber || conn->ep.sentinel)
		return 0;
	snprintf(buf, sizeof(buf), "%d", conn->ep.db);
	argv[0] = "SELECT";
	argvlen[0] = 6;
	argv[1] = buf;
	argvlen[1] = strlen(buf);
	rl_stream_append(conn->stream, 2, argv, argvlen);
	return 1;
}

/* The handshake's CLIENT SETNAME: which process, and what for */
static void
queue_setname(RLConn *conn)
{
	const char *argv[3];
	size_t		argvlen[3];
	char		buf[64];

	snprintf(buf, sizeof(buf), "redis_lock:%d%s%s", MyProcPid,
			 MyBackendType == B_BG_WORKER ? ":worker" : "",
			 conn->subscriber ? ":sub" : "");
	argv[0] = "CLIENT";
	argvlen[0] = 6;
	argv[1] = "SETNAME";
	argvlen[1] = 7;
	argv[2] = buf;
	argvlen[2] = strlen(buf);
	rl_stream_append(conn->stream, 3, argv, argvlen);
}

/* The handshake's last command: COMMAND INFO of the probed names */
static void
queue_probe(RLConn *conn)
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
	rl_stream_append(conn->stream, 2 + probe_n, pargv, pargvlen);
}

/*
 * Queue the handshake of conn, whose connect just started, in front of
 * whatever the caller sends: the whole handshake costs no extra round trip.
 * What the server offers is asked last (its reply is told apart by that),
 * unless the caller's run itself starts with that question (run_asks);
 * *probing tells whether it was.  Returns how many commands were queued.
 */
int
rl_handshake_queue(RLConn *conn, bool run_asks, bool *probing)
{
	int			n = 0;

	n += queue_auth(conn);
	n += queue_select(conn);
	queue_setname(conn);
	n++;
	*probing = probe_n > 0 && !conn->subscriber && !conn->ep.sentinel &&
		!run_asks;
	if (*probing)
	{
		queue_probe(conn);
		n++;
	}
	return n;
}

/*
 * Remember what a COMMAND INFO probe answered about the server behind conn:
 * an array with one entry per name, nil for a command it does not know.
 */
void
rl_note_commands(RLConn *conn, RLReply *r)
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
	else if (!rl_reply_fits(r, "[?*]") || r->elements != (size_t) probe_n)
		refusal = "unexpected reply to COMMAND INFO";
	else
	{
		int			i;

		/*
		 * A command's description, which starts with its name, or nil
		 * (empty, older servers): unknown.  A description of another name
		 * is no answer about this one.
		 */
		for (i = 0; i < probe_n; i++)
		{
			RLReply    *d = r->element[i];

			if (rl_reply_fits(d, "[s ?*]") &&
				d->element[0]->len == strlen(probe_names[i]) &&
				pg_strncasecmp(d->element[0]->str, probe_names[i],
							   d->element[0]->len) == 0)
				known |= 1 << i;
		}
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
	{
		rl_poll_conn(conn, GetCurrentTimestamp());
		if (conn->generation != rl_settings_generation)
			rl_finish_owed(conn, true);
	}
	if (conn->stream != NULL && !conn->subscriber &&
		(conn->busy || conn->generation != rl_settings_generation ||
		 rl_stream_has_unsent(conn->stream) ||
		 (conn->nowed == 0 && rl_has_unasked_bytes(conn))))
		rl_conn_close(conn);
	if (refusal != NULL)
		*refusal = conn->commands_refusal;
	return conn->commands;
}

/*
 * Does the reply to a handshake command refuse the connection?  Then
 * *failure and *errcode say how (the reply's text never shows the
 * password).
 */
bool
rl_handshake_refused(RLReply *r, RLFailure *failure, int *errcode)
{
	if (r->type != REDIS_REPLY_ERROR)
		return false;
	if (strncmp(r->str, "WRONGPASS", 9) == 0 ||
		strstr(r->str, "invalid password") != NULL ||
		strstr(r->str, "invalid username-password") != NULL)
	{
		*failure = RL_FAIL_PASSWORD;
		*errcode = ERRCODE_INVALID_PASSWORD;
	}
	else if (strncmp(r->str, "NOAUTH", 6) == 0)
	{
		*failure = RL_FAIL_NOAUTH;
		*errcode = ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION;
	}
	else if (strstr(r->str, "AUTH") != NULL)
	{
		*failure = RL_FAIL_AUTH;
		*errcode = ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION;
	}
	else
	{
		*failure = RL_FAIL_SETUP;
		*errcode = ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION;
	}
	return true;
}
