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

#include "wait/wait.h"

/* Checks of one wait after the first are at least this far apart */
#define RL_DEADLOCK_MIN_RECHECK_MS	10

/*
 * PostgreSQL 14 and later stamp every heavyweight-lock wait with the time
 * it began (PGPROC.waitStart): a wait's identity, which lets a check see
 * that nothing began waiting since the last one, and a confirmation see
 * that a process stayed in one wait.
 */
#if PG_VERSION_NUM >= 140000
#define RL_HAVE_WAIT_START
#endif

#ifndef DSM_HANDLE_INVALID
#define DSM_HANDLE_INVALID ((dsm_handle) 0)
#endif

/* One lock waited for, as published */
typedef struct RLWaitId
{
	uint64		id;				/* rl_registry_key_id() */
	RLProtocol	protocol;		/* the hold waited for (RLWaitKey) */
} RLWaitId;

/* What one backend waits for, while it waits and has been checked once */
typedef struct RLWaitRecord
{
	int			pid;			/* 0: nobody waits here */
	int			nkeys;			/* every key waited for */
	uint64		seq;			/* this publication; never reused */
	dsm_handle	more;			/* nkeys > RL_DEADLOCK_INLINE_KEYS: the
								 * segment holding all of them (a
								 * RLWaitSegment); DSM_HANDLE_INVALID when
								 * none could be made: keys[] only */
	RLWaitId	keys[RL_DEADLOCK_INLINE_KEYS];	/* the first ones */
} RLWaitRecord;

/*
 * Every key of a wait too long for its record: written before the record
 * names it, never changed after; its own pid and seq let a reader see that
 * it is that publication's (a handle may name a newer segment).
 */
typedef struct RLWaitSegment
{
	int			pid;
	int			nkeys;
	uint64		seq;
	RLWaitId	keys[FLEXIBLE_ARRAY_MEMBER];
} RLWaitSegment;

/*
 * One record per process that can run SQL, indexed by its PGPROC number,
 * like the wait queue's seats.
 */
typedef struct RLDeadlockShared
{
	LWLock	   *records_lock;	/* the records and next_seq; no other lock of
								 * the extension is taken while it is held */
	LWLock	   *victim_lock;	/* held while a cycle is confirmed: first in
								 * the extension's lock order, before the
								 * registry lock, the records lock, and
								 * PostgreSQL's ProcArrayLock and lock
								 * manager locks (interface/shmem.c) */
	uint64		next_seq;
	int			nrecords;
	RLWaitRecord records[FLEXIBLE_ARRAY_MEMBER];
} RLDeadlockShared;

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
static bool callbacks_set = false;

/*
 * A cycle the last check found, until Redis has been asked about its holds
 * and rl_deadlock_confirm decided (or the wait ended): its context hangs
 * off TopMemoryContext, so that an error in the caller's round trip leaves
 * it to the next check or the wait's end to free.
 */
typedef struct Check Check;
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

	if (rl_dl == NULL || MyProc == NULL)
		return NULL;
#if PG_VERSION_NUM >= 170000
	procno = MyProcNumber;
#else
	procno = MyProc->pgprocno;
#endif
	return procno >= 0 && procno < rl_dl->nrecords ? &rl_dl->records[procno] : NULL;
}

/* ----------------------------------------------------------------
 * The wait: begin, publish, withdraw, end
 * ----------------------------------------------------------------
 */
static void
redis_lock_deadlock_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_COMMIT)
		rl_deadlock_wait_end();
}

static void
redis_lock_deadlock_subxact_callback(SubXactEvent event,
									 SubTransactionId mySubid,
									 SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		rl_deadlock_wait_end();
}

static void
redis_lock_deadlock_before_shmem_exit(int code, Datum arg)
{
	rl_deadlock_wait_end();
}

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

	if (!callbacks_set)
	{
		RegisterXactCallback(redis_lock_deadlock_xact_callback, NULL);
		RegisterSubXactCallback(redis_lock_deadlock_subxact_callback, NULL);
		before_shmem_exit(redis_lock_deadlock_before_shmem_exit, (Datum) 0);
		callbacks_set = true;
	}
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

/* One edge of the wait-for graph: a process blocked by another */
typedef struct Edge
{
	int			pid;			/* the blocking process */
	uint64		key_id;			/* Redis: the lock waited for; 0: PostgreSQL */
	const RLRegistryHold *hold; /* Redis: the blocking hold (Check.holds) */
	RLProtocol	protocol;		/* Redis: the hold waited for */
} Edge;

/* A process on the path the search follows */
typedef struct Step
{
	int			pid;
	bool		redis;			/* waits for Redis locks (else PostgreSQL's) */
	int			record;			/* redis: index of its record; -1: us */
	uint64		seq;			/* redis: the publication followed */
	uint64		wait_start;		/* PostgreSQL: its wait's start (14+) */
	Edge	   *edges;
	int			nedges;
	int			next;			/* edges[next - 1]: the one followed */
} Step;

/* Another backend's published wait, as the check found it */
typedef struct Waiter
{
	RLWaitRecord r;
	int			record;			/* its index in the records */
	const RLWaitId *keys;		/* every key it waits for (r.keys, or a copy
								 * of its segment's) */
	int			nkeys;
} Waiter;

struct Check
{
	Waiter	   *waiters;		/* sorted by pid */
	int			nwaiters;
	RLRegistryHold *holds;		/* holds of the locks waited for, by key_id */
	int			nholds;
	int		   *waiting;		/* pids of every process seen waiting, and
								 * ours: the only holders a cycle can go
								 * through (sorted, once the waiters are in) */
	int			nwaiting;
	HTAB	   *seen;			/* pids reached */
	Step	   *path;
	int			depth;
	int			path_cap;
	int			followed;		/* processes whose waits were looked at */
};

/* What this backend's wait published, and the records (deadlock.c) */
extern RLDeadlockShared *rl_dl;
extern RLWaitRecord rl_dl_mine;
extern RLWaitId *rl_dl_mine_keys;
extern dsm_segment *rl_dl_mine_segment;

/* The wait-for graph: the others' waits, the search, the cycle found */
extern uint64 rl_dl_scan_procs(Check *c, int *blocked);
extern uint64 rl_dl_snapshot_waiters(Check *c, uint64 print);
extern void rl_dl_read_segments(Check *c);
extern RLRegistryHold *rl_dl_holds_of(const uint64 *ids, int nids,
									  const int *pids, int npids,
									  int *nholds);
extern int	rl_dl_sort_unique(uint64 *ids, int n);
extern bool rl_dl_search(Check *c);
extern bool rl_dl_confirm_cycle(Check *c);
extern void rl_dl_describe_cycle(Check *c, char **client_out, char **log_out);

static int
pid_cmp(const void *a, const void *b)
{
	int			x = ((const Waiter *) a)->r.pid;
	int			y = ((const Waiter *) b)->r.pid;

	return x < y ? -1 : x > y ? 1 : 0;
}

static int
u64_cmp(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

static int
hold_cmp(const void *a, const void *b)
{
	return u64_cmp(&((const RLRegistryHold *) a)->key_id,
				   &((const RLRegistryHold *) b)->key_id);
}

static int
int_cmp(const void *a, const void *b)
{
	int			x = *(const int *) a;
	int			y = *(const int *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

/* Sort pids and drop duplicates; returns how many remain */
static int
sort_unique_pids(int *pids, int n)
{
	int			m = 0;
	int			i;

	qsort(pids, n, sizeof(int), int_cmp);
	for (i = 0; i < n; i++)
		if (m == 0 || pids[m - 1] != pids[i])
			pids[m++] = pids[i];
	return m;
}

/* Is a hold of held in the way of a wait for want?  Readers share. */
static bool
modes_conflict(RLProtocol want, RLProtocol held)
{
	return want != RL_PROTOCOL_RW_READ || held != RL_PROTOCOL_RW_READ;
}

/* The start of pid's current heavyweight-lock wait, 0 if none or unknown */
static uint64
wait_start_of(int pid)
{
#ifdef RL_HAVE_WAIT_START
	PGPROC	   *proc = BackendPidGetProc(pid);
	uint64		start;

	if (proc == NULL)
		return 0;
	start = pg_atomic_read_u64(&proc->waitStart);
	pg_read_barrier();
	return proc->pid == pid ? start : 0;
#else
	return 0;
#endif
}

/* pg_blocking_pids(pid): the processes its heavyweight-lock wait waits for */
static int32 *
blocking_pids(int pid, int *n)
{
	ArrayType  *a;

	a = DatumGetArrayTypeP(DirectFunctionCall1(pg_blocking_pids,
											   Int32GetDatum(pid)));
	/* an int4[] without nulls, as pg_blocking_pids() builds it */
	if (ARR_HASNULL(a) || ARR_ELEMTYPE(a) != INT4OID)
		elog(ERROR, "unexpected result of pg_blocking_pids()");
	*n = ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a));
	return (int32 *) ((char *) a + ARR_OVERHEAD_NONULLS(ARR_NDIM(a)));
}

/*
 * Every other process that waits for a heavyweight lock, folded into a
 * fingerprint with the identity of its wait, and noted in c->waiting;
 * *blocked counts them.  Reads PGPROCs without their locks: a wait that
 * begins meanwhile changes the next fingerprint.
 */
uint64
rl_dl_scan_procs(Check *c, int *blocked)
{
	uint64		print = 0;
	uint32		i;

	*blocked = 0;
	c->waiting = palloc(sizeof(int) * (2 * ProcGlobal->allProcCount + rl_dl->nrecords + 1));
	c->waiting[c->nwaiting++] = MyProcPid;
	for (i = 0; i < ProcGlobal->allProcCount; i++)
	{
		PGPROC	   *proc = &ProcGlobal->allProcs[i];
		int			pid = proc->pid;
		bool		waits = proc->waitLock != NULL;

		if (pid == 0 || pid == MyProcPid)
			continue;
#ifdef RL_HAVE_WAIT_START
		{
			uint64		start = pg_atomic_read_u64(&proc->waitStart);

			if (start != 0)
			{
				print = hash_combine64(print, hash_combine64((uint64) pid, start));
				waits = true;
			}
		}
#endif
		if (waits)
		{
			PGPROC	   *leader = proc->lockGroupLeader;

			(*blocked)++;
			c->waiting[c->nwaiting++] = pid;
			/* a parallel worker's wait is its leader's, which holds the locks */
			if (leader != NULL && leader != proc && leader->pid != 0)
				c->waiting[c->nwaiting++] = leader->pid;
		}
	}
	return print;
}

/* Copy the other backends' records, sorted by pid, folding in their seqs */
uint64
rl_dl_snapshot_waiters(Check *c, uint64 print)
{
	Waiter	   *w = palloc(sizeof(Waiter) * Max(rl_dl->nrecords, 1));
	int			n = 0;
	int			i;

	LWLockAcquire(rl_dl->records_lock, LW_SHARED);
	for (i = 0; i < rl_dl->nrecords; i++)
	{
		if (rl_dl->records[i].pid == 0 || rl_dl->records[i].pid == MyProcPid)
			continue;
		w[n].r = rl_dl->records[i];
		w[n].record = i;
		n++;
	}
	LWLockRelease(rl_dl->records_lock);
	qsort(w, n, sizeof(Waiter), pid_cmp);
	for (i = 0; i < n; i++)
	{
		print = hash_combine64(print, hash_combine64((uint64) w[i].r.pid, w[i].r.seq));
		c->waiting[c->nwaiting++] = w[i].r.pid;
		w[i].keys = w[i].r.keys;
		w[i].nkeys = Min(w[i].r.nkeys, RL_DEADLOCK_INLINE_KEYS);
	}
	c->nwaiting = sort_unique_pids(c->waiting, c->nwaiting);
	c->waiters = w;
	c->nwaiters = n;
	return print;
}

/*
 * Every key of the waiters whose records have no room for all of theirs,
 * from their segments.  A segment gone meanwhile (its wait ended: its seq
 * will not match at the confirmation), or one that is not this
 * publication's, leaves the record's keys alone.
 */
void
rl_dl_read_segments(Check *c)
{
	int			i;

	for (i = 0; i < c->nwaiters; i++)
	{
		Waiter	   *w = &c->waiters[i];
		dsm_segment *seg;
		RLWaitSegment *s;
		Size		need;

		if (w->r.nkeys <= RL_DEADLOCK_INLINE_KEYS || w->r.more == DSM_HANDLE_INVALID ||
			(rl_dl_mine_segment != NULL && w->r.more == dsm_segment_handle(rl_dl_mine_segment)))
			continue;
		seg = dsm_attach(w->r.more);
		if (seg == NULL)
			continue;
		s = dsm_segment_address(seg);
		need = offsetof(RLWaitSegment, keys) + sizeof(RLWaitId) * (Size) w->r.nkeys;
		if (dsm_segment_map_length(seg) >= need && s->pid == w->r.pid &&
			s->seq == w->r.seq && s->nkeys == w->r.nkeys)
		{
			RLWaitId   *keys = palloc(sizeof(RLWaitId) * w->r.nkeys);

			memcpy(keys, s->keys, sizeof(RLWaitId) * w->r.nkeys);
			w->keys = keys;
			w->nkeys = w->r.nkeys;
		}
		dsm_detach(seg);
	}
}

static Waiter *
find_waiter(Check *c, int pid)
{
	Waiter		key;

	key.r.pid = pid;
	return bsearch(&key, c->waiters, c->nwaiters, sizeof(Waiter), pid_cmp);
}

/*
 * The holds, in this server, of the locks whose ids are given (sorted,
 * unique) by the given backends (sorted, unique): the registry's one pass,
 * again with more room if it was short.
 */
RLRegistryHold *
rl_dl_holds_of(const uint64 *ids, int nids, const int *pids, int npids,
			   int *nholds)
{
	int			cap = 16;
	RLRegistryHold *holds = palloc(sizeof(RLRegistryHold) * cap);
	int			n;

	while ((n = rl_registry_holders(ids, nids, pids, npids, holds, cap)) > cap)
	{
		cap = n + n / 2;
		holds = repalloc(holds, sizeof(RLRegistryHold) * cap);
	}
	qsort(holds, n, sizeof(RLRegistryHold), hold_cmp);
	*nholds = n;
	return holds;
}

/* Sort ids and drop duplicates; returns how many remain */
int
rl_dl_sort_unique(uint64 *ids, int n)
{
	int			m = 0;
	int			i;

	qsort(ids, n, sizeof(uint64), u64_cmp);
	for (i = 0; i < n; i++)
		if (m == 0 || ids[m - 1] != ids[i])
			ids[m++] = ids[i];
	return m;
}

/* The edges of a wait for Redis locks: the conflicting holds of its keys */
static void
redis_edges(Check *c, Step *node, const RLWaitId *keys, int nkeys)
{
	int			cap = 4;
	int			k;

	node->edges = palloc(sizeof(Edge) * cap);
	for (k = 0; k < nkeys; k++)
	{
		int			lo = 0;
		int			hi = c->nholds;

		/* the first hold of the key */
		while (lo < hi)
		{
			int			mid = lo + (hi - lo) / 2;

			if (c->holds[mid].key_id < keys[k].id)
				lo = mid + 1;
			else
				hi = mid;
		}
		for (; lo < c->nholds && c->holds[lo].key_id == keys[k].id; lo++)
		{
			RLRegistryHold *h = &c->holds[lo];

			if (h->pid == node->pid || !modes_conflict(keys[k].protocol, h->protocol))
				continue;
			if (node->nedges == cap)
			{
				cap *= 2;
				node->edges = repalloc(node->edges, sizeof(Edge) * cap);
			}
			node->edges[node->nedges].pid = h->pid;
			node->edges[node->nedges].key_id = h->key_id;
			node->edges[node->nedges].hold = h;
			node->edges[node->nedges].protocol = keys[k].protocol;
			node->nedges++;
		}
	}
}

/* Put pid on the path, with the edges of whatever it waits for */
static void
push(Check *c, int pid)
{
	Step	   *node;
	Waiter	   *w;

	if (c->depth == c->path_cap)
	{
		c->path_cap *= 2;
		c->path = repalloc(c->path, sizeof(Step) * c->path_cap);
	}
	node = &c->path[c->depth++];
	memset(node, 0, sizeof(Step));
	node->pid = pid;
	c->followed++;
	if (pid == MyProcPid)
	{
		node->redis = true;
		node->record = -1;
		node->seq = rl_dl_mine.seq;
		redis_edges(c, node, rl_dl_mine_keys, rl_dl_mine.nkeys);
	}
	else if ((w = find_waiter(c, pid)) != NULL)
	{
		node->redis = true;
		node->record = w->record;
		node->seq = w->r.seq;
		redis_edges(c, node, w->keys, w->nkeys);
	}
	else
	{
		int32	   *pids;
		int			n;
		int			i;

		/* the wait's identity first: a confirmation compares it afterwards */
		node->wait_start = wait_start_of(pid);
		pids = blocking_pids(pid, &n);
		node->edges = palloc(sizeof(Edge) * Max(n, 1));
		for (i = 0; i < n; i++)
		{
			/* 0: a prepared transaction, which never waits */
			if (pids[i] == 0 || pids[i] == pid)
				continue;
			node->edges[node->nedges].pid = pids[i];
			node->edges[node->nedges].key_id = 0;
			node->edges[node->nedges].hold = NULL;
			node->edges[node->nedges].protocol = RL_PROTOCOL_SIMPLE;
			node->nedges++;
		}
	}
}

/*
 * Depth-first from this backend along the edges; true when one leads back
 * to it: then c->path is the cycle, each node's edges[next - 1] the edge
 * taken.  Each process is looked at once (at most one pg_blocking_pids()
 * call each).
 */
bool
rl_dl_search(Check *c)
{
	HASHCTL		ctl;
	bool		found;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(int);
	ctl.entrysize = sizeof(int);
	ctl.hcxt = CurrentMemoryContext;
	c->seen = hash_create("redis_lock deadlock search", 64, &ctl,
						  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	c->path_cap = 8;
	c->path = palloc(sizeof(Step) * c->path_cap);
	c->depth = 0;
	(void) hash_search(c->seen, &MyProcPid, HASH_ENTER, NULL);
	push(c, MyProcPid);
	while (c->depth > 0)
	{
		Step	   *top = &c->path[c->depth - 1];
		int			pid;

		if (top->next >= top->nedges)
		{
			c->depth--;			/* a dead end: never looked at again */
			continue;
		}
		pid = top->edges[top->next++].pid;
		if (pid == MyProcPid)
			return true;
		(void) hash_search(c->seen, &pid, HASH_ENTER, &found);
		if (!found)
			push(c, pid);
	}
	return false;
}

/*
 * Is the cycle real?  The search read the processes at different moments,
 * S; a process on it may have stopped waiting in between (released the
 * lock, then began another wait), and failing a transaction for a cycle
 * that never was all at once would be worse than a late detection.  And the
 * registry may still show a hold Redis no longer has.  So: (0) the caller
 * asked Redis, at a moment T' after S, and every hold on the cycle was
 * there with its holder's owner value (rl_deadlock_confirm checks that
 * before calling this); then, with victim_lock held, (1) the registry's
 * pass shows every one of those holds (same slot, same owner value) at a
 * moment T after T'; then (2) every PostgreSQL waiter is still blocked by
 * the next process, in the same wait as when the search looked (its
 * waitStart, 14+); then (3) every Redis waiter still has the publication
 * the search followed.  Each process was then waiting over an interval from
 * S to T, and a waiting process takes and gives up nothing, so at T' every
 * edge of the cycle held at once, in Redis too.  (On 13 a PostgreSQL
 * waiter's wait has no identity: (2) only sees it blocked by the next.)
 * Another member of the cycle that confirms it after us finds our record
 * withdrawn, so it does not fail too.
 */
bool
rl_dl_confirm_cycle(Check *c)
{
	uint64	   *ids = palloc(sizeof(uint64) * Max(c->depth, 1));
	int		   *pids = palloc(sizeof(int) * Max(c->depth, 1));
	RLRegistryHold *holds;
	int			nids = 0;
	int			nholds;
	int			i;
	int			j;
	bool		ok = true;

	for (i = 0; i < c->depth; i++)
		if (c->path[i].redis)
		{
			pids[nids] = c->path[i].edges[c->path[i].next - 1].pid;
			ids[nids++] = c->path[i].edges[c->path[i].next - 1].key_id;
		}
	holds = rl_dl_holds_of(ids, rl_dl_sort_unique(ids, nids), pids,
					 sort_unique_pids(pids, nids), &nholds);
	for (i = 0; i < c->depth && ok; i++)
	{
		Step	   *n = &c->path[i];
		Edge	   *e = &n->edges[n->next - 1];

		if (!n->redis)
			continue;
		ok = false;
		for (j = 0; j < nholds && !ok; j++)
			ok = holds[j].key_id == e->key_id && holds[j].pid == e->pid &&
				holds[j].slot == e->hold->slot &&
				strcmp(holds[j].owner, e->hold->owner) == 0 &&
				modes_conflict(e->protocol, holds[j].protocol);
	}
	for (i = 0; i < c->depth && ok; i++)
	{
		Step	   *n = &c->path[i];
		int32	   *blockers;
		int			nb;

		if (n->redis)
			continue;
		blockers = blocking_pids(n->pid, &nb);
		ok = false;
		for (j = 0; j < nb && !ok; j++)
			ok = blockers[j] == n->edges[n->next - 1].pid;
		ok = ok && wait_start_of(n->pid) == n->wait_start;
	}
	if (ok)
	{
		LWLockAcquire(rl_dl->records_lock, LW_SHARED);
		for (i = 0; i < c->depth && ok; i++)
		{
			Step	   *n = &c->path[i];

			if (n->redis && n->record >= 0)
				ok = rl_dl->records[n->record].pid == n->pid &&
					rl_dl->records[n->record].seq == n->seq;
		}
		LWLockRelease(rl_dl->records_lock);
	}
	return ok;
}

/* "ShareLock on transaction 745": what pid waits for, or NULL */
static char *
describe_pg_wait(int pid)
{
	BlockedProcsData *d = GetBlockerStatusData(pid);
	int			pass;
	int			i;
	int			j;

	/* its own wait first, else one of its lock group's (parallel workers) */
	for (pass = 0; pass < 2; pass++)
	{
		for (i = 0; i < d->nprocs; i++)
		{
			BlockedProcData *bp = &d->procs[i];

			if (pass == 0 && bp->pid != pid)
				continue;
			for (j = bp->first_lock; j < bp->first_lock + bp->num_locks; j++)
			{
				LockInstanceData *li = &d->locks[j];
				StringInfoData tag;

				if (li->pid != bp->pid || li->waitLockMode == NoLock)
					continue;
				initStringInfo(&tag);
				DescribeLockTag(&tag, &li->locktag);
				return psprintf("%s on %s",
								GetLockmodeName(li->locktag.locktag_lockmethodid,
												li->waitLockMode),
								tag.data);
			}
		}
	}
	return NULL;
}

/*
 * What a confirmed cycle c->path is reported with, as PostgreSQL's
 * DeadLockReport does: one line per process for the client (*client), the
 * same plus each process's query for the server log (*log), allocated in
 * the current memory context.
 */
void
rl_dl_describe_cycle(Check *c, char **client_out, char **log_out)
{
	StringInfoData client;
	StringInfoData log;
	int			i;

	initStringInfo(&client);
	initStringInfo(&log);
	for (i = 0; i < c->depth; i++)
	{
		Step	   *n = &c->path[i];
		Edge	   *e = &n->edges[n->next - 1];

		if (i > 0)
			appendStringInfoChar(&client, '\n');
		if (n->redis)
			appendStringInfo(&client,
							 e->protocol == RL_PROTOCOL_RW_READ ?
							 "Process %d waits for a read hold of Redis lock \"%s\"; blocked by process %d." :
							 e->protocol == RL_PROTOCOL_RW_WRITE ?
							 "Process %d waits for the write hold of Redis lock \"%s\"; blocked by process %d." :
							 "Process %d waits for Redis lock \"%s\"; blocked by process %d.",
							 n->pid, e->hold->key + e->hold->name_off, e->pid);
		else
		{
			char	   *what = describe_pg_wait(n->pid);

			if (what != NULL)
				appendStringInfo(&client,
								 "Process %d waits for %s; blocked by process %d.",
								 n->pid, what, e->pid);
			else
				appendStringInfo(&client,
								 "Process %d waits for a PostgreSQL lock; blocked by process %d.",
								 n->pid, e->pid);
		}
	}
	appendStringInfoString(&log, client.data);
	for (i = 0; i < c->depth; i++)
		appendStringInfo(&log, "\nProcess %d: %s", c->path[i].pid,
						 pgstat_get_backend_current_activity(c->path[i].pid, false));
	*client_out = client.data;
	*log_out = log.data;
}

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
