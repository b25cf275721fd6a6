/*-------------------------------------------------------------------------
 *
 * waitend.c
 *	  Owns the end of every publication of a wait (the record the waiters'
 *	  view reads, waiters.c, and the deadlock check's, deadlock.c): each
 *	  registers the function that withdraws it, and whatever ends the wait
 *	  calls them all -- the end of the transaction or subtransaction it ran
 *	  in, or backend exit.  Also this backend's PGPROC number, which indexes
 *	  both publications' records.
 *
 *	  Must not: know what a publication holds, raise, or wait.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/wait/waitend.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/proc.h"

#include "wait/wait_int.h"

/* The publications of a wait: waiters.c's and deadlock.c's */
#define RL_WAIT_ENDS_MAX	2

static RLWaitEnd ends[RL_WAIT_ENDS_MAX];
static int	nends = 0;

/*
 * This backend's number among the processes that have a PGPROC (what
 * indexes a record of the waiters and of the deadlock check), or -1 when it
 * has none.
 */
int
rl_wait_my_procno(void)
{
	if (MyProc == NULL)
		return -1;
#if PG_VERSION_NUM >= 170000
	return MyProcNumber;
#else
	return MyProc->pgprocno;
#endif
}

/*
 * Withdraw every publication, in the order they were first registered: each
 * end is independent of the others, does nothing when its publication is
 * not made, and never raises.
 */
static void
end_wait(void)
{
	int			i;

	for (i = 0; i < nends; i++)
		ends[i] ();
}

static void
redis_lock_wait_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_COMMIT)
		end_wait();
}

static void
redis_lock_wait_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								 SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		end_wait();
}

static void
redis_lock_wait_before_shmem_exit(int code, Datum arg)
{
	end_wait();
}

/*
 * A publication about to be made is withdrawn by end (which must never
 * raise and be idempotent) whenever the wait ends.  Called before each
 * publication, so that no error can leave one behind; registers the
 * callbacks once per backend, and each end once.
 */
void
rl_wait_end_with(RLWaitEnd end)
{
	int			i;

	if (nends == 0)
	{
		RegisterXactCallback(redis_lock_wait_xact_callback, NULL);
		RegisterSubXactCallback(redis_lock_wait_subxact_callback, NULL);
		before_shmem_exit(redis_lock_wait_before_shmem_exit, (Datum) 0);
	}
	for (i = 0; i < nends; i++)
		if (ends[i] == end)
			return;
	if (nends >= RL_WAIT_ENDS_MAX)
		elog(ERROR, "too many publications of a wait");
	ends[nends++] = end;
}
