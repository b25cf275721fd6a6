/*-------------------------------------------------------------------------
 *
 * waitqueue.c
 *	  Owns the server-local wait queues: the backends of this PostgreSQL
 *	  server that wait for the same Redis lock form a queue in shared
 *	  memory.  Its head (the "leader") is the only one that subscribes,
 *	  retries and is woken in Redis; the others sleep on their latches and
 *	  are promoted one at a time, in arrival order, when the leader stops
 *	  waiting (granted, timed out, cancelled, or exited).  So a release
 *	  wakes one backend per server instead of every waiter, and the Redis
 *	  work per hand-over does not grow with the number of local waiters.
 *
 *	  Exists only with shared_preload_libraries = 'redis_lock'; otherwise
 *	  every waiter contends in Redis, as without this file.  Other servers
 *	  and foreign clients on the same lock still contend in Redis with the
 *	  leader: the queue orders only this server's waiters.
 *
 *	  Must not: talk to Redis, raise an ERROR of its own (a sleeper's
 *	  CHECK_FOR_INTERRUPTS serves cancel and terminate), or touch any
 *	  backend's seat but its own, except to promote the next waiter when
 *	  leaving as leader.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/wait/waitqueue.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "postmaster/autovacuum.h"
#include "replication/walsender.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"

#include "wait/wait.h"

/* Longest nap between looks at one's own seat: a safety net, not the signal */
#define RL_QUEUE_NAP_MS		1000

/* One backend's place in the queue of the lock it waits for */
typedef struct RLQueueSeat
{
	uint64		lock_id;		/* rl_waitq_id() of the lock; 0: not waiting */
	uint64		ticket;			/* arrival order: the next leader is the lowest */
	bool		leader;			/* the one waiter of its lock working in Redis */
} RLQueueSeat;

/*
 * One seat per process that can run SQL, indexed by its PGPROC number, so a
 * backend never needs more than one and the array never fills.  A queue is
 * the set of seats with the same lock_id; it has exactly one leader while it
 * is not empty.  All fields but nseated are under lock.
 */
typedef struct RLWaitQueues
{
	LWLock	   *lock;			/* the wait-queue lock: no other lock of the
								 * extension is taken while it is held
								 * (interface/shmem.c) */
	pg_atomic_uint32 nseated;	/* seats in use: 0 keeps the check O(1) */
	uint64		next_ticket;
	int			nseats;
	RLQueueSeat seats[FLEXIBLE_ARRAY_MEMBER];
} RLWaitQueues;

static RLWaitQueues *queues = NULL;
static RLQueueSeat *my_seat = NULL; /* set while this backend waits */
static bool exit_hook_set = false;

/* Room for nseats seats in the extension's area (interface/shmem.c) */
Size
rl_waitq_shmem_size(int nseats)
{
	return add_size(offsetof(RLWaitQueues, seats),
					mul_size(nseats, sizeof(RLQueueSeat)));
}

/*
 * The queues at area, nseats seats (one per process that can run SQL),
 * with lock their LWLock: every seat empty when just created (!found)
 */
void
rl_waitq_shmem_init(void *area, int nseats, LWLock *lock, bool found)
{
	queues = (RLWaitQueues *) area;
	if (!found)
	{
		memset(queues, 0, rl_waitq_shmem_size(nseats));
		queues->lock = lock;
		pg_atomic_init_u32(&queues->nseated, 0);
		queues->next_ticket = 1;
		queues->nseats = nseats;
	}
}

/*
 * The identity of a lock for queueing: where it lives and its key.  Two
 * locks sharing an id (a 64-bit hash collision) would only be queued
 * together, never granted together: Redis decides every grant.
 */
uint64
rl_waitq_id(const char *target_spec, const char *key)
{
	uint64		h;

	h = hash_bytes_extended((const unsigned char *) target_spec,
							(int) strlen(target_spec), 0);
	h = hash_bytes_extended((const unsigned char *) key, (int) strlen(key), h);
	return h != 0 ? h : 1;
}

/* This backend's seat index, or -1 when it has none (no preload, aux) */
static int
seat_index(void)
{
	int			procno;

	if (queues == NULL || MyProc == NULL)
		return -1;
#if PG_VERSION_NUM >= 170000
	procno = MyProcNumber;
#else
	procno = MyProc->pgprocno;
#endif
	return procno >= 0 && procno < queues->nseats ? procno : -1;
}

/* Does any backend of this server wait in a queue now?  One atomic read */
bool
rl_waitq_any(void)
{
	return queues != NULL && pg_atomic_read_u32(&queues->nseated) > 0;
}

/*
 * Do backends of this server wait for the lock now?  A newcomer that finds
 * some queues behind them instead of trying first, so local waiters are
 * served in arrival order.  O(1) while nobody waits for any lock; false
 * for lock_id 0 (a lock that does not queue locally).
 */
bool
rl_waitq_has_waiters(uint64 lock_id)
{
	bool		found = false;
	int			i;

	if (lock_id == 0 || queues == NULL ||
		pg_atomic_read_u32(&queues->nseated) == 0)
		return false;
	LWLockAcquire(queues->lock, LW_SHARED);
	for (i = 0; i < queues->nseats && !found; i++)
		found = queues->seats[i].lock_id == lock_id;
	LWLockRelease(queues->lock);
	return found;
}

static void
redis_lock_waitq_before_shmem_exit(int code, Datum arg)
{
	rl_waitq_leave();
}

/*
 * Take a seat in the lock's queue.  Returns true when this backend leads
 * (the queue was empty, or there is no queue to join): it should contend
 * in Redis now.  Otherwise rl_waitq_wait_turn() sleeps until it leads.
 */
bool
rl_waitq_join(uint64 lock_id)
{
	int			idx = seat_index();
	bool		leader = true;
	int			i;

	Assert(my_seat == NULL);
	if (idx < 0)
		return true;
	if (!exit_hook_set)
	{
		before_shmem_exit(redis_lock_waitq_before_shmem_exit, (Datum) 0);
		exit_hook_set = true;
	}
	LWLockAcquire(queues->lock, LW_EXCLUSIVE);
	for (i = 0; i < queues->nseats && leader; i++)
		if (queues->seats[i].lock_id == lock_id && queues->seats[i].leader)
			leader = false;
	my_seat = &queues->seats[idx];
	my_seat->lock_id = lock_id;
	my_seat->ticket = queues->next_ticket++;
	my_seat->leader = leader;
	pg_atomic_fetch_add_u32(&queues->nseated, 1);
	LWLockRelease(queues->lock);
	return leader;
}

static bool
am_leader(void)
{
	bool		leader;

	LWLockAcquire(queues->lock, LW_SHARED);
	leader = my_seat->leader;
	LWLockRelease(queues->lock);
	return leader;
}

/*
 * Sleep until this backend leads its queue (true) or the deadline passes
 * (false; it keeps its seat until rl_waitq_leave).  Cancel, terminate and
 * postmaster death end the sleep at once.
 */
bool
rl_waitq_wait_turn(TimestampTz deadline)
{
	if (my_seat == NULL)
		return true;
	for (;;)
	{
		long		left_ms;

		if (am_leader())
			return true;
		left_ms = (long) ((deadline - GetCurrentTimestamp() + 999) / 1000);
		if (left_ms <= 0)
			return false;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(left_ms, RL_QUEUE_NAP_MS), rl_wait_event(RL_WAIT_QUEUE));
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * Give up this backend's seat, if it has one; a leader hands the lead to
 * the earliest waiter of the same lock and wakes it.  Never raises: it runs
 * after every wait, at (sub)transaction abort and at backend exit.
 */
void
rl_waitq_leave(void)
{
	uint64		lock_id;
	bool		was_leader;
	int			next = -1;
	int			i;

	if (my_seat == NULL)
		return;
	LWLockAcquire(queues->lock, LW_EXCLUSIVE);
	lock_id = my_seat->lock_id;
	was_leader = my_seat->leader;
	my_seat->lock_id = 0;
	my_seat->leader = false;
	pg_atomic_fetch_sub_u32(&queues->nseated, 1);
	if (was_leader)
	{
		for (i = 0; i < queues->nseats; i++)
		{
			RLQueueSeat *s = &queues->seats[i];

			if (s->lock_id == lock_id &&
				(next < 0 || s->ticket < queues->seats[next].ticket))
				next = i;
		}
		if (next >= 0)
			queues->seats[next].leader = true;
	}
	LWLockRelease(queues->lock);
	my_seat = NULL;
	if (next >= 0)
		SetLatch(&GetPGProcByNumber(next)->procLatch);
}
