/*-------------------------------------------------------------------------
 *
 * resolve.c
 *	  Owns turning host names into addresses without blocking the backend:
 *	  c-ares, the names of one round trip asked for together on one
 *	  channel, its sockets waited for on the latch, bounded by the caller's
 *	  deadline; cancel and terminate end the wait at once.  getaddrinfo
 *	  would block past redis_lock.connect_timeout and ignore cancel (a DNS
 *	  server that never answers held a backend for 6 s).  Numeric
 *	  addresses never reach the resolver; names in /etc/hosts are answered
 *	  by c-ares without the network.
 *
 *	  Must not: open connections (stream.c does), know about Redis.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/resolve.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <arpa/inet.h>
#include <ares.h>
#include <netinet/in.h>

#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/memutils.h"

#include "net/net.h"

/* The most resolver sockets waited for at once (one per name server and
 * protocol in use); more are left to c-ares's own timeouts */
#define RL_RESOLVER_SOCKETS 16

/* A socket c-ares wants watched, and for what */
typedef struct ResolverSocket
{
	ares_socket_t fd;
	bool		readable;
	bool		writable;
} ResolverSocket;

/*
 * What the c-ares callbacks learnt of one name: its answer (set from inside
 * ares_process_fd or ares_destroy)
 */
typedef struct Answer
{
	bool		done;
	bool		timed_out;		/* not done by the deadline */
	TimestampTz done_at;
	int			status;
	struct ares_addrinfo *res;
} Answer;

/*
 * The sockets of a channel to wait for (kept by the socket-state callback
 * as c-ares opens, closes and re-arms them; c-ares 1.34 deprecates asking
 * for them with ares_getsock)
 */
typedef struct Resolution
{
	int			nsocks;
	ResolverSocket socks[RL_RESOLVER_SOCKETS];
} Resolution;

static void
resolved(void *arg, int status, int timeouts, struct ares_addrinfo *res)
{
	Answer	   *a = (Answer *) arg;

	a->done = true;
	a->done_at = GetCurrentTimestamp();
	a->status = status;
	a->res = res;
}

static void
socket_state(void *arg, ares_socket_t fd, int readable, int writable)
{
	Resolution *r = (Resolution *) arg;
	int			i;

	for (i = 0; i < r->nsocks; i++)
		if (r->socks[i].fd == fd)
			break;
	if (!readable && !writable)
	{
		/* closed: forget it */
		if (i < r->nsocks)
			r->socks[i] = r->socks[--r->nsocks];
		return;
	}
	if (i == r->nsocks)
	{
		if (r->nsocks == RL_RESOLVER_SOCKETS)
			return;
		r->nsocks++;
	}
	r->socks[i].fd = fd;
	r->socks[i].readable = readable != 0;
	r->socks[i].writable = writable != 0;
}

/* A numeric address: no resolver needed */
static int
numeric(const char *host, int port, RLAddr **out)
{
	RLAddr		a;

	memset(&a, 0, sizeof(a));
	if (inet_pton(AF_INET, host, &((struct sockaddr_in *) &a.sa)->sin_addr) == 1)
	{
		((struct sockaddr_in *) &a.sa)->sin_family = AF_INET;
		((struct sockaddr_in *) &a.sa)->sin_port = htons(port);
		a.family = AF_INET;
		a.len = sizeof(struct sockaddr_in);
	}
	else if (inet_pton(AF_INET6, host, &((struct sockaddr_in6 *) &a.sa)->sin6_addr) == 1)
	{
		((struct sockaddr_in6 *) &a.sa)->sin6_family = AF_INET6;
		((struct sockaddr_in6 *) &a.sa)->sin6_port = htons(port);
		a.family = AF_INET6;
		a.len = sizeof(struct sockaddr_in6);
	}
	else
		return 0;
	*out = palloc(sizeof(RLAddr));
	**out = a;
	return 1;
}

/*
 * The addresses c-ares found, IPv4 first (as hiredis did), then IPv6; -1
 * when out of memory (no ERROR: c-ares' result is still to be freed)
 */
static int
collect(struct ares_addrinfo *res, RLAddr **out)
{
	struct ares_addrinfo_node *node;
	int			n = 0;
	int			pass;

	for (node = res->nodes; node != NULL; node = node->ai_next)
		n++;
	*out = palloc_extended(sizeof(RLAddr) * Max(n, 1), MCXT_ALLOC_NO_OOM | MCXT_ALLOC_ZERO);
	if (*out == NULL)
		return -1;
	n = 0;
	for (pass = 0; pass < 2; pass++)
	{
		int			family = pass == 0 ? AF_INET : AF_INET6;

		for (node = res->nodes; node != NULL; node = node->ai_next)
		{
			if (node->ai_family != family ||
				node->ai_addrlen > (ares_socklen_t) sizeof(struct sockaddr_storage))
				continue;
			(*out)[n].family = family;
			(*out)[n].len = node->ai_addrlen;
			memcpy(&(*out)[n].sa, node->ai_addr, node->ai_addrlen);
			n++;
		}
	}
	return n;
}

/*
 * One wait for the resolver's sockets or the latch, at most wait_ms; then
 * let c-ares read what came, or act on its timeouts.
 */
static void
wait_once(ares_channel ch, const Resolution *r, long wait_ms,
		  WaitEventSet *volatile *setp)
{
	WaitEvent	occurred[RL_RESOLVER_SOCKETS + 2];
	int			nev;
	int			i;

#if PG_VERSION_NUM >= 170000
	*setp = CreateWaitEventSet(NULL, RL_RESOLVER_SOCKETS + 2);
#else
	*setp = CreateWaitEventSet(CurrentMemoryContext, RL_RESOLVER_SOCKETS + 2);
#endif
	AddWaitEventToSet(*setp, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(*setp, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	for (i = 0; i < r->nsocks; i++)
	{
		uint32		ev = 0;

		if (r->socks[i].readable)
			ev |= WL_SOCKET_READABLE;
		if (r->socks[i].writable)
			ev |= WL_SOCKET_WRITEABLE;
		AddWaitEventToSet(*setp, ev, r->socks[i].fd, NULL, NULL);
	}
	nev = WaitEventSetWait(*setp, wait_ms, occurred, lengthof(occurred),
						   rl_wait_event(RL_WAIT_CONNECT));
	FreeWaitEventSet(*setp);
	*setp = NULL;
	if (nev == 0)
		ares_process_fd(ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
	for (i = 0; i < nev; i++)
	{
		if (occurred[i].events & WL_LATCH_SET)
		{
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
		else
			ares_process_fd(ch,
							(occurred[i].events & WL_SOCKET_READABLE) ? occurred[i].fd : ARES_SOCKET_BAD,
							(occurred[i].events & WL_SOCKET_WRITEABLE) ? occurred[i].fd : ARES_SOCKET_BAD);
	}
}

/*
 * A resolver channel with the system's configuration, telling r which
 * sockets to wait for.  A test bed can point
 * it at another resolv.conf with RL_TEST_RESOLV_CONF in the server's
 * environment (t/test_resolve.py: a DNS server that never answers, one
 * that gives a name two addresses); nothing else reads that variable.
 */
static bool
channel_init(ares_channel *ch, Resolution *r)
{
	struct ares_options opts;
	int			mask = ARES_OPT_SOCK_STATE_CB;
	char	   *conf = getenv("RL_TEST_RESOLV_CONF");

	memset(&opts, 0, sizeof(opts));
	opts.sock_state_cb = socket_state;
	opts.sock_state_cb_data = r;
	if (conf != NULL && conf[0] != '\0')
	{
		opts.resolvconf_path = conf;
		mask |= ARES_OPT_RESOLVCONF;
	}
	return ares_init_options(ch, &opts, mask) == ARES_SUCCESS;
}

/* Are all the answers in? */
static bool
all_done(const Answer *answers, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		if (!answers[i].done)
			return false;
	return true;
}

/*
 * Wait for the answers on channel ch until deadline, and, with interrupts
 * held, no longer than RL_HELD_WAIT_CUT_MS (rl_held_wait_bounded).
 */
static void
await_answers(ares_channel ch, Resolution *r, Answer *answers, int n,
			  TimestampTz deadline, WaitEventSet *volatile *setp)
{
	TimestampTz end = deadline;

	if (rl_held_wait_bounded())
		end = Min(end, TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												   RL_HELD_WAIT_CUT_MS));
	while (!all_done(answers, n))
	{
		TimestampTz now = GetCurrentTimestamp();
		struct timeval tv;
		struct timeval *tvp;
		long		wait_ms;

		if (now >= end)
			break;
		wait_ms = (long) ((end - now + 999) / 1000);
		tvp = ares_timeout(ch, NULL, &tv);
		if (tvp != NULL)
			wait_ms = Min(wait_ms, (long) (tvp->tv_sec * 1000 + (tvp->tv_usec + 999) / 1000));
		wait_once(ch, r, Max(wait_ms, 1), setp);
	}
}

/* Fill in name from its answer a, asked at start; frees what c-ares allocated */
static void
take_answer(RLResolution *name, Answer *a, TimestampTz start)
{
	int			n;

	name->took_ms = (a->done_at - start) / 1000;
	if (a->timed_out)
		name->why = pstrdup("name resolution timed out");
	else if (a->status != ARES_SUCCESS || a->res == NULL)
		name->why = pstrdup(ares_strerror(a->status));
	if (name->why != NULL)
	{
		if (a->res != NULL)
			ares_freeaddrinfo(a->res);
		a->res = NULL;
		return;
	}
	n = collect(a->res, &name->addrs);
	ares_freeaddrinfo(a->res);
	a->res = NULL;
	if (n < 0)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	name->naddrs = n;
	if (n == 0)
		name->why = pstrdup("no address");
}

/*
 * Resolve the names together, by deadline: one query each, all on one
 * channel, waited for together, so that several names (Redlock masters,
 * Sentinels, the nodes of one round) cost the slowest, not the sum.  Each
 * name gets its addresses (IPv4 first, then IPv6) with its port, palloc'd
 * in the current memory context, or naddrs 0 and why.  Numeric addresses
 * never reach the resolver.  Cancel and terminate interrupt it with an
 * ERROR; nothing c-ares allocated outlives that.
 */
void
rl_resolve_all(RLResolution *names, int n, TimestampTz deadline)
{
	static bool library_ready = false;
	ares_channel ch;
	Resolution	r;
	Answer	   *volatile answers;
	struct ares_addrinfo_hints hints;
	WaitEventSet *volatile set = NULL;
	TimestampTz start = GetCurrentTimestamp();
	int			nasked = 0;
	int			i;

	for (i = 0; i < n; i++)
	{
		names[i].addrs = NULL;
		names[i].why = NULL;
		names[i].took_ms = 0;
		names[i].naddrs = numeric(names[i].host, names[i].port, &names[i].addrs);
		if (names[i].naddrs == 0)
			nasked++;
	}
	if (nasked == 0)
		return;
	if (!library_ready && ares_library_init(ARES_LIB_INIT_ALL) == ARES_SUCCESS)
		library_ready = true;
	memset(&r, 0, sizeof(r));
	if (!library_ready || !channel_init(&ch, &r))
	{
		for (i = 0; i < n; i++)
			if (names[i].naddrs == 0)
				names[i].why = pstrdup("could not start the name resolver");
		return;
	}
	answers = palloc0(sizeof(Answer) * n);
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = ARES_AI_NUMERICSERV;
	PG_TRY();
	{
		for (i = 0; i < n; i++)
		{
			char		service[16];

			if (names[i].naddrs > 0)
			{
				answers[i].done = true;
				continue;
			}
			snprintf(service, sizeof(service), "%d", names[i].port);
			ares_getaddrinfo(ch, names[i].host, service, &hints, resolved, &answers[i]);
		}
		await_answers(ch, &r, answers, n, deadline, &set);
	}
	PG_CATCH();
	{
		if (set != NULL)
			FreeWaitEventSet(set);
		ares_destroy(ch);		/* runs the callbacks: answers may be set */
		for (i = 0; i < n; i++)
			if (answers[i].res != NULL)
				ares_freeaddrinfo(answers[i].res);
		PG_RE_THROW();
	}
	PG_END_TRY();
	/* what has not come yet is called back now, without an answer */
	for (i = 0; i < n; i++)
		answers[i].timed_out = !answers[i].done;
	ares_destroy(ch);
	PG_TRY();
	{
		for (i = 0; i < n; i++)
			if (names[i].naddrs == 0)
				take_answer(&names[i], &answers[i], start);
	}
	PG_CATCH();
	{
		for (i = 0; i < n; i++)
			if (answers[i].res != NULL)
				ares_freeaddrinfo(answers[i].res);
		PG_RE_THROW();
	}
	PG_END_TRY();
	pfree(answers);
}
