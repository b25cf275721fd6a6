/*-------------------------------------------------------------------------
 *
 * resolve.c
 *	  Owns turning a host name into addresses without blocking the backend:
 *	  c-ares, its sockets waited for on the latch, bounded by the caller's
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
 *	  src/resolve.c
 *
 *-------------------------------------------------------------------------
 */
#include "resolve.h"

#include <arpa/inet.h>
#include <ares.h>
#include <netinet/in.h>

#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/memutils.h"

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
 * What the c-ares callbacks learnt: the answer (set from inside
 * ares_process_fd or ares_destroy) and the sockets to wait for (kept by the
 * socket-state callback as c-ares opens, closes and re-arms them; c-ares
 * 1.34 deprecates asking for them with ares_getsock)
 */
typedef struct Resolution
{
	bool		done;
	int			status;
	struct ares_addrinfo *res;
	int			nsocks;
	ResolverSocket socks[RL_RESOLVER_SOCKETS];
} Resolution;

static void
resolved(void *arg, int status, int timeouts, struct ares_addrinfo *res)
{
	Resolution *r = (Resolution *) arg;

	r->done = true;
	r->status = status;
	r->res = res;
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

/*
 * When the resolutions made while a cancel or terminate is pending with
 * interrupts held must end (0: none pending): one bound for all of them, so
 * that the several names of one wait (Redlock masters, Sentinels) share
 * RL_HELD_WAIT_CUT_MS rather than get it each.
 */
static TimestampTz held_cut_at = 0;

/*
 * The addresses of host (IPv4 first, then IPv6) with port, palloc'd in the
 * current memory context into *out; their number, or 0 with *why set when
 * the name cannot be resolved by deadline.  Cancel and terminate interrupt
 * it with an ERROR; nothing c-ares allocated outlives that.
 */
int
rl_resolve(const char *host, int port, TimestampTz deadline, RLAddr **out, char **why)
{
	static bool library_ready = false;
	ares_channel ch;
	Resolution	r;
	struct ares_addrinfo_hints hints;
	char		service[16];
	WaitEventSet *volatile set = NULL;
	int			n;

	*out = NULL;
	if (numeric(host, port, out) == 1)
		return 1;
	if (!library_ready)
	{
		if (ares_library_init(ARES_LIB_INIT_ALL) != ARES_SUCCESS)
		{
			*why = pstrdup("could not start the name resolver");
			return 0;
		}
		library_ready = true;
	}
	memset(&r, 0, sizeof(r));
	if (!channel_init(&ch, &r))
	{
		*why = pstrdup("could not start the name resolver");
		return 0;
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = ARES_AI_NUMERICSERV;
	snprintf(service, sizeof(service), "%d", port);
	PG_TRY();
	{
		TimestampTz end = deadline;

		if (!rl_held_wait_interrupted())
			held_cut_at = 0;
		ares_getaddrinfo(ch, host, service, &hints, resolved, &r);
		while (!r.done)
		{
			TimestampTz now = GetCurrentTimestamp();
			struct timeval tv;
			struct timeval *tvp;
			long		wait_ms;

			/* with interrupts held, a pending cancel cuts the wait short */
			if (rl_held_wait_interrupted())
			{
				if (held_cut_at == 0)
					held_cut_at = TimestampTzPlusMilliseconds(now, RL_HELD_WAIT_CUT_MS);
				end = Min(end, held_cut_at);
			}
			if (now >= end)
				break;
			wait_ms = (long) ((end - now + 999) / 1000);
			tvp = ares_timeout(ch, NULL, &tv);
			if (tvp != NULL)
				wait_ms = Min(wait_ms, (long) (tvp->tv_sec * 1000 + (tvp->tv_usec + 999) / 1000));
			wait_once(ch, &r, Max(wait_ms, 1), &set);
		}
	}
	PG_CATCH();
	{
		if (set != NULL)
			FreeWaitEventSet(set);
		ares_destroy(ch);		/* runs the callback: r.res may be set */
		if (r.res != NULL)
			ares_freeaddrinfo(r.res);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (!r.done)
	{
		ares_destroy(ch);
		if (r.res != NULL)
			ares_freeaddrinfo(r.res);
		*why = pstrdup("name resolution timed out");
		return 0;
	}
	ares_destroy(ch);
	if (r.status != ARES_SUCCESS || r.res == NULL)
	{
		if (r.res != NULL)
			ares_freeaddrinfo(r.res);
		*why = pstrdup(ares_strerror(r.status));
		return 0;
	}
	n = collect(r.res, out);
	ares_freeaddrinfo(r.res);
	if (n < 0)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	if (n == 0)
		*why = pstrdup("no address");
	return n;
}
