/*-------------------------------------------------------------------------
 *
 * lockacquire.c
 *	  Owns acquiring: one attempt, reentrancy (a lock the session holds is
 *	  verified and counted again), the wait for a busy lock (behind this
 *	  server's earlier waiters, then subscribed to its release with attempts
 *	  between wake-ups, bounded backoff and Redlock jitter), the wait's
 *	  deadlock checks (a cycle deadlock.c finds is confirmed in Redis here,
 *	  one round trip, before it is decided), what is given back when an
 *	  attempt does not grant, and the interface lockmany.c acquires several
 *	  locks through (rl_many_*).
 *
 *	  Must not: call hiredis, know script bodies (scripts.c does), define
 *	  SQL-callable functions (functions.c does), release held locks
 *	  (lockrelease.c does), or act at transaction end (lockxact.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/lock/lockacquire.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/memutils.h"

#include "net/net.h"
#include "redis/redis.h"
#include "worker/worker.h"
#include "wait/wait.h"
#include "lock/lock_int.h"

#if PG_VERSION_NUM >= 150000
#include "common/pg_prng.h"
#endif

/* ----------------------------------------------------------------
 * Acquire
 * ----------------------------------------------------------------
 */
typedef enum AcqOutcome
{
	ACQ_GOT,
	ACQ_BUSY,					/* held elsewhere (or too slow, Redlock) */
	ACQ_WRONGTYPE,
	ACQ_UNDECIDED				/* no majority answered */
} AcqOutcome;

/*
 * One acquire round on the entry's node(s).  Under redisson_fair a busy lock
 * puts us in its queue when the entry is queued (e->queued_ms: our wait).
 */
static AcqOutcome
attempt(RLHeld *e, int64 lease_ms, RLLockOp *op)
{
	rl_lt_op_init(op, RL_OP_ACQUIRE, e, lease_ms);
	op->queue_wait_ms = e->queued_ms;
	/* what stops it before it is sent raises before it is a doubt */
	rl_lock_ops_route(op, 1);
	e->expires_at = rl_lt_doubt_horizon(lease_ms);
	e->late_grant = true;		/* until we know: a cancel may cut it short */
	e->lease_from = GetCurrentTimestamp();	/* a grant's lease starts later */
	rl_lock_ops_run(op, 1, RL_RUN_HARD);
	/* only a node that failed once our bytes may have reached it runs it late */
	e->late_grant = op->failed > 0 && op->maybe_ran;
	if (op->wrongtype != NULL)
		return ACQ_WRONGTYPE;
	if (rl_op_granted(op))
		return ACQ_GOT;
	if (RL_OP_YES(op) || RL_OP_NO(op))
		return ACQ_BUSY;
	return ACQ_UNDECIDED;
}

/*
 * After an attempt that did not grant: give back grants below the quorum
 * (Redlock) at once.  Returns true when nothing of ours can be left in
 * Redis.  A reply lost to a failure is left as a doubt, not chased now: the
 * failure that lost it is likely still going on.  *stale (when not NULL) is
 * set when the give-back itself failed after its bytes may have reached a
 * node: a release with our owner value may still land there.
 */
static bool
release_partial_grants(RLHeld *e, RLLockOp *op, bool *stale)
{
	RLLockOp	rel;

	if (stale != NULL)
		*stale = false;
	if (op->yes == 0)
		return !op->maybe_ran;
	rl_lt_op_init(&rel, RL_OP_RELEASE, e, e->lease_ms);
	rl_lock_ops_run(&rel, 1, RL_RUN_SOFT);
	if (stale != NULL)
		*stale = rel.failed > 0 && rel.maybe_ran;
	return rel.failed == 0;
}

static void
grant(RLHeld *e, int64 fence, int64 lease_ms, bool watchdog, RLScope scope)
{
	e->fence = fence;
	e->lease_ms = lease_ms;
	e->watchdog = watchdog;
	e->loss_unsure = false;
	e->was_renewed = false;
	e->lost_reported_at = 0;
	/* as the worker counts renewals: from when the grant was sent */
	e->acquired_at = e->lease_from != 0 ? e->lease_from : GetCurrentTimestamp();
	rl_lt_add_hold(e, scope);
	rl_lt_registry_sync(e, true);
	rl_stats_add(RL_STAT_ACQUIRED, 1);
}

static long
retry_jitter(long max_ms)
{
	if (max_ms <= 0)
		return 0;
#if PG_VERSION_NUM >= 150000
	return (long) pg_prng_uint64_range(&pg_global_prng_state, 0, (uint64) max_ms);
#else
	return random() % (max_ms + 1);
#endif
}

/*
 * The server-local wait queue id of an entry's lock, or 0 when its waiters
 * do not queue locally: without preload, and for the layouts whose waiters
 * must each be seen in Redis (read holds share the lock; a fair lock keeps
 * its own queue there).
 */
static uint64
local_queue_id(RLHeld *e)
{
	if (!rl_watchdog_enabled() ||
		(e->names.protocol != RL_PROTOCOL_SIMPLE &&
		 e->names.protocol != RL_PROTOCOL_REDISSON))
		return 0;
	return rl_waitq_id(e->target->spec, e->names.key);
}

/* Would an acquire of e that may wait queue behind backends of this server? */
static bool
behind_local_waiters(RLHeld *e, int64 wait_ms)
{
	return wait_ms > 0 && rl_waitq_any() &&
		rl_waitq_has_waiters(local_queue_id(e));
}

/* End of a wait: how long it took goes to the stats */
static AcqOutcome
waited(TimestampTz start, AcqOutcome outcome)
{
	rl_stats_add(RL_STAT_WAIT_US, (uint64) (GetCurrentTimestamp() - start));
	return outcome;
}

/*
 * Ask Redis, in one round trip, whether each hold on a cycle the deadlock
 * check found (deadlock.c) is still there with its holder's owner value:
 * an inspect of its key on its target, read only, with this session's
 * passwords.  Run only from a wait's loop, where interrupts are not held:
 * a cancel ends it, and redis_lock.command_timeout bounds it.  A hold Redis
 * does not show, or a node that does not answer, leaves it unconfirmed: no
 * deadlock is reported for it, and the wait goes on.
 */
static void
confirm_holds_in_redis(RLDeadlockHold *holds, int n)
{
	MemoryContext cxt;
	MemoryContext old;
	RLLockOp   *ops;
	RLLockNames *names;
	int			i;

	cxt = AllocSetContextCreate(CurrentMemoryContext,
								"redis_lock deadlock confirmation",
								ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(cxt);
	ops = palloc0(sizeof(RLLockOp) * n);
	names = palloc0(sizeof(RLLockNames) * n);
	for (i = 0; i < n; i++)
	{
		rl_names_from_key(&names[i], holds[i].protocol, "", holds[i].key, cxt);
		/* the form the holder took it with works there; inspect has both */
		names[i].script_free = holds[i].script_free || !rl_scripting;
		strlcpy(names[i].owner, holds[i].owner, sizeof(names[i].owner));
		ops[i].kind = RL_OP_INSPECT;
		ops[i].target = rl_target_from_spec(holds[i].target_spec);
		ops[i].names = &names[i];
	}
	rl_lock_ops_run(ops, n, RL_RUN_SOFT);
	for (i = 0; i < n; i++)
		holds[i].in_redis = rl_op_held_by(&ops[i], holds[i].owner);
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
}

/*
 * In a wait's loop, wherever it may raise: the deadlock check due at now,
 * if any (deadlock.c).  A cycle it finds is confirmed in Redis first, then
 * decided (40P01 when it is real).
 */
static void
check_deadlock(TimestampTz now)
{
	RLDeadlockHold *holds;
	int			n;

	if (!rl_deadlock_check_due(now, &holds, &n))
		return;
	confirm_holds_in_redis(holds, n);
	rl_deadlock_confirm();
}

/*
 * Wait behind this server's earlier waiters for the lock (waitqueue.c), if
 * its waiters queue locally: only the head of that queue works in Redis.
 * Returns true when the wait ended here, with *outcome what it came to: the
 * wait ran out in the queue, or the one attempt made when our turn came
 * decided it.  Returns false to go on waiting in Redis.
 */
static bool
wait_local_turn(RLHeld *e, int64 lease_ms, TimestampTz deadline,
				RLLockOp *op, AcqOutcome *outcome)
{
	uint64		queue_id = local_queue_id(e);
	bool		turn;
	TimestampTz now;

	/* no Redlock grants below the quorum kept while sleeping in the queue */
	if (queue_id != 0 && op->yes > 0)
		(void) release_partial_grants(e, op, NULL);
	if (queue_id == 0 || rl_waitq_join(queue_id))
		return false;

	/* asleep in the queue, it is still checked for deadlocks */
	while (!(turn = rl_waitq_wait_turn(rl_deadlock_wake_at(deadline))) &&
		   (now = GetCurrentTimestamp()) < deadline)
		check_deadlock(now);
	if (!turn)
	{
		/* the wait ran out behind earlier local waiters */
		rl_waitq_leave();
		*outcome = ACQ_BUSY;
		return true;
	}

	/*
	 * Our turn came because the waiter before us stopped waiting, most often
	 * because it got the lock, and its hold is often over by now: try once
	 * before subscribing, which a grant makes unnecessary.
	 */
	*outcome = attempt(e, lease_ms, op);
	if (*outcome == ACQ_GOT || *outcome == ACQ_WRONGTYPE ||
		(*outcome == ACQ_UNDECIDED && e->target->kind != RL_TOPO_REDLOCK))
	{
		rl_waitq_leave();
		return true;
	}
	if (op->yes > 0)
		(void) release_partial_grants(e, op, NULL);
	return false;
}

/*
 * Subscribe to the lock's release channel on every node of its target
 * (filling subs, returning how many), and a fair lock's waiter joins its
 * queue in Redis.  The connections are noted as dirty until the wait ends.
 */
static int
subscribe_for_release(RLHeld *e, int64 wait_ms, const char *sub,
					  const char *channel, RLConn **subs)
{
	int			nsubs;
	int			i;

	nsubs = rl_target_nodes_or_raise(e->target, e->names.key, e->names.keylen,
									  subs, true);
	for (i = 0; i < nsubs && rl_lt_ndirty_subs < (int) lengthof(rl_lt_dirty_subs); i++)
		rl_lt_dirty_subs[rl_lt_ndirty_subs++] = subs[i];

	/*
	 * The release channel, and in the same round trip the lock key's
	 * keyspace notifications: where the server publishes them, a holder
	 * that never publishes (redis-py, node-redlock, redsync) wakes us too
	 * when it deletes the key or the key expires.
	 */
	rl_subscribe(subs, nsubs, sub, channel, e->names.key, rl_command_timeout_ms);
	/* a fair lock's waiter joins its queue; it leaves it however it stops */
	if (e->names.protocol == RL_PROTOCOL_REDISSON_FAIR && e->queued_ms == 0)
	{
		e->queued_ms = wait_ms;
		rl_lt_nqueued++;
	}
	return nsubs;
}

/*
 * How long to sleep after an attempt that did not decide, at now: when the
 * holders are of ours, which publish on release (busy_publishes), poll
 * rarely; else back off (*backoff).  Never past the holder's expiry (pttl,
 * 0 if unknown) or the deadline; Redlock adds jitter.  One rule for a
 * single lock's wait and a set's (lockmany.c).
 */
long
rl_retry_sleep_ms(bool busy_publishes, int64 pttl, bool redlock, long *backoff,
				  TimestampTz now, TimestampTz deadline)
{
	long		sleep_ms;

	if (busy_publishes)
		sleep_ms = 1000;
	else
	{
		sleep_ms = *backoff;
		*backoff = Min(*backoff * 2, 100);
	}
	if (pttl > 0)
		sleep_ms = Min(sleep_ms, (long) pttl + 1);
	if (redlock)
		sleep_ms += retry_jitter(Min(sleep_ms, 50));
	sleep_ms = Min(sleep_ms, (long) ((deadline - now + 999) / 1000));
	if (sleep_ms < 1)
		sleep_ms = 1;
	return sleep_ms;
}

/*
 * Sleep from now until wake or a wake-up message.  A holder that publishes
 * wakes us on its channel: its keyspace "del" would only wake us a second
 * time.  A deadlock check that comes due meanwhile runs without an attempt
 * of its own.
 */
static void
sleep_until_woken(RLHeld *e, RLLockOp *op, RLConn **subs, int nsubs,
				  const char *channel, TimestampTz now, TimestampTz wake)
{
	while (!rl_wait_for_message(subs, nsubs, channel,
								op->holder_publishes ? NULL : e->names.key,
								(long) ((rl_deadlock_wake_at(wake) - now + 999) / 1000)) &&
		   (now = GetCurrentTimestamp()) < wake)
		check_deadlock(now);
}

/*
 * A Redlock attempt left a node whose answer is unknown (it failed after
 * the command may have reached it, or the give-back failed): the next
 * attempt goes with a fresh owner value, the old one to the worker, so
 * that a command still on its way cannot delete or outlive the new grant.
 */
static void
renew_owner_while_waiting(RLHeld *e)
{
	rl_lt_renew_owner(e, false);
	if (rl_watchdog_enabled())
		e->registry_slot = rl_registry_add(e->name, &e->names, e->target,
										   e->lease_ms);
}

/*
 * Alternate attempts with sleeps that end on a release message, on the
 * holder's expiry, or on a bounded backoff for holders that never publish,
 * until the lock is ours, refused for good, or the deadline passed.
 */
static AcqOutcome
attempt_until_deadline(RLHeld *e, int64 lease_ms, TimestampTz deadline,
					   RLLockOp *op, RLConn **subs, int nsubs,
					   const char *channel)
{
	bool		redlock = e->target->kind == RL_TOPO_REDLOCK;
	long		backoff = 8;
	bool		stale;

	for (;;)
	{
		AcqOutcome	outcome;
		TimestampTz now;
		long		sleep_ms;

		/* the release may have happened before the subscription took */
		outcome = attempt(e, lease_ms, op);
		if (outcome == ACQ_GOT || outcome == ACQ_WRONGTYPE)
			return outcome;
		if (outcome == ACQ_UNDECIDED && !redlock)
			return outcome;		/* one node and it failed: an error now */
		stale = false;
		if (op->yes > 0)
			(void) release_partial_grants(e, op, &stale);
		if (stale || e->late_grant)
			renew_owner_while_waiting(e);
		now = GetCurrentTimestamp();
		if (now >= deadline)
			return outcome;

		sleep_ms = rl_retry_sleep_ms(outcome == ACQ_BUSY && op->holder_publishes,
									 op->pttl, redlock, &backoff, now, deadline);
		sleep_until_woken(e, op, subs, nsubs, channel, now,
						  TimestampTzPlusMilliseconds(now, sleep_ms));
	}
}

/*
 * Stop waiting: leave the local queue, unsubscribe without waiting for the
 * replies, and leave a fair lock's queue in Redis unless the grant did.
 */
static void
stop_waiting(RLHeld *e, RLConn **subs, int nsubs, const char *unsub,
			 const char *channel, AcqOutcome outcome)
{
	/* the next local waiter takes over at once, while we tidy up */
	rl_waitq_leave();
	rl_unsubscribe_async(subs, nsubs, unsub, channel, e->names.key);
	rl_lt_ndirty_subs = 0;
	if (e->queued_ms > 0)
	{
		if (outcome == ACQ_GOT)
		{
			/* the grant took us out of the queue */
			e->queued_ms = 0;
			rl_lt_nqueued--;
		}
		else
			rl_lt_leave_queues();
	}
}

/*
 * Wait for the lock.  First, behind this server's earlier waiters for it,
 * if any (waitqueue.c): only the head of that queue works in Redis.  Then
 * subscribe to its release channel on every node and alternate attempts
 * with latch waits that end on a release message, on the holder's expiry,
 * or on a bounded backoff for holders that never publish.  Redlock retries
 * add random jitter so contenders do not collide again.
 */
static AcqOutcome
wait_for_lock(RLHeld *e, int64 lease_ms, int64 wait_ms, RLLockOp *op)
{
	TimestampTz start = GetCurrentTimestamp();
	TimestampTz deadline = TimestampTzPlusMilliseconds(start, wait_ms);
	RLConn	   *subs[RL_MAX_NODES];
	int			nsubs;
	const char *sub = rl_pubsub_subscribe_cmd();
	const char *unsub = rl_pubsub_unsubscribe_cmd();
	const char *channel = rl_wait_channel(&e->names);
	AcqOutcome	outcome;

	rl_stats_add(RL_STAT_WAITS, 1);
	if (wait_local_turn(e, lease_ms, deadline, op, &outcome))
		return waited(start, outcome);
	nsubs = subscribe_for_release(e, wait_ms, sub, channel, subs);
	outcome = attempt_until_deadline(e, lease_ms, deadline, op, subs, nsubs,
									 channel);
	stop_waiting(e, subs, nsubs, unsub, channel, outcome);
	return waited(start, outcome);
}

/*
 * A lock the session holds was found not ours: warn, and forget its holds
 * and its entry; the caller takes the lock anew.
 */
static void
discard_lost(RLHeld *e)
{
	if (!e->lost)
		rl_lt_mark_lost(e);
	ereport(WARNING,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("Redis lock \"%s\" was lost; acquiring it anew", e->name),
			 errdetail("The %d earlier hold(s) of this session are discarded; releasing them will report that the lock is not held.",
					   RL_HOLDS(e))));
	e->session_holds = e->xact_holds = 0;
	rl_lt_became_doubt(e);
	rl_lt_entry_remove(e);
}

/*
 * A lock the session holds, acquired again: one round trip proves we still
 * own it (and refutes a loss the worker only presumed); the hold is counted.
 * When lost, warns, forgets the entry and returns false: acquired anew.
 */
static bool
acquire_again(RLHeld *e, int64 lease_ms, RLScope scope)
{
	int64		refresh = e->watchdog ? e->lease_ms : lease_ms;

	if ((!e->lost || e->loss_presumed) && rl_lt_verify_and_refresh(e, refresh))
	{
		if (!e->watchdog)
			e->lease_ms = refresh;
		rl_lt_add_hold(e, scope);
		rl_lt_registry_sync(e, true);
		return true;
	}
	discard_lost(e);
	return false;
}

/*
 * The entry an acquire attempt runs on: a doubt of the same name is reused
 * while it still matches the settings, with a fresh owner value (its old
 * one goes to the worker, see rl_lt_renew_owner; settled here without
 * preloading unless reclaimed: that one's release is on its way already),
 * else a new one; registered with the watchdog under the passwords of now.
 */
/*
 * The permits and limit of the semaphore acquire under way
 * (rl_acquire_permits), for the entry its attempts run on
 */
static int	sem_permits;
static int	sem_max_permits;

static RLHeld *
entry_for_attempt(RLHeld *doubt, RLLockMode mode, const char *name,
				  int64 lease_ms, bool reclaimed)
{
	RLHeld	   *e = doubt;

	if (e != NULL)
	{
		RLLockNames probe;

		memset(&probe, 0, sizeof(probe));
		rl_names_build(&probe, rl_lt_mode_protocol(mode), rl_key_prefix, name,
					   CurrentMemoryContext);
		if (e->target != rl_current_target() ||
			e->names.protocol != probe.protocol ||
			e->names.script_free != probe.script_free ||
			strcmp(e->names.key, probe.key) != 0)
		{
			/* not for these settings: one the worker has stays its own */
			if (RL_HANDED(e))
				rl_lt_entry_leave_to_worker(e);
			else
				rl_lt_entry_remove(e);
			e = NULL;
		}
	}
	if (e != NULL)
		rl_lt_renew_owner(e, !reclaimed);
	if (e == NULL)
		e = rl_lt_entry_create(mode, name);
	else if (e->registry_slot >= 0)
		rl_lt_registry_drop(e);
	if (mode == RL_MODE_PERMIT)
	{
		e->names.permits = sem_permits;
		e->names.max_permits = sem_max_permits;
	}
	e->lease_ms = lease_ms;
	if (rl_watchdog_enabled() && e->registry_slot < 0)
		e->registry_slot = rl_registry_add(e->name, &e->names, e->target,
										   e->lease_ms);
	return e;
}

/* Granted, but WAIT saw too few replicas: release again and raise */
static void
refuse_unreplicated(RLHeld *e)
{
	char	   *name = pstrdup(e->name);

	/*
	 * Still a doubt, no holds counted: released here, interruptibly (a
	 * cancel leaves it a doubt, for the worker or the next call)
	 */
	rl_lt_release_soft(&e, 1, NULL, true);
	rl_stats_add(RL_STAT_FAILED, 1);
	ereport(ERROR,
			(errcode(ERRCODE_CONNECTION_FAILURE),
			 errmsg("Redis lock \"%s\" was not replicated to %d replica(s) within %s",
					name, rl_wait_replicas, rl_format_ms(rl_wait_replicas_timeout_ms)),
			 errdetail("The lock was released again; without replicas a failover could lose it."),
			 errhint("Check the replicas, or lower redis_lock.wait_replicas.")));
}

/*
 * Not ours: give back partial grants, forget the entry if nothing of ours
 * can be left in Redis, and raise unless the lock was simply busy.
 */
static void
not_granted(RLHeld *e, AcqOutcome outcome, RLLockOp *op)
{
	char	   *name = pstrdup(e->name);
	RLProtocol	protocol = e->names.protocol;

	/*
	 * The error raised below names the failed call's key, which points into
	 * the entry's names: keep a copy past the entry.
	 */
	if (op->failure != NULL && op->failure->key != NULL)
		op->failure->key = pnstrdup(op->failure->key, op->failure->keylen);
	if (release_partial_grants(e, op, NULL))
		rl_lt_entry_remove(e);
	switch (outcome)
	{
		case ACQ_WRONGTYPE:
			{
				RLLockNames n;

				memset(&n, 0, sizeof(n));
				rl_names_build(&n, protocol, rl_key_prefix, name,
							   CurrentMemoryContext);
				rl_stats_add(RL_STAT_FAILED, 1);
				rl_raise_wrong_type(name, &n, op->wrongtype);
			}
			break;
		case ACQ_UNDECIDED:
			rl_stats_add(RL_STAT_FAILED, 1);
			rl_raise_undecided(RL_ACTION_ACQUIRE, name, op);
			break;
		default:
			rl_stats_add(RL_STAT_TIMED_OUT, 1);
			/* a partial grant not given back is the worker's to settle */
			rl_lt_hand_doubts_to_worker();
			break;
	}
}

/*
 * Refuse what a layout cannot do where the settings point: read-write and
 * fair locks on independent masters (their sharing and queues have no
 * majority rule), and on a Cluster the names whose companion keys would
 * fall in other hash slots.
 */
void
rl_refuse_unsupported_layout(RLLockMode mode, const char *name)
{
	RLProtocol	protocol = rl_lt_mode_protocol(mode);
	RLTopologyKind kind = rl_current_target()->kind;

	if (protocol != RL_PROTOCOL_SIMPLE && protocol != RL_PROTOCOL_REDISSON &&
		kind == RL_TOPO_REDLOCK)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("Redis lock layout \"%s\" is not supported on several independent masters",
						rl_protocol_name(protocol)),
				 errdetail("Lock \"%s\" would use it, and redis_lock.nodes is set.", name),
				 errhint("Use protocol simple or redisson there, or one Redis, Sentinel or Cluster.")));
	if (kind == RL_TOPO_CLUSTER)
	{
		char	   *key = psprintf("%s%s", rl_key_prefix ? rl_key_prefix : "", name);

		if (rl_key_splits_slots(protocol, key))
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("Redis lock \"%s\" cannot use layout \"%s\" on a Redis Cluster",
							name, rl_protocol_name(protocol)),
					 errdetail("Its key \"%s\" has a \"{\" without a complete hash tag, so the keys Redisson's naming puts beside it would fall in other hash slots.",
							   key),
					 errhint("Use a name without \"{\", or with a complete hash tag such as \"{tag}\".")));
		pfree(key);
	}
}

/*
 * Take one mode of lock name: the exclusive lock, or the read or the write
 * hold of its read-write lock.  ttl_ms <= 0 means "ttl NULL": the lease is
 * redis_lock.lease_time, renewed by the watchdog when it runs.  Returns the
 * fencing token (0 when there is none: Redlock, read-write locks);
 * *obtained is false when the wait elapsed.
 */
int64
rl_acquire(RLLockMode mode, const char *name, int64 ttl_ms, int64 wait_ms,
		   RLScope scope, bool *obtained)
{
	RLHeld	   *e;
	RLLockOp	op;
	AcqOutcome	outcome;
	bool		doubt;
	bool		reclaimed = false;
	int64		lease_ms = ttl_ms > 0 ? ttl_ms : rl_lease_time_ms;
	bool		watchdog = ttl_ms <= 0 && rl_watchdog_enabled();

	*obtained = false;
	rl_safe_point();
	rl_refuse_unsupported_layout(mode, name);

	e = rl_lt_entry_find(mode, name);

	/*
	 * Its release on its way, the lock is taken again behind local waiters:
	 * it queues below without an attempt of its own, so nothing of its own
	 * would follow that release on the connection.  Should the release not
	 * have run (NOSCRIPT, a redirection), the waiters would find our token
	 * until our turn comes, behind them.  So its answer is waited for
	 * (interruptible, within its deadline) and the release settled, sent
	 * again if it did not run, before the lock is taken again.
	 */
	if (e != NULL && RL_RELEASING(e) && behind_local_waiters(e, wait_ms))
	{
		rl_wait_owed(rl_command_timeout_ms);
		rl_lt_settle_pending(true, true);
		e = rl_lt_entry_find(mode, name);
	}
	/*
	 * The same behind local waiters when its release went to the worker at
	 * an abort (its connection was not ready then): that release is made
	 * now, interruptibly, as the abort would have made it, so that the
	 * waiters are served first and never find our owner value.
	 */
	if (e != NULL && e->release_handed && behind_local_waiters(e, wait_ms))
	{
		if (rl_lt_take_back_from_worker(e))
			rl_lt_release_soft(&e, 1, NULL, true);
		else
			rl_lt_entry_remove(e);
		e = rl_lt_entry_find(mode, name);
	}
	if (e != NULL && RL_RELEASING(e))
	{
		rl_lt_reclaim_releasing(e);
		reclaimed = true;
	}
	if (e != NULL && RL_HOLDS(e) > 0)
	{
		if (acquire_again(e, lease_ms, scope))
		{
			*obtained = true;
			return e->fence;
		}
		e = NULL;
	}
	doubt = e != NULL;
	e = entry_for_attempt(e, mode, name, lease_ms, reclaimed);

	/*
	 * Behind local waiters, a newcomer that may wait joins their queue
	 * without trying first: they are served in arrival order.  Not a doubt
	 * retried: its first attempt also settles what an earlier one left.  But
	 * an entry whose release is on its way does queue: that release frees
	 * the lock for the waiters, and the attempt pipelined behind it on the
	 * same connection would win every time.
	 */
	if ((!doubt || reclaimed) && behind_local_waiters(e, wait_ms))
	{
		rl_lt_op_init(&op, RL_OP_ACQUIRE, e, lease_ms);
		rl_lock_ops_route(&op, 1);
		e->expires_at = rl_lt_doubt_horizon(lease_ms);
		outcome = ACQ_BUSY;
	}
	else
		outcome = attempt(e, lease_ms, &op);
	if (outcome != ACQ_GOT && outcome != ACQ_WRONGTYPE && wait_ms > 0 &&
		(outcome == ACQ_BUSY || e->target->kind == RL_TOPO_REDLOCK))
	{
		RLWaitKey	wk = {e->target->spec, e->names.key, e->names.protocol};
		const char *wname = e->name;
		const char *wowner = e->names.owner;

		/*
		 * A semaphore's waiter waits for no holder in particular (any of
		 * them may give a permit back): no deadlock is found through it.
		 */
		rl_waiters_begin(&wk, &wname, &wowner, 1);
		if (mode != RL_MODE_PERMIT)
			rl_deadlock_wait_begin(&wk, 1);
		outcome = wait_for_lock(e, lease_ms, wait_ms, &op);
		if (mode != RL_MODE_PERMIT)
			rl_deadlock_wait_end();
		rl_waiters_end();
	}

	if (outcome == ACQ_GOT && op.replicas_short > 0)
		refuse_unreplicated(e);
	if (outcome == ACQ_GOT)
	{
		grant(e, op.fence_value, lease_ms, watchdog, scope);
		*obtained = true;
		/*
		 * An earlier release answered during this round trip says so now;
		 * no round trip here (a cancel in it would fail an acquire that
		 * counted its grant).
		 */
		if (rl_lt_npending > 0)
			rl_lt_settle_pending(false, false);
		return e->fence;
	}
	not_granted(e, outcome, &op);
	if (rl_lt_npending > 0)
		rl_lt_settle_pending(false, false);
	return 0;
}

/*
 * Take permits of semaphore name, waiting up to wait_ms (none when 0):
 * true when they were taken.  max_permits is the limit passed to Redis
 * under redis_semaphore (0 under redisson_semaphore, which keeps its count
 * in Redis).  A session holds one set of permits of a semaphore at a time:
 * taking more while it holds some would wait for itself once the limit is
 * reached, so it takes every permit it needs in one call.
 */
bool
rl_acquire_permits(const char *name, int permits, int max_permits,
				   int64 ttl_ms, int64 wait_ms, RLScope scope)
{
	RLHeld	   *e = rl_lt_entry_find(RL_MODE_PERMIT, name);
	bool		obtained;

	if (e != NULL && RL_HOLDS(e) > 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("this session already holds permits of Redis semaphore \"%s\"",
						name),
				 errdetail("It holds %d of them.", e->names.permits),
				 errhint("Release them first, or take every permit needed in one call.")));
	sem_permits = permits;
	sem_max_permits = max_permits;
	(void) rl_acquire(RL_MODE_PERMIT, name, ttl_ms, wait_ms, scope, &obtained);
	return obtained;
}

/* ----------------------------------------------------------------
 * Several locks at once: the interface lockmany.c acquires through
 * (lock.h)
 * ----------------------------------------------------------------
 */

/* A wait for several locks: its deadlock check due at now (check_deadlock) */
void
rl_many_check_deadlock(TimestampTz now)
{
	check_deadlock(now);
}

/* What a single acquire refuses for this name's layout (exclusive mode) */
void
rl_many_check_layout(const char *name)
{
	rl_refuse_unsupported_layout(RL_MODE_EXCLUSIVE, name);
}

/*
 * The layout an acquire of several locks would take name in: the one this
 * session holds it in, else the settings' (rl_many_entry replaces a doubt
 * of another layout).
 */
RLProtocol
rl_many_layout(const char *name)
{
	RLHeld	   *e = rl_lt_entry_find(RL_MODE_EXCLUSIVE, name);

	if (e != NULL && RL_HOLDS(e) > 0 && !e->lost)
		return e->names.protocol;
	return rl_lt_mode_protocol(RL_MODE_EXCLUSIVE);
}

/*
 * Raise before anything is made unless the names of a set that have no
 * entry yet fit under redis_lock.max_locks_per_session.
 */
void
rl_many_check_room(const char *const *names, int n)
{
	int			more = 0;
	int			i;

	for (i = 0; i < n; i++)
		if (rl_lt_entry_find(RL_MODE_EXCLUSIVE, names[i]) == NULL)
			more++;
	if (more > 0)
		rl_lt_ensure_room(more);
}

/*
 * The entry an acquire of several locks works on for name: the session's
 * own when it holds the lock (*held; its holds are counted on a grant), or
 * the one a single acquire's attempt would use (a doubt of the name reused,
 * its token retried; else a new one).  A hold known lost is discarded
 * first, as a single acquire does.
 */
RLHeld *
rl_many_entry(const char *name, int64 lease_ms, bool *held)
{
	RLHeld	   *e = rl_lt_entry_find(RL_MODE_EXCLUSIVE, name);
	bool		reclaimed = false;

	*held = false;
	if (e != NULL && RL_RELEASING(e))
	{
		rl_lt_reclaim_releasing(e);
		reclaimed = true;
	}
	if (e != NULL && RL_HOLDS(e) > 0)
	{
		if (!e->lost)
		{
			*held = true;
			return e;
		}
		rl_many_discard_lost(e);
		e = NULL;
	}
	return entry_for_attempt(e, RL_MODE_EXCLUSIVE, name, lease_ms, reclaimed);
}

/* An acquire of e is about to be sent: a doubt until its answer is known */
void
rl_many_sending(RLHeld *e, int64 lease_ms)
{
	Assert(RL_HOLDS(e) == 0);
	e->expires_at = rl_lt_doubt_horizon(lease_ms);
	e->late_grant = true;		/* until we know: a cancel may cut it short */
	e->lease_from = GetCurrentTimestamp();	/* a grant's lease starts later */
}

/* Its answer came: late_grant when a node failed after it may have run */
void
rl_many_answered(RLHeld *e, bool late_grant)
{
	e->late_grant = late_grant;
}

/*
 * A lock the session holds was found not ours: warn, as a single acquire
 * does, and forget the holds; the caller takes the lock anew.
 */
void
rl_many_discard_lost(RLHeld *e)
{
	discard_lost(e);
}

/*
 * Give back grants not kept (entries with no holds), in one round trip per
 * node.  settled[i]: nothing of ours is left for ents[i]; otherwise it
 * stays a doubt.  Cancel ends it with an ERROR, leaving them doubts.
 */
void
rl_many_give_back(RLHeld **ents, int n, bool *settled)
{
	int		   *results = palloc(sizeof(int) * Max(n, 1));
	int			i;

	(void) rl_lt_release_entries(ents, n, RL_RUN_SOFT, results);
	for (i = 0; i < n; i++)
		settled[i] = results[i] != RELEASE_UNKNOWN;
	pfree(results);
}

/*
 * Count the grant of e: a new hold of a lock the session held (its token
 * and, under the watchdog, its lease unchanged, as a reentrant single
 * acquire), or the first hold of a new grant.  sent_at: when the acquire
 * that (re)started its lease was sent.
 */
void
rl_many_grant(RLHeld *e, bool held, int64 fence, int64 lease_ms,
			  TimestampTz sent_at, bool watchdog, RLScope scope)
{
	e->lease_from = sent_at;
	if (!held)
	{
		grant(e, fence, lease_ms, watchdog, scope);
		return;
	}
	if (!e->watchdog)
		e->lease_ms = lease_ms;
	rl_lt_add_hold(e, scope);
	rl_lt_registry_sync(e, true);
}

/* Drop an entry with no holds of which nothing can be left in Redis */
void
rl_many_forget(RLHeld *e)
{
	Assert(RL_HOLDS(e) == 0);
	rl_lt_entry_remove(e);
}

/* Doubts an acquire leaves behind go to the worker (with preloading) */
void
rl_many_doubts_to_worker(void)
{
	rl_lt_hand_doubts_to_worker();
}

/*
 * Subscriber connections of a wait under way: an interrupted wait leaves
 * them subscribed, and they are closed at the next safe point or at
 * transaction end.
 */
void
rl_many_subscribed(RLConn **subs, int n)
{
	int			i;

	for (i = 0; i < n && rl_lt_ndirty_subs < (int) lengthof(rl_lt_dirty_subs); i++)
		rl_lt_dirty_subs[rl_lt_ndirty_subs++] = subs[i];
}

/* The wait unsubscribed its connections itself */
void
rl_many_unsubscribed(void)
{
	rl_lt_ndirty_subs = 0;
}
