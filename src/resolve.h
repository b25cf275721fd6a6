/*-------------------------------------------------------------------------
 *
 * resolve.h
 *	  Host names to addresses, waited for on the latch (resolve.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/resolve.h
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

extern int	rl_resolve(const char *host, int port, TimestampTz deadline,
					   RLAddr **out, char **why);

#endif							/* RL_RESOLVE_H */
