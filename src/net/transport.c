/*-------------------------------------------------------------------------
 *
 * transport.c
 *	  Owns pipelined round trips (rl_run) over one or many connections at
 *	  once, with each connection's (re)connect, the replies to its handshake
 *	  (which handshake.c queues and judges) read in the same round trip,
 *	  and the resend of a round whose cached connection turned out dead.
 *
 *	  Every wait goes through a WaitEventSet on the process latch plus the
 *	  sockets, so query cancel, statement_timeout, backend termination and
 *	  postmaster death end it; every wait has a deadline.  hiredis replies
 *	  are copied into palloc'd RLReply trees before anything can throw, so
 *	  nothing malloc'd by hiredis or OpenSSL outlives an ERROR except the
 *	  cached connections' streams, which only rl_conn_close() frees.
 *
 *	  Must not: know about locks, scripts or topologies, nor about sockets
 *	  or TLS (stream.c does); keep connections (connection.c) or send
 *	  without waiting (owed.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/transport.c
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
	bool		resent;			/* sent again after bytes of the first send
								 * went out (RLCall.resent) */
	bool		failed;
	RLFailure	failure;
	char	   *reason;			/* detail of the failure */
	int			errcode;
	RLResolution *resolved;		/* its name's addresses for the next connect
								 * (resolve_names), or NULL */
	TimestampTz connect_deadline;	/* of the address being tried */
	TimestampTz connect_end;	/* of the whole connect: connect_timeout */
	TimestampTz deadline;		/* for the replies; starts once connected */
	int			timeout_ms;
} RunConn;

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
		rl_owed_fail_all(rc->conn, failure, errcode, reason);
	/* its state is unknown: never reuse it */
	rl_conn_close(rc->conn);
}

static void
append_argv(RunConn *rc, int argc, const char **argv, const size_t *argvlen)
{
	if (rc->failed)
		return;
	rl_stream_append(rc->conn->stream, argc, argv, argvlen);
}

static void
append_call(RunConn *rc, RLCall *call)
{
	if (rc->failed)
		return;
	rl_stream_append_call(rc->conn->stream, call);
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
 * Resolve the names of the runs about to connect, all at once, within
 * connect_timeout, rather than one after another.  Each connect then gets
 * what its own name's resolution left of connect_timeout (the resolution
 * is part of the connect): a name that never resolves delays the others'
 * connects by connect_timeout, but does not eat their time.
 */
static void
resolve_names(RunConn **need, int n, TimestampTz now)
{
	RLResolution *names = palloc0(sizeof(RLResolution) * n);
	int			i;

	for (i = 0; i < n; i++)
	{
		names[i].host = need[i]->conn->ep.host;
		names[i].port = need[i]->conn->ep.port;
		need[i]->resolved = &names[i];
	}
	rl_resolve_all(names, n, TimestampTzPlusMilliseconds(now, rl_connect_timeout_ms));
	now = GetCurrentTimestamp();
	for (i = 0; i < n; i++)
		need[i]->connect_end =
			TimestampTzPlusMilliseconds(now, Max(0, rl_connect_timeout_ms - names[i].took_ms));
}

/*
 * Start a non-blocking connect and queue the handshake in front of whatever
 * the caller sends.
 */
static void
start_connect(RunConn *rc, TimestampTz now)
{
	RLConn	   *conn = rc->conn;
	RLStreamFailure failure;
	char	   *reason;

	if (rc->resolved == NULL)
		resolve_names(&rc, 1, now);
	conn->stream = rl_stream_open(&conn->ep, rc->resolved, &failure, &reason);
	/* a later connect of this run (a stale connection's retry) looks again */
	rc->resolved = NULL;
	if (conn->stream == NULL)
	{
		rc->failed = true;
		rc->failure = rl_stream_failure(failure);
		rc->errcode = ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION;
		rc->reason = reason;
		return;
	}
	rl_wes_invalidate();
	if (conn->ever_connected)
	{
		rl_stats_add(RL_STAT_RECONNECTS, 1);
	}
	conn->ever_connected = true;
	conn->connects++;
	conn->generation = rl_settings_generation;
	rc->connecting = true;
	rc->connect_deadline = address_deadline(rc, GetCurrentTimestamp());
	rc->handshake = rl_handshake_queue(conn, rc->nsinks > 0 && rc->sinks[0]->probe,
									   &rc->probing);
}

/* Check one handshake reply: a refusal fails the run */
static void
check_handshake(RunConn *rc, RLReply *r)
{
	RLFailure	failure;
	int			errcode;

	if (rl_handshake_refused(r, &failure, &errcode))
		run_fail(rc, failure, errcode, pstrdup(r->str));
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

	/* {kind, channel, subscriptions} */
	if (!rl_reply_fits(r, "[s s ?*]"))
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
		RLFailure	failure;
		char	   *err;

		/* replies owed to earlier sends come first: Redis answers in order */
		if (rc->conn->nowed > 0)
		{
			if (!rl_owed_drain(rc->conn, &failure, &err))
			{
				run_fail(rc, failure, ERRCODE_PROTOCOL_VIOLATION,
						 psprintf("a reply owed to an earlier command: %s", err));
				return;
			}
			if (rc->conn->nowed > 0)
				return;			/* our own replies come after them */
		}
		if (!rl_next_reply(rc->conn, &r, &failure, &err))
		{
			run_fail(rc, failure, ERRCODE_PROTOCOL_VIOLATION, err);
			return;
		}
		if (r == NULL)
			return;
		if (rc->handshake > 0)
		{
			rc->handshake--;
			/* the probe comes last; a refusal of it is only noted */
			if (rc->handshake == 0 && rc->probing)
				rl_note_commands(rc->conn, r);
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
				rl_note_commands(rc->conn, r);
			call->reply = r;
			rc->next++;
		}
	}
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
			run_fail(rc, rl_stream_failure(failure),
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
 * for a given token), but a repeat does not answer as the first would
 * have: a compare-and-delete whose first send ran finds nothing of ours.
 * So the calls are marked resent when bytes of the first send went out
 * (the connection may have died after Redis ran them, with the reply on
 * its way), for the layer above to read their answers accordingly.
 */
static bool
retry_stale(RunConn *rc, TimestampTz now)
{
	if (!rc->reused || rc->next > 0 ||
		(rc->failure != RL_FAIL_SEND && rc->failure != RL_FAIL_RECEIVE))
		return false;
	rc->resent = rc->wrote;
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

	rl_assert_may_wait("a round trip to Redis");
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
		call->resent = false;
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
 * Phase 2: (re)connect where needed, the names of every connection to make
 * resolved together first, then queue every command and write what the
 * sockets take at once (usually everything).
 */
static void
write_runs(RunConn *runs, int nruns, TimestampTz now)
{
	RunConn   **need = NULL;	/* made only when a run must connect */
	int			nneed = 0;
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
			rl_poll_conn(conn, now);
		/* and what is on its way to a connection about to be closed */
		if (conn->stream != NULL && conn->nowed > 0)
			rl_finish_owed(conn, conn->generation != rl_settings_generation);
		/* (replies owed to earlier sends are bytes asked for) */
		if (conn->stream != NULL &&
			(conn->busy || conn->generation != rl_settings_generation ||
			 /* subscriber connections get pushes by design */
			 (!conn->subscriber && (rl_has_unsent(conn) ||
									(conn->nowed == 0 && rl_has_unasked_bytes(conn))))))
			rl_conn_close(conn);
		if (conn->stream == NULL)
		{
			if (need == NULL)
				need = palloc(sizeof(RunConn *) * nruns);
			need[nneed++] = rc;
		}
	}
	/* before any run's clock starts: a resolution takes its time */
	if (nneed > 0)
	{
		resolve_names(need, nneed, now);
		now = GetCurrentTimestamp();
		pfree(need);
	}
	for (i = 0; i < nruns; i++)
	{
		RunConn    *rc = &runs[i];

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
				rl_sock_add(sw, rl_stream_socket(rc->conn->stream), WL_SOCKET_READABLE, i);
			continue;
		}
		if (rc->connecting && now >= rc->connect_deadline &&
			now < rc->connect_end && !rl_stream_in_handshake(rc->conn->stream) &&
			rl_stream_next_address(rc->conn->stream))
		{
			/* that address never answered: the next one, in a new wait set */
			rl_wes_invalidate();
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
			rl_owed_fail_all(rc->conn, RL_FAIL_TIMEOUT, ERRCODE_CONNECTION_FAILURE,
							 psprintf("no reply within %s",
									  rl_format_ms(rc->conn->owed[0].timeout_ms)));
			rl_conn_close(rc->conn);
			rc->owed_retried = true;
			/* ours may have been written behind them, and run */
			rc->resent = rc->resent || rc->wrote;
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
		rl_sock_add(sw, rl_stream_socket(rc->conn->stream),
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
			if (rc->conn->stream != NULL && rl_has_unasked_bytes(rc->conn))
				rl_conn_close(rc->conn);
			continue;
		}
		if (rc->connecting)
		{
			finish_connect(rc);
			if (rc->failed || rc->connecting)
				continue;
		}
		if (rl_has_unsent(rc->conn) && !flush_some(rc))
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
				run_fail(rc, rl_stream_failure(failure),
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
			call->resent = rc->resent;
			if (rc->failed && call->reply == NULL)
				rl_call_fail(call, rc->failure, rc->errcode, rc->reason);
		}
	}
}

/* With interrupts held, every run gets at most RL_HELD_WAIT_CUT_MS from now */
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

		if (!cut && rl_held_wait_bounded())
		{
			cut_deadlines(runs, nruns, now);
			cut = true;
		}
		if (pending_sockets(runs, nruns, &sw, now) == 0)
			break;
		if (rl_wait_sockets(&sw, next_deadline_ms(runs, &sw, now),
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
