/*-------------------------------------------------------------------------
 *
 * locktable.c
 *	  Owns this backend's table of Redis locks and everything that changes
 *	  it: acquire (with reentrancy and the wake-up/poll wait), release,
 *	  extend, the transaction callbacks (transaction-scoped locks, PREPARE
 *	  refusal, verify-on-commit) and release at backend exit.
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
 *	  than needed.
 *
 *	  The releases after COMMIT and ABORT, at ROLLBACK TO SAVEPOINT and at
 *	  the end of redis_lock_with_lock are sent without waiting for their
 *	  answers (release_later): their entries stay, with no holds and marked
 *	  releasing, until the answers are read (at the connection's next use or
 *	  a safe point) and settled (settle_pending) as a waited-for release
 *	  would have been; a failure there becomes a doubt.
 *
 *	  Must not: call hiredis (transport.c and stream.c do; its header is
 *	  included here only for the REDIS_REPLY_* codes of an RLReply's type),
 *	  know script bodies (scripts.c does), define SQL-callable functions
 *	  (functions.c does).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/locktable.c
 *
 *-------------------------------------------------------------------------
 */
#include "locktable.h"

#include <hiredis/hiredis.h>

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#if PG_VERSION_NUM >= 150000
#include "common/pg_prng.h"
#endif

/* Bound of the release round trip at backend exit */
#define RL_EXIT_TIMEOUT_MS	500

static HTAB *held = NULL;
static int	ndoubts = 0;		/* entries with zero holds, not handed */
static int	nhanded = 0;		/* doubts handed to the worker */
static int	nqueued = 0;		/* entries with queued_ms set */
static MemoryContext work_cxt = NULL;
static MemoryContext names_cxt = NULL;	/* the entries' key/channel strings */
static uint64 last_serial = 0;	/* RLHeld.serial of the newest entry */

/*
 * A release sent without waiting for its answer (after COMMIT or ABORT, at
 * the end of redis_lock_with_lock): the entry stays, with no holds and
 * marked releasing, until the answer is in; then it is settled as
 * release_soft settles one (settle_pending).  Lives in rl_owed_context(),
 * with its op and a copy of the entry's names, so that the answer can be
 * reported even when the entry is gone or was taken again (superseded).
 */
typedef struct PendingRelease
{
	char		hkey[RL_MAX_NAME_LEN + 2];	/* the entry's: mode letter + name */
	uint64		serial;			/* of the entry it releases */
	bool		superseded;		/* the same entry was acquired again */
	RLLockOp   *op;
	RLLockNames names;
	struct PendingRelease *next;
} PendingRelease;

static PendingRelease *pending = NULL;
static int	npending = 0;

/* an interrupted wait may have left these subscribed */
static RLConn *dirty_subs[64];
static int	ndirty_subs = 0;

static void redis_lock_locktable_xact_callback(XactEvent event, void *arg);
static void redis_lock_locktable_subxact_callback(SubXactEvent event,
												  SubTransactionId mySubid,
												  SubTransactionId parentSubid,
												  void *arg);
static void redis_lock_locktable_before_shmem_exit(int code, Datum arg);

/*
 * Transaction-scoped holds in the order taken, each tagged with the
 * subtransaction that owns it, so that ROLLBACK TO SAVEPOINT drops the holds
 * taken since the savepoint, as it does for pg_advisory_xact_lock.  The holds
 * of the current subtransaction are always the tail.  Names, not entry
 * pointers: an entry can be removed and its memory reused while a record of
 * it remains (a lock found lost and taken anew); a record whose entry has no
 * transaction hold left is skipped.
 */
typedef struct XactHold
{
	SubTransactionId subid;
	char	   *hkey;			/* the entry's hash key */
} XactHold;

static XactHold *xact_log = NULL;
static int	xact_log_len = 0;
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

static void
ensure_table(void)
{
	HASHCTL		ctl;

	if (held != NULL)
		return;
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = RL_MAX_NAME_LEN + 2;
	ctl.entrysize = sizeof(RLHeld);
	ctl.hcxt = TopMemoryContext;
	held = hash_create("redis_lock held locks", 64, &ctl,
#if PG_VERSION_NUM >= 140000
					   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
#else
					   HASH_ELEM | HASH_CONTEXT);
#endif
	held_peak = 0;
	if (!callbacks_registered)
	{
		work_cxt = AllocSetContextCreate(TopMemoryContext, "redis_lock work",
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
static void
maybe_shrink(void)
{
	if (held != NULL && held_peak > SHRINK_THRESHOLD &&
		hash_get_num_entries(held) == 0)
	{
		hash_destroy(held);
		held = NULL;
		MemoryContextReset(names_cxt);
		ensure_table();
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
	n->key = n->fence_key = n->channel = NULL;
}

/* The table's key of one mode of a name: its mode letter, then the name */
static void
held_key(char *hkey, RLLockMode mode, const char *name)
{
	static const char letter[] = {
		[RL_MODE_EXCLUSIVE] = 'x',
		[RL_MODE_READ] = 'r',
		[RL_MODE_WRITE] = 'w',
	};

	hkey[0] = letter[mode];
	strlcpy(hkey + 1, name, RL_MAX_NAME_LEN + 1);
}

/* The entry of one mode of a name, or NULL */
static RLHeld *
entry_find(RLLockMode mode, const char *name)
{
	char		hkey[RL_MAX_NAME_LEN + 2];

	if (held == NULL)
		return NULL;
	held_key(hkey, mode, name);
	return hash_search(held, hkey, HASH_FIND, NULL);
}

/*
 * The wire layout of a mode: redis_lock.protocol for exclusive locks,
 * Redisson's read-write lock for the other two.
 */
static RLProtocol
mode_protocol(RLLockMode mode)
{
	switch (mode)
	{
		case RL_MODE_EXCLUSIVE:
			break;
		case RL_MODE_READ:
			return RL_PROTOCOL_RW_READ;
		case RL_MODE_WRITE:
			return RL_PROTOCOL_RW_WRITE;
	}
	return (RLProtocol) rl_protocol;
}

/*
 * Create an entry of one mode of a name (zero holds: a doubt until granted)
 * for the settings now.
 */
static RLHeld *
entry_create(RLLockMode mode, const char *name)
{
	RLLockNames names;
	RLHeld	   *e;
	bool		found;
	char		hkey[RL_MAX_NAME_LEN + 2];
	RLTarget   *target = rl_current_target();	/* may raise: nothing made yet */

	memset(&names, 0, sizeof(names));
	rl_names_build(&names, mode_protocol(mode), rl_key_prefix, name,
				   names_cxt);
	held_key(hkey, mode, name);
	PG_TRY();
	{
		rl_new_owner(names.protocol, names.owner);
		e = hash_search(held, hkey, HASH_ENTER, &found);
	}
	PG_CATCH();
	{
		free_names(&names);
		PG_RE_THROW();
	}
	PG_END_TRY();
	Assert(!found);
	held_peak = Max(held_peak, hash_get_num_entries(held));
	memset(((char *) e) + offsetof(RLHeld, name), 0,
		   sizeof(RLHeld) - offsetof(RLHeld, name));
	strlcpy(e->name, name, sizeof(e->name));
	e->mode = mode;
	e->target = target;
	e->names = names;
	e->registry_slot = -1;
	e->serial = ++last_serial;
	ndoubts++;
	return e;
}

/* ----------------------------------------------------------------
 * The entry's slot in the shared registry (registry.c)
 * ----------------------------------------------------------------
 */
static void
registry_sync(RLHeld *e, bool refreshed)
{
	RLLockState st;

	memset(&st, 0, sizeof(st));
	st.watchdog = e->watchdog;
	st.lost = e->lost;
	st.session_holds = e->session_holds;
	st.xact_holds = e->xact_holds;
	st.fence = e->fence;
	st.lease_ms = e->lease_ms;
	st.acquired_at = e->acquired_at;
	rl_registry_update(e->registry_slot, &st, e->names.owner, refreshed);
}

static void
registry_drop(RLHeld *e)
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
static void
hand_to_worker(RLHeld *e)
{
	Assert(RL_HOLDS(e) == 0 && !e->handed && e->registry_slot >= 0);
	e->handed_gen = rl_registry_hand_off(e->registry_slot, e->expires_at,
										 e->late_grant);
	e->handed = true;
	ndoubts--;
	nhanded++;
}

/*
 * Take a handed doubt back from the worker, waiting out a release of the
 * worker's under way.  Returns false when the worker settled it already:
 * then the slot is no longer the entry's.
 */
static bool
take_back_from_worker(RLHeld *e)
{
	bool		ours = rl_registry_reclaim(e->registry_slot, e->handed_gen);

	Assert(e->handed);
	e->handed = false;
	nhanded--;
	ndoubts++;
	if (!ours)
		e->registry_slot = -1;
	return ours;
}

static bool
registry_says_lost(RLHeld *e)
{
	return rl_registry_lost(e->registry_slot);
}

static void
entry_remove(RLHeld *e)
{
	/* a release on its way: its answer will find no entry, and is dropped */
	if (e->releasing)
	{
		e->releasing = false;
		ndoubts++;
	}
	/* its release is ours again, and is dropped with the entry */
	if (e->handed)
		(void) take_back_from_worker(e);
	if (RL_HOLDS(e) == 0)
		ndoubts--;
	if (e->queued_ms > 0)
		nqueued--;				/* its queue entry times out by itself */
	if (e->registry_slot >= 0)
		registry_drop(e);
	free_names(&e->names);
	hash_search(held, e->hkey, HASH_REMOVE, NULL);
}

/* Record a transaction hold of an entry (by its hash key) for the current
 * subtransaction */
static void
xact_log_push(const char *hkey)
{
	MemoryContext old = MemoryContextSwitchTo(xact_log_cxt);

	if (xact_log_len == xact_log_cap)
	{
		xact_log_cap = Max(16, xact_log_cap * 2);
		xact_log = xact_log == NULL ? palloc(sizeof(XactHold) * xact_log_cap) :
			repalloc(xact_log, sizeof(XactHold) * xact_log_cap);
	}
	xact_log[xact_log_len].subid = GetCurrentSubTransactionId();
	xact_log[xact_log_len].hkey = pstrdup(hkey);
	xact_log_len++;
	MemoryContextSwitchTo(old);
}

static void
xact_log_reset(void)
{
	xact_log = NULL;
	xact_log_len = xact_log_cap = 0;
	if (xact_log_cxt != NULL)
		MemoryContextReset(xact_log_cxt);
}

static void
add_hold(RLHeld *e, RLScope scope)
{
	/* recorded first: if that fails, nothing was counted */
	if (scope == RL_SCOPE_XACT)
		xact_log_push(e->hkey);
	if (RL_HOLDS(e) == 0)
		ndoubts--;				/* leaves the doubt set */
	if (scope == RL_SCOPE_XACT)
		e->xact_holds++;
	else
		e->session_holds++;
}

/*
 * Latest moment a key written now with this lease can still exist, even if
 * the command is resent after a dead connection.
 */
static TimestampTz
doubt_horizon(int64 lease_ms)
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
static void
became_doubt(RLHeld *e)
{
	Assert(RL_HOLDS(e) == 0);
	ndoubts++;
	e->watchdog = false;
	e->late_grant = false;
	e->expires_at = doubt_horizon(e->lease_ms);
	registry_sync(e, false);
}

/*
 * The entry of an exclusive lock this backend has at least one hold on;
 * else NULL
 */
RLHeld *
rl_lookup(const char *name)
{
	RLHeld	   *e = entry_find(RL_MODE_EXCLUSIVE, name);

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
		RLHeld	   *e = entry_find(order[i], name);

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
		RLHeld	   *e = entry_find(mode, name);

		if (e != NULL)
			entry_remove(e);
	}
}

/*
 * Does this session hold the read hold of the read-write lock name without
 * its write hold?  Then asking for the write hold would wait for itself.
 */
bool
rl_holds_read_only(const char *name)
{
	RLHeld	   *r = entry_find(RL_MODE_READ, name);
	RLHeld	   *w = entry_find(RL_MODE_WRITE, name);

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
	if (held == NULL)
		return 0;
	*out = palloc(sizeof(RLHeld) * Max(hash_get_num_entries(held), 1));
	hash_seq_init(&seq, held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (RL_HOLDS(e) == 0)
			continue;
		if (e->registry_slot >= 0 && !e->lost && registry_says_lost(e))
			e->lost = true;
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
	{
		if (strncmp(r->str, "OOM", 3) == 0)
			return ERRCODE_INSUFFICIENT_RESOURCES;
		if (strncmp(r->str, "READONLY", 8) == 0 ||
			strncmp(r->str, "MASTERDOWN", 10) == 0 ||
			strncmp(r->str, "LOADING", 7) == 0 ||
			strncmp(r->str, "BUSY", 4) == 0 ||
			strncmp(r->str, "CLUSTERDOWN", 11) == 0 ||
			strncmp(r->str, "TRYAGAIN", 8) == 0)
			return ERRCODE_CONNECTION_FAILURE;
		/*
		 * An ACL refusal: NOPERM for a command, "can't run this command"
		 * (Redis 7.0) or "ACL failure in script" (Redis 7.2+, Valkey) for
		 * one inside a script
		 */
		if (strncmp(r->str, "NOPERM", 6) == 0 ||
			strstr(r->str, "can't run this command") != NULL ||
			strstr(r->str, "ACL failure in script") != NULL)
			return ERRCODE_INSUFFICIENT_PRIVILEGE;
		if (strncmp(r->str, "WRONGTYPE", 9) == 0)
			return ERRCODE_WRONG_OBJECT_TYPE;
		return ERRCODE_EXTERNAL_ROUTINE_EXCEPTION;
	}
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
static void
report_call(int elevel, RLLockAction action, const char *name, RLCall *call)
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
static uint64 call_seq = 0;

/* Every call that finds a lock lost says so (API: false plus a WARNING) */
static void
warn_lost(RLHeld *e)
{
	if (e->lost_reported_at == call_seq)
		return;
	e->lost_reported_at = call_seq;
	ereport(WARNING,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("Redis lock \"%s\" was lost", e->name),
			 errdetail("Its lease expired or another client deleted or took over key \"%s\".",
					   e->names.key)));
}

static void
mark_lost(RLHeld *e)
{
	if (!e->lost)
		rl_stats_add(RL_STAT_LOST, 1);
	e->lost = true;
	registry_sync(e, false);
}

/* ----------------------------------------------------------------
 * Operations on the entry's node(s)
 * ----------------------------------------------------------------
 */
static void
op_init(RLLockOp *op, RLOpKind kind, RLHeld *e, int64 lease_ms)
{
	memset(op, 0, sizeof(*op));
	op->kind = kind;
	op->target = e->target;
	op->names = &e->names;
	op->lease_ms = lease_ms;
	/* tokens from independent masters would not be ordered: no fencing */
	op->fence = e->target->kind != RL_TOPO_REDLOCK;
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
	report_call(ERROR, action, name, op->failure);
	pg_unreachable();
}

#define RELEASE_UNKNOWN (-1)

/*
 * Release every entry in one round (one pipelined round trip per node,
 * however many locks).  results[i]: 1 released, 0 not ours (lost or
 * absent), RELEASE_UNKNOWN when no majority answered.
 */
static RLLockOp *
release_entries(RLHeld **ents, int n, RLRunMode mode, int *results)
{
	RLLockOp   *ops = palloc(sizeof(RLLockOp) * Max(n, 1));
	int			i;

	for (i = 0; i < n; i++)
		op_init(&ops[i], RL_OP_RELEASE, ents[i], ents[i]->lease_ms);
	if (n > 0)
		rl_lock_ops_run(ops, n, mode);
	for (i = 0; i < n; i++)
		results[i] = RL_OP_YES(&ops[i]) ? 1 : RL_OP_NO(&ops[i]) ? 0 : RELEASE_UNKNOWN;
	return ops;
}

/*
 * Release in Redis every entry in ents (their holds already zero), never
 * raising.  Where warn[i] is set (locks the session held) failures become
 * WARNINGs and a missing key is reported lost; doubts (warn NULL or unset)
 * are settled quietly.
 * Entries whose outcome stays unknown remain as doubts.  Interrupts are held
 * so the bounded wait is not cut short by a cancel at once (a cancel or
 * terminate that comes meanwhile cuts it to RL_HELD_WAIT_CUT_MS, see
 * transport.c), unless interruptible: then a cancel ends it with an ERROR,
 * leaving every entry as it was.
 */
static void
release_soft(RLHeld **ents, int n, const bool *warn, bool interruptible)
{
	int		   *results;
	RLLockOp   *ops;
	int			i;

	if (n == 0)
		return;
	results = palloc(sizeof(int) * n);
	if (!interruptible)
		HOLD_INTERRUPTS();
	ops = release_entries(ents, n, RL_RUN_SOFT, results);
	if (!interruptible)
		RESUME_INTERRUPTS();
	for (i = 0; i < n; i++)
	{
		RLHeld	   *e = ents[i];
		bool		held = warn != NULL && warn[i];

		if (results[i] == RELEASE_UNKNOWN)
		{
			if (held)
				report_call(WARNING, RL_ACTION_RELEASE, e->name, ops[i].failure);
			continue;
		}
		if (results[i] == 0 && held && !e->lost)
		{
			mark_lost(e);
			warn_lost(e);
		}
		if (results[i] == 1 && held)
			rl_stats_add(RL_STAT_RELEASED, 1);
		entry_remove(e);
	}
}

/* A warn[] for release_soft: every entry was held by the session */
static bool *
warn_for_all(int n)
{
	bool	   *warn = palloc(sizeof(bool) * Max(n, 1));

	memset(warn, true, sizeof(bool) * Max(n, 1));
	return warn;
}

/* ----------------------------------------------------------------
 * Releases sent without waiting for their answers
 * ----------------------------------------------------------------
 */

/* A copy of an entry's names in the owed context (see PendingRelease) */
static void
copy_names(RLLockNames *to, const RLLockNames *from)
{
	MemoryContext cxt = rl_owed_context();

	*to = *from;
	to->key = from->key ? MemoryContextStrdup(cxt, from->key) : NULL;
	to->fence_key = from->fence_key ? MemoryContextStrdup(cxt, from->fence_key) : NULL;
	to->channel = from->channel ? MemoryContextStrdup(cxt, from->channel) : NULL;
}

/* Nothing owed and nothing pending any more: free what they used */
static void
owed_memory_reset(void)
{
	if (npending == 0 && rl_owed_count() == 0)
		rl_owed_reset();
}

/*
 * Send the release of every entry in ents (holds already zero, out of
 * renewal: became_doubt) without waiting for the answers, which nothing the
 * session does depends on: the lock is free for waiters as soon as Redis
 * runs it, and the answer is read at the connection's next use or the next
 * safe point (settle_pending), where a lost lock or a failure is reported as
 * a synchronous release would have.  An entry whose connection could not
 * take it at once (closed, out of step, a script-free server whose commands
 * are not known yet) is not sent: those are moved to the front of ents and
 * their number returned, for the caller to release as before.  Interrupts
 * are held: only the write is waited for, bounded by command_timeout (cut to
 * RL_HELD_WAIT_CUT_MS by a cancel).
 */
static int
release_later(RLHeld **ents, int n)
{
	MemoryContext old;
	RLLockOp   *ops;
	PendingRelease *recs;
	bool	   *sent;
	int			left = 0;
	int			i;

	if (n == 0)
		return 0;
	old = MemoryContextSwitchTo(rl_owed_context());
	ops = palloc(sizeof(RLLockOp) * n);
	recs = palloc0(sizeof(PendingRelease) * n);
	sent = palloc(sizeof(bool) * n);
	for (i = 0; i < n; i++)
	{
		RLHeld	   *e = ents[i];
		PendingRelease *p = &recs[i];

		strlcpy(p->hkey, e->hkey, sizeof(p->hkey));
		p->serial = e->serial;
		copy_names(&p->names, &e->names);
		op_init(&ops[i], RL_OP_RELEASE, e, e->lease_ms);
		ops[i].names = &p->names;
		p->op = &ops[i];
	}
	MemoryContextSwitchTo(old);

	HOLD_INTERRUPTS();
	rl_lock_ops_send(ops, n, sent);
	RESUME_INTERRUPTS();

	for (i = 0; i < n; i++)
	{
		RLHeld	   *e = ents[i];

		if (!sent[i])
		{
			ents[left++] = e;
			continue;
		}
		/* out of the doubt set until its answer is in */
		Assert(RL_HOLDS(e) == 0 && !e->handed && !e->releasing);
		e->releasing = true;
		ndoubts--;
		recs[i].next = pending;
		pending = &recs[i];
		npending++;
	}
	owed_memory_reset();
	return left;
}

/*
 * A release still on its way whose answer no longer decides the entry's
 * fate (its lock was acquired again with the same token, see
 * reclaim_releasing): say only what a synchronous release would have said.
 */
static void
report_superseded(PendingRelease *p, int result)
{
	if (result == 0)
		ereport(WARNING,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("Redis lock \"%s\" was lost", p->hkey + 1),
				 errdetail("Its lease expired or another client deleted or took over key \"%s\".",
						   p->names.key)));
	else if (result == RELEASE_UNKNOWN && !p->op->goes_again)
		report_call(WARNING, RL_ACTION_RELEASE, p->hkey + 1, p->op->failure);
}

/*
 * Settle every release sent without waiting whose answers are in (those
 * already read, and what a look at the sockets finds, without waiting), as
 * release_soft settles a release of a lock the session held: released, the
 * entry goes; not ours, it is reported lost (WARNING) and goes; no majority
 * answered, the failure is a WARNING and the entry stays as a doubt, for the
 * worker or settle_doubts.  A node that did not run it and would have been
 * asked again (a redirection, NOSCRIPT after a restart) has it run again
 * here, synchronously: interruptible when the caller is (a cancel leaves
 * those entries doubts), else bounded as release_soft; without send_again
 * those stay pending for the next safe point.
 */
static void
settle_pending(bool interruptible, bool send_again)
{
	PendingRelease **pp;
	PendingRelease *p;
	RLHeld	  **again = NULL;
	int			nagain = 0;

	if (npending == 0)
		return;
	again = palloc(sizeof(RLHeld *) * npending);
	rl_poll_owed();
	pp = &pending;
	while ((p = *pp) != NULL)
	{
		RLLockOp   *op = p->op;
		RLHeld	   *e;
		int			result;

		if (!rl_lock_op_answered(op) ||
			(!send_again && op->goes_again && !p->superseded &&
			 !RL_OP_YES(op) && !RL_OP_NO(op)))
		{
			/* not in yet, or to be sent again at the next safe point */
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		npending--;
		result = RL_OP_YES(op) ? 1 : RL_OP_NO(op) ? 0 : RELEASE_UNKNOWN;
		e = held != NULL ? hash_search(held, p->hkey, HASH_FIND, NULL) : NULL;
		if (e == NULL || e->serial != p->serial || !e->releasing)
		{
			/* forgotten meanwhile (force release, new settings): nothing */
			if (p->superseded)
				report_superseded(p, result);
			continue;
		}
		/* a doubt again until settled below */
		e->releasing = false;
		ndoubts++;
		if (result == RELEASE_UNKNOWN && op->goes_again)
		{
			again[nagain++] = e;
			continue;
		}
		if (result == RELEASE_UNKNOWN)
		{
			/* stays a doubt: the worker (or settle_doubts) releases it */
			report_call(WARNING, RL_ACTION_RELEASE, e->name, op->failure);
			continue;
		}
		if (result == 0 && !e->lost)
		{
			mark_lost(e);
			warn_lost(e);
		}
		if (result == 1)
			rl_stats_add(RL_STAT_RELEASED, 1);
		entry_remove(e);
	}
	owed_memory_reset();
	if (nagain > 0)
		release_soft(again, nagain, warn_for_all(nagain), interruptible);
	pfree(again);
}

/*
 * The lock of an entry whose release is on its way is acquired again: the
 * entry becomes a doubt, which the acquire reuses, token and all (so it
 * needs no wait for the answer).  That is safe because the release was sent
 * first on the same connection to each node and Redis runs them in order:
 * if the release ran, the acquire finds the lock free; if it did not (a
 * redirection, NOSCRIPT), the acquire finds its own token, which every
 * layout grants again.  Either way the acquire's answer alone tells what
 * the session holds, so the release's answer is then only reported.
 */
static void
reclaim_releasing(RLHeld *e)
{
	PendingRelease *p;

	Assert(e->releasing);
	for (p = pending; p != NULL; p = p->next)
		if (p->serial == e->serial)
			p->superseded = true;
	e->releasing = false;
	ndoubts++;
}

/* ----------------------------------------------------------------
 * Safe points
 * ----------------------------------------------------------------
 */

/*
 * Settle doubts here (without preloading, or those without a registry
 * slot): forget those whose lease has surely run out, send an idempotent
 * compare-and-delete for the rest.  Cancel interrupts it like any call: the
 * doubts stay as they were.
 */
static void
settle_doubts(void)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;
	RLHeld	  **ents;
	int			n = 0;
	int			cap = ndoubts;
	TimestampTz now = GetCurrentTimestamp();
	MemoryContext old;

	if (ndoubts <= 0 || held == NULL)
		return;
	old = MemoryContextSwitchTo(work_cxt);
	ents = palloc(sizeof(RLHeld *) * cap);
	hash_seq_init(&seq, held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (RL_HOLDS(e) != 0 || e->handed || e->releasing)
			continue;
		if (e->expires_at != 0 && now > e->expires_at)
			entry_remove(e);
		else if (n < cap)
			ents[n++] = e;
	}
	release_soft(ents, n, NULL, true);
	MemoryContextSwitchTo(old);
	MemoryContextReset(work_cxt);
}

/*
 * Hand every doubt to the watchdog worker (with preloading): no round trip
 * here, and none that a cancel would have to wait for.  A doubt without a
 * registry slot stays for settle_doubts; one of an entry never tried is
 * dropped, nothing of it can be in Redis.
 */
static void
hand_doubts_to_worker(void)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;

	if (ndoubts <= 0 || held == NULL || !rl_watchdog_enabled())
		return;
	hash_seq_init(&seq, held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (RL_HOLDS(e) != 0 || e->handed || e->releasing)
			continue;
		if (e->expires_at == 0)
			entry_remove(e);
		else if (e->registry_slot >= 0)
			hand_to_worker(e);
	}
}

/*
 * Forget the handed doubts the worker has settled.  Scanning the table only
 * when the shared settled-event counter moved keeps this O(1) per call.
 */
static void
forget_settled_doubts(void)
{
	static uint32 seen_events = 0;
	uint32		events;
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;

	events = rl_registry_settled_events();
	if (events == seen_events)
		return;
	seen_events = events;
	hash_seq_init(&seq, held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (e->handed && !rl_registry_handed(e->registry_slot, e->handed_gen))
		{
			e->handed = false;
			nhanded--;
			ndoubts++;
			e->registry_slot = -1;
			entry_remove(e);
		}
	}
}

static void
clean_dirty_subs(void)
{
	int			i;

	/* an interrupted wait may have left a subscription: drop it */
	for (i = 0; i < ndirty_subs; i++)
		rl_conn_close(dirty_subs[i]);
	ndirty_subs = 0;
}

/*
 * Take every queued entry out of its fair lock's queue, in one round trip
 * per node, never raising and with interrupts held (it also runs at
 * transaction abort and backend exit, after a cancelled wait).  Whatever
 * the answer, the entries count as out: an entry left behind in Redis ends
 * at its queue time, and waiters behind it go on.
 */
static void
leave_queues(void)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;
	RLLockOp   *ops;
	int			n = 0;

	if (nqueued <= 0 || held == NULL)
		return;
	ops = palloc(sizeof(RLLockOp) * nqueued);
	hash_seq_init(&seq, held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (e->queued_ms == 0)
			continue;
		if (n < nqueued)
		{
			op_init(&ops[n], RL_OP_DEQUEUE, e, e->lease_ms);
			ops[n++].queue_wait_ms = e->queued_ms;
		}
		e->queued_ms = 0;
	}
	nqueued = 0;
	HOLD_INTERRUPTS();
	rl_lock_ops_run(ops, n, RL_RUN_SOFT);
	RESUME_INTERRUPTS();
	pfree(ops);
}

/*
 * Report lost locks the watchdog found since the last call.  Scanning the
 * table only when the shared lost-event counter moved keeps this O(1) per
 * call however many locks the session holds.
 */
static void
report_lost(void)
{
	static uint32 seen_events = 0;
	uint32		events;
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;

	if (!rl_watchdog_enabled() || held == NULL)
		return;
	events = rl_registry_lost_events();
	if (events == seen_events)
		return;
	seen_events = events;
	hash_seq_init(&seq, held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (RL_HOLDS(e) > 0 && !e->lost && e->registry_slot >= 0 &&
			registry_says_lost(e))
		{
			e->lost = true;
			warn_lost(e);
		}
	}
}

/* Called at the start of every SQL-callable function */
void
rl_safe_point(void)
{
	call_seq++;
	ensure_table();
	if (npending > 0)
		settle_pending(true, true);
	if (ndirty_subs > 0)
		clean_dirty_subs();
	if (nqueued > 0)
		leave_queues();
	if (nhanded > 0)
		forget_settled_doubts();
	if (ndoubts > 0)
		hand_doubts_to_worker();
	if (ndoubts > 0)
		settle_doubts();
	report_lost();
}

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
	op_init(op, RL_OP_ACQUIRE, e, lease_ms);
	op->queue_wait_ms = e->queued_ms;
	e->expires_at = doubt_horizon(lease_ms);
	e->late_grant = true;		/* until we know: a cancel may cut it short */
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
 * failure that lost it is likely still going on.
 */
static bool
release_partial_grants(RLHeld *e, RLLockOp *op)
{
	RLLockOp	rel;

	if (op->yes == 0)
		return !op->maybe_ran;
	op_init(&rel, RL_OP_RELEASE, e, e->lease_ms);
	rl_lock_ops_run(&rel, 1, RL_RUN_SOFT);
	return rel.failed == 0;
}

static void
grant(RLHeld *e, int64 fence, int64 lease_ms, bool watchdog, RLScope scope)
{
	e->fence = fence;
	e->lease_ms = lease_ms;
	e->watchdog = watchdog;
	e->lost = false;
	e->lost_reported_at = 0;
	e->acquired_at = GetCurrentTimestamp();
	add_hold(e, scope);
	registry_sync(e, true);
	rl_stats_add(RL_STAT_ACQUIRED, 1);
}

static long
jitter(long max_ms)
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

/* End of a wait: how long it took goes to the stats */
static AcqOutcome
waited(TimestampTz start, AcqOutcome outcome)
{
	rl_stats_add(RL_STAT_WAIT_US, (uint64) (GetCurrentTimestamp() - start));
	return outcome;
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
		(void) release_partial_grants(e, op);
	if (queue_id == 0 || rl_waitq_join(queue_id))
		return false;

	/* asleep in the queue, it is still checked for deadlocks */
	while (!(turn = rl_waitq_wait_turn(rl_deadlock_wake_at(deadline))) &&
		   (now = GetCurrentTimestamp()) < deadline)
		rl_deadlock_check_due(now);
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
		(void) release_partial_grants(e, op);
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
	for (i = 0; i < nsubs && ndirty_subs < (int) lengthof(dirty_subs); i++)
		dirty_subs[ndirty_subs++] = subs[i];

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
		nqueued++;
	}
	return nsubs;
}

/*
 * How long to sleep after an attempt that did not decide, at now: holders
 * of ours publish on release, so poll rarely; others back off (*backoff).
 * Never past the holder's expiry or the deadline; Redlock adds jitter.
 */
static long
retry_sleep_ms(RLLockOp *op, AcqOutcome outcome, bool redlock, long *backoff,
			   TimestampTz now, TimestampTz deadline)
{
	long		sleep_ms;

	if (outcome == ACQ_BUSY && op->holder_publishes)
		sleep_ms = 1000;
	else
	{
		sleep_ms = *backoff;
		*backoff = Min(*backoff * 2, 100);
	}
	if (op->pttl > 0)
		sleep_ms = Min(sleep_ms, (long) op->pttl + 1);
	if (redlock)
		sleep_ms += jitter(Min(sleep_ms, 50));
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
		rl_deadlock_check_due(now);
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
		if (op->yes > 0)
			(void) release_partial_grants(e, op);
		now = GetCurrentTimestamp();
		if (now >= deadline)
			return outcome;

		sleep_ms = retry_sleep_ms(op, outcome, redlock, &backoff, now, deadline);
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
	ndirty_subs = 0;
	if (e->queued_ms > 0)
	{
		if (outcome == ACQ_GOT)
		{
			/* the grant took us out of the queue */
			e->queued_ms = 0;
			nqueued--;
		}
		else
			leave_queues();
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

/* Verify a held lock with Redis and restart its lease; false if lost */
static bool
verify_and_refresh(RLHeld *e, int64 lease_ms)
{
	RLLockOp	op;

	op_init(&op, RL_OP_EXTEND, e, lease_ms);
	rl_lock_ops_run(&op, 1, RL_RUN_HARD);
	if (RL_OP_YES(&op))
		return true;
	if (!RL_OP_NO(&op))
		rl_raise_undecided(RL_ACTION_VERIFY, e->name, &op);
	return false;
}

/*
 * A lock the session holds, acquired again: one round trip proves we still
 * own it, and the hold is counted.  When it was lost, warns, forgets the
 * entry and returns false: the caller acquires it anew.
 */
static bool
acquire_again(RLHeld *e, int64 lease_ms, RLScope scope)
{
	int64		refresh = e->watchdog ? e->lease_ms : lease_ms;

	if (!e->lost && verify_and_refresh(e, refresh))
	{
		if (!e->watchdog)
			e->lease_ms = refresh;
		add_hold(e, scope);
		registry_sync(e, true);
		return true;
	}
	if (!e->lost)
		mark_lost(e);
	ereport(WARNING,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("Redis lock \"%s\" was lost; acquiring it anew", e->name),
			 errdetail("The %d earlier hold(s) of this session are discarded; releasing them will report that the lock is not held.",
					   RL_HOLDS(e))));
	e->session_holds = e->xact_holds = 0;
	became_doubt(e);
	entry_remove(e);
	return false;
}

/*
 * The entry an acquire attempt runs on: a doubt of the same name is reused
 * (its token retried) while it still matches the settings, else a new one;
 * registered with the watchdog under the passwords of now.
 */
static RLHeld *
entry_for_attempt(RLHeld *doubt, RLLockMode mode, const char *name,
				  int64 lease_ms)
{
	RLHeld	   *e = doubt;

	/* settled by the worker meanwhile: nothing of it is left */
	if (e != NULL && e->handed && !take_back_from_worker(e))
	{
		entry_remove(e);
		e = NULL;
	}
	if (e != NULL)
	{
		RLLockNames probe;

		memset(&probe, 0, sizeof(probe));
		rl_names_build(&probe, mode_protocol(mode), rl_key_prefix, name,
					   CurrentMemoryContext);
		if (e->target != rl_current_target() ||
			e->names.protocol != probe.protocol ||
			e->names.script_free != probe.script_free ||
			strcmp(e->names.key, probe.key) != 0)
		{
			entry_remove(e);
			e = NULL;
		}
	}
	if (e == NULL)
		e = entry_create(mode, name);
	else if (e->registry_slot >= 0)
		registry_drop(e);
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

	release_soft(&e, 1, NULL, false);	/* still a doubt: no holds counted */
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
	if (release_partial_grants(e, op))
		entry_remove(e);
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
			hand_doubts_to_worker();
			break;
	}
}

/*
 * Refuse what a layout cannot do where the settings point: read-write and
 * fair locks on independent masters (their sharing and queues have no
 * majority rule), and on a Cluster the names whose companion keys would
 * fall in other hash slots.
 */
static void
refuse_unsupported_layout(RLLockMode mode, const char *name)
{
	RLProtocol	protocol = mode_protocol(mode);
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
	int64		lease_ms = ttl_ms > 0 ? ttl_ms : rl_lease_time_ms;
	bool		watchdog = ttl_ms <= 0 && rl_watchdog_enabled();

	*obtained = false;
	rl_safe_point();
	refuse_unsupported_layout(mode, name);

	e = entry_find(mode, name);
	if (e != NULL && e->releasing)
		reclaim_releasing(e);
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
	e = entry_for_attempt(e, mode, name, lease_ms);

	/*
	 * Behind local waiters, a newcomer that may wait joins their queue
	 * without trying first: they are served in arrival order.  Not a doubt
	 * retried: its first attempt also settles what an earlier one left.
	 */
	if (wait_ms > 0 && !doubt && rl_waitq_any() &&
		rl_waitq_has_waiters(local_queue_id(e)))
	{
		op_init(&op, RL_OP_ACQUIRE, e, lease_ms);
		e->expires_at = doubt_horizon(lease_ms);
		outcome = ACQ_BUSY;
	}
	else
		outcome = attempt(e, lease_ms, &op);
	if (outcome != ACQ_GOT && outcome != ACQ_WRONGTYPE && wait_ms > 0 &&
		(outcome == ACQ_BUSY || e->target->kind == RL_TOPO_REDLOCK))
	{
		RLWaitKey	wk = {e->target->spec, e->names.key, e->names.protocol};

		rl_deadlock_wait_begin(&wk, 1);
		outcome = wait_for_lock(e, lease_ms, wait_ms, &op);
		rl_deadlock_wait_end();
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
		if (npending > 0)
			settle_pending(false, false);
		return e->fence;
	}
	not_granted(e, outcome, &op);
	if (npending > 0)
		settle_pending(false, false);
	return 0;
}

/* ----------------------------------------------------------------
 * Release / extend
 * ----------------------------------------------------------------
 */
/*
 * Drop one session hold of one mode of name and, when it was the last hold,
 * delete it in Redis.  Returns false with a WARNING when it is not held at
 * session scope or was lost; raises when Redis' answer is unknown.
 */
static bool release_one(RLLockMode mode, const char *name, bool nowait);

bool
rl_release(RLLockMode mode, const char *name)
{
	return release_one(mode, name, false);
}

/*
 * The release at the end of redis_lock_with_lock: as rl_release, but when
 * the last hold goes the release is sent without waiting for its answer
 * (release_later), which is reported by the next call.
 */
void
rl_release_nowait(const char *name)
{
	(void) release_one(RL_MODE_EXCLUSIVE, name, true);
}

static bool
release_one(RLLockMode mode, const char *name, bool nowait)
{
	RLHeld	   *e;
	int			result;
	RLLockOp   *op;

	rl_safe_point();
	e = entry_find(mode, name);
	if (e == NULL || RL_HOLDS(e) == 0)
	{
		ereport(WARNING,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("you do not hold Redis lock \"%s\"", name),
				 mode == RL_MODE_READ ?
				 errdetail("This session has no read hold of it.") :
				 mode == RL_MODE_WRITE ?
				 errdetail("This session has no write hold of it.") : 0));
		return false;
	}
	if (e->session_holds == 0)
	{
		ereport(WARNING,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("Redis lock \"%s\" is held only at transaction scope", name),
				 errdetail("It is released when the transaction ends.")));
		return false;
	}
	e->session_holds--;
	if (RL_HOLDS(e) > 0)
	{
		registry_sync(e, false);
		if (e->lost)
		{
			warn_lost(e);
			return false;
		}
		return true;
	}
	became_doubt(e);
	if (e->lost)
	{
		/* known gone or taken over: nothing of ours to delete */
		warn_lost(e);
		entry_remove(e);
		return false;
	}
	if (nowait && release_later(&e, 1) == 0)
		return true;
	op = release_entries(&e, 1, RL_RUN_HARD, &result);
	if (result == RELEASE_UNKNOWN)
		rl_raise_undecided(RL_ACTION_RELEASE, name, op);
	if (result == 0)
	{
		mark_lost(e);
		warn_lost(e);
		entry_remove(e);
		return false;
	}
	rl_stats_add(RL_STAT_RELEASED, 1);
	entry_remove(e);
	return true;
}

/*
 * Drop one session hold on name without raising and without being
 * interrupted; used on the error path of redis_lock_with_lock.
 */
void
rl_release_one_error_safe(const char *name)
{
	RLHeld	   *e;

	e = entry_find(RL_MODE_EXCLUSIVE, name);
	if (e == NULL || e->session_holds == 0)
		return;
	e->session_holds--;
	if (RL_HOLDS(e) > 0)
	{
		registry_sync(e, false);
		return;
	}
	became_doubt(e);
	/* (waited for: an error path, where a round trip more costs nothing) */
	release_soft(&e, 1, warn_for_all(1), false);
}

/*
 * Take k holds of one scope from e.  If it is still held it only has its
 * registry slot updated; if it is now free it goes to out for a release
 * round trip, unless it is known lost: then it is forgotten at once, there is
 * nothing of ours left to delete (removing the current entry of a sequential
 * scan of the table is allowed).
 */
static void
drop_holds(RLHeld *e, RLScope scope, int k, RLHeld **out, int *nout)
{
	int		   *mine = scope == RL_SCOPE_XACT ? &e->xact_holds : &e->session_holds;

	Assert(k > 0 && k <= *mine);
	*mine -= k;
	if (RL_HOLDS(e) > 0)
	{
		e->unreachable = false; /* only for the release that is not made */
		registry_sync(e, false);
		return;
	}
	became_doubt(e);
	if (e->lost)
	{
		warn_lost(e);
		entry_remove(e);
		return;
	}
	out[(*nout)++] = e;
}

/*
 * Drop every hold of one scope (see drop_holds).  Returns how many entries
 * had holds of that scope.  out has room for the whole table, in the current
 * memory context.
 */
static int
drop_scope(RLScope scope, RLHeld ***out, int *nout)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;
	int			count = 0;

	*nout = 0;
	*out = palloc(sizeof(RLHeld *) * Max(hash_get_num_entries(held), 1));
	hash_seq_init(&seq, held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		int			mine = scope == RL_SCOPE_XACT ? e->xact_holds : e->session_holds;

		if (mine == 0)
			continue;
		count++;
		drop_holds(e, scope, mine, *out, nout);
	}
	return count;
}

/*
 * Drop every session hold and release, in one round trip per node, the locks
 * left free.  Returns how many locks had session holds; raises after
 * settling the others if a release's outcome is unknown.
 */
int
rl_release_all_session(void)
{
	RLHeld	  **ents;
	RLLockOp   *ops;
	int			n;
	int			count;
	int		   *results;
	int			i;
	int			unknown = -1;

	rl_safe_point();
	count = drop_scope(RL_SCOPE_SESSION, &ents, &n);
	results = palloc(sizeof(int) * Max(n, 1));
	ops = release_entries(ents, n, RL_RUN_SOFT, results);
	for (i = 0; i < n; i++)
	{
		if (results[i] == RELEASE_UNKNOWN)
		{
			if (unknown < 0)
				unknown = i;
			continue;
		}
		if (results[i] == 0)
		{
			mark_lost(ents[i]);
			warn_lost(ents[i]);
		}
		else
			rl_stats_add(RL_STAT_RELEASED, 1);
		entry_remove(ents[i]);
	}
	if (unknown >= 0)
		rl_raise_undecided(RL_ACTION_RELEASE, ents[unknown]->name, &ops[unknown]);
	maybe_shrink();
	return count;
}

/*
 * DISCARD ALL: like advisory locks, every session-scoped lock goes.  It has
 * already done its work when this runs, so nothing here raises: a release
 * whose outcome is unknown is a WARNING and stays a doubt, settled by the
 * next call or at exit.
 */
void
rl_discard_session_locks(void)
{
	RLHeld	  **ents;
	int			n;
	MemoryContext old;

	if (held == NULL || hash_get_num_entries(held) == 0)
		return;
	old = MemoryContextSwitchTo(work_cxt);
	(void) drop_scope(RL_SCOPE_SESSION, &ents, &n);
	release_soft(ents, n, warn_for_all(n), false);
	MemoryContextSwitchTo(old);
	MemoryContextReset(work_cxt);
	maybe_shrink();
}

/*
 * Restart the lease of a held lock: ttl_ms > 0 is a fixed lease, otherwise
 * redis_lock.lease_time, renewed by the watchdog when it runs.  Returns false
 * with a WARNING when the lock is not held or was found lost.
 */
bool
rl_extend(const char *name, int64 ttl_ms)
{
	RLHeld	   *e;
	int64		lease_ms;
	bool		watchdog;

	rl_safe_point();
	e = entry_find(RL_MODE_EXCLUSIVE, name);
	if (e == NULL || RL_HOLDS(e) == 0)
	{
		ereport(WARNING,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("you do not hold Redis lock \"%s\"", name)));
		return false;
	}
	lease_ms = ttl_ms > 0 ? ttl_ms : rl_lease_time_ms;
	watchdog = ttl_ms <= 0 && rl_watchdog_enabled();

	/*
	 * A renewal the worker has already taken out would put the old lease
	 * back after ours.  Give the registry the new lease first: the slot
	 * moves to a new generation, so that renewal is not sent (or, if it is
	 * under way, we wait for its answer before sending ours), and any later
	 * one carries the new lease, which our PEXPIRE sets anyway.  Should the
	 * round trip below fail, the lock is still renewed, with the lease the
	 * session now believes in.
	 */
	if (e->watchdog && !e->lost && lease_ms != e->lease_ms)
	{
		e->lease_ms = lease_ms;
		registry_sync(e, false);
		rl_registry_wait_idle(e->registry_slot);
	}
	if (e->lost || !verify_and_refresh(e, lease_ms))
	{
		mark_lost(e);
		warn_lost(e);
		return false;
	}
	/* an explicit ttl is a fixed lease; NULL hands it (back) to the watchdog */
	e->lease_ms = lease_ms;
	e->watchdog = watchdog;
	registry_sync(e, true);
	return true;
}

/* ----------------------------------------------------------------
 * Transaction and exit callbacks
 * ----------------------------------------------------------------
 */
static bool
any_xact_holds(void)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;

	/* every transaction hold has its record in the log (add_hold) */
	if (held == NULL || xact_log_len == 0)
		return false;
	hash_seq_init(&seq, held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (e->xact_holds > 0)
		{
			hash_seq_term(&seq);
			return true;
		}
	}
	return false;
}

/*
 * Before COMMIT: check with Redis, in one round trip per node however many
 * locks, that every transaction-scoped lock is still ours (and restart its
 * lease).  A lost one fails the COMMIT: the transaction rolls back.
 */
static void
verify_xact_locks(void)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;
	RLHeld	  **ents;
	RLLockOp   *ops;
	int			n = 0;
	int			i;
	MemoryContext old;

	/* no transaction hold taken: nothing to verify, and no scan */
	if (!rl_verify_on_commit || held == NULL || xact_log_len == 0)
		return;
	old = MemoryContextSwitchTo(work_cxt);
	ents = palloc(sizeof(RLHeld *) * Max(hash_get_num_entries(held), 1));
	hash_seq_init(&seq, held);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (e->xact_holds > 0)
			ents[n++] = e;
	if (n == 0)
	{
		MemoryContextSwitchTo(old);
		return;
	}
	ops = palloc(sizeof(RLLockOp) * n);
	for (i = 0; i < n; i++)
	{
		e = ents[i];
		if (e->registry_slot >= 0 && !e->lost && registry_says_lost(e))
			e->lost = true;
		op_init(&ops[i], RL_OP_EXTEND, e, e->lease_ms);
	}
	rl_lock_ops_run(ops, n, RL_RUN_HARD);
	for (i = 0; i < n; i++)
	{
		if (!RL_OP_YES(&ops[i]) && !RL_OP_NO(&ops[i]))
			ents[i]->unreachable = true;
	}
	for (i = 0; i < n; i++)
	{
		e = ents[i];
		if (!RL_OP_YES(&ops[i]) && !RL_OP_NO(&ops[i]))
			rl_raise_undecided(RL_ACTION_VERIFY, e->name, &ops[i]);
		if (RL_OP_NO(&ops[i]) || e->lost)
		{
			mark_lost(e);
			e->lost_reported_at = call_seq;
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("Redis lock \"%s\" was lost before COMMIT", e->name),
					 errdetail("Its lease expired or another client took key \"%s\"; the transaction is rolled back.",
							   e->names.key),
					 errhint("Retry the transaction; use a longer ttl or ttl NULL with the watchdog.")));
		}
	}
	MemoryContextSwitchTo(old);
	MemoryContextReset(work_cxt);
}

/*
 * Of the entries about to be released, keep those Redis did not answer for
 * at the COMMIT verify as doubts (the next call settles them); returns how
 * many are left to release, compacted at the front.
 */
static int
keep_unreachable_as_doubts(RLHeld **ents, int n)
{
	int			i;
	int			k = 0;

	for (i = 0; i < n; i++)
	{
		if (ents[i]->unreachable)
			ents[i]->unreachable = false;
		else
			ents[k++] = ents[i];
	}
	return k;
}

/* At COMMIT or ABORT: drop transaction holds and release what is free */
static void
end_of_xact(void)
{
	RLHeld	  **ents;
	int			n;
	MemoryContext old;

	if (held == NULL)
		return;

	/*
	 * Every transaction hold has its record in the log (add_hold), so an
	 * empty log means there is none to drop: skip the scan of the table,
	 * which every transaction of a session that ever used a lock would pay.
	 */
	if (xact_log_len == 0 && ndirty_subs == 0 && nqueued <= 0)
	{
		xact_log_reset();
		maybe_shrink();
		return;
	}
	xact_log_reset();
	old = MemoryContextSwitchTo(work_cxt);
	(void) drop_scope(RL_SCOPE_XACT, &ents, &n);

	/*
	 * Older doubts wait for the next redis_lock call: the failure that made
	 * them is often still going on, and an abort should not wait for it
	 * twice.  So do the locks whose verify at COMMIT just failed.
	 */
	n = keep_unreachable_as_doubts(ents, n);
	n = release_later(ents, n);
	release_soft(ents, n, warn_for_all(n), false);
	if (ndirty_subs > 0)
		clean_dirty_subs();
	/* a wait cut short by an error leaves its fair queue now */
	leave_queues();
	MemoryContextSwitchTo(old);
	MemoryContextReset(work_cxt);
	maybe_shrink();
}

/*
 * Transaction callback: verify transaction-scoped locks before COMMIT,
 * refuse PREPARE while any is held, release them at COMMIT or ABORT.
 */
static void
redis_lock_locktable_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			verify_xact_locks();
			break;
		case XACT_EVENT_PRE_PREPARE:
			if (any_xact_holds())
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that holds transaction-scoped Redis locks"),
						 errhint("Use session-scoped locks (xact => false) in transactions that are prepared.")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
			/* a wait cut short by an error gives up its local seat */
			rl_waitq_leave();
			end_of_xact();
			/* a call cut short left a doubt: the worker settles it now */
			hand_doubts_to_worker();
			break;
		case XACT_EVENT_PREPARE:
			xact_log_reset();	/* only records of holds found lost */
			break;
		default:
			break;
	}
}

/* ROLLBACK TO SAVEPOINT: drop the holds the subtransaction took */
static void
release_subxact_holds(SubTransactionId mySubid)
{
	RLHeld	  **ents;
	int			n = 0;
	MemoryContext old = MemoryContextSwitchTo(work_cxt);

	ents = palloc(sizeof(RLHeld *) * xact_log_len);
	while (xact_log_len > 0 && xact_log[xact_log_len - 1].subid == mySubid)
	{
		XactHold   *h = &xact_log[--xact_log_len];
		RLHeld	   *e = hash_search(held, h->hkey, HASH_FIND, NULL);

		pfree(h->hkey);
		if (e != NULL && e->xact_holds > 0)
			drop_holds(e, RL_SCOPE_XACT, 1, ents, &n);
	}
	n = release_later(ents, n);
	release_soft(ents, n, warn_for_all(n), false);
	MemoryContextSwitchTo(old);
	MemoryContextReset(work_cxt);
}

/*
 * ROLLBACK TO SAVEPOINT (and a failed PL/pgSQL exception block): drop the
 * transaction holds the subtransaction took and release, in one pipelined
 * round trip, the locks that are free now.  Interrupts are held here, the
 * wait is bounded and failures are WARNINGs.  RELEASE SAVEPOINT hands the
 * holds to the parent.  Nothing to do, and O(1), when no transaction hold
 * was taken.  Doubts that an interrupted call left go to the worker.
 */
static void
redis_lock_locktable_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
									  SubTransactionId parentSubid, void *arg)
{
	int			i;

	if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		for (i = xact_log_len - 1; i >= 0 && xact_log[i].subid == mySubid; i--)
			xact_log[i].subid = parentSubid;
		return;
	}
	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;
	rl_waitq_leave();
	if (nqueued > 0)
	{
		MemoryContext old = MemoryContextSwitchTo(work_cxt);

		leave_queues();
		MemoryContextSwitchTo(old);
		MemoryContextReset(work_cxt);
	}
	if (xact_log_len > 0 && held != NULL)
		release_subxact_holds(mySubid);
	/* a call cut short (a cancel caught by PL/pgSQL) left a doubt */
	hand_doubts_to_worker();
}

/*
 * Backend exit: release everything this session holds, bounded by the
 * command timeout.  What cannot be released here goes to the watchdog
 * worker, or expires with its lease.
 */
static void
redis_lock_locktable_before_shmem_exit(int code, Datum arg)
{
	HASH_SEQ_STATUS seq;
	RLHeld	   *e;
	RLHeld	  **ents;
	int			n = 0;

	if (held == NULL || hash_get_num_entries(held) == 0)
		return;

	/*
	 * Soft and with interrupts held: this neither raises nor is cut short,
	 * so it is bounded more tightly than a statement's round trip.  A
	 * terminated backend must be gone promptly, and what it cannot release
	 * now goes to the watchdog worker (or expires with its lease).  The
	 * process is exiting: nothing else reads these settings any more.
	 */
	rl_command_timeout_ms = Min(rl_command_timeout_ms, RL_EXIT_TIMEOUT_MS);
	rl_connect_timeout_ms = Min(rl_connect_timeout_ms, RL_EXIT_TIMEOUT_MS);

	/*
	 * Releases still on their way: their answers, within the same bound
	 * (what has not come by then fails, leaving a doubt for the worker)
	 */
	if (npending > 0)
	{
		HOLD_INTERRUPTS();
		rl_wait_owed(RL_EXIT_TIMEOUT_MS);
		settle_pending(false, true);
		RESUME_INTERRUPTS();
	}
	MemoryContextSwitchTo(work_cxt);
	ents = palloc(sizeof(RLHeld *) * hash_get_num_entries(held));
	hash_seq_init(&seq, held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (RL_HOLDS(e) > 0)
		{
			e->session_holds = e->xact_holds = 0;
			became_doubt(e);
		}
		/* a handed doubt is the worker's already */
		if (!e->lost && !e->handed)
			ents[n++] = e;
	}
	leave_queues();
	release_soft(ents, n, NULL, false);

	/* what could not be released goes to the watchdog worker */
	hash_seq_init(&seq, held);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (e->lost)
			registry_drop(e);
		else if (!e->handed && e->registry_slot >= 0)
			hand_to_worker(e);
	}
	rl_close_all();
}

/* ----------------------------------------------------------------
 * Several locks at once: release here, and the interface lockmany.c
 * acquires through (locktable.h)
 * ----------------------------------------------------------------
 */

/*
 * Drop one session hold of each exclusive lock in names (distinct) and
 * release, in one round trip per node however many, those left free.
 * Returns how many holds were dropped of locks still ours (what
 * rl_release would have returned true for); a name not held, held only at
 * transaction scope, or lost is a WARNING each, as rl_release.  Raises
 * after settling the others if a release's outcome is unknown.
 */
int
rl_release_many(const char *const *names, int n)
{
	RLHeld	  **ents = palloc(sizeof(RLHeld *) * Max(n, 1));
	int		   *results = palloc(sizeof(int) * Max(n, 1));
	RLLockOp   *ops;
	int			nents = 0;
	int			released = 0;
	int			unknown = -1;
	int			i;

	rl_safe_point();
	for (i = 0; i < n; i++)
	{
		RLHeld	   *e = entry_find(RL_MODE_EXCLUSIVE, names[i]);

		if (e == NULL || RL_HOLDS(e) == 0)
		{
			ereport(WARNING,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("you do not hold Redis lock \"%s\"", names[i])));
			continue;
		}
		if (e->session_holds == 0)
		{
			ereport(WARNING,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("Redis lock \"%s\" is held only at transaction scope", names[i]),
					 errdetail("It is released when the transaction ends.")));
			continue;
		}
		e->session_holds--;
		if (RL_HOLDS(e) > 0)
		{
			registry_sync(e, false);
			if (e->lost)
				warn_lost(e);
			else
				released++;
			continue;
		}
		became_doubt(e);
		if (e->lost)
		{
			warn_lost(e);
			entry_remove(e);
			continue;
		}
		ents[nents++] = e;
	}
	ops = release_entries(ents, nents, RL_RUN_SOFT, results);
	for (i = 0; i < nents; i++)
	{
		if (results[i] == RELEASE_UNKNOWN)
		{
			if (unknown < 0)
				unknown = i;
			continue;
		}
		if (results[i] == 0)
		{
			mark_lost(ents[i]);
			warn_lost(ents[i]);
		}
		else
		{
			rl_stats_add(RL_STAT_RELEASED, 1);
			released++;
		}
		entry_remove(ents[i]);
	}
	if (unknown >= 0)
		rl_raise_undecided(RL_ACTION_RELEASE, ents[unknown]->name, &ops[unknown]);
	return released;
}

/* What a single acquire refuses for this name's layout (exclusive mode) */
void
rl_many_check_layout(const char *name)
{
	refuse_unsupported_layout(RL_MODE_EXCLUSIVE, name);
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
	RLHeld	   *e = entry_find(RL_MODE_EXCLUSIVE, name);

	*held = false;
	if (e != NULL && e->releasing)
		reclaim_releasing(e);
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
	return entry_for_attempt(e, RL_MODE_EXCLUSIVE, name, lease_ms);
}

/* An acquire of e is about to be sent: a doubt until its answer is known */
void
rl_many_sending(RLHeld *e, int64 lease_ms)
{
	Assert(RL_HOLDS(e) == 0);
	e->expires_at = doubt_horizon(lease_ms);
	e->late_grant = true;		/* until we know: a cancel may cut it short */
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
	if (!e->lost)
		mark_lost(e);
	ereport(WARNING,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("Redis lock \"%s\" was lost; acquiring it anew", e->name),
			 errdetail("The %d earlier hold(s) of this session are discarded; releasing them will report that the lock is not held.",
					   RL_HOLDS(e))));
	e->session_holds = e->xact_holds = 0;
	became_doubt(e);
	entry_remove(e);
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

	(void) release_entries(ents, n, RL_RUN_SOFT, results);
	for (i = 0; i < n; i++)
		settled[i] = results[i] != RELEASE_UNKNOWN;
	pfree(results);
}

/*
 * Count the grant of e: a new hold of a lock the session held (its token
 * and, under the watchdog, its lease unchanged, as a reentrant single
 * acquire), or the first hold of a new grant.
 */
void
rl_many_grant(RLHeld *e, bool held, int64 fence, int64 lease_ms,
			  bool watchdog, RLScope scope)
{
	if (!held)
	{
		grant(e, fence, lease_ms, watchdog, scope);
		return;
	}
	if (!e->watchdog)
		e->lease_ms = lease_ms;
	add_hold(e, scope);
	registry_sync(e, true);
}

/* Drop an entry with no holds of which nothing can be left in Redis */
void
rl_many_forget(RLHeld *e)
{
	Assert(RL_HOLDS(e) == 0);
	entry_remove(e);
}

/* Doubts an acquire leaves behind go to the worker (with preloading) */
void
rl_many_doubts_to_worker(void)
{
	hand_doubts_to_worker();
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

	for (i = 0; i < n && ndirty_subs < (int) lengthof(dirty_subs); i++)
		dirty_subs[ndirty_subs++] = subs[i];
}

/* The wait unsubscribed its connections itself */
void
rl_many_unsubscribed(void)
{
	ndirty_subs = 0;
}
