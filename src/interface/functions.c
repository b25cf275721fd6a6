/*-------------------------------------------------------------------------
 *
 * functions.c
 *	  Owns the SQL-callable functions (doc/reference.md, "Functions"): argument
 *	  checks (NULL, empty, oversized names; ttl and wait ranges), the errors
 *	  a caller sees for a wait that elapsed, and the shape of every result.
 *
 *	  The work itself is done by the lock table (locktable.c and the lock*.c
 *	  files beside it; lockmany.c for several locks at once); this file must
 *	  not keep lock state of its own or talk to Redis except through them and
 *	  lockop.c, and must not call hiredis: its header is included only for the
 *	  REDIS_REPLY_* codes of the RLReply trees lockop.c hands back.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/interface/functions.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>
#include <hiredis/hiredis.h>

#include "access/htup_details.h"
#include "access/xact.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/tuplestore.h"

#include "net/net.h"
#include "redis/redis.h"
#include "worker/worker.h"
#include "lock/lock.h"
#include "interface/interface.h"

PG_FUNCTION_INFO_V1(redis_lock_acquire);
PG_FUNCTION_INFO_V1(redis_lock_try_acquire);
PG_FUNCTION_INFO_V1(redis_lock_release);
PG_FUNCTION_INFO_V1(redis_lock_release_all);
PG_FUNCTION_INFO_V1(redis_lock_with_lock);
PG_FUNCTION_INFO_V1(redis_lock_extend);
PG_FUNCTION_INFO_V1(redis_lock_fence);
PG_FUNCTION_INFO_V1(redis_lock_check);
PG_FUNCTION_INFO_V1(redis_lock_held);
PG_FUNCTION_INFO_V1(redis_lock_status);
PG_FUNCTION_INFO_V1(redis_lock_force_release);
PG_FUNCTION_INFO_V1(redis_lock_acquire_read);
PG_FUNCTION_INFO_V1(redis_lock_try_acquire_read);
PG_FUNCTION_INFO_V1(redis_lock_release_read);
PG_FUNCTION_INFO_V1(redis_lock_acquire_write);
PG_FUNCTION_INFO_V1(redis_lock_try_acquire_write);
PG_FUNCTION_INFO_V1(redis_lock_release_write);
PG_FUNCTION_INFO_V1(redis_lock_acquire_many);
PG_FUNCTION_INFO_V1(redis_lock_release_many);

/* ----------------------------------------------------------------
 * Argument checks
 * ----------------------------------------------------------------
 */

/*
 * Refuse a lock name whose Redis key (the key prefix applied) would contain
 * a reserved mark (protocol.c): it could take the place of a fence counter,
 * a fair lock's queue or another key locks use beside their own.  element
 * is the name's 1-based place in an array, 0 for a name given alone.
 * Every function taking a lock name refuses it, also those that would only
 * find nothing, so such a name behaves the same everywhere.  what names the
 * parameter (lock_name, semaphore_name, lock_names) in the message.
 */
static void
refuse_reserved_name(const char *name, int element, const char *what)
{
	const char *prefix = rl_key_prefix ? rl_key_prefix : "";
	const char *mark = rl_reserved_mark(prefix, name);

	if (mark == NULL)
		return;
	if (element == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s \"%s\" is reserved", what, name),
				 errdetail("Its Redis key \"%s%s\" contains \"%s\", which marks the keys that locks use beside their own (fence counters, queues, timeouts).",
						   prefix, name, mark)));
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("%s must not contain a reserved name", what),
			 errdetail("Element %d, \"%s\", has the Redis key \"%s%s\", which contains \"%s\": that marks the keys that locks use beside their own (fence counters, queues, timeouts).",
					   element, name, prefix, name, mark)));
}

/*
 * A name argument: not null, not empty, not too long, not reserved.  what
 * names the parameter in the messages.
 */
static char *
arg_name(FunctionCallInfo fcinfo, int argno, const char *what)
{
	text	   *t;
	int			len;
	char	   *name;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
	t = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(t);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what)));
	if (len > RL_MAX_NAME_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be longer than %d bytes", what, RL_MAX_NAME_LEN),
				 errdetail("The name given has %d bytes.", len)));
	name = text_to_cstring(t);
	refuse_reserved_name(name, 0, what);
	return name;
}

char *
rl_fn_arg_name(FunctionCallInfo fcinfo, int argno)
{
	return arg_name(fcinfo, argno, "lock_name");
}

char *
rl_fn_arg_semaphore_name(FunctionCallInfo fcinfo, int argno)
{
	return arg_name(fcinfo, argno, "semaphore_name");
}

/* Interval argument in milliseconds; -1 when NULL */
int64
rl_fn_arg_interval_ms(FunctionCallInfo fcinfo, int argno, const char *what,
				bool zero_ok)
{
	Interval   *iv;
	double		ms;

	if (PG_ARGISNULL(argno))
		return -1;
	iv = PG_GETARG_INTERVAL_P(argno);
#ifdef INTERVAL_NOT_FINITE
	if (INTERVAL_NOT_FINITE(iv))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be finite", what)));
#endif
	ms = (double) iv->month * DAYS_PER_MONTH * SECS_PER_DAY * 1000.0 +
		(double) iv->day * SECS_PER_DAY * 1000.0 + (double) iv->time / 1000.0;
	if (ms < 0 && zero_ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be negative", what)));
	if (ms <= 0 && !zero_ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be positive", what)));
	if (ms > (double) RL_MAX_MS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not exceed %d milliseconds", what, (int) RL_MAX_MS),
				 errdetail("That is about 24 days."),
				 errhint("Use ttl NULL and the watchdog for longer holds.")));
	/* a positive sub-millisecond ttl still means "expire", not "forever" */
	return (int64) ceil(ms);
}

bool
rl_fn_arg_bool(FunctionCallInfo fcinfo, int argno, const char *what)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
	return PG_GETARG_BOOL(argno);
}

/* The mode column of redis_lock_held() and redis_lock_locks (1.2) */
static Datum
mode_datum(RLProtocol protocol)
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

Interval *
rl_fn_ms_to_interval(int64 ms)
{
	Interval   *iv = palloc0(sizeof(Interval));

	iv->time = ms * 1000;
	return iv;
}

/* ----------------------------------------------------------------
 * Acquire
 * ----------------------------------------------------------------
 */
static void
raise_not_obtained(const char *name, int64 wait_ms)
{
	if (wait_ms == 0)
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not obtain Redis lock \"%s\"", name),
				 errdetail("Another client holds it.")));
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("could not obtain Redis lock \"%s\" within %s", name,
					rl_format_ms(wait_ms))));
}

/*
 * Refuse a session-scoped hold (of a lock or of a semaphore's permits)
 * where redis_lock.session_locks is off
 */
void
rl_fn_check_scope(bool xact)
{
	if (!xact && !rl_session_locks)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("session-scoped Redis locks are disabled for this session"),
				 errdetail("redis_lock.session_locks is off: behind a transaction-pooling connection pooler another client would inherit the lock."),
				 errhint("Take the lock with xact => true inside a transaction, or use redis_lock_with_lock.")));
}

/*
 * The acquire functions' common part: arguments (lock_name, ttl, wait,
 * xact), then one mode of the lock.  A session that holds a read-write lock
 * for reading only is refused its write hold at once (*obtained false, or
 * 55P03 when refuse_upgrade): it would wait for itself.
 */
static int64
do_acquire(FunctionCallInfo fcinfo, RLLockMode mode, int64 default_wait,
		   bool refuse_upgrade, bool *obtained, int64 *wait_out)
{
	char	   *name = rl_fn_arg_name(fcinfo, 0);
	int64		ttl = rl_fn_arg_interval_ms(fcinfo, 1, "ttl", false);
	int64		wait = rl_fn_arg_interval_ms(fcinfo, 2, "wait", true);
	bool		xact = rl_fn_arg_bool(fcinfo, 3, "xact");

	if (wait < 0)
		wait = default_wait;
	*wait_out = wait;
	rl_fn_check_scope(xact);
	if (mode == RL_MODE_WRITE && rl_holds_read_only(name))
	{
		if (refuse_upgrade)
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("could not obtain Redis lock \"%s\" for writing", name),
					 errdetail("This session holds it for reading, and a read hold cannot be upgraded."),
					 errhint("Release the read hold first, or take the write hold before reading.")));
		*obtained = false;
		return 0;
	}
	return rl_acquire(mode, name, ttl, wait,
					  xact ? RL_SCOPE_XACT : RL_SCOPE_SESSION, obtained);
}

/*
 * redis_lock_acquire(lock_name, ttl, wait, xact): take the lock, waiting up
 * to wait (redis_lock.wait_timeout when NULL).  Returns its fencing token, or
 * NULL when there is none (Redlock); raises 55P03 if it is not obtained.
 */
Datum
redis_lock_acquire(PG_FUNCTION_ARGS)
{
	bool		obtained;
	int64		wait;
	int64		fence = do_acquire(fcinfo, RL_MODE_EXCLUSIVE, rl_wait_timeout_ms,
									   true, &obtained, &wait);

	if (!obtained)
		raise_not_obtained(text_to_cstring(PG_GETARG_TEXT_PP(0)), wait);
	/* Redlock: tokens from independent masters are not ordered, so none */
	if (fence == 0)
		PG_RETURN_NULL();
	PG_RETURN_INT64(fence);
}

/*
 * redis_lock_try_acquire(lock_name, ttl, wait, xact): take the lock if it can
 * be had within wait (none when NULL).  Returns whether it was obtained
 * instead of raising when it was not.
 */
Datum
redis_lock_try_acquire(PG_FUNCTION_ARGS)
{
	bool		obtained;
	int64		wait;

	(void) do_acquire(fcinfo, RL_MODE_EXCLUSIVE, 0, false, &obtained, &wait);
	PG_RETURN_BOOL(obtained);
}

/* The read-write lock functions: one mode, raising or not */
static bool
acquire_rw(FunctionCallInfo fcinfo, RLLockMode mode, bool raise)
{
	bool		obtained;
	int64		wait;

	(void) do_acquire(fcinfo, mode, raise ? rl_wait_timeout_ms : 0, raise,
					  &obtained, &wait);
	if (!obtained && raise)
		raise_not_obtained(text_to_cstring(PG_GETARG_TEXT_PP(0)), wait);
	return obtained;
}

/*
 * redis_lock_acquire_read(lock_name, ttl, wait, xact): take a shared hold of
 * the read-write lock, waiting up to wait (redis_lock.wait_timeout when
 * NULL); true, or 55P03 when it is not obtained.
 */
Datum
redis_lock_acquire_read(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_rw(fcinfo, RL_MODE_READ, true));
}

/* redis_lock_try_acquire_read: the same, false instead of the error */
Datum
redis_lock_try_acquire_read(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_rw(fcinfo, RL_MODE_READ, false));
}

/*
 * redis_lock_acquire_write(lock_name, ttl, wait, xact): take the exclusive
 * hold of the read-write lock; true, or 55P03 when it is not obtained, at
 * once when this session holds only a read hold of it (no upgrade).
 */
Datum
redis_lock_acquire_write(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_rw(fcinfo, RL_MODE_WRITE, true));
}

/* redis_lock_try_acquire_write: the same, false instead of the error */
Datum
redis_lock_try_acquire_write(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_rw(fcinfo, RL_MODE_WRITE, false));
}

/* ----------------------------------------------------------------
 * Release, extend, fence
 * ----------------------------------------------------------------
 */
/*
 * redis_lock_release(lock_name): drop one session-scoped hold.  Returns false
 * with a WARNING when the session holds none or the lock was lost.
 */
Datum
redis_lock_release(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(rl_release(RL_MODE_EXCLUSIVE, rl_fn_arg_name(fcinfo, 0)));
}

/* redis_lock_release_read(lock_name): drop one session-scoped read hold */
Datum
redis_lock_release_read(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(rl_release(RL_MODE_READ, rl_fn_arg_name(fcinfo, 0)));
}

/* redis_lock_release_write(lock_name): drop one session-scoped write hold */
Datum
redis_lock_release_write(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(rl_release(RL_MODE_WRITE, rl_fn_arg_name(fcinfo, 0)));
}

/*
 * redis_lock_release_all(): drop every session-scoped hold; returns how many
 * locks had any.  Transaction-scoped holds stay until the transaction ends.
 */
Datum
redis_lock_release_all(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(rl_release_all_session());
}

/*
 * redis_lock_extend(lock_name, ttl): restart a held lock's lease (ttl NULL
 * hands it to the watchdog).  Returns false with a WARNING when it is not
 * held or was found lost.
 */
Datum
redis_lock_extend(PG_FUNCTION_ARGS)
{
	char	   *name = rl_fn_arg_name(fcinfo, 0);
	int64		ttl = rl_fn_arg_interval_ms(fcinfo, 1, "ttl", false);

	PG_RETURN_BOOL(rl_extend(RL_MODE_EXCLUSIVE, name, ttl));
}

/*
 * redis_lock_check(lock_name): true while the session holds the lock and
 * it was not found lost; the loss as an ERROR (40001) when it was; false
 * when it is not held.  No round trip (locklost.c).
 */
Datum
redis_lock_check(PG_FUNCTION_ARGS)
{
	char	   *name = rl_fn_arg_name(fcinfo, 0);

	PG_RETURN_BOOL(rl_check_lock(name));
}

/*
 * redis_lock_fence(lock_name): the fencing token of a lock this session
 * holds; NULL when it holds none or the lock has no token (Redlock).
 */
Datum
redis_lock_fence(PG_FUNCTION_ARGS)
{
	char	   *name = rl_fn_arg_name(fcinfo, 0);
	RLHeld	   *e;

	rl_safe_point();
	e = rl_lookup(name);
	if (e == NULL || e->fence == 0)
		PG_RETURN_NULL();
	PG_RETURN_INT64(e->fence);
}

/* ----------------------------------------------------------------
 * Several locks at once
 * ----------------------------------------------------------------
 */
static int
cstring_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/*
 * The lock_names argument: a one-dimensional text array of distinct names,
 * each valid as a single lock_name, at most redis_lock.max_locks of them.
 * Checked before any round trip.
 */
static char **
arg_lock_names(FunctionCallInfo fcinfo, int argno, int *n)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;
	char	  **names;
	char	  **sorted;
	int			i;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("lock_names must not be null")));
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lock_names must be a one-dimensional array")));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, n);
	if (*n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lock_names must not be empty")));
	for (i = 0; i < *n; i++)
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("lock_names must not contain null"),
					 errdetail("Element %d is null.", i + 1)));
	if (*n > rl_session_lock_limit())
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("too many Redis locks asked for at once"),
				 errdetail("%d names were given; redis_lock.max_locks_per_session is %d.",
						   *n, rl_session_lock_limit())));
	names = palloc(sizeof(char *) * *n);
	for (i = 0; i < *n; i++)
	{
		text	   *t = DatumGetTextPP(elems[i]);
		int			len = VARSIZE_ANY_EXHDR(t);

		if (len == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("lock_names must not contain an empty name"),
					 errdetail("Element %d is empty.", i + 1)));
		if (len > RL_MAX_NAME_LEN)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("lock names must not be longer than %d bytes", RL_MAX_NAME_LEN),
					 errdetail("Element %d has %d bytes.", i + 1, len)));
		names[i] = text_to_cstring(t);
		refuse_reserved_name(names[i], i + 1, "lock_names");
	}
	sorted = palloc(sizeof(char *) * *n);
	memcpy(sorted, names, sizeof(char *) * *n);
	qsort(sorted, *n, sizeof(char *), cstring_cmp);
	for (i = 1; i < *n; i++)
		if (strcmp(sorted[i - 1], sorted[i]) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("lock_names must not contain duplicates"),
					 errdetail("Lock \"%s\" is named more than once.", sorted[i])));
	pfree(sorted);
	return names;
}

/* "a", "b" and "c"; past a few names, how many more */
static char *
quoted_names(char **names, int n)
{
	StringInfoData buf;
	int			shown = Min(n, 5);
	int			i;

	initStringInfo(&buf);
	for (i = 0; i < shown; i++)
	{
		if (i > 0)
			appendStringInfoString(&buf, i == n - 1 ? " and " : ", ");
		appendStringInfo(&buf, "\"%s\"", names[i]);
	}
	if (shown < n)
		appendStringInfo(&buf, " and %d more", n - shown);
	return buf.data;
}

/*
 * redis_lock_acquire_many(lock_names, ttl, wait, xact): take every lock or
 * none, waiting up to wait (redis_lock.wait_timeout when NULL).  Returns
 * the fencing tokens in the order given (NULL elements without fencing:
 * Redlock); raises 55P03, naming the lock that was busy, if they are not
 * obtained.
 */
Datum
redis_lock_acquire_many(PG_FUNCTION_ARGS)
{
	int			n;
	char	  **names = arg_lock_names(fcinfo, 0, &n);
	int64		ttl = rl_fn_arg_interval_ms(fcinfo, 1, "ttl", false);
	int64		wait = rl_fn_arg_interval_ms(fcinfo, 2, "wait", true);
	bool		xact = rl_fn_arg_bool(fcinfo, 3, "xact");
	bool		obtained;
	int			busy;
	int64	   *fences;
	Datum	   *elems;
	bool	   *nulls;
	int			dims[1];
	int			lbs[1] = {1};
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			i;

	if (wait < 0)
		wait = rl_wait_timeout_ms;
	if (!xact && !rl_session_locks)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("session-scoped Redis locks are disabled for this session"),
				 errdetail("redis_lock.session_locks is off: behind a transaction-pooling connection pooler another client would inherit the lock."),
				 errhint("Take the locks with xact => true inside a transaction.")));
	fences = rl_acquire_many((const char *const *) names, n, ttl, wait,
							 xact ? RL_SCOPE_XACT : RL_SCOPE_SESSION,
							 &obtained, &busy);
	if (!obtained)
	{
		if (wait == 0)
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("could not obtain Redis locks %s", quoted_names(names, n)),
					 errdetail("Another client holds Redis lock \"%s\"; none of the %d locks was taken.",
							   names[busy], n)));
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not obtain Redis locks %s within %s",
						quoted_names(names, n), rl_format_ms(wait)),
				 errdetail("Another client holds Redis lock \"%s\"; none of the %d locks was taken.",
						   names[busy], n)));
	}
	elems = palloc(sizeof(Datum) * n);
	nulls = palloc(sizeof(bool) * n);
	for (i = 0; i < n; i++)
	{
		/* Redlock: tokens from independent masters are not ordered, so none */
		nulls[i] = fences[i] == 0;
		elems[i] = Int64GetDatum(fences[i]);
	}
	dims[0] = n;
	get_typlenbyvalalign(INT8OID, &typlen, &typbyval, &typalign);
	PG_RETURN_ARRAYTYPE_P(construct_md_array(elems, nulls, 1, dims, lbs, INT8OID,
											 typlen, typbyval, typalign));
}

/*
 * redis_lock_release_many(lock_names): drop one session-scoped hold of each;
 * returns how many were dropped of locks still held (a WARNING for each
 * name not held, held only at transaction scope, or lost).
 */
Datum
redis_lock_release_many(PG_FUNCTION_ARGS)
{
	int			n;
	char	  **names = arg_lock_names(fcinfo, 0, &n);

	PG_RETURN_INT32(rl_release_many((const char *const *) names, n));
}

/* ----------------------------------------------------------------
 * with_lock: acquire, run the query in a subtransaction, release
 * ----------------------------------------------------------------
 */
/*
 * redis_lock_with_lock(lock_name, query, ttl, wait): run query in a
 * subtransaction while holding the lock, then release it, also when the query
 * fails.  Returns the number of rows the query processed.
 */
Datum
redis_lock_with_lock(PG_FUNCTION_ARGS)
{
	char	   *name = rl_fn_arg_name(fcinfo, 0);
	char	   *query;
	int64		ttl;
	int64		wait;
	bool		obtained;
	uint64		processed = 0;
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("query must not be null")));
	query = text_to_cstring(PG_GETARG_TEXT_PP(1));
	ttl = rl_fn_arg_interval_ms(fcinfo, 2, "ttl", false);
	wait = rl_fn_arg_interval_ms(fcinfo, 3, "wait", true);
	if (wait < 0)
		wait = rl_wait_timeout_ms;

	(void) rl_acquire(RL_MODE_EXCLUSIVE, name, ttl, wait, RL_SCOPE_SESSION,
					  &obtained);
	if (!obtained)
		raise_not_obtained(name, wait);

	/*
	 * The query runs in a subtransaction so that on error we are back in a
	 * clean state to release the lock before re-raising the error as is.
	 */
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	PG_TRY();
	{
		int			ret;

		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		ret = SPI_execute(query, false, 0);
		if (ret < 0)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("query could not run inside redis_lock_with_lock"),
					 errdetail_internal("SPI_execute returned %s.",
										SPI_result_code_string(ret))));
		processed = SPI_processed;
		SPI_finish();
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
		rl_release_one_error_safe(name);
		ReThrowError(edata);
	}
	PG_END_TRY();

	/* nothing here depends on the release's answer: not waited for */
	rl_release_nowait(name);
	PG_RETURN_INT64((int64) processed);
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
			values[10] = mode_datum(e->names.protocol);
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
		values[12] = mode_datum(l->st.protocol);
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
