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
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/topology.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <hiredis/hiredis.h>

#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/memutils.h"

#include "net/net.h"

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
			elog(ERROR, "invalid URL \"%s\" in list: %s", tok, msg);
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
		elog(ERROR, "malformed target \"%s\"", spec);
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
		/* sentinel|<master name>|<url giving user and db>|<sentinel urls> */
		const char *data = strchr(rest, '|');
		const char *list = data ? strchr(data + 1, '|') : NULL;
		char	   *msg;
		char	   *dataurl;
		int			i;

		if (list == NULL)
			elog(ERROR, "malformed target \"%s\"", spec);
		t->kind = RL_TOPO_SENTINEL;
		t->master_name = MemoryContextStrdup(TopMemoryContext,
											 pnstrdup(rest, data - rest));
		dataurl = pnstrdup(data + 1, list - data - 1);
		if (!rl_parse_url(dataurl, &t->data, &msg))
			elog(ERROR, "invalid URL \"%s\": %s", dataurl, msg);
		t->nendpoints = parse_list(list + 1, &t->endpoints);
		for (i = 0; i < t->nendpoints; i++)
			t->endpoints[i].sentinel = true;
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
		spec = psprintf("sentinel|%s|%s|%s", rl_sentinel_master, rl_url, rl_sentinels);
	else if (rl_cluster)
		spec = psprintf("cluster|%s", rl_url);
	else
		spec = psprintf("single|%s", rl_url);

	current = rl_target_from_spec(spec);
	pfree(spec);
	current_generation = rl_settings_generation;
	return current;
}

/* How many nodes must agree: a majority of Redlock masters, else 1 */
int
rl_target_quorum(RLTarget *t)
{
	return t->kind == RL_TOPO_REDLOCK ? t->nendpoints / 2 + 1 : 1;
}

/* Most nodes one lock operation on t is sent to */
int
rl_target_max_nodes(RLTarget *t)
{
	return t->kind == RL_TOPO_REDLOCK ? t->nendpoints : 1;
}

/* Redlock asks each master with a small timeout; others the command timeout */
int
rl_target_timeout(RLTarget *t)
{
	if (t->kind == RL_TOPO_REDLOCK)
		return Min(rl_node_timeout_ms, rl_command_timeout_ms);
	return rl_command_timeout_ms;
}

/* ----------------------------------------------------------------
 * Sentinel
 * ----------------------------------------------------------------
 */

/* Ask the master's ROLE: is it really a master (not a demoted one)? */
static bool
is_master(const RLEndpoint *ep)
{
	RLCall		call;
	const char *argv[1] = {"ROLE"};

	memset(&call, 0, sizeof(call));
	rl_call_set(&call, rl_conn_for(ep, false), 1, argv, NULL);
	rl_run(&call, 1, RL_RUN_SOFT, rl_command_timeout_ms);
	/* {"master", offset, replicas} */
	return rl_reply_fits(call.reply, "[t ?*]") &&
		strcmp(call.reply->element[0]->str, "master") == 0;
}

/*
 * Find the master through the Sentinels: ask all of them at once, take the
 * addresses they report, keep the first that confirms with ROLE.  When none
 * does, returns false with *error set; never raises for a Redis failure.
 */
static bool
discover_master(RLTarget *t, char **error)
{
	RLCall	   *calls = palloc0(sizeof(RLCall) * t->nendpoints);
	int			i;
	char	   *why = NULL;
	RLEndpoint	refused;		/* the address ROLE last refused */

	refused.port = 0;
	t->master_known = false;
	for (i = 0; i < t->nendpoints; i++)
	{
		const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", t->master_name};

		rl_call_set(&calls[i], rl_conn_for(&t->endpoints[i], false), 3, argv, NULL);
	}
	rl_run(calls, t->nendpoints, RL_RUN_SOFT, rl_command_timeout_ms);
	for (i = 0; i < t->nendpoints; i++)
	{
		RLReply    *r = calls[i].reply;
		RLEndpoint	ep;
		char	   *end;
		long		port;

		/* {host, port} */
		if (!rl_reply_fits(r, "[s s]"))
		{
			if (why == NULL)
				why = calls[i].error ? rl_call_problem(&calls[i]) :
					psprintf("Sentinel at %s does not know master \"%s\"",
							 rl_conn_label(calls[i].conn), t->master_name);
			continue;
		}
		ep = t->data;
		/* a master found through a TLS Sentinel is reached over TLS */
		ep.tls = ep.tls || t->endpoints[i].tls;
		if (r->element[0]->len == 0 || r->element[0]->len >= sizeof(ep.host))
			continue;
		strlcpy(ep.host, r->element[0]->str, sizeof(ep.host));
		port = strtol(r->element[1]->str, &end, 10);
		if (end == r->element[1]->str || *end != '\0' || port <= 0 || port > 65535)
			continue;
		ep.port = (int) port;
		/* Sentinels mostly name the same address: ask its ROLE once */
		if (refused.port == ep.port && strcmp(refused.host, ep.host) == 0)
			continue;
		if (is_master(&ep))
		{
			t->master = ep;
			t->master_known = true;
			break;
		}
		refused = ep;
		why = psprintf("%s:%d, named by the Sentinel at %s, is not a master (yet)",
					   ep.host, ep.port, rl_conn_label(calls[i].conn));
	}
	pfree(calls);
	if (!t->master_known)
		*error = psprintf("could not find the Redis master \"%s\" through Sentinel: %s",
						  t->master_name, why ? why : "no Sentinel answered");
	return t->master_known;
}

/* ----------------------------------------------------------------
 * Cluster
 * ----------------------------------------------------------------
 */
static int
slot_node_index(RLSlotMap *m, const RLEndpoint *proto, const char *host, int port)
{
	int			i;

	for (i = 0; i < m->nnodes; i++)
		if (m->nodes[i].port == port && strcmp(m->nodes[i].host, host) == 0)
			return i;
	if (m->nnodes == m->capacity)
	{
		m->capacity = Max(8, m->capacity * 2);
		m->nodes = m->nodes == NULL ?
			MemoryContextAlloc(TopMemoryContext, sizeof(RLEndpoint) * m->capacity) :
			repalloc(m->nodes, sizeof(RLEndpoint) * m->capacity);
	}
	m->nodes[m->nnodes] = *proto;
	strlcpy(m->nodes[m->nnodes].host, host, sizeof(m->nodes[0].host));
	m->nodes[m->nnodes].port = port;
	m->nodes[m->nnodes].db = 0;
	return m->nnodes++;
}

/* Parse "host:port" (last colon) from a MOVED/ASK reply */
static bool
parse_hostport(const char *s, char *host, size_t hostsz, int *port)
{
	const char *colon = strrchr(s, ':');

	if (colon == NULL || colon == s || (size_t) (colon - s) >= hostsz)
		return false;
	memcpy(host, s, colon - s);
	host[colon - s] = '\0';
	*port = atoi(colon + 1);
	return *port > 0;
}

/*
 * Load the slot map with CLUSTER SLOTS from the seeds or known nodes, the
 * first that answers.  When none does, returns false with *error set (the
 * old map, if any, stays as it was); never raises for a Redis failure.
 */
static bool
load_slots(RLTarget *t, const RLConn *avoid, char **error)
{
	RLSlotMap  *m = t->slots;
	int			i;
	char	   *why = NULL;

	if (m == NULL)
	{
		m = t->slots = MemoryContextAllocZero(TopMemoryContext, sizeof(RLSlotMap));
		for (i = 0; i < 16384; i++)
			m->owner[i] = -1;
	}
	for (i = 0; i < t->nendpoints + m->nnodes; i++)
	{
		const RLEndpoint *ep = i < t->nendpoints ? &t->endpoints[i] : &m->nodes[i - t->nendpoints];
		const char *argv[2] = {"CLUSTER", "SLOTS"};
		RLCall		call;
		RLReply    *r;
		size_t		k;

		memset(&call, 0, sizeof(call));
		rl_call_set(&call, rl_conn_for(ep, false), 2, argv, NULL);
		if (call.conn == avoid)
			continue;
		rl_run(&call, 1, RL_RUN_SOFT, rl_command_timeout_ms);
		r = call.reply;
		if (!rl_reply_fits(r, "[?*]"))
		{
			if (why == NULL)
				why = call.error || (r && r->type == REDIS_REPLY_ERROR) ?
					rl_call_problem(&call) :
					psprintf("%s replied without a slot map", rl_conn_label(call.conn));
			continue;
		}
		/* a slot the new map does not name has no known owner */
		for (k = 0; k < 16384; k++)
			m->owner[k] = -1;
		for (k = 0; k < r->elements; k++)
		{
			RLReply    *range = r->element[k];
			RLReply    *master;
			const char *host;
			long long	first;
			long long	last;
			long long	port;
			int			idx;
			int			s1;

			/* {first slot, last slot, {host, port, ...}, replicas...} */
			if (!rl_reply_fits(range, "[i i [s i ?*] ?*]"))
				continue;
			first = range->element[0]->integer;
			last = range->element[1]->integer;
			master = range->element[2];
			if (first < 0 || last > 16383 || first > last ||
				master->element[0]->len >= sizeof(ep->host))
				continue;
			port = master->element[1]->integer;
			if (port < 1 || port > 65535)
				continue;
			/* an empty host means "the node you asked" */
			host = master->element[0]->len > 0 ? master->element[0]->str : ep->host;
			idx = slot_node_index(m, &t->endpoints[0], host, (int) port);
			for (s1 = (int) first; s1 <= (int) last; s1++)
				m->owner[s1] = (int16) idx;
		}
		m->loaded = true;
		return true;
	}
	*error = psprintf("could not load the Redis Cluster slot map: %s",
					  why ? why : "no node answered");
	return false;
}

/* ----------------------------------------------------------------
 * Routing
 * ----------------------------------------------------------------
 */

/*
 * Connections for the node(s) holding key: every master for Redlock, else
 * one.  conns needs room for rl_target_max_nodes(t).  May talk to Redis to
 * learn the topology (Sentinel, Cluster); when that fails, returns -1 with
 * *error set.  Raises only for interrupts.
 */
int
rl_target_nodes(RLTarget *t, const char *key, size_t keylen, RLConn **conns,
				bool subscriber, char **error)
{
	int			i;

	*error = NULL;
	switch (t->kind)
	{
		case RL_TOPO_REDLOCK:
			for (i = 0; i < t->nendpoints; i++)
				conns[i] = rl_conn_for(&t->endpoints[i], subscriber);
			return t->nendpoints;
		case RL_TOPO_SENTINEL:
			if (!t->master_known && !discover_master(t, error))
				return -1;
			conns[0] = rl_conn_for(&t->master, subscriber);
			return 1;
		case RL_TOPO_CLUSTER:
			{
				int			owner;

				if ((t->slots == NULL || !t->slots->loaded) &&
					!load_slots(t, NULL, error))
					return -1;
				owner = t->slots->owner[rl_key_slot(key, keylen)];
				conns[0] = rl_conn_for(owner >= 0 ? &t->slots->nodes[owner] : &t->endpoints[0],
									   subscriber);
				return 1;
			}
		default:
			conns[0] = rl_conn_for(&t->endpoints[0], subscriber);
			return 1;
	}
}

/* rl_target_nodes for callers that cannot go on without the nodes */
int
rl_target_nodes_or_raise(RLTarget *t, const char *key, size_t keylen,
						 RLConn **conns, bool subscriber)
{
	char	   *error;
	int			n = rl_target_nodes(t, key, keylen, conns, subscriber, &error);

	if (n < 0)
	{
		RLCall		call;

		memset(&call, 0, sizeof(call));
		call.key = key;
		call.keylen = keylen;
		rl_call_fail(&call, RL_FAIL_ROUTE,
					 ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION, error);
		rl_raise_call_error(&call);
	}
	return n;
}

/* Where a MOVED/ASK reply points; false if it is not one */
static bool
redirect_of(RLCall *c, bool *ask, int *slot, RLEndpoint *to)
{
	RLReply    *r = c->reply;
	char		host[256];
	int			port;
	char	   *sp;

	if (r == NULL || r->type != REDIS_REPLY_ERROR || c->target == NULL ||
		c->target->kind != RL_TOPO_CLUSTER)
		return false;
	if (strncmp(r->str, "MOVED ", 6) == 0)
		*ask = false;
	else if (strncmp(r->str, "ASK ", 4) == 0)
		*ask = true;
	else
		return false;
	*slot = atoi(r->str + (*ask ? 4 : 6));
	sp = strrchr(r->str, ' ');
	if (sp == NULL || !parse_hostport(sp + 1, host, sizeof(host), &port))
		return false;
	*to = c->target->endpoints[0];
	strlcpy(to->host, host, sizeof(to->host));
	to->port = port;
	to->db = 0;
	return true;
}

/* Sentinel: did this call fail because the master moved? */
static bool
master_gone(RLCall *c)
{
	if (c->target == NULL || c->target->kind != RL_TOPO_SENTINEL)
		return false;
	if (c->error != NULL)
		return true;
	return rl_reply_is_error(c->reply, "READONLY") ||
		rl_reply_is_error(c->reply, "MASTERDOWN") ||
		rl_reply_is_error(c->reply, "LOADING");
}

/* Cluster: did this call fail because its node died or lost the slot? */
static bool
node_gone(RLCall *c)
{
	if (c->target == NULL || c->target->kind != RL_TOPO_CLUSTER)
		return false;
	return c->error != NULL || rl_reply_is_error(c->reply, "CLUSTERDOWN");
}

/*
 * Learn again where c's key lives after its node failed: the Sentinel
 * master, or the cluster slot map (no MOVED ever comes from a dead node;
 * the map is asked of the other nodes first).  Each target is refreshed at
 * most once per round (done/ndone).  Returns the connection to retry on, or
 * NULL to leave the failure as it is: the key still lives on the node that
 * failed, or where it lives could not be learnt.
 */
static RLConn *
reroute(RLCall *c, RLTarget **done, int *ndone)
{
	RLTarget   *t = c->target;
	RLConn	   *to = NULL;
	char	   *error = NULL;
	bool		ok = true;
	int			i;

	for (i = 0; i < *ndone && done[i] != t; i++)
		;
	if (i == *ndone)
	{
		done[(*ndone)++] = t;
		if (t->kind == RL_TOPO_SENTINEL)
			ok = discover_master(t, &error);
		else
		{
			ok = load_slots(t, c->conn, &error);
			if (!ok)
				t->slots->loaded = false;	/* the next call tries again */
		}
	}
	if (t->kind == RL_TOPO_SENTINEL)
	{
		if (ok && t->master_known)
			to = rl_conn_for(&t->master, false);
	}
	else if (ok && t->slots->loaded)
	{
		int			owner = t->slots->owner[rl_key_slot(c->key, c->keylen)];

		if (owner >= 0)
			to = rl_conn_for(&t->slots->nodes[owner], false);
	}
	return to == c->conn ? NULL : to;
}

/* The round trip bound of calls: the tightest of their targets, plus WAIT */
static int
round_timeout(RLCall *calls, int ncalls)
{
	int			timeout = rl_command_timeout_ms;
	int			extra = 0;
	int			i;

	for (i = 0; i < ncalls; i++)
	{
		if (calls[i].target != NULL)
			timeout = Min(timeout, rl_target_timeout(calls[i].target));
		extra = Max(extra, calls[i].extra_ms);
	}
	return timeout + extra;
}

/* What rl_target_run remembers across its retry rounds */
typedef struct RetryState
{
	bool	   *rerouted;		/* per call: its key was re-routed already */
	RLTarget  **done;			/* targets whose topology was re-learnt */
	int			ndone;
	int		   *redo;			/* calls to send again this round */
} RetryState;

/*
 * The call of a group (RLCall.follows) that says whether the group goes
 * again: the first one redirected, told to try again or refused by a node
 * that is gone (in MULTI ... EXEC a queued command gets the MOVED, EXEC
 * only EXECABORT), or failed on the way; else the group's first.
 */
static RLCall *
group_verdict(RLCall *group, int len)
{
	int			i;

	for (i = 0; i < len; i++)
	{
		if (group[i].error != NULL || rl_reply_goes_again(group[i].reply))
			return &group[i];
	}
	return &group[0];
}

/*
 * Is r an error rl_target_run answers by sending the call again, elsewhere
 * or later: a redirection, TRYAGAIN, or a node that is no (usable) master?
 * The command did not run there.
 */
bool
rl_reply_goes_again(RLReply *r)
{
	static const char *const again[] = {"MOVED ", "ASK ", "TRYAGAIN",
	"READONLY", "MASTERDOWN", "LOADING", "CLUSTERDOWN"};
	int			k;

	for (k = 0; k < (int) lengthof(again); k++)
		if (rl_reply_is_error(r, again[k]))
			return true;
	return false;
}

/*
 * Decide which calls go again, pointing each at its new node: MOVED and ASK
 * (counted in *redirects), TRYAGAIN (*tryagain), and once per call a node
 * that failed.  A group (a call and those that follow it: WAIT after a
 * script, MULTI ... EXEC) goes whole, to one node, with ASKING before its
 * first call.  Returns how many calls are in rs->redo.
 */
static int
plan_retries(RLCall *calls, int ncalls, RetryState *rs, int *redirects,
			 bool *tryagain)
{
	int			nredo = 0;
	int			i;
	int			len;

	rs->ndone = 0;
	*tryagain = false;
	for (i = 0; i < ncalls; i += len)
	{
		RLCall	   *c = &calls[i];
		RLCall	   *v;
		bool		ask;
		int			slot;
		RLEndpoint	to;
		int			j;

		len = rl_group_len(calls, ncalls, i);
		v = group_verdict(c, len);
		if (redirect_of(v, &ask, &slot, &to))
		{
			RLSlotMap  *m = v->target->slots;

			if (!ask && m != NULL && slot >= 0 && slot < 16384)
				m->owner[slot] = (int16) slot_node_index(m, &to, to.host, to.port);
			c->conn = rl_conn_for(&to, false);
			c->asking = ask;
			(*redirects)++;
		}
		else if (rl_reply_is_error(v->reply, "TRYAGAIN"))
		{
			*tryagain = true;
			c->asking = false;
		}
		else if (!rs->rerouted[i] && c->key != NULL &&
				 (master_gone(v) || node_gone(v)))
		{
			RLConn	   *conn;

			rs->rerouted[i] = true;
			conn = reroute(c, rs->done, &rs->ndone);
			if (conn == NULL)
				continue;
			c->conn = conn;
		}
		else
			continue;
		for (j = 0; j < len; j++)
		{
			calls[i + j].conn = c->conn;
			rs->redo[nredo++] = i + j;
		}
	}
	return nredo;
}

/*
 * Send the calls listed in redo again, in one round trip.  A call that
 * failed after its bytes went out (re-routed), or whose earlier send may
 * have run, stays marked resent (RLCall.resent): its reply is not the
 * first send's.
 */
static void
run_again(RLCall *calls, const int *redo, int nredo, int timeout)
{
	RLCall	   *again = palloc(sizeof(RLCall) * nredo);
	bool	   *ran = palloc(sizeof(bool) * nredo);
	int			i;

	for (i = 0; i < nredo; i++)
	{
		again[i] = calls[redo[i]];
		ran[i] = again[i].resent || (again[i].error != NULL && again[i].sent);
	}
	rl_run(again, nredo, RL_RUN_SOFT, timeout);
	for (i = 0; i < nredo; i++)
	{
		calls[redo[i]] = again[i];
		calls[redo[i]].asking = false;
		calls[redo[i]].resent |= ran[i];
	}
	pfree(again);
	pfree(ran);
}

/*
 * Run calls built for targets' nodes.  Always soft underneath; then follows
 * cluster redirections (MOVED updates the slot map, ASK is sent with ASKING),
 * waits out TRYAGAIN during slot migration, and, once per call, re-learns
 * where a key lives when its node failed (a Sentinel master that moved, a
 * cluster master that died and was replaced).  A group of calls (WAIT after
 * a script, a MULTI ... EXEC transaction) is always sent again whole.
 * Only then, in hard mode, a remaining failure raises.  Resending is safe
 * because every script, and every script-free form, is idempotent per
 * token (protocol.c).
 */
void
rl_target_run(RLCall *calls, int ncalls, RLRunMode mode)
{
	TimestampTz deadline = 0;
	int			redirects = 0;
	long		pause_ms = 5;
	int			timeout = round_timeout(calls, ncalls);
	RetryState	rs;
	int			i;

	rs.rerouted = palloc0(sizeof(bool) * Max(ncalls, 1));
	rs.done = palloc(sizeof(RLTarget *) * Max(ncalls, 1));
	rs.redo = palloc(sizeof(int) * Max(ncalls, 1));
	rl_run(calls, ncalls, RL_RUN_SOFT, timeout);

	/* redirections are bounded by count, TRYAGAIN only by the deadline */
	while (redirects < 16)
	{
		bool		tryagain;
		int			nredo = plan_retries(calls, ncalls, &rs, &redirects, &tryagain);

		if (nredo == 0)
			break;
		if (deadline == 0)
			deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout);
		else if (GetCurrentTimestamp() >= deadline)
			break;
		if (tryagain)
		{
			/* a multi-key script in a slot being migrated: wait a little */
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 pause_ms, rl_wait_event(RL_WAIT_RETRY));
			pause_ms = Min(pause_ms * 2, 50);
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
		run_again(calls, rs.redo, nredo, timeout);
	}
	pfree(rs.rerouted);
	pfree(rs.done);
	pfree(rs.redo);

	if (mode == RL_RUN_HARD)
		for (i = 0; i < ncalls; i++)
			if (calls[i].error != NULL)
				rl_raise_call_error(&calls[i]);
}
