/*-------------------------------------------------------------------------
 *
 * functions.c
 *	  Owns the SQL-callable functions that take and give back locks
 *	  (doc/reference.md, "Functions"): acquire, release, extend, fence,
 *	  several locks at once, with_lock; the argument checks every function
 *	  shares (NULL, empty, oversized names; ttl and wait ranges), the errors
 *	  a caller sees for a wait that elapsed, and the shape of their results.
 *	  The functions that look at locks are in statusfunctions.c.
 *
 *	  The work itself is done by the lock table (locktable.c and the lock*.c
 *	  files beside it; lockmany.c for several locks at once); this file must
 *	  not keep lock state of its own or talk to Redis except through them,
 *	  and must not call hiredis.
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

#include "redis/redis.h"
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
