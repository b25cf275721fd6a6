/*-------------------------------------------------------------------------
 *
 * owed.c
 *	  Owns calls sent without waiting for their replies (rl_send): writing
 *	  them, reading the replies their connection owes whenever it is read
 *	  next or polled (rl_poll_owed, rl_wait_owed), and waiting out a reply
 *	  that has begun before anything else is sent behind it.
 *
 *	  Must not: run round trips (transport.c), keep the queue's memory or
 *	  fail its calls other than through connection.c, know about locks.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/owed.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <hiredis/hiredis.h>

#include "miscadmin.h"
#include "pgstat.h"
#include "utils/memutils.h"

#include "net/net_int.h"

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
 * Hand the complete replies in conn's buffer to the calls it owes, no more
 * than it owes.  False when a reply could not be parsed or is too large
 * (*failure and *reason say which and why; the caller closes conn).
 */
bool
rl_owed_drain(RLConn *conn, RLFailure *failure, char **reason)
{
	while (conn->nowed > 0 && conn->stream != NULL)
	{
		RLReply    *r;
		bool		ok;
		MemoryContext old = MemoryContextSwitchTo(rl_owed_context());

		ok = rl_next_reply(conn, &r, failure, reason);
		MemoryContextSwitchTo(old);
		if (!ok)
			return false;
		if (r == NULL)
			break;
		rl_owed_answer(conn, r);
	}
	return true;
}

/*
 * Read, without waiting, what came on a connection that owes replies and
 * hand it out; a connection that broke, or whose oldest owed reply is past
 * its deadline, is closed (its owed calls fail).
 */
void
rl_poll_conn(RLConn *conn, TimestampTz now)
{
	RLStreamFailure failure;
	char	   *reason;
	RLFailure	bad;
	char	   *why;

	if (conn->nowed == 0)
		return;
	if (conn->stream == NULL)
	{
		rl_owed_fail_all(conn, RL_FAIL_RECEIVE, ERRCODE_CONNECTION_FAILURE,
						 "the connection was closed before the reply came");
		return;
	}
	if (rl_stream_read(conn->stream, &failure, &reason) == RL_STREAM_FAILED)
	{
		/* what came before the failure still counts */
		if (rl_owed_drain(conn, &bad, &why) && conn->nowed == 0)
		{
			rl_conn_close(conn);
			return;
		}
		rl_owed_fail_all(conn, rl_stream_failure(failure), ERRCODE_CONNECTION_FAILURE,
						 reason);
		rl_conn_close(conn);
		return;
	}
	if (!rl_owed_drain(conn, &bad, &why))
	{
		rl_owed_fail_all(conn, bad, ERRCODE_PROTOCOL_VIOLATION, why);
		rl_conn_close(conn);
		return;
	}
	if (conn->nowed > 0 && now >= conn->owed[0].deadline)
	{
		rl_owed_fail_all(conn, RL_FAIL_TIMEOUT, ERRCODE_CONNECTION_FAILURE,
						 psprintf("no reply within %s", rl_format_ms(conn->owed[0].timeout_ms)));
		rl_conn_close(conn);
	}
}

/*
 * Wait (up to each reply's deadline) until no owed reply on conn has begun
 * without ending, or, with every, until conn owes nothing.  A server that
 * stops mid-reply and then answers the next command would otherwise
 * complete the owed frame with that command's reply, out of step for good;
 * a connection about to be closed because the settings changed would fail
 * replies that are on their way (their releases taken for doubts).  Rare:
 * a release's reply is a few bytes, half a round trip away.  What does not
 * come in time fails, the connection closed.
 */
void
rl_finish_owed(RLConn *conn, bool every)
{
	TimestampTz cut_at = 0;

	while (conn->stream != NULL && conn->nowed > 0 &&
		   (every || rl_stream_has_partial_reply(conn->stream)))
	{
		SockWait	sw;
		TimestampTz now = GetCurrentTimestamp();
		TimestampTz deadline = conn->owed[0].deadline;

		if (cut_at == 0 && rl_held_wait_bounded())
			cut_at = TimestampTzPlusMilliseconds(now, RL_HELD_WAIT_CUT_MS);
		if (cut_at != 0)
			deadline = Min(deadline, cut_at);
		if (now >= deadline)
		{
			rl_owed_fail_all(conn, RL_FAIL_TIMEOUT, ERRCODE_CONNECTION_FAILURE,
							 psprintf("no whole reply within %s",
									  rl_format_ms(conn->owed[0].timeout_ms)));
			rl_conn_close(conn);
			return;
		}
		sw.nsock = 0;
		rl_sock_add(&sw, rl_stream_socket(conn->stream), rl_stream_events(conn->stream), 0);
		if (rl_wait_sockets(&sw, Max((long) ((deadline - now + 999) / 1000), 1),
							RL_WAIT_REPLY) < 0)
		{
			rl_owed_fail_all(conn, RL_FAIL_LOCAL, ERRCODE_CONNECTION_FAILURE,
							 "postmaster exited");
			rl_conn_close(conn);
			return;
		}
		/* (no deadline check here: rl_poll_conn's is the owed call's own) */
		rl_poll_conn(conn, GetCurrentTimestamp());
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
		rl_stream_in_handshake(conn->stream) || rl_has_unsent(conn))
		return false;
	if (conn->nowed > 0)
	{
		rl_poll_conn(conn, GetCurrentTimestamp());
		/*
		 * not behind a reply that has begun and not ended (see write_runs);
		 * all in: nothing may have come after them either
		 */
		return conn->stream != NULL &&
			(conn->nowed == 0 ? !rl_has_unasked_bytes(conn) :
			 !rl_stream_has_partial_reply(conn->stream));
	}
	/* a connection the server closed meanwhile shows its EOF here */
	return !rl_has_unasked_bytes(conn);
}

/*
 * Send every call (its connection ready, see rl_conn_ready_to_send) without
 * waiting for the replies: each becomes owed (RLCall.owed) until its reply
 * or failure is recorded in it; the calls must live in rl_owed_context()
 * until then.  Only the writes are waited for (they usually go at once),
 * through the latch and within timeout_ms, which also bounds how long each
 * reply may take.  With interrupts held (COMMIT, ABORT) the wait is cut to
 * RL_HELD_WAIT_CUT_MS (rl_held_wait_bounded); otherwise a cancel raises, and
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
		rl_stream_append_call(conn->stream, call);
		conn->owed[conn->nowed].call = call;
		conn->owed[conn->nowed].deadline = deadline;
		conn->owed[conn->nowed].timeout_ms = timeout_ms;
		conn->nowed++;
		rl_total_owed++;
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
			RLFailure	bad;
			char	   *why;
			int			j;

			if (conn->stream == NULL || !rl_has_unsent(conn))
				continue;
			for (j = 0; j < sw.nsock && calls[sw.owner[j]]->conn != conn; j++)
				;
			if (j < sw.nsock)
				continue;		/* already written in this pass */
			if (rl_stream_write(conn->stream, &progress, &failure, &reason) == RL_STREAM_FAILED)
			{
				rl_owed_fail_all(conn, RL_FAIL_SEND, ERRCODE_CONNECTION_FAILURE, reason);
				rl_conn_close(conn);
				continue;
			}
			/* TLS may have read on the way: hand out what came */
			if (conn->nowed > 0 && rl_stream_is_tls(conn->stream) &&
				!rl_owed_drain(conn, &bad, &why))
			{
				rl_owed_fail_all(conn, bad, ERRCODE_PROTOCOL_VIOLATION, why);
				rl_conn_close(conn);
				continue;
			}
			/* past RL_WES_MAXSOCK a socket is only written again next pass */
			if (rl_has_unsent(conn) && sw.nsock < RL_WES_MAXSOCK)
				rl_sock_add(&sw, rl_stream_socket(conn->stream),
							rl_stream_events(conn->stream), i);
		}
		if (sw.nsock == 0)
			break;
		now = GetCurrentTimestamp();
		if (!cut && rl_held_wait_bounded())
		{
			deadline = Min(deadline, TimestampTzPlusMilliseconds(now, RL_HELD_WAIT_CUT_MS));
			cut = true;
		}
		if (now >= deadline ||
			rl_wait_sockets(&sw, Max((long) ((deadline - now + 999) / 1000), 1),
							RL_WAIT_REPLY) < 0)
		{
			for (i = 0; i < ncalls; i++)
			{
				RLConn	   *conn = calls[i]->conn;

				if (conn->stream == NULL || !rl_has_unsent(conn))
					continue;
				rl_owed_fail_all(conn, RL_FAIL_TIMEOUT, ERRCODE_CONNECTION_FAILURE,
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
				rl_owed_fail_all(conn, rl_stream_failure(failure), ERRCODE_CONNECTION_FAILURE, reason);
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

	if (rl_total_owed == 0)
		return;
	now = GetCurrentTimestamp();
	for (c = rl_conn_list; c != NULL; c = c->next)
		if (c->nowed > 0)
			rl_poll_conn(c, now);
}

/*
 * Wait up to timeout_ms (and no longer than each reply's own deadline) for
 * every owed reply; what has not come by then fails, its connection closed.
 * Through the latch: interrupts raise unless held; while they are held the
 * wait is cut to RL_HELD_WAIT_CUT_MS (rl_held_wait_bounded).  site
 * names the caller (rl_wait_owed).
 */
void
rl_wait_owed_at(int timeout_ms, const char *site)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   timeout_ms);
	bool		cut = false;

	rl_wait_site = site;
	if (timeout_ms > 0 && rl_total_owed > 0)
		rl_assert_may_wait("a wait for replies owed");

	for (;;)
	{
		SockWait	sw;
		RLConn	   *c;
		RLConn	   *owner[RL_WES_MAXSOCK];
		TimestampTz now;
		TimestampTz until;
		int			i;

		rl_poll_owed();
		if (rl_total_owed == 0)
			return;
		now = GetCurrentTimestamp();
		if (!cut && rl_held_wait_bounded())
		{
			deadline = Min(deadline, TimestampTzPlusMilliseconds(now, RL_HELD_WAIT_CUT_MS));
			cut = true;
		}
		until = deadline;
		sw.nsock = 0;
		for (c = rl_conn_list; c != NULL; c = c->next)
		{
			if (c->nowed == 0)
				continue;
			/* past RL_WES_MAXSOCK a connection is only polled, pass by pass */
			if (now < deadline && sw.nsock >= RL_WES_MAXSOCK)
				continue;
			if (now >= deadline)
			{
				rl_owed_fail_all(c, RL_FAIL_TIMEOUT, ERRCODE_CONNECTION_FAILURE,
								 psprintf("no reply within %s", rl_format_ms(timeout_ms)));
				rl_conn_close(c);
				continue;
			}
			until = Min(until, c->owed[0].deadline);
			owner[sw.nsock] = c;
			rl_sock_add(&sw, rl_stream_socket(c->stream), rl_stream_events(c->stream),
						sw.nsock);
		}
		if (sw.nsock == 0)
			return;
		if (rl_wait_sockets(&sw, Max((long) ((until - now + 999) / 1000), 1),
							RL_WAIT_REPLY) < 0)
		{
			for (i = 0; i < sw.nsock; i++)
			{
				rl_owed_fail_all(owner[i], RL_FAIL_LOCAL, ERRCODE_CONNECTION_FAILURE,
								 "postmaster exited");
				rl_conn_close(owner[i]);
			}
			return;
		}
	}
}
