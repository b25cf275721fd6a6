/*-------------------------------------------------------------------------
 *
 * waits.c
 *	  The SQL functions that show who waits for whom through Redis locks:
 *	  redis_lock_all_waits() (the view redis_lock_waits) and
 *	  redis_lock_blocking_pids(pid).  Each wait of this server's backends
 *	  (published by wait/waiters.c) is joined with the holders Redis reports
 *	  now for its lock, read by the inspect that redis_lock_status runs, in
 *	  the owner forms it shows; a holder whose owner value is a hold of this
 *	  server's registry is that backend's.  One inspect operation per
 *	  distinct lock, all of them in one rl_lock_ops_run: one pipelined round
 *	  trip per node, however many rows.  A semaphore's permits are waited
 *	  for without a holder in particular, and its key names none in a form
 *	  a lock check could tell from another application's: its waits show no
 *	  holder, and Redis is not asked about them.
 *
 *	  Must not: keep lock state, wait for a lock, show a value of a key that
 *	  is not a lock, or ask Redis once per row.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/interface/waits.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <hiredis/hiredis.h>

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "net/net.h"
#include "redis/redis.h"
#include "worker/worker.h"
#include "wait/wait.h"
#include "lock/lock.h"
#include "interface/interface.h"

PG_FUNCTION_INFO_V1(redis_lock_all_waits);
PG_FUNCTION_INFO_V1(redis_lock_blocking_pids);

/* One holder of a lock, as a majority of its nodes reports it */
typedef struct Holder
{
	const char *owner;			/* value or Redisson field (an owner form) */
	int			nodes;			/* nodes that show it */
	int64		ttl_ms;			/* the smallest pttl of those */
	int			pid;			/* the holding backend of this server, or 0 */
} Holder;

/* One lock some backend waits for, and what Redis says of it */
typedef struct Waited
{
	const char *target_spec;
	const char *key;
	uint64		key_id;			/* rl_registry_key_id() */
	RLLockNames names;
	Holder	   *holders;
	int			nholders;
} Waited;

/* One row: a waiter's key and one of its lock's holders (or none) */
typedef struct WaitRow
{
	const RLWaiter *w;
	const Holder *h;			/* NULL: no holder */
	const char *kind;			/* holder_kind */
} WaitRow;

/* The lock of w in locks[0..*n), added when not there yet */
static Waited *
waited_lock(Waited *locks, int *n, const RLWaiter *w)
{
	int			i;

	for (i = 0; i < *n; i++)
		if (strcmp(locks[i].key, w->key) == 0 &&
			strcmp(locks[i].target_spec, w->target_spec) == 0)
			return &locks[i];
	locks[*n].target_spec = w->target_spec;
	locks[*n].key = w->key;
	locks[*n].key_id = rl_registry_key_id(w->target_spec, w->key);
	rl_names_from_key(&locks[*n].names, w->protocol, "", w->key,
					  CurrentMemoryContext);
	locks[*n].names.script_free = !rl_scripting;
	locks[*n].holders = NULL;
	locks[*n].nholders = 0;
	return &locks[(*n)++];
}

/* Count owner (with its node's pttl) among l's holders */
static void
add_holder(Waited *l, const char *owner, int64 pttl)
{
	int			i;

	for (i = 0; i < l->nholders; i++)
		if (strcmp(l->holders[i].owner, owner) == 0)
			break;
	if (i == l->nholders)
	{
		l->holders[i].owner = owner;
		l->holders[i].nodes = 0;
		l->holders[i].ttl_ms = pttl;
		l->holders[i].pid = 0;
		l->nholders++;
	}
	l->holders[i].nodes++;
	l->holders[i].ttl_ms = Min(l->holders[i].ttl_ms, pttl);
}

/*
 * l's holders from its inspect op: every value or holder field that a
 * majority of its nodes (one node: it) shows, as redis_lock_status reads
 * each node's answer (rl_op_inspect_holders: only a lock's owner forms).
 */
static void
read_holders(Waited *l, RLLockOp *op)
{
	int			kept = 0;
	int			i;

	l->holders = palloc(sizeof(Holder) * op->nodes * RL_LOCK_FIELDS_MAX);
	for (i = 0; i < op->nodes; i++)
	{
		const char *holders[RL_LOCK_FIELDS_MAX];
		int64		pttl = 0;
		int			n = rl_op_inspect_holders(op, i, holders, &pttl);
		int			k;

		for (k = 0; k < n; k++)
			add_holder(l, holders[k], pttl);
	}
	for (i = 0; i < l->nholders; i++)
		if (l->holders[i].nodes >= rl_target_quorum(op->target))
			l->holders[kept++] = l->holders[i];
	l->nholders = kept;
}

/*
 * Ask Redis who holds each lock of locks: one inspect op each, run
 * together (one round trip per node).  Redis not answering is an error,
 * as for redis_lock_status.
 */
static void
ask_redis(Waited *locks, int n, const char *const *lock_names)
{
	RLLockOp   *ops = palloc0(sizeof(RLLockOp) * Max(n, 1));
	int			i;

	if (n == 0)
		return;
	for (i = 0; i < n; i++)
	{
		ops[i].kind = RL_OP_INSPECT;
		ops[i].target = rl_target_from_spec(locks[i].target_spec);
		ops[i].names = &locks[i].names;
	}
	rl_lock_ops_run(ops, n, RL_RUN_HARD);
	for (i = 0; i < n; i++)
	{
		if (!RL_OP_YES(&ops[i]))
			rl_raise_undecided(RL_ACTION_INSPECT, lock_names[i], &ops[i]);
		read_holders(&locks[i], &ops[i]);
	}
}

static int
key_id_cmp(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

/*
 * The backends of this server whose holds (the registry's, with their
 * owner values) are the holders Redis reported: each such holder's pid.
 */
static void
match_registry(Waited *locks, int n)
{
	uint64	   *ids = palloc(sizeof(uint64) * Max(n, 1));
	RLRegistryHold *holds = NULL;
	int			nholds = 0;
	int			cap = 16;
	int			i;

	for (i = 0; i < n; i++)
		ids[i] = locks[i].key_id;
	qsort(ids, n, sizeof(uint64), key_id_cmp);
	for (;;)
	{
		holds = palloc(sizeof(RLRegistryHold) * cap);
		nholds = rl_registry_holders(ids, n, NULL, 0, holds, cap);
		if (nholds <= cap)
			break;
		pfree(holds);
		cap = nholds * 2;
	}
	for (i = 0; i < n; i++)
	{
		int			h;
		int			j;

		for (h = 0; h < locks[i].nholders; h++)
			for (j = 0; j < nholds; j++)
				if (holds[j].key_id == locks[i].key_id &&
					strcmp(holds[j].owner, locks[i].holders[h].owner) == 0)
					locks[i].holders[h].pid = holds[j].pid;
	}
}

/*
 * Is holder h the grant that ends w's wait?  Redis shows it before the
 * waiter's wait ends (and before a later look at the registry, after the
 * waits were copied): a backend never waits for itself.
 */
static bool
is_own_grant(const RLWaiter *w, const Holder *h)
{
	return h->pid == w->pid || strcmp(h->owner, w->owner) == 0;
}

/* Append the row of waiter w and holder h (NULL: none) to *rows */
static void
add_row(WaitRow **rows, int *n, int *cap, const RLWaiter *w, const Holder *h)
{
	WaitRow    *r;

	if (*n == *cap)
	{
		*cap *= 2;
		*rows = repalloc(*rows, sizeof(WaitRow) * *cap);
	}
	r = &(*rows)[(*n)++];
	r->w = w;
	r->h = h;
	r->kind = h == NULL ? NULL :
		h->pid != 0 ? "sql" : rl_protocol_name(w->protocol);
}

/*
 * Every row of the waits of only_pid (0: of every backend): each key
 * waited for, once per holder Redis reports for it, or once with no
 * holder.  Returns how many; *rows allocated in the current context.
 */
static int
wait_rows(int only_pid, WaitRow **rows)
{
	RLWaiter   *ws;
	int			nw = rl_waiters_snapshot(&ws);
	Waited	   *locks = palloc(sizeof(Waited) * Max(nw, 1));
	Waited	  **lock_of = palloc(sizeof(Waited *) * Max(nw, 1));
	const char **lock_names = palloc(sizeof(char *) * Max(nw, 1));
	int			nlocks = 0;
	int			nrows = 0;
	int			cap = Max(nw, 1);
	int			i;

	for (i = 0; i < nw; i++)
	{
		lock_of[i] = NULL;
		if ((only_pid != 0 && ws[i].pid != only_pid) ||
			RL_PROTOCOL_IS_SEM(ws[i].protocol))
			continue;
		lock_names[nlocks] = ws[i].name;
		lock_of[i] = waited_lock(locks, &nlocks, &ws[i]);
	}
	ask_redis(locks, nlocks, lock_names);
	match_registry(locks, nlocks);

	*rows = palloc(sizeof(WaitRow) * cap);
	for (i = 0; i < nw; i++)
	{
		Waited	   *l = lock_of[i];
		int			shown = 0;
		int			h;

		if (only_pid != 0 && ws[i].pid != only_pid)
			continue;
		for (h = 0; l != NULL && h < l->nholders; h++)
		{
			if (is_own_grant(&ws[i], &l->holders[h]))
				continue;
			add_row(rows, &nrows, &cap, &ws[i], &l->holders[h]);
			shown++;
		}
		if (shown == 0)
			add_row(rows, &nrows, &cap, &ws[i], NULL);
	}
	return nrows;
}

/*
 * redis_lock_all_waits(): one row per key a backend of this server waits
 * for and holder Redis reports for it now: pid, lock_name, mode,
 * redis_key, waiting_since, holder_kind, holder_pid, holder, holder_ttl.
 * Not executable by PUBLIC (the view redis_lock_waits is for pg_monitor).
 */
Datum
redis_lock_all_waits(PG_FUNCTION_ARGS)
{
	Tuplestorestate *ts;
	TupleDesc	td;
	WaitRow    *rows;
	int			n;
	int			i;

	rl_fn_materialize(fcinfo, &ts, &td);
	rl_safe_point();
	n = wait_rows(0, &rows);
	for (i = 0; i < n; i++)
	{
		const RLWaiter *w = rows[i].w;
		const Holder *h = rows[i].h;
		Datum		values[9];
		bool		nulls[9] = {0};

		values[0] = Int32GetDatum(w->pid);
		values[1] = CStringGetTextDatum(w->name);
		values[2] = rl_fn_mode_datum(w->protocol);
		values[3] = CStringGetTextDatum(w->key);
		values[4] = TimestampTzGetDatum(w->since);
		if (h == NULL)
			nulls[5] = nulls[6] = nulls[7] = nulls[8] = true;
		else
		{
			values[5] = CStringGetTextDatum(rows[i].kind);
			values[6] = Int32GetDatum(h->pid);
			nulls[6] = h->pid == 0;
			values[7] = CStringGetTextDatum(h->owner);
			values[8] = IntervalPGetDatum(rl_fn_ms_to_interval(h->ttl_ms));
			nulls[8] = h->ttl_ms <= 0;
		}
		tuplestore_putvalues(ts, td, values, nulls);
	}
	return (Datum) 0;
}

static int
pid_cmp(const void *a, const void *b)
{
	int			x = DatumGetInt32(*(const Datum *) a);
	int			y = DatumGetInt32(*(const Datum *) b);

	return x < y ? -1 : x > y ? 1 : 0;
}

/*
 * redis_lock_blocking_pids(pid): the backends of this server that hold
 * what pid waits for in Redis (the holder_pid values of its rows in
 * redis_lock_waits), distinct and sorted; empty when pid does not wait.
 */
Datum
redis_lock_blocking_pids(PG_FUNCTION_ARGS)
{
	int32		pid = PG_GETARG_INT32(0);
	WaitRow    *rows;
	Datum	   *pids;
	int			n;
	int			npids = 0;
	int			i;

	rl_safe_point();
	n = pid != 0 ? wait_rows(pid, &rows) : 0;
	pids = palloc(sizeof(Datum) * Max(n, 1));
	for (i = 0; i < n; i++)
		if (rows[i].h != NULL && rows[i].h->pid != 0)
			pids[npids++] = Int32GetDatum(rows[i].h->pid);
	qsort(pids, npids, sizeof(Datum), pid_cmp);
	n = npids;
	npids = 0;
	for (i = 0; i < n; i++)
		if (npids == 0 || DatumGetInt32(pids[npids - 1]) != DatumGetInt32(pids[i]))
			pids[npids++] = pids[i];
	PG_RETURN_ARRAYTYPE_P(construct_array(pids, npids, INT4OID, sizeof(int32),
										  true, TYPALIGN_INT));
}
