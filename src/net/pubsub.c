/*-------------------------------------------------------------------------
 *
 * pubsub.c
 *	  Owns pub/sub subscriber connections: subscribing to release channels
 *	  and keyspace notifications, unsubscribing without waiting, and
 *	  waiting on the latch for a message for one lock or for any of several.
 *
 *	  Must not: send anything but (S)SUBSCRIBE and (S)UNSUBSCRIBE on a
 *	  subscriber connection, know about locks beyond the channel and key
 *	  names it is given.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/pubsub.c
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

	/* {"message", channel, payload} */
	if (!rl_reply_fits(r, "[s s ?]"))
		return false;
	kind = r->element[0]->str;
	if (strcmp(kind, "message") != 0 && strcmp(kind, "smessage") != 0)
		return false;
	return strcmp(r->element[1]->str, channel) == 0;
}

/*
 * Does a keyspace event say the key is gone (deleted, expired, evicted)?
 * Other events on it (a renewal's "expire", "hset") do not.
 */
static bool
is_gone_event(const char *event)
{
	return strcmp(event, "del") == 0 || strcmp(event, "expired") == 0 ||
		strcmp(event, "evicted") == 0;
}

/*
 * Does a keyspace event tell a waiter that room may have come free: the
 * key is gone, or members of it are (a redis-semaphore holder's ZREM, stale
 * members removed), which such holders never publish?
 */
static bool
is_room_event(const char *event)
{
	return is_gone_event(event) || strcmp(event, "zrem") == 0 ||
		strcmp(event, "zremrangebyscore") == 0;
}

/*
 * Is this push a keyspace notification that room may have come free
 * (is_room_event)?  Other events on the key (a renewal's "expire", "hset")
 * are not a reason to try again.
 */
static bool
is_key_gone(RLReply *r, const char *kchannel)
{
	const char *event;

	if (kchannel == NULL || !is_message_for(r, kchannel) ||
		!rl_reply_fits(r->element[2], "s"))
		return false;
	event = r->element[2]->str;
	return is_room_event(event);
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
	const char **channels = palloc(sizeof(char *) * Max(n, 1));
	const char **keys = palloc(sizeof(char *) * Max(n, 1));
	int			i;

	/* one entry a connection, each for the same lock */
	for (i = 0; i < n; i++)
	{
		channels[i] = channel;
		keys[i] = key;
	}
	return rl_wait_for_any_message(subs, n, channels, keys, timeout_ms);
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

/*
 * Write the unsubscribes appended to each connection, one write per
 * connection for all of its own; a connection that cannot take them is
 * closed.
 */
static void
flush_unsubscribes(RLConn **subs, int n)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		RLConn	   *c = subs[i];
		bool		progress;
		RLStreamFailure failure;
		char	   *reason;

		if (c->stream == NULL || !rl_has_unsent(c))
			continue;
		if (rl_stream_write(c->stream, &progress, &failure, &reason) == RL_STREAM_FAILED)
			rl_conn_close(c);
	}
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
	flush_unsubscribes(subs, n);
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
 * Send what is unsent and read what came on the sockets a latch wait found
 * ready (sw's owners index conns).  Returns false when a connection broke:
 * it is closed, its subscriptions gone.
 */
static bool
pump_ready(SockWait *sw, RLConn **conns)
{
	int			i;

	for (i = 0; i < sw->nready; i++)
	{
		RLConn	   *c = conns[sw->ready[i]];
		bool		progress;
		RLStreamFailure failure;
		char	   *reason;

		if (c->stream == NULL)
			continue;
		if ((rl_has_unsent(c) &&
			 rl_stream_write(c->stream, &progress, &failure, &reason) == RL_STREAM_FAILED) ||
			(((sw->ready_ev[i] & WL_SOCKET_READABLE) || rl_stream_is_tls(c->stream)) &&
			 rl_stream_read(c->stream, &failure, &reason) == RL_STREAM_FAILED))
		{
			rl_conn_close(c);
			return false;
		}
	}
	return true;
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
			RLFailure	failure;
			char	   *err;

			if (c->stream == NULL)
				continue;
			for (;;)
			{
				if (!rl_next_reply(c, &r, &failure, &err))
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
			rl_sock_add(&sw, rl_stream_socket(conns[i]->stream),
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
		if (rl_wait_sockets(&sw, wait_ms, RL_WAIT_RELEASE) < 0 ||
			!pump_ready(&sw, conns))
			return true;
	}
}

/* ----------------------------------------------------------------
 * Keyspace notifications alone, for the watchdog's watch of the locks it
 * renews (watchevents.c): entry i is key i on subscriber connection
 * subs[i].  The wait reports which keys are gone, not only that one is.
 * ----------------------------------------------------------------
 */

/*
 * SUBSCRIBE to the keyspace notifications of every entry, pipelined per
 * connection, waiting up to timeout_ms for the confirmations.  A refused
 * subscription (an ACL that denies that channel) sets refused[i] and
 * leaves the connection open: it carries the other entries' subscriptions,
 * which still stand.  A connection that failed or did not answer in time
 * is closed (rl_run).  Returns what went wrong first, or NULL.
 */
char *
rl_subscribe_keyspace(RLConn **subs, const char **keys, int n, int timeout_ms,
					  bool *refused)
{
	RLCall	   *calls = palloc0(sizeof(RLCall) * Max(n, 1));
	char	   *problem = NULL;
	int			i;

	for (i = 0; i < n; i++)
	{
		const char *argv[2] = {"SUBSCRIBE", keyspace_channel(subs[i], keys[i])};

		rl_call_set(&calls[i], subs[i], 2, argv, NULL);
	}
	rl_run(calls, n, RL_RUN_SOFT, timeout_ms);
	for (i = 0; i < n; i++)
	{
		refused[i] = calls[i].reply != NULL &&
			calls[i].reply->type == REDIS_REPLY_ERROR;
		if ((refused[i] || calls[i].reply == NULL) && problem == NULL)
			problem = rl_call_problem(&calls[i]);
	}
	pfree(calls);
	return problem;
}

/* UNSUBSCRIBE every entry without waiting, as rl_unsubscribe_async */
void
rl_unsubscribe_keyspace_async(RLConn **subs, const char **keys, int n)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		const char *argv[2] = {"UNSUBSCRIBE", keyspace_channel(subs[i], keys[i])};
		size_t		argvlen[2] = {11, strlen(argv[1])};

		if (subs[i]->stream != NULL)
			rl_stream_append(subs[i]->stream, 2, argv, argvlen);
	}
	flush_unsubscribes(subs, n);
}

/*
 * Hand every keyspace notification of a key gone that conn has buffered to
 * gone (the key, without the channel's prefix).  Returns false when the
 * connection broke (it is closed).
 */
static bool
drain_keyspace_gone(RLConn *conn, RLKeyGoneCallback gone, void *arg, bool *any)
{
	char	   *prefix = keyspace_channel(conn, "");
	size_t		plen = strlen(prefix);

	for (;;)
	{
		RLReply    *r;
		RLFailure	failure;
		char	   *err;

		if (!rl_next_reply(conn, &r, &failure, &err))
		{
			rl_conn_close(conn);
			return false;
		}
		if (r == NULL)
			return true;
		/* {"message", keyspace channel, event} */
		if (rl_reply_fits(r, "[s s s]") &&
			strcmp(r->element[0]->str, "message") == 0 &&
			strncmp(r->element[1]->str, prefix, plen) == 0 &&
			is_gone_event(r->element[2]->str))
		{
			gone(r->element[1]->str + plen, arg);
			*any = true;
		}
	}
}

/*
 * Wait up to timeout_ms, or until the latch is set, for keyspace
 * notifications that keys are gone on any of conns, handing each key to
 * gone.  Other pushes (confirmations, a renewal's own "expire") are read
 * and skipped without returning.  Returns false when a connection broke:
 * it is closed, and its subscriptions must be made again.  Interrupts are
 * checked as in every latch wait (rl_wait_sockets).
 */
bool
rl_wait_keyspace_gone(RLConn **conns, int n, long timeout_ms,
					  RLKeyGoneCallback gone, void *arg)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   timeout_ms);

	for (;;)
	{
		SockWait	sw;
		bool		any = false;
		TimestampTz now;
		int			i;

		for (i = 0; i < n; i++)
			if (conns[i]->stream != NULL &&
				!drain_keyspace_gone(conns[i], gone, arg, &any))
				return false;
		if (any)
			return true;
		now = GetCurrentTimestamp();
		if (now >= deadline)
			return true;
		sw.nsock = 0;
		for (i = 0; i < n; i++)
			if (conns[i]->stream != NULL)
				rl_sock_add(&sw, rl_stream_socket(conns[i]->stream),
							rl_stream_events(conns[i]->stream), i);
		if (sw.nsock == 0)
		{
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 (long) ((deadline - now + 999) / 1000),
							 rl_wait_event(RL_WAIT_WATCHDOG));
			ResetLatch(MyLatch);
			return true;
		}
		if (rl_wait_sockets(&sw, (long) ((deadline - now + 999) / 1000),
							RL_WAIT_WATCHDOG) < 0)
			return true;
		/* woken by the latch: the worker has something to look at */
		if (sw.nready == 0 && GetCurrentTimestamp() < deadline)
			return true;
		if (!pump_ready(&sw, conns))
			return false;
	}
}
