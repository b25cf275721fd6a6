/*-------------------------------------------------------------------------
 *
 * wait_int.h
 *	  What the files of wait/ share, and no other subsystem sees (the
 *	  public header is wait/wait.h): the deadlock check's (deadlock.c,
 *	  which owns this backend's wait and its record, and deadlock_graph.c,
 *	  the wait-for graph), and the end of a wait's publications that
 *	  waiters.c and deadlock.c register with waitend.c.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/wait/wait_int.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_WAIT_INT_H
#define RL_WAIT_INT_H

#include "wait/wait.h"
#include "storage/dsm.h"
#include "storage/lwlock.h"
#include "utils/hsearch.h"

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

typedef struct Check Check;

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

/* waitend.c: what both publications of a wait share */
typedef void (*RLWaitEnd) (void);
extern int	rl_wait_my_procno(void);
extern void rl_wait_end_with(RLWaitEnd end);

#endif							/* RL_WAIT_INT_H */
