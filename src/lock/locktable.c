/*-------------------------------------------------------------------------
 *
 * locktable.c
 *	  Owns this backend's table of Redis locks: its entries (one per mode
 *	  of a name), their holds, their slots in the shared registry, the
 *	  operations on an entry's node(s) with their error reports, and the
 *	  release of entries whose answer is waited for (rl_lt_release_soft).  The
 *	  files above it change the table through lock_int.h: acquiring
 *	  (lockacquire.c), releasing and extending (lockrelease.c), doubts and
 *	  releases on their way (lockdoubts.c), the transaction and exit
 *	  callbacks (lockxact.c).  It registers those callbacks with PostgreSQL
 *	  when the table is first made; it never calls them.
 *
 *	  An entry with zero holds is a *doubt*: a grant or a release whose
 *	  outcome we could not learn (connection lost, interrupt, timeout).  The
 *	  session never counts it as held.  With preloading it is handed to the
 *	  watchdog worker at once (at the transaction or subtransaction abort
 *	  that follows an interrupted call, at COMMIT, or where it arose), which
 *	  settles it with an idempotent compare-and-delete as soon as Redis
 *	  answers, whether or not this session ever calls again; the entry stays
 *	  behind, so that acting on the same lock again first takes it back from
 *	  the worker (the same owner must not race the worker's release).
 *	  Without preloading it is settled at the next safe point (next
 *	  redis_lock call, transaction end, backend exit) or forgotten once its
 *	  lease has surely run out.  So no error leaves the session believing it
 *	  holds a lock it does not, and no unknown grant is left in Redis longer
 *	  than needed.  The states an entry goes through, and the one function
 *	  that moves it between them, are lockstate.c's.
 *
 *	  Must not: call hiredis (transport.c and stream.c do; its header is
 *	  included here only for the REDIS_REPLY_* codes of an RLReply's type),
 *	  know script bodies (scripts.c does), define SQL-callable functions
 *	  (functions.c does), call into the files of the table above it.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/lock/locktable.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <hiredis/hiredis.h>

#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/memutils.h"

#include "net/net.h"
#include "redis/redis.h"
#include "worker/worker.h"
#include "lock/lock_int.h"

HTAB	   *rl_lt_held = NULL;
int			rl_lt_ndoubts = 0;	/* entries in state DOUBT (lockstate.c) */
int			rl_lt_nhanded = 0;	/* in HANDED or RELEASING_HANDED */
int			rl_lt_nqueued = 0;	/* entries with queued_ms set */
MemoryContext rl_lt_work_cxt = NULL;
static MemoryContext names_cxt = NULL;	/* the entries' key/channel strings */
static uint64 last_serial = 0;	/* RLHeld.serial of the newest entry */

XactHold   *rl_lt_xact_log = NULL;
int			rl_lt_xact_log_len = 0;
static int	xact_log_cap = 0;
static MemoryContext xact_log_cxt = NULL;	/* reset at transaction end */

/* ----------------------------------------------------------------
 * Entries
 * ----------------------------------------------------------------
 */
static bool callbacks_registered = false;

/* dynahash never gives memory back: rebuild the table when it empties */
#define SHRINK_THRESHOLD 1024
static long held_peak = 0;

void
rl_lt_ensure_table(void)
{
	HASHCTL		ctl;

	if (rl_lt_held != NULL)
		return;
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = RL_MAX_NAME_LEN + 2;
	ctl.entrysize = sizeof(RLHeld);
	ctl.hcxt = TopMemoryContext;
	rl_lt_held = hash_create("redis_lock held locks", 64, &ctl,
					   HASH_ELEM | RL_HASH_STRINGS | HASH_CONTEXT);
	held_peak = 0;
	if (!callbacks_registered)
	{
		rl_lt_work_cxt = AllocSetContextCreate(TopMemoryContext, "redis_lock work",
										 ALLOCSET_SMALL_SIZES);
		names_cxt = AllocSetContextCreate(TopMemoryContext, "redis_lock names",
										  ALLOCSET_DEFAULT_SIZES);
		xact_log_cxt = AllocSetContextCreate(TopMemoryContext,
											 "redis_lock transaction holds",
											 ALLOCSET_SMALL_SIZES);
		RegisterXactCallback(redis_lock_locktable_xact_callback, NULL);
		RegisterSubXactCallback(redis_lock_locktable_subxact_callback, NULL);
		before_shmem_exit(redis_lock_locktable_before_shmem_exit, (Datum) 0);
		callbacks_registered = true;
	}
}

/* Call only outside sequential scans of the table */
void
rl_lt_maybe_shrink(void)
{
	if (rl_lt_held != NULL && held_peak > SHRINK_THRESHOLD &&
		hash_get_num_entries(rl_lt_held) == 0)
	{
		hash_destroy(rl_lt_held);
		rl_lt_held = NULL;
		MemoryContextReset(names_cxt);
		rl_lt_ensure_table();
	}
}

static void
free_names(RLLockNames *n)
{
	if (n->key)
		pfree(n->key);
	if (n->fence_key)
		pfree(n->fence_key);
	if (n->channel)
		pfree(n->channel);
	if (n->release_channel)
		pfree(n->release_channel);
	n->key = n->fence_key = n->channel = n->release_channel = NULL;
}

/* The table's key of one mode of a name: its mode letter, then the name */
static void
held_key(char *hkey, RLLockMode mode, const char *name)
{
	static const char letter[] = {
		[RL_MODE_EXCLUSIVE] = 'x',
		[RL_MODE_READ] = 'r',
		[RL_MODE_WRITE] = 'w',
		[RL_MODE_PERMIT] = 'p',
	};

	hkey[0] = letter[mode];
	strlcpy(hkey + 1, name, RL_MAX_NAME_LEN + 1);
}

/* The entry of one mode of a name, or NULL */
RLHeld *
rl_lt_entry_find(RLLockMode mode, const char *name)
{
	char		hkey[RL_MAX_NAME_LEN + 2];

	if (rl_lt_held == NULL)
		return NULL;
	held_key(hkey, mode, name);
	return hash_search(rl_lt_held, hkey, HASH_FIND, NULL);
}

/*
 * The wire layout of a mode: redis_lock.protocol for exclusive locks,
 * Redisson's read-write lock for the other two.
 */
RLProtocol
rl_lt_mode_protocol(RLLockMode mode)
{
	switch (mode)
	{
		case RL_MODE_EXCLUSIVE:
			break;
		case RL_MODE_READ:
			return RL_PROTOCOL_RW_READ;
		case RL_MODE_WRITE:
			return RL_PROTOCOL_RW_WRITE;
		case RL_MODE_PERMIT:
			return (RLProtocol) rl_semaphore_protocol;
	}
	return (RLProtocol) rl_protocol;
}

/*
 * Raise unless the table has room for more new entries under
 * redis_lock.max_locks_per_session.  Entries settling a release or a doubt
 * count too: what a session leaves in Redis is bounded, whatever it asks for.
 */
void
rl_lt_ensure_room(int more)
{
	long		entries = hash_get_num_entries(rl_lt_held);
	int			limit = rl_session_lock_limit();

	if (entries + more > limit)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("too many Redis locks held by this session"),
				 errdetail("The session holds or is still settling %ld locks and asks for %d more; redis_lock.max_locks_per_session is %d.",
						   entries, more, limit),
				 errhint("Release locks, or ask a superuser to raise redis_lock.max_locks_per_session.")));
}

/*
 * The owner value of a new grant of one mode of a name (rl_mint_owner: a
 * fresh one, whatever the layout), and for a read hold the owner value of
 * the session's write hold of the same lock, if any: Redisson lets a
 * writer's thread read, and our read goes in under that write.
 */
static void
mint_owner(RLLockNames *names, RLLockMode mode, const char *name)
{
	RLHeld	   *w = NULL;

	rl_mint_owner(names->protocol, names->owner);
	if (mode == RL_MODE_READ)
		w = rl_lt_entry_find(RL_MODE_WRITE, name);
	if (w != NULL && RL_HOLDS(w) > 0)
		strlcpy(names->writer, w->names.owner, sizeof(names->writer));
	else
		names->writer[0] = '\0';
}

/*
 * Create an entry of one mode of a name (zero holds: a doubt until granted)
 * for the settings now.
 */
RLHeld *
rl_lt_entry_create(RLLockMode mode, const char *name)
{
	RLLockNames names;
	RLHeld	   *e;
	bool		found;
	char		hkey[RL_MAX_NAME_LEN + 2];
	RLTarget   *target;

	rl_lt_ensure_room(1);
	target = rl_current_target();	/* may raise: nothing made yet */

	memset(&names, 0, sizeof(names));
	rl_names_build(&names, rl_lt_mode_protocol(mode), rl_key_prefix, name,
				   names_cxt);
	held_key(hkey, mode, name);
	PG_TRY();
	{
		mint_owner(&names, mode, name);
		e = hash_search(rl_lt_held, hkey, HASH_ENTER, &found);
	}
	PG_CATCH();
	{
		free_names(&names);
		PG_RE_THROW();
	}
	PG_END_TRY();
	Assert(!found);
	held_peak = Max(held_peak, hash_get_num_entries(rl_lt_held));
	memset(((char *) e) + offsetof(RLHeld, name), 0,
		   sizeof(RLHeld) - offsetof(RLHeld, name));
	strlcpy(e->name, name, sizeof(e->name));
	e->mode = mode;
	e->target = target;
	e->names = names;
	e->registry_slot = -1;
	e->serial = ++last_serial;
	rl_lt_set_state(e, RL_ENTRY_DOUBT);
	return e;
}

/* ----------------------------------------------------------------
 * The entry's slot in the shared registry (registry.c)
 * ----------------------------------------------------------------
 */
void
rl_lt_registry_sync(RLHeld *e, bool refreshed)
{
	RLLockState st;

	memset(&st, 0, sizeof(st));
	st.watchdog = e->watchdog;
	st.lost = e->lost;
	st.on_lost = e->on_lost;
	st.session_holds = e->session_holds;
	st.xact_holds = e->xact_holds;
	st.fence = e->fence;
	st.lease_ms = e->lease_ms;
	st.acquired_at = e->acquired_at;
	rl_registry_update(e->registry_slot, &st, e->names.owner,
					   refreshed ? e->lease_from : 0);
}

void
rl_lt_registry_drop(RLHeld *e)
{
	rl_registry_remove(e->registry_slot);
	e->registry_slot = -1;
}

/*
 * A doubt goes to the watchdog worker, which releases it whenever Redis
 * answers (the backend exits, or it is a doubt that no round trip of this
 * session should wait for).  The entry stays, marked handed, until the
 * worker is done or it is taken back.
 */
void
rl_lt_hand_to_worker(RLHeld *e)
{
	Assert(RL_HOLDS(e) == 0 && !RL_HANDED(e) && e->registry_slot >= 0);
	e->handed_gen = rl_registry_hand_off(e->registry_slot, e->expires_at,
										 e->late_grant, 0);
	rl_lt_set_state(e, RL_ENTRY_HANDED);
}

/*
 * Take a handed doubt back from the worker, waiting out a release of the
 * worker's under way (interruptibly; with interrupts held that is not
 * waited for).  Returns false when the worker settled it already, or keeps
 * it because its command is under way and interrupts are held: then the
 * slot is no longer the entry's, and the worker settles the owner value.
 */
bool
rl_lt_take_back_from_worker(RLHeld *e)
{
	bool		ours = rl_registry_reclaim(e->registry_slot, e->handed_gen) == RL_RECLAIMED;

	Assert(RL_HANDED(e));
	rl_lt_set_state(e, RL_ENTRY_DOUBT);
	if (!ours)
		e->registry_slot = -1;
	return ours;
}

/*
 * Give a doubt (no holds) a fresh owner value (mint_owner) before it is
 * tried again.  Its old one may still be on its way in a command whose
 * outcome is unknown: a release that would delete the new grant, an
 * acquire that would land after the session released it and stay for its
 * lease; neither can match the new value.  The old value stays with the
 * worker until settled (the entry's registry slot is handed off and kept by
 * the worker); without one, when settle, its compare-and-delete is made
 * here (interruptibly: a cancel leaves the entry as it was), else it is
 * left to its lease.
 */
void
rl_lt_renew_owner(RLHeld *e, bool settle)
{
	Assert(RL_HOLDS(e) == 0 && !RL_RELEASING(e));
	if (RL_HANDED(e))
	{
		/* the worker has the old value already, and keeps it */
		rl_lt_set_state(e, RL_ENTRY_DOUBT);
		e->registry_slot = -1;
	}
	else if (e->registry_slot >= 0 && e->expires_at != 0)
	{
		(void) rl_registry_hand_off(e->registry_slot, e->expires_at,
									e->late_grant, 0);
		e->registry_slot = -1;
	}
	else if (settle && e->expires_at != 0)
	{
		int			result;

		(void) rl_lt_release_entries(&e, 1, RL_RUN_SOFT, &result);
	}
	if (e->registry_slot >= 0)
		rl_lt_registry_drop(e); /* never tried: nothing of it in Redis */
	mint_owner(&e->names, e->mode, e->name);
	e->expires_at = 0;
	e->late_grant = false;
}

/*
 * The worker found e lost since the session last looked: e is lost here
 * too, presumed lost when the worker only presumed it (no renewal answered
 * for a lease).  Returns whether that was found now.
 */
bool
rl_lt_take_worker_loss(RLHeld *e)
{
	uint8		cause;
	TimestampTz lost_at;
	TimestampTz cancelled_at;

	if (e->registry_slot < 0 || e->lost ||
		!rl_registry_loss(e->registry_slot, &cause, &lost_at, &cancelled_at))
		return false;
	rl_lt_set_lost(e);
	e->loss_presumed = cause == RL_LOST_UNREACHABLE;
	return true;
}

/*
 * Redis answered a round trip sent at sent that found e's owner value
 * there: the worker renews it from then on (rl_registry_found_ours).  A
 * loss the worker only presumed (no renewal answered for a lease), whether
 * the entry has taken it yet or not, is refuted: withdrawn from the
 * registry, and the entry is held again, unless the worker has signalled
 * the holder for it already.  A loss found for certain stays, and becomes
 * the entry's.  Returns whether e is ours.
 */
bool
rl_lt_found_ours(RLHeld *e, TimestampTz sent)
{
	if (e->lost && !e->loss_presumed)
		return false;
	if (rl_registry_found_ours(e->registry_slot, sent))
	{
		if (e->lost)
			rl_lt_set_found_ours(e);
		return true;
	}
	(void) rl_lt_take_worker_loss(e);
	return !e->lost;
}

void
rl_lt_entry_remove(RLHeld *e)
{
	/* a release on its way: its answer will find no entry, and is dropped */
	if (RL_RELEASING(e))
		rl_lt_set_state(e, RL_HANDED(e) ? RL_ENTRY_HANDED : RL_ENTRY_DOUBT);
	/* its release is ours again, and is dropped with the entry */
	if (RL_HANDED(e))
		(void) rl_lt_take_back_from_worker(e);
	rl_lt_set_state(e, RL_ENTRY_FREE);
	if (e->queued_ms > 0)
		rl_lt_nqueued--;				/* its queue entry times out by itself */
	if (e->registry_slot >= 0)
		rl_lt_registry_drop(e);
	free_names(&e->names);
	hash_search(rl_lt_held, e->hkey, HASH_REMOVE, NULL);
	Assert(hash_get_num_entries(rl_lt_held) > 0 ||
		   (rl_lt_ndoubts == 0 && rl_lt_nhanded == 0));
}

/*
 * Forget a handed doubt here and leave its release to the worker, whose
 * registry slot it keeps: for an entry the settings no longer describe, so
 * that an entry of the same name can be made for them.
 */
void
rl_lt_entry_leave_to_worker(RLHeld *e)
{
	Assert(RL_HANDED(e) && RL_HOLDS(e) == 0 && !RL_RELEASING(e));
	rl_lt_set_state(e, RL_ENTRY_FREE);
	e->registry_slot = -1;
	if (e->queued_ms > 0)
		rl_lt_nqueued--;
	free_names(&e->names);
	hash_search(rl_lt_held, e->hkey, HASH_REMOVE, NULL);
	Assert(hash_get_num_entries(rl_lt_held) > 0 ||
		   (rl_lt_ndoubts == 0 && rl_lt_nhanded == 0));
}

/* Record a transaction hold of an entry (by its hash key) for the current
 * subtransaction */
static void
xact_log_push(const char *hkey)
{
	MemoryContext old = MemoryContextSwitchTo(xact_log_cxt);

	if (rl_lt_xact_log_len == xact_log_cap)
	{
		xact_log_cap = Max(16, xact_log_cap * 2);
		rl_lt_xact_log = rl_lt_xact_log == NULL ? palloc(sizeof(XactHold) * xact_log_cap) :
			repalloc(rl_lt_xact_log, sizeof(XactHold) * xact_log_cap);
	}
	rl_lt_xact_log[rl_lt_xact_log_len].subid = GetCurrentSubTransactionId();
	rl_lt_xact_log[rl_lt_xact_log_len].hkey = pstrdup(hkey);
	rl_lt_xact_log_len++;
	MemoryContextSwitchTo(old);
}

void
rl_lt_xact_log_reset(void)
{
	rl_lt_xact_log = NULL;
	rl_lt_xact_log_len = xact_log_cap = 0;
	if (xact_log_cxt != NULL)
		MemoryContextReset(xact_log_cxt);
}

void
rl_lt_add_hold(RLHeld *e, RLScope scope)
{
	bool		first = RL_HOLDS(e) == 0;

	/* recorded first: if that fails, nothing was counted */
	if (scope == RL_SCOPE_XACT)
		xact_log_push(e->hkey);
	if (first)
		e->on_lost = (uint8) rl_on_lost;	/* as set when it is taken */
	if (scope == RL_SCOPE_XACT)
		e->xact_holds++;
	else
		e->session_holds++;
	if (first)
		rl_lt_set_state(e, RL_ENTRY_HELD);	/* leaves the doubt set */
}

/*
 * Latest moment a key written now with this lease can still exist, even if
 * the command is resent after a dead connection.
 */
TimestampTz
rl_lt_doubt_horizon(int64 lease_ms)
{
	return TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
									   lease_ms + 2 * rl_command_timeout_ms +
									   rl_connect_timeout_ms);
}

/*
 * After hold counts went to zero by direct assignment.  Nobody holds the
 * lock any more, whatever the release that follows achieves: the registry
 * slot stops being renewed now, before any round trip can fail.
 */
void
rl_lt_became_doubt(RLHeld *e)
{
	Assert(RL_HOLDS(e) == 0);
	e->was_renewed = e->watchdog;
	rl_lt_set_state(e, RL_ENTRY_DOUBT);
	e->watchdog = false;
	e->late_grant = false;
	e->expires_at = rl_lt_doubt_horizon(e->lease_ms);
	rl_lt_registry_sync(e, false);
}

/*
 * The entry of an exclusive lock this backend has at least one hold on;
 * else NULL
 */
RLHeld *
rl_lookup(const char *name)
{
	RLHeld	   *e = rl_lt_entry_find(RL_MODE_EXCLUSIVE, name);

	return (e != NULL && RL_HOLDS(e) > 0) ? e : NULL;
}

/* The entry of one mode of name this backend holds, else NULL */
RLHeld *
rl_lookup_mode(RLLockMode mode, const char *name)
{
	RLHeld	   *e = rl_lt_entry_find(mode, name);

	return (e != NULL && RL_HOLDS(e) > 0) ? e : NULL;
}

/*
 * The entry of name this backend holds, whichever mode: the exclusive lock
 * first, then the write hold, then the read hold; else NULL
 */
RLHeld *
rl_lookup_any(const char *name)
{
	static const RLLockMode order[] = {RL_MODE_EXCLUSIVE, RL_MODE_WRITE, RL_MODE_READ};
	int			i;

	for (i = 0; i < (int) lengthof(order); i++)
	{
		RLHeld	   *e = rl_lt_entry_find(order[i], name);

		if (e != NULL && RL_HOLDS(e) > 0)
			return e;
	}
	return NULL;
}

/*
 * Drop name's entries (every mode), held or doubtful, and their registry
 * slots without a round trip to Redis: the caller knows the lock is gone (a
 * force release).
 */
void
rl_forget(const char *name)
{
	RLLockMode	mode;

	for (mode = RL_MODE_EXCLUSIVE; mode <= RL_MODE_WRITE; mode++)
	{
		RLHeld	   *e = rl_lt_entry_find(mode, name);

		if (e != NULL)
			rl_lt_entry_remove(e);
	}
}

/*
 * Does this session hold the read hold of the read-write lock name without
 * its write hold?  Then asking for the write hold would wait for itself.
 */
bool
rl_holds_read_only(const char *name)
{
	RLHeld	   *r = rl_lt_entry_find(RL_MODE_READ, name);
	RLHeld	   *w = rl_lt_entry_find(RL_MODE_WRITE, name);

	return r != NULL && RL_HOLDS(r) > 0 && (w == NULL || RL_HOLDS(w) == 0);
}

/* Holding entries, palloc'd array in the caller's context */
int
rl_held_snapshot(RLHeld **out)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;
	int			n = 0;

	*out = NULL;
	if (rl_lt_held == NULL)
		return 0;
	*out = palloc(sizeof(RLHeld) * Max(hash_get_num_entries(rl_lt_held), 1));
	hash_seq_init(&seq, rl_lt_held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (RL_HOLDS(e) == 0)
			continue;
		(void) rl_lt_take_worker_loss(e);
		(*out)[n++] = *e;
	}
	return n;
}

/* ----------------------------------------------------------------
 * Reporting
 * ----------------------------------------------------------------
 */
static int
call_sqlstate(RLCall *call)
{
	RLReply    *r = call->reply;

	if (call->error != NULL)
		return call->sqlstate ? call->sqlstate : ERRCODE_CONNECTION_FAILURE;
	if (r != NULL && r->type == REDIS_REPLY_ERROR)
		return rl_error_reply_sqlstate(r);
	return ERRCODE_PROTOCOL_VIOLATION;
}

/*
 * errmsg "could not <action> Redis lock", inside an ereport; one literal
 * message a case so that gettext finds each
 */
static int
action_failed(RLLockAction action, const char *name)
{
	switch (action)
	{
		case RL_ACTION_ACQUIRE:
			return errmsg("could not acquire Redis lock \"%s\"", name);
		case RL_ACTION_RELEASE:
			return errmsg("could not release Redis lock \"%s\"", name);
		case RL_ACTION_VERIFY:
			return errmsg("could not verify Redis lock \"%s\"", name);
		case RL_ACTION_FORCE_RELEASE:
			return errmsg("could not force-release Redis lock \"%s\"", name);
		case RL_ACTION_INSPECT:
			return errmsg("could not inspect Redis lock \"%s\"", name);
	}
	elog(ERROR, "unexpected Redis lock action %d", (int) action);
	pg_unreachable();
}

/* errcontext naming the Redis command of a failed call, its key and node */
static int
call_context(RLCall *call)
{
	if (call->conn == NULL)
		return errcontext("Redis key \"%s\"", call->key ? call->key : "");
	return errcontext("Redis %s on key \"%s\" at %s", rl_call_command_name(call),
					  call->key ? call->key : "", rl_conn_label(call->conn));
}

/* Report a failed call about lock name at elevel (ERROR does not return) */
void
rl_lt_report_call(int elevel, RLLockAction action, const char *name, RLCall *call)
{
	int			code = call_sqlstate(call);

	ereport(elevel,
			(errcode(code),
			 action_failed(action, name),
			 errdetail_internal("%s", rl_call_problem(call)),
			 call_context(call),
			 code == ERRCODE_CONNECTION_FAILURE ?
			 errhint("Check redis_lock.url and that the Redis server is a reachable master.") : 0));
}

/* The key of lock name holds something else: nothing was taken or changed */
void
rl_raise_wrong_type(const char *name, const RLLockNames *n, const char *type)
{
	/* a semaphore's scripts say which of its keys, and what it holds */
	if (RL_PROTOCOL_IS_SEM(n->protocol))
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("Redis semaphore \"%s\" has a key of another kind", name),
				 errdetail("Key %s, not a semaphore of layout \"%s\"; nothing was changed.",
						   type, rl_protocol_name(n->protocol)),
				 errhint("Check redis_lock.semaphore_protocol and redis_lock.key_prefix, or use another semaphore name.")));
	ereport(ERROR,
			(errcode(ERRCODE_WRONG_OBJECT_TYPE),
			 errmsg("Redis key \"%s\" holds a %s, not a lock of protocol \"%s\"",
					n->key, type, rl_protocol_name(n->protocol)),
			 errdetail("Lock \"%s\" maps to that key; the key was not changed.", name),
			 RL_PROTOCOL_IS_RW(n->protocol) ?
			 errhint("A read-write lock cannot share its name with an exclusive lock: check redis_lock.key_prefix, or use another lock name.") :
			 errhint("Check redis_lock.protocol and redis_lock.key_prefix, or use another lock name.")));
}

/* SQL-callable calls so far; lets a call warn about one lost lock once */
uint64		rl_lt_call_seq = 0;

/*
 * Every call that finds a lock lost says so (API: false plus a WARNING);
 * a release that cannot tell a loss from its own delete says that, and so
 * does a loss the worker only presumed (a round trip that finds the lock
 * ours refutes it, rl_lt_found_ours).
 */
void
rl_lt_warn_lost(RLHeld *e)
{
	if (e->lost_reported_at == rl_lt_call_seq)
		return;
	e->lost_reported_at = rl_lt_call_seq;
	if (e->loss_unsure)
	{
		ereport(WARNING,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 e->mode == RL_MODE_PERMIT ?
				 errmsg("permits of Redis semaphore \"%s\" may have been lost", e->name) :
				 errmsg("Redis lock \"%s\" may have been lost", e->name),
				 errdetail("Its release was sent again after its reply was lost and found key \"%s\" gone, after its lease may have run out: this release or the lease's end removed it.",
						   e->names.key)));
		return;
	}
	if (e->loss_presumed)
	{
		ereport(WARNING,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 e->mode == RL_MODE_PERMIT ?
				 errmsg("permits of Redis semaphore \"%s\" may have been lost", e->name) :
				 errmsg("Redis lock \"%s\" may have been lost", e->name),
				 errdetail("No renewal of key \"%s\" was answered before its lease ran out: Redis has expired it, unless the renewals ran and only their answers were lost.",
						   e->names.key)));
		return;
	}
	ereport(WARNING,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 e->mode == RL_MODE_PERMIT ?
			 errmsg("permits of Redis semaphore \"%s\" were lost", e->name) :
			 errmsg("Redis lock \"%s\" was lost", e->name),
			 errdetail("Its lease expired or another client deleted or took over key \"%s\".",
					   e->names.key)));
}

void
rl_lt_mark_lost(RLHeld *e)
{
	/* not known lost: reported (rl_lt_warn_lost), not counted */
	if (e->loss_unsure)
		return;
	if (!e->lost)
		rl_stats_add(RL_STAT_LOST, 1);
	rl_lt_set_lost(e);
	e->loss_presumed = false;	/* found so by this session */
	rl_lt_registry_sync(e, false);
}

/* ----------------------------------------------------------------
 * Operations on the entry's node(s)
 * ----------------------------------------------------------------
 */
/*
 * Until when e's lease surely lasts in Redis, by our clock: lease_ms from
 * the later of the round trip that last started it (e->lease_from) and the
 * worker's last renewal, both counted from when they were sent, less the
 * clock-drift allowance of Redlock (1% + 2 ms).  Another client that cuts
 * our lease short (PEXPIRE, a Redisson reader's renewal) is not foreseen.
 * 0: not known.
 */
static TimestampTz
lease_surely_until(RLHeld *e)
{
	TimestampTz from = e->lease_from;

	if (from == 0 || e->lease_ms <= 0)
		return 0;
	if (e->registry_slot >= 0 && !RL_HANDED(e))
		from = Max(from, rl_registry_renewed_at(e->registry_slot));
	return TimestampTzPlusMilliseconds(from, e->lease_ms - (e->lease_ms / 100 + 2));
}

/*
 * Whether e's key may last past ours_until, for a release about to go:
 * when the worker renews it (a renewal it sent may have run in Redis with
 * its answer never read: Redis frozen with it unread, a connection
 * dropped), or when the release goes before then.
 */
static bool
lease_may_outlive(RLHeld *e, TimestampTz ours_until)
{
	if (e->watchdog || e->was_renewed)
		return true;
	return GetCurrentTimestamp() < ours_until;
}

void
rl_lt_op_init(RLLockOp *op, RLOpKind kind, RLHeld *e, int64 lease_ms)
{
	memset(op, 0, sizeof(*op));
	op->kind = kind;
	op->target = e->target;
	op->names = &e->names;
	op->lease_ms = lease_ms;
	/* tokens from independent masters would not be ordered: no fencing */
	op->fence = e->target->kind != RL_TOPO_REDLOCK;
	/* a release sent again reads its answer by it (lockop.c) */
	if (kind == RL_OP_RELEASE)
	{
		op->ours_until = lease_surely_until(e);
		op->may_outlive = lease_may_outlive(e, op->ours_until);
	}
}

/* Raise for an op whose outcome no majority decided */
void
rl_raise_undecided(RLLockAction action, const char *name, RLLockOp *op)
{
	if (op->nodes > 1)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 action_failed(action, name),
				 errdetail("No majority of the %d Redis masters answered: %d yes, %d no, %d failed; the first failure: %s.",
						   op->nodes, op->yes, op->no, op->failed,
						   rl_call_problem(op->failure)),
				 errhint("Check redis_lock.nodes and redis_lock.node_timeout.")));
	if (op->failure->error != NULL)
		rl_raise_call_error(op->failure);
	rl_lt_report_call(ERROR, action, name, op->failure);
	pg_unreachable();
}

/*
 * Release every entry in one round (one pipelined round trip per node,
 * however many locks).  results[i]: 1 released, 0 not ours (lost or
 * absent), RELEASE_UNKNOWN when no majority answered.
 */
RLLockOp *
rl_lt_release_entries(RLHeld **ents, int n, RLRunMode mode, int *results)
{
	RLLockOp   *ops = palloc(sizeof(RLLockOp) * Max(n, 1));
	int			i;

	for (i = 0; i < n; i++)
		rl_lt_op_init(&ops[i], RL_OP_RELEASE, ents[i], ents[i]->lease_ms);
	if (n > 0)
		rl_lock_ops_run(ops, n, mode);
	for (i = 0; i < n; i++)
	{
		results[i] = RL_OP_YES(&ops[i]) ? 1 : RL_OP_NO(&ops[i]) ? 0 : RELEASE_UNKNOWN;
		ents[i]->loss_unsure = results[i] == 0 && !RL_OP_SURELY_NO(&ops[i]);
	}
	return ops;
}

/*
 * Release in Redis every entry in ents (their holds already zero), never
 * raising.  Where warn[i] is set (locks the session held) failures become
 * WARNINGs and a missing key is reported lost; doubts (warn NULL or unset)
 * are settled quietly.
 * Entries whose outcome stays unknown remain as doubts.  Interrupts are held
 * so that a cancel does not cut it short with an ERROR, and the wait is then
 * bounded by RL_HELD_WAIT_CUT_MS (only without preloading, or at exit: with
 * it the paths that must not raise hand their work to the worker), unless
 * interruptible: then a cancel ends it with an ERROR, leaving every entry as
 * it was.
 */
void
rl_lt_release_soft(RLHeld **ents, int n, const bool *warn, bool interruptible)
{
	int		   *results;
	RLLockOp   *ops;
	int			i;

	if (n == 0)
		return;
	results = palloc(sizeof(int) * n);
	if (!interruptible)
		HOLD_INTERRUPTS();
	ops = rl_lt_release_entries(ents, n, RL_RUN_SOFT, results);
	if (!interruptible)
		RESUME_INTERRUPTS();
	for (i = 0; i < n; i++)
	{
		RLHeld	   *e = ents[i];
		bool		held = warn != NULL && warn[i];

		if (results[i] == RELEASE_UNKNOWN)
		{
			if (held)
				rl_lt_report_call(WARNING, RL_ACTION_RELEASE, e->name, ops[i].failure);
			continue;
		}
		if (results[i] == 0 && held && !e->lost)
		{
			rl_lt_mark_lost(e);
			rl_lt_warn_lost(e);
		}
		if (results[i] == 1 && held)
			rl_stats_add(RL_STAT_RELEASED, 1);
		rl_lt_entry_remove(e);
	}
}

/* A warn[] for rl_lt_release_soft: every entry was held by the session */
bool *
rl_lt_warn_for_all(int n)
{
	bool	   *warn = palloc(sizeof(bool) * Max(n, 1));

	memset(warn, true, sizeof(bool) * Max(n, 1));
	return warn;
}

/*
 * Verify a held lock with Redis and restart its lease; false if lost (a
 * loss the worker only presumed is refuted if Redis finds it ours,
 * rl_lt_found_ours).  Its
 * lease then runs from when this was sent (e->lease_from); while the answer
 * is not in, and if it never comes, that is not known (the caller may have
 * set a longer lease_ms already).
 */
bool
rl_lt_verify_and_refresh(RLHeld *e, int64 lease_ms)
{
	RLLockOp	op;
	TimestampTz sent = GetCurrentTimestamp();

	e->lease_from = 0;
	rl_lt_op_init(&op, RL_OP_EXTEND, e, lease_ms);
	rl_lock_ops_run(&op, 1, RL_RUN_HARD);
	if (RL_OP_YES(&op))
	{
		e->lease_from = sent;
		return rl_lt_found_ours(e, sent);
	}
	if (!RL_OP_NO(&op))
		rl_raise_undecided(RL_ACTION_VERIFY, e->name, &op);
	return false;
}
