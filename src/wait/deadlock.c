/*-------------------------------------------------------------------------
 *
 * deadlock.c
 *	  Owns the detection of deadlocks that run through Redis locks.  A
 *	  backend waiting for a Redis lock held by another backend of this
 *	  server, once it has waited deadlock_timeout, follows what the holders
 *	  wait for -- PostgreSQL heavyweight locks (rows, tables, advisory
 *	  locks, transaction ids) as pg_blocking_pids() sees them, and the Redis
 *	  locks other backends wait for -- and when that leads back to itself it
 *	  fails with 40P01, as PostgreSQL's own detector does.  That detector
 *	  cannot see a wait for a Redis lock: without this, each side of such a
 *	  cycle waits out its whole wait.
 *
 *	  A waiting backend publishes which Redis locks it waits for, in a
 *	  record of its own in shared memory, from its first check on: a wait
 *	  shorter than deadlock_timeout touches no shared memory.  A wait for
 *	  more keys than the record has room for (a multi-key acquire) puts all
 *	  of them in a dynamic shared memory segment of its own, which other
 *	  checks read: a cycle through any of them is found.  Who holds a lock
 *	  comes from the watchdog registry.  Holders outside this server (other
 *	  servers, services) are not known here and never close a cycle.
 *
 *	  The registry learns that a hold is gone from Redis (an administrator's
 *	  force release, a restart, a failover) only at the worker's next
 *	  renewal, so a cycle the registry shows is confirmed before anyone is
 *	  failed for it: each of its holds in Redis, by the caller, in one round
 *	  trip (rl_deadlock_check_due hands them over, rl_deadlock_confirm
 *	  decides), then every edge again here (see rl_dl_confirm_cycle).  At most one
 *	  member of a cycle fails: the first to confirm it.  Exists only with
 *	  shared_preload_libraries = 'redis_lock'.
 *
 *	  This file owns each backend's wait: its record and segment, their
 *	  publication and withdrawal, when a check is due, and the decision on
 *	  a cycle found (rl_deadlock_confirm, with its 40P01).  The wait-for
 *	  graph -- the snapshot of the others' waits and of the holds, the
 *	  search, the confirmation of a cycle's edges here and its description
 *	  -- is deadlock_graph.c's.
 *
 *	  Must not: talk to Redis, hold an LWLock across an ERROR of its own,
 *	  raise where interrupts are held, report a cycle whose holds Redis did
 *	  not confirm, or leave a wait published after the wait (its end,
 *	  transaction abort, subtransaction abort and backend exit each withdraw
 *	  it, and its segment with it).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/wait/deadlock.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "postmaster/autovacuum.h"
#include "replication/walsender.h"
#include "storage/dsm.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/array.h"
#include "utils/fmgrprotos.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "worker/worker.h"
#include "wait/wait_int.h"

/* Checks of one wait after the first are at least this far apart */
#define RL_DEADLOCK_MIN_RECHECK_MS	10

RLDeadlockShared *rl_dl = NULL;

/* This backend's wait */
static bool waiting = false;
static const RLWaitKey *wait_keys = NULL;
static int	wait_nkeys = 0;
static TimestampTz next_check = 0;
static int	recheck_ms = 0;
static bool published = false;	/* my_record holds this wait */
static RLWaitRecord *my_record = NULL;
RLWaitRecord rl_dl_mine;		/* what this wait published (also without a
								 * record of its own) */
RLWaitId   *rl_dl_mine_keys = NULL;	/* every key of it (TopMemoryContext) */
static int	mine_keys_cap = 0;
dsm_segment *rl_dl_mine_segment = NULL;	/* rl_dl_mine.more, attached */

/*
 * A cycle the last check found, until Redis has been asked about its holds
 * and rl_deadlock_confirm decided (or the wait ended): its context hangs
 * off TopMemoryContext, so that an error in the caller's round trip leaves
 * it to the next check or the wait's end to free.
 */
static MemoryContext pending_cxt = NULL;
static Check *pending = NULL;
static RLDeadlockHold *pending_holds = NULL;
static int	pending_nholds = 0;

/*
 * A check that found no cycle leaves the fingerprint of every wait it saw
 * (PostgreSQL 14+): while it stays the same, no cycle can have formed and
 * the next check ends there.
 */
static bool quiet_valid = false;
static uint64 quiet_print = 0;

/* ----------------------------------------------------------------
 * Shared memory
 * ----------------------------------------------------------------
 */

/* Room for nrecords records in the extension's area (interface/shmem.c) */
Size
rl_deadlock_shmem_size(int nrecords)
{
	return add_size(offsetof(RLDeadlockShared, records),
					mul_size(nrecords, sizeof(RLWaitRecord)));
}

/*
 * The records at area, nrecords of them (one per process that can run
 * SQL), with their two LWLocks: none used when just created (!found)
 */
void
rl_deadlock_shmem_init(void *area, int nrecords, LWLock *records_lock,
					   LWLock *victim_lock, bool found)
{
	rl_dl = (RLDeadlockShared *) area;
	if (!found)
	{
		memset(rl_dl, 0, rl_deadlock_shmem_size(nrecords));
		rl_dl->records_lock = records_lock;
		rl_dl->victim_lock = victim_lock;
		rl_dl->next_seq = 1;
		rl_dl->nrecords = nrecords;
	}
}

/* This backend's record, or NULL when it has none */
static RLWaitRecord *
record_of_mine(void)
{
	int			procno;

	if (rl_dl == NULL)
		return NULL;
	procno = rl_wait_my_procno();
	return procno >= 0 && procno < rl_dl->nrecords ? &rl_dl->records[procno] : NULL;
}

/* ----------------------------------------------------------------
 * The wait: begin, publish, withdraw, end
 * ----------------------------------------------------------------
 */

/*
 * A segment holding every key of this wait, not yet named by any record
 * (its seq is set when it is), or NULL when no more segments can be made
 * (max_connections decides how many): the record alone then tells the
 * others' checks of its first keys.  Kept for the session, not a resource
 * owner: withdraw() detaches it, which destroys it.
 */
static dsm_segment *
make_segment(void)
{
	dsm_segment *seg;
	RLWaitSegment *w;

	seg = dsm_create(add_size(offsetof(RLWaitSegment, keys),
							  mul_size(rl_dl_mine.nkeys, sizeof(RLWaitId))),
					 DSM_CREATE_NULL_IF_MAXSEGMENTS);
	if (seg == NULL)
		return NULL;
	dsm_pin_mapping(seg);
	w = dsm_segment_address(seg);
	w->pid = MyProcPid;
	w->nkeys = rl_dl_mine.nkeys;
	w->seq = 0;
	memcpy(w->keys, rl_dl_mine_keys, sizeof(RLWaitId) * rl_dl_mine.nkeys);
	return seg;
}

/*
 * Publish what this wait waits for (again, with a new seq, when its keys
 * changed).  The callbacks that withdraw it come first, so that no error
 * can leave it published.
 */
static void
publish(void)
{
	dsm_segment *seg = NULL;
	dsm_segment *old_seg;
	int			i;

	rl_wait_end_with(rl_deadlock_wait_end);
	if (wait_nkeys > mine_keys_cap)
	{
		int			cap = Max(wait_nkeys, 2 * mine_keys_cap);

		rl_dl_mine_keys = rl_dl_mine_keys == NULL ?
			MemoryContextAlloc(TopMemoryContext, sizeof(RLWaitId) * cap) :
			repalloc(rl_dl_mine_keys, sizeof(RLWaitId) * cap);
		mine_keys_cap = cap;
	}
	rl_dl_mine.pid = MyProcPid;
	rl_dl_mine.nkeys = wait_nkeys;
	for (i = 0; i < rl_dl_mine.nkeys; i++)
	{
		rl_dl_mine_keys[i].id = rl_registry_key_id(wait_keys[i].target_spec,
											 wait_keys[i].key);
		rl_dl_mine_keys[i].protocol = wait_keys[i].protocol;
	}
	memcpy(rl_dl_mine.keys, rl_dl_mine_keys,
		   sizeof(RLWaitId) * Min(rl_dl_mine.nkeys, RL_DEADLOCK_INLINE_KEYS));
	my_record = record_of_mine();
	if (my_record != NULL && rl_dl_mine.nkeys > RL_DEADLOCK_INLINE_KEYS)
		seg = make_segment();
	rl_dl_mine.more = seg != NULL ? dsm_segment_handle(seg) : DSM_HANDLE_INVALID;
	LWLockAcquire(rl_dl->records_lock, LW_EXCLUSIVE);
	rl_dl_mine.seq = rl_dl->next_seq++;
	if (seg != NULL)
		((RLWaitSegment *) dsm_segment_address(seg))->seq = rl_dl_mine.seq;
	if (my_record != NULL)
		*my_record = rl_dl_mine;
	LWLockRelease(rl_dl->records_lock);
	published = true;
	/* the last publication's segment, which no record names any more */
	old_seg = rl_dl_mine_segment;
	rl_dl_mine_segment = seg;
	if (old_seg != NULL)
		dsm_detach(old_seg);
}

/* Withdraw this backend's record, leaving its segment; never raises */
static void
withdraw_record(void)
{
	if (!published)
		return;
	published = false;
	if (my_record == NULL)
		return;
	LWLockAcquire(rl_dl->records_lock, LW_EXCLUSIVE);
	my_record->pid = 0;
	my_record->nkeys = 0;
	my_record->more = DSM_HANDLE_INVALID;
	LWLockRelease(rl_dl->records_lock);
}

/* Withdraw this backend's record and its segment; never raises */
static void
withdraw(void)
{
	dsm_segment *seg = rl_dl_mine_segment;

	withdraw_record();
	rl_dl_mine_segment = NULL;
	/* a check reading it meanwhile keeps it until it detaches */
	if (seg != NULL)
		dsm_detach(seg);
}

/* Forget the cycle the last check found, if any; never raises */
static void
drop_pending(void)
{
	MemoryContext cxt = pending_cxt;

	pending = NULL;
	pending_holds = NULL;
	pending_nholds = 0;
	pending_cxt = NULL;
	if (cxt == NULL)
		return;
	if (CurrentMemoryContext == cxt)
		MemoryContextSwitchTo(TopMemoryContext);
	MemoryContextDelete(cxt);
}

/*
 * This backend starts waiting for keys (nkeys of them; the caller keeps
 * them valid while it waits).  Only local state: nothing is published, and
 * nothing is checked, before deadlock_timeout.  No-op without preloading.
 */
void
rl_deadlock_wait_begin(const RLWaitKey *keys, int nkeys)
{
	rl_deadlock_wait_end();
	if (rl_dl == NULL || nkeys <= 0)
		return;
	waiting = true;
	wait_keys = keys;
	wait_nkeys = nkeys;
	quiet_valid = false;
	recheck_ms = Max(DeadlockTimeout, RL_DEADLOCK_MIN_RECHECK_MS);
	next_check = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), DeadlockTimeout);
}

/*
 * The keys this wait waits for changed (a multi-key waiter granted some of
 * them): call it whenever the keys waited for, or the keys held, change
 * during one wait.  Republished at once if published: a key granted in the
 * middle of a wait is a hold nobody began waiting for, which the next
 * checks must not take for unchanged.
 */
void
rl_deadlock_wait_keys(const RLWaitKey *keys, int nkeys)
{
	if (!waiting)
		return;
	wait_keys = keys;
	wait_nkeys = nkeys;
	quiet_valid = false;
	if (published)
		publish();
}

/* The earlier of deadline and the next check of this wait */
TimestampTz
rl_deadlock_wake_at(TimestampTz deadline)
{
	return waiting ? Min(deadline, next_check) : deadline;
}

/* This backend stopped waiting (any way); never raises, idempotent */
void
rl_deadlock_wait_end(void)
{
	withdraw();
	drop_pending();
	waiting = false;
	wait_keys = NULL;
	wait_nkeys = 0;
}

/* ----------------------------------------------------------------
 * The check
 * ----------------------------------------------------------------
 */

/*
 * The holds on the cycle c->path, for the caller to ask Redis about (one
 * per Redis edge), into pending_holds; false when one of them is no longer
 * in the registry (its holder let it go since the search: no cycle).
 */
static bool
holds_to_confirm(Check *c)
{
	int			i;

	pending_holds = palloc0(sizeof(RLDeadlockHold) * Max(c->depth, 1));
	pending_nholds = 0;
	for (i = 0; i < c->depth; i++)
	{
		Step	   *n = &c->path[i];
		const RLRegistryHold *h;
		RLDeadlockHold *out;

		if (!n->redis)
			continue;
		h = n->edges[n->next - 1].hold;
		out = &pending_holds[pending_nholds++];
		out->target_spec = rl_registry_hold_target(h);
		if (out->target_spec == NULL)
			return false;
		out->key = h->key;
		out->owner = h->owner;
		out->protocol = h->protocol;
		out->script_free = h->script_free;
		out->in_redis = false;
	}
	return true;
}

/*
 * One check: is this backend, waiting for its keys, on a cycle of waits?
 * Returns true when the search found one, left in pending with the holds
 * Redis is to be asked about.  Its cost: a look at every PGPROC and record;
 * only when a wait began since the last check (PostgreSQL 14+; on 13,
 * always) one pass over the registry, a read of the segment of each waiter
 * for more keys than its record has room for, and a pg_blocking_pids() call
 * per process the search reaches.
 */
static bool
run_check(void)
{
	MemoryContext cxt;
	MemoryContext old;
	Check	   *c;
	TimestampTz started = GetCurrentTimestamp();
	uint64		print;
	uint64	   *ids;
	int			nids = 0;
	int			blocked;
	int			i;
	int			k;

	/* freed with its parent if the check raises */
	cxt = AllocSetContextCreate(CurrentMemoryContext, "redis_lock deadlock check",
								ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(cxt);
	c = palloc0(sizeof(Check));
	print = rl_dl_scan_procs(c, &blocked);
	print = rl_dl_snapshot_waiters(c, print);
	if (quiet_valid && print == quiet_print)
	{
		ereport(DEBUG1,
				(errmsg_internal("redis_lock deadlock check: no wait began since the last check, %ld us",
								 (long) (GetCurrentTimestamp() - started))));
		goto done;
	}
	if (blocked + c->nwaiters == 0)
	{
		ereport(DEBUG1,
				(errmsg_internal("redis_lock deadlock check: no other process waits, %ld us",
								 (long) (GetCurrentTimestamp() - started))));
		goto quiet;
	}
	rl_dl_read_segments(c);

	/* the holds of every lock a wait waits for, in one pass */
	nids = rl_dl_mine.nkeys;
	for (i = 0; i < c->nwaiters; i++)
		nids += c->waiters[i].nkeys;
	ids = palloc(sizeof(uint64) * (nids + 1));
	nids = 0;
	for (k = 0; k < rl_dl_mine.nkeys; k++)
		ids[nids++] = rl_dl_mine_keys[k].id;
	for (i = 0; i < c->nwaiters; i++)
		for (k = 0; k < c->waiters[i].nkeys; k++)
			ids[nids++] = c->waiters[i].keys[k].id;
	nids = rl_dl_sort_unique(ids, nids);
	c->holds = rl_dl_holds_of(ids, nids, c->waiting, c->nwaiting, &c->nholds);

	if (!rl_dl_search(c))
	{
		ereport(DEBUG1,
				(errmsg_internal("redis_lock deadlock check: no cycle; %d other process(es) waiting, %d Redis hold(s) of %d lock(s) waited for, %d process(es) followed, %ld us",
								 blocked + c->nwaiters, c->nholds, nids, c->followed,
								 (long) (GetCurrentTimestamp() - started))));
		goto quiet;
	}

	/* the cycle waits for Redis' word: its context outlives this call */
	MemoryContextSetParent(cxt, TopMemoryContext);
	pending_cxt = cxt;
	pending = c;
	if (holds_to_confirm(c))
	{
		ereport(DEBUG1,
				(errmsg_internal("redis_lock deadlock check: a cycle of %d process(es) found, %ld us; asking Redis about its %d hold(s)",
								 c->depth, (long) (GetCurrentTimestamp() - started),
								 pending_nholds)));
		MemoryContextSwitchTo(old);
		return true;
	}
	ereport(DEBUG1,
			(errmsg_internal("redis_lock deadlock check: a cycle of %d process(es) was not confirmed",
							 c->depth)));
	MemoryContextSwitchTo(old);
	drop_pending();
	quiet_valid = false;
	return false;

quiet:
#ifdef RL_HAVE_WAIT_START
	quiet_valid = true;
	quiet_print = print;
#endif
done:
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
	return false;
}

/*
 * In a wait's loop: check for a deadlock if one is due (deadlock_timeout
 * after the wait began, then every deadlock_timeout).  O(1) when none is
 * due.  Returns true when the check found a cycle: *holds (*nholds of them)
 * are its holds, for the caller to ask Redis about before it calls
 * rl_deadlock_confirm (wait.h).
 */
bool
rl_deadlock_check_due(TimestampTz now, RLDeadlockHold **holds, int *nholds)
{
	bool		found;

	drop_pending();
	*holds = NULL;
	*nholds = 0;
	if (!waiting || now < next_check)
		return false;
	next_check = TimestampTzPlusMilliseconds(now, recheck_ms);
	/* never an ERROR, nor a wait on Redis, where interrupts are held off */
	if (InterruptHoldoffCount > 0 || CritSectionCount > 0)
		return false;
	if (!published)
		publish();
	found = run_check();
	next_check = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), recheck_ms);
	if (found)
	{
		*holds = pending_holds;
		*nholds = pending_nholds;
	}
	return found;
}

/*
 * Decide the cycle the last rl_deadlock_check_due found, once the caller
 * has asked Redis about its holds: when Redis has every one and the cycle
 * still holds here (rl_dl_confirm_cycle), fail this backend's wait with 40P01, as
 * PostgreSQL's own detector does; otherwise the wait goes on.  No-op when
 * no cycle is pending.
 */
void
rl_deadlock_confirm(void)
{
	MemoryContext old;
	Check	   *c = pending;
	bool		confirmed = false;
	char	   *client = NULL;
	char	   *log = NULL;
	int			i;

	if (c == NULL || InterruptHoldoffCount > 0 || CritSectionCount > 0)
	{
		drop_pending();
		return;
	}
	old = MemoryContextSwitchTo(pending_cxt);
	for (i = 0; i < pending_nholds; i++)
		if (!pending_holds[i].in_redis)
			break;
	if (i < pending_nholds)
	{
		Edge	   *e = NULL;
		int			k;
		int			r = 0;

		/* pending_holds are the Redis edges' holds, in the path's order */
		for (k = 0; k < c->depth && e == NULL; k++)
			if (c->path[k].redis && r++ == i)
				e = &c->path[k].edges[c->path[k].next - 1];
		Assert(e != NULL);
		ereport(DEBUG1,
				(errmsg_internal("redis_lock deadlock check: a cycle of %d process(es) was not confirmed: Redis did not show process %d holding Redis lock \"%s\"",
								 c->depth, e->pid, e->hold->key + e->hold->name_off)));
	}
	else
	{
		LWLockAcquire(rl_dl->victim_lock, LW_EXCLUSIVE);
		confirmed = rl_dl_confirm_cycle(c);
		if (confirmed)
			withdraw_record();	/* gone before the next member looks */
		LWLockRelease(rl_dl->victim_lock);
		if (!confirmed)
			ereport(DEBUG1,
					(errmsg_internal("redis_lock deadlock check: a cycle of %d process(es) was not confirmed",
									 c->depth)));
	}
	MemoryContextSwitchTo(old);
	if (confirmed)
		rl_dl_describe_cycle(c, &client, &log);
	/* the round trip took its time: the next check is deadlock_timeout away */
	next_check = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), recheck_ms);
	quiet_valid = false;
	if (!confirmed)
	{
		drop_pending();
		return;
	}
	rl_deadlock_wait_end();
	pgstat_report_deadlock();
	ereport(ERROR,
			(errcode(ERRCODE_T_R_DEADLOCK_DETECTED),
			 errmsg("deadlock detected"),
			 errdetail_internal("%s", client),
			 errdetail_log("%s", log),
			 errhint("See server log for query details.")));
}
