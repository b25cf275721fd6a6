/*-------------------------------------------------------------------------
 *
 * topology.c
 *	  Owns the answer to "which Redis server(s) does this key live on":
 *	  one server (redis_lock.url), several independent Redlock masters
 *	  (redis_lock.nodes), a master found through Sentinel
 *	  (redis_lock.sentinels), or the slot owner in a Redis Cluster.  Also
 *	  the cluster key-slot function.
 *
 *	  Targets are built from the settings and cached by their text; a held
 *	  lock keeps pointing at the target it was taken on, so changing the
 *	  settings never redirects the release of a lock already held.
 *
 *	  Nothing here knows about scripts or the lock table.
 *
 *-------------------------------------------------------------------------
 */
#include "redis_lock.h"

#include "utils/memutils.h"

static RLTarget *targets = NULL;
static RLTarget *current = NULL;
static uint64 current_generation = 0;

/* CRC16-CCITT (XMODEM), as Redis Cluster uses for key slots */
static uint16
crc16(const char *buf, size_t len)
{
	static uint16 table[256];
	static bool ready = false;
	uint16		crc = 0;
	size_t		i;

	if (!ready)
	{
		int			n;

		for (n = 0; n < 256; n++)
		{
			uint16		c = (uint16) (n << 8);
			int			k;

			for (k = 0; k < 8; k++)
				c = (c & 0x8000) ? (uint16) ((c << 1) ^ 0x1021) : (uint16) (c << 1);
			table[n] = c;
		}
		ready = true;
	}
	for (i = 0; i < len; i++)
		crc = (uint16) ((crc << 8) ^ table[((crc >> 8) ^ (uint8) buf[i]) & 0xff]);
	return crc;
}

/* Cluster slot of a key, honouring {hash tags} */
uint16
rl_key_slot(const char *key, size_t len)
{
	const char *open = memchr(key, '{', len);

	if (open != NULL)
	{
		const char *close = memchr(open + 1, '}', len - (open + 1 - key));

		if (close != NULL && close > open + 1)
			return crc16(open + 1, close - open - 1) & 16383;
	}
	return crc16(key, len) & 16383;
}

/* Parse a comma-separated URL list into endpoints (TopMemoryContext) */
static int
parse_list(const char *list, RLEndpoint **out)
{
	char	   *copy = pstrdup(list);
	char	   *tok;
	char	   *save = NULL;
	int			n = 0;
	int			cap = 4;
	RLEndpoint *eps = MemoryContextAlloc(TopMemoryContext, sizeof(RLEndpoint) * cap);

	for (tok = strtok_r(copy, ", \t", &save); tok != NULL;
		 tok = strtok_r(NULL, ", \t", &save))
	{
		char	   *msg;

		if (n == cap)
		{
			cap *= 2;
			eps = repalloc(eps, sizeof(RLEndpoint) * cap);
		}
		/* the check hook accepted the list, so this cannot fail */
		if (!rl_parse_url(tok, &eps[n], &msg))
			elog(ERROR, "redis_lock: invalid URL \"%s\" in list: %s", tok, msg);
		n++;
	}
	pfree(copy);
	*out = eps;
	return n;
}

/*
 * The target a spec text describes ("single|url", "redlock|urls",
 * "sentinel|master|urls", "cluster|url"); built once, cached for good.
 */
RLTarget *
rl_target_from_spec(const char *spec)
{
	RLTarget   *t;
	const char *rest = strchr(spec, '|');

	for (t = targets; t != NULL; t = t->next)
		if (strcmp(t->spec, spec) == 0)
			return t;
	if (rest == NULL)
		elog(ERROR, "redis_lock: malformed target \"%s\"", spec);
	rest++;

	t = MemoryContextAllocZero(TopMemoryContext, sizeof(RLTarget));
	t->spec = MemoryContextStrdup(TopMemoryContext, spec);
	if (strncmp(spec, "redlock|", 8) == 0)
	{
		t->kind = RL_TOPO_REDLOCK;
		t->nendpoints = parse_list(rest, &t->endpoints);
	}
	else if (strncmp(spec, "sentinel|", 9) == 0)
	{
		const char *list = strchr(rest, '|');

		if (list == NULL)
			elog(ERROR, "redis_lock: malformed target \"%s\"", spec);
		t->kind = RL_TOPO_SENTINEL;
		t->master_name = MemoryContextStrdup(TopMemoryContext,
											 pnstrdup(rest, list - rest));
		t->nendpoints = parse_list(list + 1, &t->endpoints);
	}
	else if (strncmp(spec, "cluster|", 8) == 0)
	{
		t->kind = RL_TOPO_CLUSTER;
		t->nendpoints = parse_list(rest, &t->endpoints);
	}
	else
	{
		t->kind = RL_TOPO_SINGLE;
		t->nendpoints = parse_list(rest, &t->endpoints);
	}
	t->next = targets;
	targets = t;
	return t;
}

/*
 * The target the current settings describe.  Precedence: redis_lock.nodes
 * (Redlock), then redis_lock.sentinels, then redis_lock.url (as a cluster
 * seed when redis_lock.cluster is on).
 */
RLTarget *
rl_current_target(void)
{
	char	   *spec;

	if (current != NULL && current_generation == rl_settings_generation)
		return current;

	if (rl_nodes != NULL && rl_nodes[0] != '\0')
		spec = psprintf("redlock|%s", rl_nodes);
	else if (rl_sentinels != NULL && rl_sentinels[0] != '\0')
		spec = psprintf("sentinel|%s|%s", rl_sentinel_master, rl_sentinels);
	else if (rl_cluster)
		spec = psprintf("cluster|%s", rl_url);
	else
		spec = psprintf("single|%s", rl_url);

	current = rl_target_from_spec(spec);
	pfree(spec);
	current_generation = rl_settings_generation;
	return current;
}

int
rl_target_quorum(RLTarget *t)
{
	return t->kind == RL_TOPO_REDLOCK ? t->nendpoints / 2 + 1 : 1;
}

int
rl_target_max_nodes(RLTarget *t)
{
	return t->kind == RL_TOPO_REDLOCK ? t->nendpoints : 1;
}

/*
 * Connections for the node(s) holding key: one per Redlock master, else
 * one.  conns must have room for rl_target_max_nodes(t).
 */
int
rl_target_nodes(RLTarget *t, const char *key, size_t keylen, RLConn **conns,
				bool subscriber)
{
	int			i;

	switch (t->kind)
	{
		case RL_TOPO_REDLOCK:
			for (i = 0; i < t->nendpoints; i++)
				conns[i] = rl_conn_for(&t->endpoints[i], subscriber);
			return t->nendpoints;
		default:
			conns[0] = rl_conn_for(&t->endpoints[0], subscriber);
			return 1;
	}
}

/* Run calls built for this target's nodes */
void
rl_target_run(RLTarget *t, RLCall *calls, int ncalls, int mode)
{
	rl_run(calls, ncalls, mode, rl_command_timeout_ms);
}
