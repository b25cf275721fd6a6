/*-------------------------------------------------------------------------
 *
 * registry.c
 *	  Owns the shared-memory registry of every backend's Redis locks: its
 *	  layout, its part of the extension's shared memory (sized and set up
 *	  from interface/shmem.c, which owns the hooks), and the calls through
 *	  which backends add, update, hand off, reclaim and remove their slots,
 *	  and read the registry (redis_lock_locks, deadlock.c).
 *
 *	  The registry lock (RLShared.lock) comes after deadlock.c's victim
 *	  lock and before ProcArrayLock in the extension's lock order
 *	  (interface/shmem.c); no other lock of the extension is taken while
 *	  it is held.
 *
 *	  All of it exists only with shared_preload_libraries = 'redis_lock';
 *	  otherwise every function here is a cheap no-op.  Backends write only
 *	  their own slots, which every write checks (slot_is_mine); the worker
 *	  (watchjobs.c) only marks slots renewed or lost and frees orphans,
 *	  always checking the slot's generation so a result never lands on a
 *	  reused slot.
 *
 *	  Must not: talk to Redis, touch a backend's local lock table, or call
 *	  into the worker (it only sets the worker's latch).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/worker/registry.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "net/net.h"
#include "worker/worker_int.h"

RLShared   *rl_shared = NULL;
static int *freelist = NULL;
static int	registry_capacity = 0;

/*
 * How many slots each role's backends have taken (redis_lock.max_locks_per_
 * role), under the registry lock: one entry per role with slots in use, so
 * never more entries than slots.
 */
typedef struct RLRoleSlots
{
	Oid			roleid;
	int			nslots;
} RLRoleSlots;

static HTAB *role_slots = NULL;

/* ----------------------------------------------------------------
 * Shared memory
 * ----------------------------------------------------------------
 */
/*
 * Room for the registry in the extension's area (interface/shmem.c): its
 * header, the slots and the free list
 */
Size
rl_registry_shmem_size(void)
{
	Size		sz = offsetof(RLShared, slots);

	sz = add_size(sz, mul_size(registry_capacity, sizeof(RLSlot)));
	sz = add_size(sz, mul_size(registry_capacity, sizeof(int)));
	return sz;
}

/*
 * Room for the hash of slots per role, which ShmemInitHash allocates apart
 * from the area, so the area holds rl_registry_shmem_size() only.  (The
 * registry once asked for the hash's room twice: PostgreSQL 19 refuses to
 * start when redis_lock.max_locks is large enough that the second copy no
 * longer fits in the slack.)
 */
Size
rl_registry_hash_size(void)
{
	return hash_estimate_size(registry_capacity, sizeof(RLRoleSlots));
}

/* The hash of slots per role: created, or attached (AddinShmemInitLock held) */
static void
attach_role_slots(void)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(RLRoleSlots);
	/* PostgreSQL 19 sizes a shared hash by one count, no longer two */
#if PG_VERSION_NUM >= 190000
	role_slots = ShmemInitHash("redis_lock slots per role", registry_capacity,
							   &ctl, HASH_ELEM | HASH_BLOBS);
#else
	role_slots = ShmemInitHash("redis_lock slots per role", registry_capacity,
							   registry_capacity, &ctl, HASH_ELEM | HASH_BLOBS);
#endif
}

/*
 * The registry at area, with lock its LWLock (the registry lock): every
 * slot free when just created (!found), also after a crash: nothing is
 * resurrected.  Called from the shmem_startup_hook with AddinShmemInitLock
 * held.
 */
void
rl_registry_shmem_init(void *area, LWLock *lock, bool found)
{
	int			i;

	attach_role_slots();
	rl_shared = (RLShared *) area;
	freelist = (int *) &rl_shared->slots[registry_capacity];
	if (!found)
	{
		memset(rl_shared, 0, rl_registry_shmem_size());
		rl_shared->lock = lock;
		pg_atomic_init_u32(&rl_shared->lost_events, 0);
		pg_atomic_init_u32(&rl_shared->settled_events, 0);
		for (i = 0; i < RL_NUM_LANES; i++)
			pg_atomic_init_u64(&rl_shared->worker_wakes_at[i], 0);
		rl_shared->nslots = registry_capacity;
		rl_shared->nfree = registry_capacity;
		for (i = 0; i < registry_capacity; i++)
			freelist[i] = registry_capacity - 1 - i;
	}
	/* backends hand what they may not wait for to the worker */
	rl_held_work_to_worker = true;
}

/* Is the shared registry there (loaded through shared_preload_libraries)? */
bool
rl_watchdog_enabled(void)
{
	return rl_shared != NULL;
}

/*
 * Called from rl_watchdog_init while preloading, before the shared memory
 * is sized (interface/shmem.c): the registry's capacity
 */
void
rl_registry_init(void)
{
	registry_capacity = rl_max_locks;
}

/* ----------------------------------------------------------------
 * Registry, backend side
 * ----------------------------------------------------------------
 */

static const char *
or_empty(const char *s)
{
	return s ? s : "";
}

#define TARGET_TABLE_FULL	(-1)
#define TARGET_TOO_LONG		(-2)

/*
 * Index of the entry for the target and the current passwords, taking a
 * reference to it; TARGET_TABLE_FULL or TARGET_TOO_LONG when there is none.
 * The caller holds the lock exclusively.
 */
static int
target_ref(RLTarget *t)
{
	const char *pw = or_empty(rl_password);
	const char *spw = or_empty(rl_sentinel_password);
	int			free_idx = -1;
	int			i;

	if (strlen(t->spec) >= RL_TARGET_SPEC_LEN || strlen(pw) >= RL_SECRET_LEN ||
		strlen(spw) >= RL_SECRET_LEN)
		return TARGET_TOO_LONG;
	for (i = 0; i < RL_MAX_TARGETS; i++)
	{
		RLSharedTarget *st = &rl_shared->targets[i];

		if (st->refs == 0)
		{
			if (free_idx < 0)
				free_idx = i;
			continue;
		}
		if (strcmp(st->spec, t->spec) == 0 && strcmp(st->password, pw) == 0 &&
			strcmp(st->sentinel_password, spw) == 0)
		{
			st->refs++;
			return i;
		}
	}
	if (free_idx >= 0)
	{
		RLSharedTarget *st = &rl_shared->targets[free_idx];

		strlcpy(st->spec, t->spec, RL_TARGET_SPEC_LEN);
		strlcpy(st->password, pw, RL_SECRET_LEN);
		strlcpy(st->sentinel_password, spw, RL_SECRET_LEN);
		st->refs = 1;
		st->lane = RL_LANE_PROMPT;
		st->failing = false;
		st->logged_at = 0;
		st->unlogged = 0;
	}
	return free_idx >= 0 ? free_idx : TARGET_TABLE_FULL;
}

/*
 * Count delta slots for role (caller holds the lock exclusively); returns
 * the role's count before.  An entry goes when its count is back to zero.
 */
static int
role_slots_add(Oid roleid, int delta)
{
	RLRoleSlots *r;
	bool		found;
	int			before;

	r = hash_search(role_slots, &roleid, delta > 0 ? HASH_ENTER_NULL : HASH_FIND,
					&found);
	if (r == NULL)
	{
		/* at most one entry per slot in use: there is always room */
		elog(delta > 0 ? ERROR : WARNING,
			 "redis_lock registry has no count for role %u", roleid);
		return 0;
	}
	if (!found)
		r->nslots = 0;
	before = r->nslots;
	r->nslots += delta;
	if (r->nslots <= 0)
		hash_search(role_slots, &roleid, HASH_REMOVE, NULL);
	return before;
}

/* Free a slot and drop its target reference; caller holds the lock */
void
rl_slot_free(int idx)
{
	RLSlot	   *s = &rl_shared->slots[idx];
	RLSharedTarget *st = &rl_shared->targets[s->target];

	if (s->state == SLOT_ORPHAN)
		pg_atomic_fetch_add_u32(&rl_shared->settled_events, 1);
	role_slots_add(s->roleid, -1);
	s->generation++;
	s->state = SLOT_FREE;
	s->st.pid = 0;
	if (--st->refs == 0)
	{
		explicit_bzero(st->password, RL_SECRET_LEN);
		explicit_bzero(st->sentinel_password, RL_SECRET_LEN);
	}
	freelist[rl_shared->nfree++] = idx;
}

/* Wake the worker of a lane */
static void
wake_worker(RLLane lane)
{
	Latch	   *latch = rl_shared->worker_latch[lane];

	if (latch != NULL)
		SetLatch(latch);
}

/*
 * Reserve a slot for a lock about to be acquired.  Capacity is checked
 * before Redis is asked, so a full registry is an error with nothing taken.
 *
 * A slot is charged to the role the session acts as, its login role or the
 * one SET ROLE chose (GetOuterUserId), never to the owner of a SECURITY
 * DEFINER function it runs: through another role's function, a superuser's
 * above all, a role would otherwise escape redis_lock.max_locks_per_role.
 * Inside a security-restricted operation (VACUUM, ANALYZE, REINDEX, REFRESH
 * MATERIALIZED VIEW, autovacuum: a table owner's index expressions and view
 * queries run as that owner) the owner is charged, not the superuser who
 * started it, whose locks no limit would count.
 */
int
rl_registry_add(const char *name, const RLLockNames *names, RLTarget *target,
				int64 lease_ms)
{
	RLSlot	   *s;
	int			idx;
	int			tidx;
	int			nfree;
	size_t		keylen = strlen(names->key);
	size_t		namelen = strlen(name);
	Oid			roleid = InSecurityRestrictedOperation() ? GetUserId() :
		GetOuterUserId();
	int			role_limit;

	if (rl_shared == NULL)
		return -1;
	/* the key is prefix + name; the slot keeps the key and where name starts */
	Assert(keylen >= namelen && keylen - namelen <= RL_MAX_PREFIX_LEN &&
		   strcmp(names->key + keylen - namelen, name) == 0);
	/* outside the lock: superuser_arg() may read the catalog */
	role_limit = superuser_arg(roleid) ? -1 : rl_role_lock_limit();
	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	if (role_limit >= 0)
	{
		RLRoleSlots *r = hash_search(role_slots, &roleid, HASH_FIND, NULL);
		int			taken = r != NULL ? r->nslots : 0;

		if (taken >= role_limit)
		{
			LWLockRelease(rl_shared->lock);
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("too many Redis locks held by role \"%s\"",
							GetUserNameFromId(roleid, false)),
					 errdetail("Its sessions hold or leave to the watchdog %d of the redis_lock.max_locks = %d locks; redis_lock.max_locks_per_role is %d.",
							   taken, rl_shared->nslots, role_limit),
					 errhint("Release locks, or ask a superuser to raise redis_lock.max_locks_per_role for this role.")));
		}
	}
	nfree = rl_shared->nfree;
	tidx = nfree > 0 ? target_ref(target) : TARGET_TABLE_FULL;
	if (nfree == 0 || tidx < 0)
	{
		LWLockRelease(rl_shared->lock);
		if (nfree == 0)
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("too many Redis locks held"),
					 errdetail("All backends together hold redis_lock.max_locks = %d locks.",
							   rl_shared->nslots),
					 errhint("Release locks, or raise redis_lock.max_locks (takes effect at server restart).")));
		if (tidx == TARGET_TOO_LONG)
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("Redis location or password too long for the watchdog"),
					 errdetail("The watchdog keeps redis_lock.url / nodes / sentinels of at most %d bytes and passwords of at most %d bytes.",
							   RL_TARGET_SPEC_LEN - 1, RL_SECRET_LEN - 1)));
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("too many different Redis targets for the watchdog"),
				 errdetail("At most %d distinct combinations of redis_lock.url / nodes / sentinels and passwords can hold locks at once.",
						   RL_MAX_TARGETS)));
	}
	role_slots_add(roleid, 1);	/* cannot fail: one entry per slot in use */
	idx = freelist[--rl_shared->nfree];
	s = &rl_shared->slots[idx];
	s->roleid = roleid;
	s->generation++;
	s->state = SLOT_RESERVED;
	s->in_flight = 0;
	s->late_grant = false;
	s->check_now = false;
	s->horizon = 0;
	s->renew_every_ms = 0;
	s->st.pid = MyProcPid;
	s->st.dbid = MyDatabaseId;
	s->target = tidx;
	s->st.protocol = names->protocol;
	s->st.script_free = names->script_free;
	s->st.permits = names->permits;
	s->st.watchdog = false;
	s->st.lost = false;
	s->st.lost_cause = RL_LOST_NOT_OURS;
	s->st.lost_at = 0;
	s->st.cancelled_at = 0;
	s->st.on_lost = RL_ON_LOST_WARN;
	s->st.session_holds = s->st.xact_holds = 0;
	s->st.fence = 0;
	s->st.lease_ms = lease_ms;
	s->st.acquired_at = s->st.last_renewed_at = GetCurrentTimestamp();
	strlcpy(s->key, names->key, sizeof(s->key));
	s->name_off = (uint16) (keylen - namelen);
	strlcpy(s->owner, names->owner, sizeof(s->owner));
	/* so that a release the worker makes for the session publishes too */
	s->release_prefix[0] = '\0';
	if (names->release_channel != NULL)
		strlcpy(s->release_prefix, names->release_channel,
				Min(strlen(names->release_channel) - keylen + 1,
					sizeof(s->release_prefix)));
	LWLockRelease(rl_shared->lock);
	return idx;
}

/*
 * Is slot s this backend's to write: taken by it (reserved or held), not
 * free, handed to the worker, or another backend's since?  A backend writes
 * only the slots it took and has not handed off (a handed entry's slot is
 * the worker's until taken back, rl_registry_reclaim), so a slot that is not
 * is a can't-happen: asserted, and in a build without assertions left
 * untouched rather than written over.  Caller holds the registry lock.
 */
static bool
slot_is_mine(const RLSlot *s)
{
	bool		mine = s->st.pid == MyProcPid &&
		(s->state == SLOT_RESERVED || s->state == SLOT_HELD);

	Assert(mine);
	return mine;
}

/*
 * Copy a lock's state (holds, fence, lease, watchdog, lost, acquired_at) and
 * owner to its slot.  refreshed_at, unless 0: the backend just restarted
 * the lease in Redis itself, with a round trip sent then, so renewal
 * restarts from then (as from a renewal of the worker's: when it was sent).
 */
void
rl_registry_update(int slot, const RLLockState *st, const char *owner,
				   TimestampTz refreshed_at)
{
	RLSlot	   *s;
	int			holds = st->session_holds + st->xact_holds;
	bool		wake;
	RLLane		lane;

	if (rl_shared == NULL || slot < 0)
		return;
	s = &rl_shared->slots[slot];
	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	if (!slot_is_mine(s))
	{
		LWLockRelease(rl_shared->lock);
		return;
	}
	if (s->state == SLOT_RESERVED && holds > 0)
		s->st.acquired_at = st->acquired_at;
	/* a renewal or loss the worker found for the old holds lands nowhere */
	if (s->state == SLOT_HELD && holds == 0)
		s->generation++;

	/*
	 * Nor is a renewal the worker took out under the old lease sent or
	 * applied once the lock leaves the watchdog or changes its lease: the
	 * compare-and-PEXPIRE would put the old lease back over the new one.
	 */
	else if (s->state == SLOT_HELD && s->st.watchdog &&
			 (!st->watchdog || s->st.lease_ms != st->lease_ms))
		s->generation++;
	s->state = holds > 0 ? SLOT_HELD : SLOT_RESERVED;
	s->st.watchdog = st->watchdog;
	s->st.lost = s->st.lost || st->lost;
	s->st.on_lost = st->on_lost;
	s->st.session_holds = st->session_holds;
	s->st.xact_holds = st->xact_holds;
	s->st.fence = st->fence;
	s->st.lease_ms = st->lease_ms;
	strlcpy(s->owner, owner, sizeof(s->owner));
	if (refreshed_at != 0)
		s->st.last_renewed_at = refreshed_at;
	lane = rl_serving_lane(&rl_shared->targets[s->target]);
	wake = s->st.watchdog && holds > 0 &&
		TimestampTzPlusMilliseconds(s->st.last_renewed_at, s->st.lease_ms / 6) <
		(TimestampTz) pg_atomic_read_u64(&rl_shared->worker_wakes_at[lane]);
	LWLockRelease(rl_shared->lock);

	/*
	 * The worker may renew a lock from lease/6 after its last renewal on;
	 * if it sleeps past that (it planned without this lock, for up to a
	 * second), wake it to plan again.  Rare: once awake, it sleeps no
	 * longer than the next lock due.
	 */
	if (wake)
		wake_worker(lane);
}

/* Free this backend's registry slot (no-op without a registry or slot) */
void
rl_registry_remove(int slot)
{
	if (rl_shared == NULL || slot < 0)
		return;
	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	if (slot_is_mine(&rl_shared->slots[slot]))
		rl_slot_free(slot);
	LWLockRelease(rl_shared->lock);
}

/*
 * The worker takes over the release of this slot's lock: its backend exits
 * without having released it, or gave up on a grant or release whose
 * outcome it could not learn (a doubt).  Nothing of it can exist in Redis
 * after horizon, unless late_grant: an acquire that may still be run by a
 * Redis that did not answer, which the worker keeps deleting until that
 * Redis has answered after the horizon.  A release its backend sent and
 * has not heard back from yet is started no earlier than not_before, that
 * release's deadline (0: at once).  Returns the slot's generation, by
 * which its backend can take it back (rl_registry_reclaim).
 */
uint32
rl_registry_hand_off(int slot, TimestampTz horizon, bool late_grant,
					 TimestampTz not_before)
{
	RLSlot	   *s;
	uint32		generation;
	RLLane		lane;

	if (rl_shared == NULL || slot < 0)
		return 0;
	s = &rl_shared->slots[slot];
	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	if (!slot_is_mine(s))
	{
		/* a generation no reclaim can match: the slot stays as it is */
		generation = s->generation - 1;
		LWLockRelease(rl_shared->lock);
		return generation;
	}
	s->generation++;			/* a renewal under way lands nowhere */
	s->state = SLOT_ORPHAN;
	s->st.watchdog = false;
	s->st.session_holds = s->st.xact_holds = 0;
	s->horizon = horizon;
	s->late_grant = late_grant;
	s->not_before = not_before;
	generation = s->generation;
	lane = rl_serving_lane(&rl_shared->targets[s->target]);
	LWLockRelease(rl_shared->lock);
	/* one not due yet is found by the worker's next pass (within 1 s) */
	if (not_before == 0)
		wake_worker(lane);
	return generation;
}

/*
 * Wait until the worker has no command for slot under way (it sends at most
 * a command_timeout's worth), for at most twice command_timeout and a
 * second: a worker that is stopped or stuck must not hold the session up
 * for good.  Returns whether the command is over.  Caller holds the
 * registry lock exclusively; returns with it held.  Cancel and terminate
 * end the wait: never called with interrupts held other than by that lock
 * (callers check, rl_assert_may_wait, before they take it).
 */
static bool
wait_out_worker(RLSlot *s)
{
	TimestampTz give_up = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													  2 * (int64) rl_command_timeout_ms + 1000);

	while (s->in_flight)
	{
		if (GetCurrentTimestamp() >= give_up)
			return false;
		LWLockRelease(rl_shared->lock);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 2, rl_wait_event(RL_WAIT_REPLY));
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	}
	return true;
}

/*
 * Take back a slot handed to the worker, before acting on its lock again
 * (the same owner would otherwise race the worker's release).  Returns
 * RL_RECLAIMED when it is ours again, reserved, with no command of the
 * worker's under way; RL_RECLAIM_SETTLED when the worker has settled it
 * already (the slot is no longer ours).  A command of the worker's under way
 * is waited out, interruptibly and bounded (wait_out_worker); with
 * interrupts held it is not (a cancel would be held off for the worker's
 * command_timeout), nor past that bound: the slot stays the worker's, which
 * settles its owner value, and RL_RECLAIM_BUSY says so (the entry goes on
 * with a fresh owner value, rl_mint_owner).
 */
RLReclaim
rl_registry_reclaim(int slot, uint32 generation)
{
	RLSlot	   *s;
	bool		ours;
	bool		held;

	if (rl_shared == NULL || slot < 0)
		return RL_RECLAIM_SETTLED;
	s = &rl_shared->slots[slot];
	/* (the lock holds interrupts: whether the caller does is seen first) */
	held = InterruptHoldoffCount > 0;
	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	/* a release under way may settle it: see what it did first */
	if (s->generation == generation && s->state == SLOT_ORPHAN && s->in_flight)
	{
		if (held || !wait_out_worker(s))
		{
			LWLockRelease(rl_shared->lock);
			return RL_RECLAIM_BUSY;
		}
	}
	ours = s->generation == generation && s->state == SLOT_ORPHAN;
	if (ours)
	{
		s->generation++;
		s->state = SLOT_RESERVED;
		s->late_grant = false;
		s->horizon = 0;
	}
	LWLockRelease(rl_shared->lock);
	return ours ? RL_RECLAIMED : RL_RECLAIM_SETTLED;
}

/* Is this slot still with the worker, as handed over with generation? */
bool
rl_registry_handed(int slot, uint32 generation)
{
	if (rl_shared == NULL || slot < 0)
		return false;
	pg_read_barrier();
	return rl_shared->slots[slot].generation == generation &&
		rl_shared->slots[slot].state == SLOT_ORPHAN;
}

/* Changes whenever the worker frees an orphan */
uint32
rl_registry_settled_events(void)
{
	return rl_shared != NULL ? pg_atomic_read_u32(&rl_shared->settled_events) : 0;
}

/*
 * Wait until no renewal of slot taken out by the worker is under way: one
 * sent with an older lease would land after what the caller sends next.
 * Call after the slot moved to a new generation, so that none is sent anew.
 */
void
rl_registry_wait_idle(int slot)
{
	if (rl_shared == NULL || slot < 0)
		return;
	rl_assert_may_wait("a wait for the watchdog worker's command");
	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	/* past its bound, a stuck worker's renewal is its own to land or not */
	(void) wait_out_worker(&rl_shared->slots[slot]);
	LWLockRelease(rl_shared->lock);
}

/*
 * Has the worker found this lock lost, and if so why, when, and when it
 * signalled the holder?  (What the holder asked to be made to do is its own
 * entry's, RLHeld.on_lost.)  Only our own slot: no lock needed (the worker
 * writes lost last).
 */
bool
rl_registry_loss(int slot, uint8 *cause, TimestampTz *lost_at,
				 TimestampTz *cancelled_at)
{
	RLSlot	   *s;

	if (rl_shared == NULL || slot < 0)
		return false;
	s = &rl_shared->slots[slot];
	Assert(s->st.pid == MyProcPid);
	if (s->st.pid != MyProcPid || !s->st.lost)
		return false;
	pg_read_barrier();			/* what the worker wrote before lost */
	*cause = s->st.lost_cause;
	*lost_at = s->st.lost_at;
	*cancelled_at = s->st.cancelled_at;
	return true;
}

/*
 * Redis answered a round trip sent at refreshed_at that found this lock
 * ours and restarted its lease: its renewals count from then on (as from a
 * renewal of the worker's answered), in the same hold of the registry lock
 * as the rest, so that the worker cannot presume it lost in between.  If
 * the worker had presumed it lost (RL_LOST_UNREACHABLE: no renewal of its
 * was answered for a lease), the presumption was wrong (the renewals ran,
 * only their answers were not read), and is withdrawn, unless the worker
 * has acted on it already: its holder signalled (cancelled_at), whose
 * cancel must still come out as the loss.  A loss Redis itself reported
 * (RL_LOST_NOT_OURS) is never withdrawn.  Returns whether one was.  Only
 * our own slot.
 */
bool
rl_registry_found_ours(int slot, TimestampTz refreshed_at)
{
	RLSlot	   *s;
	bool		withdrawn;

	if (rl_shared == NULL || slot < 0)
		return false;
	s = &rl_shared->slots[slot];
	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	if (!slot_is_mine(s) || s->state != SLOT_HELD)
	{
		LWLockRelease(rl_shared->lock);
		return false;
	}
	withdrawn = s->st.lost && s->st.lost_cause == RL_LOST_UNREACHABLE &&
		s->st.cancelled_at == 0;
	if (withdrawn)
	{
		s->st.lost = false;
		s->st.lost_at = 0;
	}
	if (!s->st.lost)
		s->st.last_renewed_at = Max(s->st.last_renewed_at, refreshed_at);
	LWLockRelease(rl_shared->lock);
	return withdrawn;
}

/*
 * When the lease of this lock was last restarted in Redis, by a round trip
 * sent then (the worker's renewal, or the backend's own refresh).  Only our
 * own slot.
 */
TimestampTz
rl_registry_renewed_at(int slot)
{
	TimestampTz t;

	if (rl_shared == NULL || slot < 0)
		return 0;
	LWLockAcquire(rl_shared->lock, LW_SHARED);
	t = rl_shared->slots[slot].st.last_renewed_at;
	LWLockRelease(rl_shared->lock);
	return t;
}

/* Changes whenever the worker marks any lock lost */
uint32
rl_registry_lost_events(void)
{
	return rl_shared != NULL ? pg_atomic_read_u32(&rl_shared->lost_events) : 0;
}

/*
 * Every registered lock of every backend, for the redis_lock_locks view.
 * Returns false without preload.
 */
bool
rl_registry_snapshot(RLLockInfo **out, int *n)
{
	int			i;
	int			k = 0;

	*out = NULL;
	*n = 0;
	if (rl_shared == NULL)
		return false;
	*out = palloc(sizeof(RLLockInfo) * Max(rl_shared->nslots, 1));
	LWLockAcquire(rl_shared->lock, LW_SHARED);
	for (i = 0; i < rl_shared->nslots; i++)
	{
		RLSlot	   *s = &rl_shared->slots[i];
		RLLockInfo *o;

		if (s->state != SLOT_HELD)
			continue;
		o = &(*out)[k++];
		o->st = s->st;
		o->name = pstrdup(s->key + s->name_off);
		o->key = pstrdup(s->key);
	}
	LWLockRelease(rl_shared->lock);
	*n = k;
	return true;
}

/*
 * The identity of a lock for deadlock detection (deadlock.c): where it
 * lives and its key, hashed.  Equal for every mode of a name (a read-write
 * lock's read and write holds share the key).
 */
uint64
rl_registry_key_id(const char *target_spec, const char *key)
{
	uint64		h;

	h = hash_bytes_extended((const unsigned char *) target_spec,
							(int) strlen(target_spec), 0);
	h = hash_bytes_extended((const unsigned char *) key, (int) strlen(key), h);
	return h != 0 ? h : 1;
}

static int
key_id_cmp(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

static int
pid_cmp(const void *a, const void *b)
{
	int			x = *(const int *) a;
	int			y = *(const int *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

/*
 * The holds in this server of the locks whose rl_registry_key_id() is one of
 * ids (nids of them, sorted ascending), by the backends in pids (npids of
 * them, sorted ascending; all backends when pids is NULL): slots held with
 * holds > 0, not found lost, whose lease has not run out since it was last
 * restarted (a fixed lease of a holder that is stuck may have expired in
 * Redis).  Fills at most cap entries of out, in the registry's order, and
 * returns how many there are: when that is more than cap, call again with
 * more room.  One pass over the registry under its lock (shared), hashing
 * the key of each held slot of those backends; nothing is allocated while
 * the lock is held.
 */
int
rl_registry_holders(const uint64 *ids, int nids, const int *pids, int npids,
					RLRegistryHold *out, int cap)
{
	uint64		seeds[RL_MAX_TARGETS];
	TimestampTz now = GetCurrentTimestamp();
	int			n = 0;
	int			i;

	if (rl_shared == NULL || nids <= 0)
		return 0;
	LWLockAcquire(rl_shared->lock, LW_SHARED);
	/* the key of a slot hashes on from the hash of its target's spec */
	for (i = 0; i < RL_MAX_TARGETS; i++)
		seeds[i] = rl_shared->targets[i].refs > 0 ?
			hash_bytes_extended((const unsigned char *) rl_shared->targets[i].spec,
								(int) strlen(rl_shared->targets[i].spec), 0) : 0;
	for (i = 0; i < rl_shared->nslots; i++)
	{
		RLSlot	   *s = &rl_shared->slots[i];
		uint64		id;

		if (s->state != SLOT_HELD ||
			(pids != NULL &&
			 bsearch(&s->st.pid, pids, npids, sizeof(int), pid_cmp) == NULL) ||
			s->st.lost || s->st.session_holds + s->st.xact_holds <= 0 ||
			now > TimestampTzPlusMilliseconds(s->st.last_renewed_at, s->st.lease_ms))
			continue;
		id = hash_bytes_extended((const unsigned char *) s->key,
								 (int) strlen(s->key), seeds[s->target]);
		if (id == 0)
			id = 1;
		if (bsearch(&id, ids, nids, sizeof(uint64), key_id_cmp) == NULL)
			continue;
		if (n < cap)
		{
			out[n].key_id = id;
			out[n].pid = s->st.pid;
			out[n].protocol = s->st.protocol;
			out[n].script_free = s->st.script_free;
			out[n].slot = i;
			out[n].name_off = s->name_off;
			strlcpy(out[n].key, s->key, sizeof(out[n].key));
			strlcpy(out[n].owner, s->owner, sizeof(out[n].owner));
		}
		n++;
	}
	LWLockRelease(rl_shared->lock);
	return n;
}

/*
 * Where a hold rl_registry_holders() found lives: a copy of its target's
 * spec (rl_target_from_spec), or NULL when its slot no longer holds that
 * lock with that owner value.  The passwords stay here: whoever asks Redis
 * about the hold uses its own.
 */
char *
rl_registry_hold_target(const RLRegistryHold *hold)
{
	RLSlot	   *s;
	char	   *spec;
	bool		found = false;

	if (rl_shared == NULL || hold->slot < 0 || hold->slot >= rl_shared->nslots)
		return NULL;
	s = &rl_shared->slots[hold->slot];
	/* nothing is allocated while the lock is held */
	spec = palloc(RL_TARGET_SPEC_LEN);
	LWLockAcquire(rl_shared->lock, LW_SHARED);
	if (s->state == SLOT_HELD && s->st.pid == hold->pid &&
		strcmp(s->key, hold->key) == 0 && strcmp(s->owner, hold->owner) == 0)
	{
		strlcpy(spec, rl_shared->targets[s->target].spec, RL_TARGET_SPEC_LEN);
		found = true;
	}
	LWLockRelease(rl_shared->lock);
	if (found)
		return spec;
	pfree(spec);
	return NULL;
}
