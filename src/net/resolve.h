/*-------------------------------------------------------------------------
 *
 * resolve.h
 *	  Host names to addresses, waited for on the latch (resolve.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/resolve.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_RESOLVE_H
#define RL_RESOLVE_H

#include "settings.h"

#include <sys/socket.h>

/* One address to connect to */
typedef struct RLAddr
{
	int			family;
	socklen_t	len;
	struct sockaddr_storage sa;
} RLAddr;

/* One name to resolve (rl_resolve_all), and what came of it */
typedef struct RLResolution
{
	const char *host;
	int			port;
	RLAddr	   *addrs;			/* IPv4 first, then IPv6; palloc'd */
	int			naddrs;			/* 0: not resolved, why says why */
	char	   *why;
	int64		took_ms;		/* how long its answer took (0: numeric) */
} RLResolution;

extern void rl_resolve_all(RLResolution *names, int n, TimestampTz deadline);

#endif							/* RL_RESOLVE_H */
