/*-------------------------------------------------------------------------
 *
 * topology.h
 *	  Where a key lives: targets, their nodes and slot maps (topology.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/topology.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_TOPOLOGY_H
#define RL_TOPOLOGY_H

#include "transport.h"

typedef enum RLTopologyKind
{
	RL_TOPO_SINGLE,
	RL_TOPO_REDLOCK,
	RL_TOPO_SENTINEL,
	RL_TOPO_CLUSTER
} RLTopologyKind;

/* Redis Cluster slot map of a target */
typedef struct RLSlotMap
{
	int			nnodes;
	int			capacity;
	RLEndpoint *nodes;
	int16		owner[16384];	/* index into nodes, -1 unknown */
	bool		loaded;
} RLSlotMap;

/*
 * Where locks live.  Built from a spec text (see rl_target_from_spec),
 * cached for good; a held lock keeps pointing at the target it was taken on.
 */
struct RLTarget
{
	char	   *spec;			/* text it was built from */
	RLTopologyKind kind;
	int			nendpoints;
	RLEndpoint *endpoints;		/* single/redlock: the masters; sentinel: the
								 * sentinels; cluster: the seed */
	char	   *master_name;	/* sentinel: monitored master's name */
	RLEndpoint	data;			/* sentinel: user/db for the master */
	RLEndpoint	master;			/* sentinel: last discovered master */
	bool		master_known;
	RLSlotMap  *slots;			/* cluster */
	RLTarget   *next;
};

extern RLTarget *rl_current_target(void);
extern RLTarget *rl_target_from_spec(const char *spec);
extern int	rl_target_quorum(RLTarget *t);
extern uint16 rl_key_slot(const char *key, size_t len);

extern int	rl_target_nodes(RLTarget *t, const char *key, size_t keylen,
							RLConn **conns, bool subscriber, char **error);
extern int	rl_target_nodes_or_raise(RLTarget *t, const char *key, size_t keylen,
									 RLConn **conns, bool subscriber);
extern void rl_target_run(RLCall *calls, int ncalls, RLRunMode mode);
extern int	rl_target_max_nodes(RLTarget *t);
extern int	rl_target_timeout(RLTarget *t);
extern bool rl_reply_goes_again(RLReply *r);

#endif							/* RL_TOPOLOGY_H */
