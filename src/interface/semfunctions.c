/*-------------------------------------------------------------------------
 *
 * semfunctions.c
 *	  Owns the SQL-callable semaphore functions (doc/semaphores.md): the
 *	  checks of a number of permits and of a limit, the errors a caller sees
 *	  for a wait that elapsed, and the shape of every result of
 *	  redis_semaphore_*.
 *
 *	  A semaphore's permits are one entry of the lock table (mode
 *	  RL_MODE_PERMIT), with the holds, doubts, watchdog renewals and
 *	  releases at transaction and session end of a lock; this file must not
 *	  keep state of its own, talk to Redis except through the lock table and
 *	  lockop.c, or call hiredis (its header is included only for the
 *	  REDIS_REPLY_* codes of the replies lockop.c hands back).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/interface/semfunctions.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <hiredis/hiredis.h>

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "net/net.h"
#include "redis/redis.h"
#include "lock/lock.h"
#include "interface/interface.h"

PG_FUNCTION_INFO_V1(redis_semaphore_acquire);
PG_FUNCTION_INFO_V1(redis_semaphore_try_acquire);
PG_FUNCTION_INFO_V1(redis_semaphore_release);
PG_FUNCTION_INFO_V1(redis_semaphore_extend);
PG_FUNCTION_INFO_V1(redis_semaphores_held);
PG_FUNCTION_INFO_V1(redis_semaphore_status);
PG_FUNCTION_INFO_V1(redis_semaphore_init);

/* At most this many permits in one call: each is a member the scripts name */
#define RL_MAX_PERMITS	1000

static int
arg_permits(FunctionCallInfo fcinfo, int argno, int min, int max)
{
	int32		permits;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("permits must not be null")));
	permits = PG_GETARG_INT32(argno);
	if (permits < min || permits > max)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("permits must be between %d and %d", min, max),
				 errdetail("The value given is %d.", permits)));
	return permits;
}

/*
 * The max_permits argument: the limit every redis-semaphore client passes
 * (none is stored in Redis), which a Redisson semaphore keeps in Redis
 * instead.  0 under redisson_semaphore.  At least permits when given.
 */
static int
arg_max_permits(FunctionCallInfo fcinfo, int argno, int permits)
{
	int32		max_permits;

	if (rl_semaphore_protocol != RL_PROTOCOL_SEM_NPM)
	{
		if (!PG_ARGISNULL(argno))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_permits is only for redis_lock.semaphore_protocol = 'redis_semaphore'"),
					 errdetail("A Redisson semaphore keeps its number of permits in Redis."),
					 errhint("Leave max_permits NULL; the semaphore's owner sets its permits (redis_semaphore_init or Redisson's trySetPermits).")));
		return 0;
	}
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_permits must be given under redis_lock.semaphore_protocol = 'redis_semaphore'"),
				 errdetail("redis-semaphore keeps no limit in Redis: every client passes the same one.")));
	max_permits = PG_GETARG_INT32(argno);
	if (max_permits < Max(permits, 1))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_permits must be at least %d", Max(permits, 1)),
				 errdetail("The value given is %d; permits is %d.", max_permits, permits)));
	return max_permits;
}

/* A semaphore wait that elapsed: 55P03 */
static void
raise_not_obtained(const char *name, int permits, int64 wait_ms)
{
	if (wait_ms == 0)
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not obtain %d permit(s) of Redis semaphore \"%s\"",
						permits, name),
				 errdetail("Other clients hold its permits, or it has none yet.")));
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("could not obtain %d permit(s) of Redis semaphore \"%s\" within %s",
					permits, name, rl_format_ms(wait_ms)),
			 errdetail("Other clients hold its permits, or it has none yet.")));
}

/*
 * The acquire functions' common part: arguments (semaphore_name, permits,
 * ttl, wait, xact, max_permits), then the permits; raise or return false
 * when the wait elapsed.
 */
static bool
acquire_permits(FunctionCallInfo fcinfo, int64 default_wait, bool raise)
{
	char	   *name = rl_fn_arg_semaphore_name(fcinfo, 0);
	int			permits = arg_permits(fcinfo, 1, 1, RL_MAX_PERMITS);
	int64		ttl = rl_fn_arg_interval_ms(fcinfo, 2, "ttl", false);
	int64		wait = rl_fn_arg_interval_ms(fcinfo, 3, "wait", true);
	bool		xact = rl_fn_arg_bool(fcinfo, 4, "xact");
	int			max_permits = arg_max_permits(fcinfo, 5, permits);

	if (wait < 0)
		wait = default_wait;
	rl_fn_check_scope(xact);
	if (rl_acquire_permits(name, permits, max_permits, ttl, wait,
						   xact ? RL_SCOPE_XACT : RL_SCOPE_SESSION))
		return true;
	if (raise)
		raise_not_obtained(name, permits, wait);
	return false;
}

/*
 * redis_semaphore_acquire(semaphore_name, permits, ttl, wait, xact,
 * max_permits): take permits, waiting up to wait (redis_lock.wait_timeout
 * when NULL); true, or 55P03 when they were not obtained.
 */
Datum
redis_semaphore_acquire(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_permits(fcinfo, rl_wait_timeout_ms, true));
}

/* redis_semaphore_try_acquire: the same, no wait when NULL, false instead */
Datum
redis_semaphore_try_acquire(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_permits(fcinfo, 0, false));
}

/*
 * redis_semaphore_release(semaphore_name): give back this session's
 * session-scoped permits of it.  false with a WARNING when it holds none,
 * or when they were lost (their lease ran out and another client put them
 * back).
 */
Datum
redis_semaphore_release(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(rl_release(RL_MODE_PERMIT, rl_fn_arg_semaphore_name(fcinfo, 0)));
}

/*
 * redis_semaphore_extend(semaphore_name, ttl): restart the lease of this
 * session's permits of it (redis_lock.lease_time and the watchdog when ttl
 * is NULL); false with a WARNING when it holds none or they were lost.
 */
Datum
redis_semaphore_extend(PG_FUNCTION_ARGS)
{
	char	   *name = rl_fn_arg_semaphore_name(fcinfo, 0);
	int64		ttl = rl_fn_arg_interval_ms(fcinfo, 1, "ttl", false);

	PG_RETURN_BOOL(rl_extend(RL_MODE_PERMIT, name, ttl));
}

/*
 * The permit ids an entry's owner value names, as the scripts make them
 * (semscripts.c): redisson_semaphore, 32 hex digits (Redisson shows its ids
 * so); redis_semaphore, "<owner>_<index>".
 */
static Datum
permit_ids(const RLHeld *e)
{
	int			n = e->names.permits;
	Datum	   *ids = palloc(sizeof(Datum) * Max(n, 1));
	int			i;

	for (i = 0; i < n; i++)
	{
		if (e->names.protocol == RL_PROTOCOL_SEM_REDISSON)
			ids[i] = CStringGetTextDatum(psprintf("%s%04x", e->names.owner, i));
		else
			ids[i] = CStringGetTextDatum(psprintf("%s_%d", e->names.owner, i));
	}
	return PointerGetDatum(construct_array(ids, n, TEXTOID, -1, false,
										   TYPALIGN_INT));
}

/*
 * redis_semaphores_held(): this session's permits, a row per semaphore and
 * scope: semaphore_name, scope, permits, permit_ids, acquired_at, lease,
 * watchdog, lost, redis_key, protocol.
 */
Datum
redis_semaphores_held(PG_FUNCTION_ARGS)
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
		RLHeld	   *e = &ents[i];
		Datum		values[10];
		bool		nulls[10] = {0};

		if (e->mode != RL_MODE_PERMIT)
			continue;
		values[0] = CStringGetTextDatum(e->name);
		values[1] = CStringGetTextDatum(e->session_holds > 0 ? "session" : "transaction");
		values[2] = Int32GetDatum(e->names.permits);
		values[3] = permit_ids(e);
		values[4] = TimestampTzGetDatum(e->acquired_at);
		values[5] = IntervalPGetDatum(rl_fn_ms_to_interval(e->lease_ms));
		values[6] = BoolGetDatum(e->watchdog);
		values[7] = BoolGetDatum(e->lost);
		values[8] = CStringGetTextDatum(e->names.key);
		values[9] = CStringGetTextDatum(rl_protocol_name(e->names.protocol));
		tuplestore_putvalues(ts, td, values, nulls);
	}
	return (Datum) 0;
}

/*
 * Names and target of a semaphore: those of the entry of this session's
 * permits of it, else from the settings.  Refuses what an acquire refuses
 * there: several independent masters, where a semaphore has no majority
 * rule, and on a Cluster a name whose keys would fall in other slots.
 */
static RLTarget *
semaphore_names_for(const char *name, RLHeld **e, RLLockNames *names)
{
	RLTarget   *target;

	*e = rl_lookup_mode(RL_MODE_PERMIT, name);
	if (*e != NULL)
	{
		*names = (*e)->names;
		return (*e)->target;
	}
	/* as an acquire would: not on Redlock, no broken hash tag on a Cluster */
	rl_refuse_unsupported_layout(RL_MODE_PERMIT, name);
	target = rl_current_target();
	memset(names, 0, sizeof(*names));
	rl_names_build(names, (RLProtocol) rl_semaphore_protocol, rl_key_prefix,
				   name, CurrentMemoryContext);
	return target;
}

/*
 * redis_semaphore_status(semaphore_name, max_permits, ttl): what Redis says
 * now, read only.  OUT initialized (its key exists), available (NULL under
 * redis_semaphore without max_permits), taken (permits whose lease runs:
 * under redis_semaphore, by ttl or redis_lock.lease_time, the lease every
 * client must share), held_by_me, redis_key.
 */
Datum
redis_semaphore_status(PG_FUNCTION_ARGS)
{
	char	   *name = rl_fn_arg_semaphore_name(fcinfo, 0);
	int64		ttl = rl_fn_arg_interval_ms(fcinfo, 2, "ttl", false);
	RLHeld	   *e;
	RLLockNames names;
	RLLockOp	op;
	RLReply    *r;
	TupleDesc	td;
	Datum		values[5];
	bool		nulls[5] = {0};
	int64		taken;

	if (get_call_result_type(fcinfo, NULL, &td) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	td = BlessTupleDesc(td);
	if (!PG_ARGISNULL(1) && PG_GETARG_INT32(1) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_permits must be positive")));

	rl_safe_point();
	memset(&op, 0, sizeof(op));
	op.kind = RL_OP_SEM_STATUS;
	op.target = semaphore_names_for(name, &e, &names);
	op.names = &names;
	op.lease_ms = ttl > 0 ? ttl : (e != NULL ? e->lease_ms : rl_lease_time_ms);
	rl_lock_ops_run(&op, 1, RL_RUN_HARD);
	if (op.wrongtype != NULL)
		rl_raise_wrong_type(name, &names, op.wrongtype);
	if (!RL_OP_YES(&op))
		rl_raise_undecided(RL_ACTION_INSPECT, name, &op);
	r = rl_op_inspect_reply(&op, 0);
	/*
	 * {exists, free (-1: the caller's limit less taken), taken}: rl_sem_reply
	 * hands a status op nothing else
	 */
	taken = r->element[2]->integer;
	values[0] = BoolGetDatum(r->element[0]->integer == 1);
	if (r->element[1]->integer >= 0)
		values[1] = Int64GetDatum(r->element[1]->integer);
	else if (!PG_ARGISNULL(1))
		values[1] = Int64GetDatum(Max(PG_GETARG_INT32(1) - taken, 0));
	else
		nulls[1] = true;
	values[2] = Int64GetDatum(taken);
	values[3] = Int32GetDatum(e != NULL ? e->names.permits : 0);
	values[4] = CStringGetTextDatum(names.key);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(td, values, nulls)));
}

/*
 * redis_semaphore_init(semaphore_name, permits): give a Redisson semaphore
 * its permits if it has none yet (Redisson's trySetPermits, whose waiters
 * it wakes); true when set, false when it had a count already, which is
 * left as it is.  Not executable by PUBLIC: whoever sets a semaphore's
 * permits first sets its limit for every application that shares it.
 */
Datum
redis_semaphore_init(PG_FUNCTION_ARGS)
{
	char	   *name = rl_fn_arg_semaphore_name(fcinfo, 0);
	int			permits = arg_permits(fcinfo, 1, 0, PG_INT32_MAX);
	RLHeld	   *e;
	RLLockNames names;
	RLLockOp	op;
	RLReply    *r;

	if (rl_semaphore_protocol != RL_PROTOCOL_SEM_REDISSON)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("a redis-semaphore semaphore has no permits to set"),
				 errdetail("redis-semaphore keeps no limit in Redis: every client passes the same one (max_permits)."),
				 errhint("Set redis_lock.semaphore_protocol = 'redisson' for a Redisson semaphore.")));
	rl_safe_point();
	memset(&op, 0, sizeof(op));
	op.kind = RL_OP_SEM_SETUP;
	op.target = semaphore_names_for(name, &e, &names);
	names.permits = permits;
	op.names = &names;
	rl_lock_ops_run(&op, 1, RL_RUN_HARD);
	if (op.wrongtype != NULL)
		rl_raise_wrong_type(name, &names, op.wrongtype);
	if (!RL_OP_YES(&op))
		rl_raise_undecided(RL_ACTION_INSPECT, name, &op);
	r = rl_op_inspect_reply(&op, 0);
	PG_RETURN_BOOL(r->integer == 1);
}
