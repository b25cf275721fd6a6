/*-------------------------------------------------------------------------
 *
 * deadlock_graph.c
 *	  Owns the wait-for graph of a deadlock check (deadlock.c runs the
 *	  check and decides): the snapshot of every process that waits -- the
 *	  PGPROCs, the other backends' published records and their segments --
 *	  and of the registry's holds of the locks waited for; the depth-first
 *	  search from this backend along the edges (a Redis lock's conflicting
 *	  holds, pg_blocking_pids() for a PostgreSQL lock); the confirmation
 *	  of each edge of a cycle found, once Redis has confirmed its holds;
 *	  and the description of a confirmed cycle for its 40P01 report.
 *
 *	  Must not: talk to Redis, write a record (only deadlock.c publishes
 *	  and withdraws), raise an ERROR of its own while an LWLock is held, or
 *	  take the records lock while holding the registry lock (the lock
 *	  order: interface/shmem.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/wait/deadlock_graph.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "storage/dsm.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "utils/array.h"
#include "utils/fmgrprotos.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "worker/worker.h"
#include "wait/wait_int.h"

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
