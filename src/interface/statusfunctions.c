/*-------------------------------------------------------------------------
 *
 * statusfunctions.c
 *	  Owns the SQL-callable functions that look at locks rather than take
 *	  them (doc/reference.md, "Functions"): redis_lock_held,
 *	  redis_lock_status, redis_lock_all_locks, redis_lock_stats, and
 *	  redis_lock_force_release, which deletes a lock whoever holds it; the
 *	  shape of their results (rl_fn_materialize for the set-returning ones).
 *
 *	  The lock functions and the argument checks every function shares are
 *	  in functions.c.  This file must not keep lock state of its own or talk
 *	  to Redis except through the lock table and lockop.c, and must not call
 *	  hiredis: its header is included only for the REDIS_REPLY_* codes of
 *	  the RLReply trees lockop.c hands back.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/interface/statusfunctions.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <hiredis/hiredis.h>

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/tuplestore.h"

#include "net/net.h"
#include "redis/redis.h"
#include "worker/worker.h"
#include "lock/lock.h"
#include "interface/interface.h"

PG_FUNCTION_INFO_V1(redis_lock_held);
PG_FUNCTION_INFO_V1(redis_lock_status);
PG_FUNCTION_INFO_V1(redis_lock_force_release);

/*
 * The mode column of redis_lock_held() and redis_lock_locks (1.2), and of
 * redis_lock_waits (1.4)
 */
Datum
rl_fn_mode_datum(RLProtocol protocol)
{
	switch (protocol)
	{
		case RL_PROTOCOL_SIMPLE:
		case RL_PROTOCOL_REDISSON:
		case RL_PROTOCOL_REDISSON_FAIR:
			break;
		case RL_PROTOCOL_RW_READ:
			return CStringGetTextDatum("read");
		case RL_PROTOCOL_RW_WRITE:
			return CStringGetTextDatum("write");
		case RL_PROTOCOL_SEM_REDISSON:
		case RL_PROTOCOL_SEM_NPM:
			return CStringGetTextDatum("permit");
	}
	return CStringGetTextDatum("exclusive");
}

/* ----------------------------------------------------------------
 * Introspection
 * ----------------------------------------------------------------
 */
void
rl_fn_materialize(FunctionCallInfo fcinfo, Tuplestorestate **ts, TupleDesc *td)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext old;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		!(rsinfo->allowedModes & SFRM_Materialize))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set")));
	old = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	if (get_call_result_type(fcinfo, NULL, td) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	*ts = tuplestore_begin_heap(true, false, work_mem);
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = *ts;
	rsinfo->setDesc = *td;
	MemoryContextSwitchTo(old);
}

/*
 * redis_lock_held(): one row per lock and scope this session holds:
 * lock_name, scope, hold_count, fence, acquired_at, lease, watchdog,
 * lost, redis_key, protocol.
 */
Datum
redis_lock_held(PG_FUNCTION_ARGS)
{
	Tuplestorestate *ts;
	TupleDesc	td;
	RLHeld	   *ents;
	int			n;
	int			i;

	rl_fn_materialize(fcinfo, &ts, &td);
	rl_safe_point();
	n = rl_held_snapshot(&ents);
	for (i = 0; i < n; i++)
	{
		int			scope;

		for (scope = 0; scope < 2; scope++)
		{
			RLHeld	   *e = &ents[i];
			int			holds = scope == 0 ? e->session_holds : e->xact_holds;
			Datum		values[11];
			bool		nulls[11] = {0};

			/* a semaphore's permits: redis_semaphores_held() */
			if (holds == 0 || e->mode == RL_MODE_PERMIT)
				continue;
			values[0] = CStringGetTextDatum(e->name);
			values[1] = CStringGetTextDatum(scope == 0 ? "session" : "transaction");
			values[2] = Int32GetDatum(holds);
			values[3] = Int64GetDatum(e->fence);
			values[4] = TimestampTzGetDatum(e->acquired_at);
			values[5] = IntervalPGetDatum(rl_fn_ms_to_interval(e->lease_ms));
			values[6] = BoolGetDatum(e->watchdog);
			values[7] = BoolGetDatum(e->lost);
			values[8] = CStringGetTextDatum(e->names.key);
			values[9] = CStringGetTextDatum(rl_protocol_name(e->names.protocol));
			/* mode: from 1.2 on (1.1's definition has no such column) */
			values[10] = rl_fn_mode_datum(e->names.protocol);
			tuplestore_putvalues(ts, td, values, nulls);
		}
	}
	return (Datum) 0;
}

/*
 * Names and target of a lock: those of an entry the session holds (any
 * mode), else from the settings
 */
static RLTarget *
lock_names_for(const char *name, RLHeld **e, RLLockNames *names)
{
	*e = rl_lookup_any(name);
	if (*e != NULL)
	{
		*names = (*e)->names;
		return (*e)->target;
	}
	memset(names, 0, sizeof(*names));
	rl_names_build(names, (RLProtocol) rl_protocol, rl_key_prefix, name,
				   CurrentMemoryContext);
	return rl_current_target();
}

/*
 * redis_lock_status(lock_name): what Redis says now.  OUT locked,
 * held_by_me, ttl, owner, redis_key, redis_type.  Only a lock's owner is
 * shown, and only in an owner form (rl_inspect_reply): a key that is not a
 * lock gives locked NULL, no ttl and no owner, only its type.  Under
 * Redlock, locked and held_by_me need a majority of the masters (locked is
 * NULL without one when a master holds a key that is not a lock), ttl is
 * the smallest one seen.
 */
Datum
redis_lock_status(PG_FUNCTION_ARGS)
{
	char	   *name = rl_fn_arg_name(fcinfo, 0);
	RLHeld	   *e;
	RLLockNames names;
	RLLockOp	op;
	TupleDesc	td;
	Datum		values[6];
	bool		nulls[6] = {0};
	const char *type = "none";
	int			locked = 0;
	int			other = 0;
	int			mine = 0;
	int64		ttl = -1;
	char	   *owner = NULL;
	int			quorum;
	int			i;

	if (get_call_result_type(fcinfo, NULL, &td) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	td = BlessTupleDesc(td);

	rl_safe_point();
	memset(&op, 0, sizeof(op));
	op.kind = RL_OP_INSPECT;
	op.target = lock_names_for(name, &e, &names);
	op.names = &names;
	rl_lock_ops_run(&op, 1, RL_RUN_HARD);
	quorum = rl_target_quorum(op.target);
	if (!RL_OP_YES(&op))
		rl_raise_undecided(RL_ACTION_INSPECT, name, &op);
	for (i = 0; i < op.nodes; i++)
	{
		/* {type} or, for a lock, {type, pttl, value or holder fields} */
		RLReply    *r = rl_op_inspect_reply(&op, i);
		RLReply    *v;
		const char *t;
		bool		this_mine = false;

		if (r == NULL)
			continue;
		t = r->element[0]->str;
		if (strcmp(t, "none") == 0)
			continue;
		if (strcmp(type, "none") == 0)
			type = t;
		if (r->elements == 1)
		{
			other++;
			continue;
		}
		locked++;
		if (r->element[1]->integer > 0 && (ttl < 0 || r->element[1]->integer < ttl))
			ttl = r->element[1]->integer;
		v = r->element[2];
		if (v->type == REDIS_REPLY_STRING)
		{
			if (owner == NULL)
				owner = v->str;
			this_mine = e != NULL && strcmp(v->str, e->names.owner) == 0;
		}
		else
		{
			size_t		k;

			if (owner == NULL)
				owner = v->element[0]->str;
			for (k = 0; k < v->elements; k++)
				if (e != NULL && strcmp(v->element[k]->str, e->names.owner) == 0)
					this_mine = true;
		}
		if (this_mine)
			mine++;
	}

	if (locked >= quorum)
		values[0] = BoolGetDatum(true);
	else if (other > 0)
		nulls[0] = true;
	else
		values[0] = BoolGetDatum(false);
	values[1] = BoolGetDatum(mine >= quorum);
	if (ttl > 0)
		values[2] = IntervalPGetDatum(rl_fn_ms_to_interval(ttl));
	else
		nulls[2] = true;
	if (owner != NULL)
		values[3] = CStringGetTextDatum(owner);
	else
		nulls[3] = true;
	values[4] = CStringGetTextDatum(names.key);
	values[5] = CStringGetTextDatum(type);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(td, values, nulls)));
}

/*
 * Force release found a string that redis_lock_status shows as no lock (no
 * TTL, a counter, a value of no lock's form): strings are what the simple
 * layout's locks are, so "not a lock of protocol simple" would mislead.
 */
static void
refuse_force_of_string(const char *name, const RLLockNames *n)
{
	ereport(ERROR,
			(errcode(ERRCODE_WRONG_OBJECT_TYPE),
			 errmsg("Redis key \"%s\" holds a string that is not a lock", n->key),
			 errdetail("Lock \"%s\" maps to that key, whose value redis_lock_status shows as no lock (no TTL, a counter, or a value of no lock's form); the key was not changed.",
					   name),
			 errhint("If you know it is an abandoned lock, such as a redis-py lock taken without a timeout, delete it in Redis.")));
}

/*
 * redis_lock_force_release(lock_name): delete the lock whoever holds it and
 * wake its waiters.  A key of a foreign type is refused, never deleted.
 */
Datum
redis_lock_force_release(PG_FUNCTION_ARGS)
{
	char	   *name = rl_fn_arg_name(fcinfo, 0);
	RLHeld	   *e;
	RLLockNames names;
	RLLockOp	op;

	rl_safe_point();
	memset(&op, 0, sizeof(op));
	op.kind = RL_OP_FORCE;
	op.target = lock_names_for(name, &e, &names);
	op.names = &names;
	rl_lock_ops_run(&op, 1, RL_RUN_HARD);
	if (op.wrongtype != NULL && strcmp(op.wrongtype, "string") == 0 &&
		!RL_PROTOCOL_IS_SEM(names.protocol))
		refuse_force_of_string(name, &names);
	if (op.wrongtype != NULL)
		rl_raise_wrong_type(name, &names, op.wrongtype);
	if (op.failed > 0 && op.yes == 0)
		rl_raise_undecided(RL_ACTION_FORCE_RELEASE, name, &op);
	/* whatever of it this session held (any mode) is gone */
	rl_forget(name);
	PG_RETURN_BOOL(op.yes > 0);
}

/* ----------------------------------------------------------------
 * Cluster-wide view and counters (1.1)
 * ----------------------------------------------------------------
 */
PG_FUNCTION_INFO_V1(redis_lock_all_locks);
PG_FUNCTION_INFO_V1(redis_lock_stats);

static void
put_lock_rows(Tuplestorestate *ts, TupleDesc td, RLLockInfo *l)
{
	int			scope;

	for (scope = 0; scope < 2; scope++)
	{
		int			holds = scope == 0 ? l->st.session_holds : l->st.xact_holds;
		Datum		values[13];
		bool		nulls[13] = {0};

		if (holds == 0)
			continue;
		values[0] = Int32GetDatum(l->st.pid);
		values[1] = ObjectIdGetDatum(l->st.dbid);
		values[2] = CStringGetTextDatum(l->name);
		values[3] = CStringGetTextDatum(scope == 0 ? "session" : "transaction");
		values[4] = Int32GetDatum(holds);
		values[5] = Int64GetDatum(l->st.fence);
		values[6] = TimestampTzGetDatum(l->st.acquired_at);
		values[7] = TimestampTzGetDatum(l->st.last_renewed_at);
		nulls[7] = l->st.last_renewed_at == 0;
		values[8] = IntervalPGetDatum(rl_fn_ms_to_interval(l->st.lease_ms));
		values[9] = BoolGetDatum(l->st.watchdog);
		values[10] = BoolGetDatum(l->st.lost);
		values[11] = CStringGetTextDatum(l->key);
		/* mode: from 1.2 on (1.1's definition has no such column) */
		values[12] = rl_fn_mode_datum(l->st.protocol);
		tuplestore_putvalues(ts, td, values, nulls);
	}
}

/*
 * Every lock of every backend (shared registry; needs preloading).
 * Without preloading, only this session's locks.
 */
Datum
redis_lock_all_locks(PG_FUNCTION_ARGS)
{
	Tuplestorestate *ts;
	TupleDesc	td;
	RLLockInfo *locks;
	int			n;
	int			i;

	rl_fn_materialize(fcinfo, &ts, &td);
	if (!rl_registry_snapshot(&locks, &n))
	{
		RLHeld	   *ents;

		rl_safe_point();
		n = rl_held_snapshot(&ents);
		locks = palloc(sizeof(RLLockInfo) * Max(n, 1));
		for (i = 0; i < n; i++)
		{
			RLLockInfo *l = &locks[i];

			memset(l, 0, sizeof(*l));
			l->st.pid = MyProcPid;
			l->st.dbid = MyDatabaseId;
			l->st.protocol = ents[i].names.protocol;
			l->st.watchdog = ents[i].watchdog;
			l->st.lost = ents[i].lost;
			l->st.session_holds = ents[i].session_holds;
			l->st.xact_holds = ents[i].xact_holds;
			l->st.fence = ents[i].fence;
			l->st.lease_ms = ents[i].lease_ms;
			l->st.acquired_at = ents[i].acquired_at;
			l->name = ents[i].name;
			l->key = ents[i].names.key;
		}
	}
	for (i = 0; i < n; i++)
		put_lock_rows(ts, td, &locks[i]);
	return (Datum) 0;
}

/*
 * redis_lock_stats(): one row of the counters (shared when preloaded, else
 * this backend's) and whether the watchdog worker runs.
 */
Datum
redis_lock_stats(PG_FUNCTION_ARGS)
{
	TupleDesc	td;
	RLStats		st;
	Datum		values[11];
	bool		nulls[11] = {0};

	if (get_call_result_type(fcinfo, NULL, &td) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	td = BlessTupleDesc(td);
	rl_stats_read(&st);
	values[0] = Int64GetDatum((int64) st.value[RL_STAT_ACQUIRED]);
	values[1] = Int64GetDatum((int64) st.value[RL_STAT_FAILED]);
	values[2] = Int64GetDatum((int64) st.value[RL_STAT_TIMED_OUT]);
	values[3] = Int64GetDatum((int64) st.value[RL_STAT_WAITS]);
	values[4] = Float8GetDatum(st.value[RL_STAT_WAIT_US] / 1000.0);
	values[5] = Int64GetDatum((int64) st.value[RL_STAT_RENEWALS]);
	values[6] = Int64GetDatum((int64) st.value[RL_STAT_LOST]);
	values[7] = Int64GetDatum((int64) st.value[RL_STAT_RECONNECTS]);
	values[8] = Int64GetDatum((int64) st.value[RL_STAT_RELEASED]);
	values[9] = BoolGetDatum(rl_watchdog_enabled());
	values[10] = Int64GetDatum((int64) st.value[RL_STAT_INTERRUPTED]);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(td, values, nulls)));
}
