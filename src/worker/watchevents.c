/*-------------------------------------------------------------------------
 *
 * watchevents.c
 *	  Owns a watchdog worker's subscriptions to the keyspace notifications
 *	  of the locks it renews: which held keys are subscribed, on which
 *	  nodes' subscriber connections, and turning a notification that a
 *	  held key is gone (deleted, expired, evicted) into a renewal due at
 *	  once (RLSlot.check_now).  At most RL_WATCH_KEYS_MAX keys, shared
 *	  fairly between the roles that hold the locks (fair_shares), so that
 *	  one role's many locks cannot leave another's unwatched; a lock
 *	  without a watch has its loss found by its renewal.  Where the server
 *	  sends no notifications nothing arrives and renewals find losses as
 *	  before, every lease/3; the same for a notification that the server
 *	  sends while the worker waits for the confirmation of other
 *	  subscriptions on its connection (the transport skips it as a stale
 *	  push).
 *
 *	  Must not: judge a lock lost (the renewal that follows does, with the
 *	  same compare as every renewal, so an event can only make a check
 *	  sooner, never make one wrong), change a slot but for check_now, send
 *	  anything but (UN)SUBSCRIBE, or wait on a target whose renewals fail.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/worker/watchevents.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "net/net.h"
#include "worker/worker_int.h"

/*
 * Keys a worker subscribes to at most; the locks beyond are checked only by
 * their renewals.  Each subscription costs the worker about 1 kB of local
 * memory and the server one channel.  The roles whose locks want a watch
 * share them (fair_shares): each gets as many as it wants up to an equal
 * part, and what some leave unused is shared among the others, so no role
 * can take every watch from another.
 */
#define RL_WATCH_KEYS_MAX		4096

/*
 * The longest a worker waits for a round of subscriptions (connecting
 * included), and how long a target whose subscriptions failed (refused by
 * an ACL that denies the channels, or too slow on a loaded machine) is left
 * alone before trying again: the first retry after RL_WATCH_RETRY_MIN_MS,
 * doubling up to RL_WATCH_RETRY_MAX_MS.  A round does not run into the
 * worker's next renewal or release: it gets what is left until then (half
 * to connect, half for the confirmations), and is put off to a later pass
 * when that is under RL_WATCH_SUBSCRIBE_MIN_MS.  Learning a Sentinel's or
 * Cluster's topology for a new subscriber connection is bounded by these
 * timeouts per server asked, not by the budget as a whole.
 */
#define RL_WATCH_SUBSCRIBE_MS	1000
#define RL_WATCH_SUBSCRIBE_MIN_MS	20
#define RL_WATCH_RETRY_MIN_MS	500
#define RL_WATCH_RETRY_MAX_MS	10000

/* A lock is subscribed to once held this long (slot_wants_watch) */
#define RL_WATCH_AFTER_MS		1000

/* Subscriber connections one sleep watches at most */
#define RL_WATCH_CONNS_MAX		64

/* "<target>:<key>": a key of one target */
#define WATCH_HKEY_LEN			(RL_MAX_KEY_LEN + 16)

/* The watches of one role's slots, in one pass over the registry */
typedef struct RoleWatches
{
	Oid			roleid;			/* hash key: must be first */
	int			wants;			/* its slots that want a watch */
	int			share;			/* how many of them may have one */
	int			kept;			/* how many have one so far */
} RoleWatches;

/* One subscribed key, held by one or more slots (read holds share a key) */
typedef struct WatchedKey
{
	char		hkey[WATCH_HKEY_LEN];	/* hash key: must be first */
	int			target;
	int			refs;			/* slots that hold it */
	int			nsubs;
	RLConn	   *subs[RL_MAX_NODES];
	uint32		opened[RL_MAX_NODES];	/* rl_conn_open_id when subscribed
										 * (0: not subscribed) */
} WatchedKey;

static HTAB *watched = NULL;
static WatchedKey **watch_of = NULL;	/* per slot: the key it counts in */
static uint32 *watch_gen = NULL;	/* per slot: its generation then */

/* per target: when to try its failed subscriptions again, and how long the
 * last wait was (0: its last round stood); one LOG line per failing spell */
static TimestampTz retry_at[RL_MAX_TARGETS];
static int	retry_ms[RL_MAX_TARGETS];

static const char *
key_of(const WatchedKey *w)
{
	return strchr(w->hkey, ':') + 1;
}

static void
watch_init(void)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = WATCH_HKEY_LEN;
	ctl.entrysize = sizeof(WatchedKey);
	ctl.hcxt = TopMemoryContext;
	watched = hash_create("redis_lock watched keys", 64, &ctl,
						  HASH_ELEM | RL_HASH_STRINGS | HASH_CONTEXT);
	watch_of = MemoryContextAllocZero(TopMemoryContext,
									  sizeof(WatchedKey *) * Max(rl_shared->nslots, 1));
	watch_gen = MemoryContextAllocZero(TopMemoryContext,
									   sizeof(uint32) * Max(rl_shared->nslots, 1));
}

/*
 * Does slot s want its key watched by the worker of lane?  Only a lock held
 * since before held_since: most locks are held for milliseconds, and each
 * subscription is a round trip of the worker's (the first on a node, a
 * connection), which a release handed to it would wait behind; a loss in a
 * lock's first RL_WATCH_AFTER_MS is found by its renewal.
 */
static bool
slot_wants_watch(RLSlot *s, RLLane lane, TimestampTz held_since)
{
	RLSharedTarget *t;

	if (s->state != SLOT_HELD || !s->st.watchdog || s->st.lost ||
		s->st.session_holds + s->st.xact_holds == 0 ||
		s->st.acquired_at > held_since)
		return false;
	t = &rl_shared->targets[s->target];
	return rl_serving_lane(t) == lane && !t->failing;
}

/* Slot i counts in w no more; w goes once no slot does */
static void
unwatch_slot(int i, List **gone)
{
	WatchedKey *w = watch_of[i];

	watch_of[i] = NULL;
	watch_gen[i] = 0;
	if (--w->refs == 0)
		*gone = lappend(*gone, w);
}

/* Slot i (s) counts in the watched key of its target and key from now on */
static void
watch_slot(int i, RLSlot *s, List **gone)
{
	char		hkey[WATCH_HKEY_LEN];
	WatchedKey *w;
	bool		found;

	snprintf(hkey, sizeof(hkey), "%d:%s", s->target, s->key);
	w = hash_search(watched, hkey, HASH_ENTER, &found);
	if (!found)
	{
		w->target = s->target;
		w->refs = 0;
		w->nsubs = 0;
	}
	else if (w->refs == 0)
		*gone = list_delete_ptr(*gone, w);	/* let go and held again */
	w->refs++;
	watch_of[i] = w;
	watch_gen[i] = s->generation;
}

static int
by_wants(const void *a, const void *b)
{
	const RoleWatches *ra = *(RoleWatches *const *) a;
	const RoleWatches *rb = *(RoleWatches *const *) b;

	return (ra->wants > rb->wants) - (ra->wants < rb->wants);
}

/*
 * Share RL_WATCH_KEYS_MAX among the roles of hash roles, fewest wants
 * first: each gets what it wants up to an equal part of what is left, so
 * a role that wants less than its part leaves the rest to the others.
 */
static void
fair_shares(HTAB *roles)
{
	int			n = hash_get_num_entries(roles);
	RoleWatches **order = palloc(sizeof(RoleWatches *) * Max(n, 1));
	HASH_SEQ_STATUS seq;
	RoleWatches *r;
	int			left = RL_WATCH_KEYS_MAX;
	int			k = 0;

	hash_seq_init(&seq, roles);
	while ((r = hash_seq_search(&seq)) != NULL)
		order[k++] = r;
	qsort(order, n, sizeof(RoleWatches *), by_wants);
	for (k = 0; k < n; k++)
	{
		order[k]->share = Min(order[k]->wants, left / (n - k));
		left -= order[k]->share;
	}
	pfree(order);
}

/* The entry of slot s's role in roles, made on first use */
static RoleWatches *
role_of(HTAB *roles, const RLSlot *s)
{
	bool		found;
	RoleWatches *r = hash_search(roles, &s->roleid, HASH_ENTER, &found);

	if (!found)
		r->wants = r->share = r->kept = 0;
	return r;
}

/*
 * Bring the set of watched keys in line with the slots: keys newly held are
 * added (unsubscribed yet), keys no longer held, or of a role over its
 * share (fair_shares), taken out (to unsubscribe: returned in *gone, still
 * in the hash).  Three passes over the registry, its lock held shared:
 * what each slot wants, what stays watched, what is watched anew; names
 * are copied only for keys newly held.
 */
static void
match_slots(RLLane lane, List **gone)
{
	TimestampTz held_since = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														 -RL_WATCH_AFTER_MS);
	bool	   *wants = palloc(sizeof(bool) * Max(rl_shared->nslots, 1));
	HASHCTL		ctl;
	HTAB	   *roles;
	int			i;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(RoleWatches);
	ctl.hcxt = CurrentMemoryContext;
	roles = hash_create("redis_lock watches per role", 16, &ctl,
						HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);

	LWLockAcquire(rl_shared->lock, LW_SHARED);
	for (i = 0; i < rl_shared->nslots; i++)
	{
		RLSlot	   *s = &rl_shared->slots[i];

		wants[i] = slot_wants_watch(s, lane, held_since);
		if (watch_of[i] != NULL && (!wants[i] || watch_gen[i] != s->generation))
			unwatch_slot(i, gone);
		if (wants[i])
			role_of(roles, s)->wants++;
	}
	fair_shares(roles);
	for (i = 0; i < rl_shared->nslots; i++)
	{
		RoleWatches *r;

		if (watch_of[i] == NULL)
			continue;
		r = role_of(roles, &rl_shared->slots[i]);
		if (r->kept < r->share)
			r->kept++;
		else
			unwatch_slot(i, gone);
	}
	for (i = 0; i < rl_shared->nslots; i++)
	{
		RLSlot	   *s = &rl_shared->slots[i];
		RoleWatches *r;

		/* the keys in *gone leave the hash after this pass */
		if (!wants[i] || watch_of[i] != NULL ||
			hash_get_num_entries(watched) - list_length(*gone) >= RL_WATCH_KEYS_MAX)
			continue;
		r = role_of(roles, s);
		if (r->kept >= r->share)
			continue;
		r->kept++;
		watch_slot(i, s, gone);
	}
	LWLockRelease(rl_shared->lock);
	hash_destroy(roles);
	pfree(wants);
}

/* Is every subscription of w standing? */
static bool
subscribed(const WatchedKey *w)
{
	int			k;

	if (w->nsubs == 0)
		return false;
	for (k = 0; k < w->nsubs; k++)
		if (w->opened[k] == 0 || rl_conn_open_id(w->subs[k]) != w->opened[k])
			return false;
	return true;
}

/*
 * After a round of subscriptions to target tidx: back off when some did not
 * stand, saying so once per spell (the locks are still renewed: only losses
 * are found later), and forget the spell once a round stood.
 */
static void
note_subscribed(int tidx, bool failed, const char *problem)
{
	if (!failed)
	{
		retry_ms[tidx] = 0;
		return;
	}
	if (retry_ms[tidx] == 0)
		ereport(LOG,
				(errmsg("redis_lock watchdog could not subscribe to the keyspace notifications of the locks it renews; it finds their losses at their renewals only until it can"),
				 problem != NULL ? errdetail_internal("%s", problem) : 0));
	retry_ms[tidx] = retry_ms[tidx] == 0 ? RL_WATCH_RETRY_MIN_MS :
		Min(retry_ms[tidx] * 2, RL_WATCH_RETRY_MAX_MS);
	retry_at[tidx] = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												 retry_ms[tidx]);
}

/*
 * Subscribe the keys of list todo (all of one target, tidx), on each node
 * that holds them; keys whose subscription did not stand are tried again
 * at a later sync, not before the target's retry time.
 */
static void
subscribe_target(List *todo, int tidx, const RLSharedTarget *target,
				 int budget_ms)
{
	RLTarget   *t = rl_target_from_spec(target->spec);
	int			cap = list_length(todo) * RL_MAX_NODES;
	RLConn	  **subs = palloc(sizeof(RLConn *) * cap);
	const char **keys = palloc(sizeof(char *) * cap);
	bool	   *refused = palloc0(sizeof(bool) * Max(cap, 1));
	int			saved_connect_ms = rl_connect_timeout_ms;
	int			saved_command_ms = rl_command_timeout_ms;
	int			n = 0;
	bool		failed = false;
	char	   *problem = NULL;
	ListCell   *lc;

	rl_use_credentials(target->password[0] ? target->password : NULL,
					   target->sentinel_password[0] ? target->sentinel_password : NULL);
	/* half of the budget to connect, the rest for the confirmations */
	rl_connect_timeout_ms = Min(rl_connect_timeout_ms, Max(budget_ms / 2, 1));
	rl_command_timeout_ms = Min(rl_command_timeout_ms,
								budget_ms - rl_connect_timeout_ms);
	foreach(lc, todo)
	{
		WatchedKey *w = lfirst(lc);
		const char *key = key_of(w);
		char	   *error;
		int			k;

		w->nsubs = rl_target_nodes(t, key, strlen(key), w->subs, true, &error);
		if (w->nsubs < 0)
		{
			w->nsubs = 0;
			failed = true;
			problem = error;
			continue;
		}
		for (k = 0; k < w->nsubs; k++)
		{
			subs[n] = w->subs[k];
			keys[n++] = key;
		}
	}
	if (n > 0)
	{
		char	   *why = rl_subscribe_keyspace(subs, keys, n,
												rl_command_timeout_ms,
												refused);

		if (problem == NULL)
			problem = why;
	}
	rl_connect_timeout_ms = saved_connect_ms;
	rl_command_timeout_ms = saved_command_ms;
	rl_use_settings_credentials();

	/* entries in the order they were made above */
	n = 0;
	foreach(lc, todo)
	{
		WatchedKey *w = lfirst(lc);
		int			k;

		for (k = 0; k < w->nsubs; k++, n++)
		{
			/* a refused key only: the others on its connection stand */
			w->opened[k] = refused[n] ? 0 : rl_conn_open_id(w->subs[k]);
			failed |= w->opened[k] == 0;
		}
	}
	note_subscribed(tidx, failed, problem);
}

/* Unsubscribe the keys of list gone, without waiting, and forget them */
static void
unsubscribe_keys(List *gone)
{
	int			cap = list_length(gone) * RL_MAX_NODES;
	RLConn	  **subs = palloc(sizeof(RLConn *) * Max(cap, 1));
	const char **keys = palloc(sizeof(char *) * Max(cap, 1));
	int			n = 0;
	ListCell   *lc;

	foreach(lc, gone)
	{
		WatchedKey *w = lfirst(lc);
		int			k;

		for (k = 0; k < w->nsubs; k++)
			if (w->opened[k] != 0 && rl_conn_open_id(w->subs[k]) == w->opened[k])
			{
				subs[n] = w->subs[k];
				keys[n++] = key_of(w);
			}
	}
	rl_unsubscribe_keyspace_async(subs, keys, n);
	foreach(lc, gone)
	{
		WatchedKey *w = lfirst(lc);

		(void) hash_search(watched, w->hkey, HASH_REMOVE, NULL);
	}
}

/*
 * What a round of subscriptions may take now, when the worker has work due
 * at due: 0 when too little is left (the round waits for a later pass).
 */
static int
round_budget_ms(TimestampTz due)
{
	long		left = (long) ((due - GetCurrentTimestamp()) / 1000);

	return left < RL_WATCH_SUBSCRIBE_MIN_MS ? 0 :
		(int) Min(left, RL_WATCH_SUBSCRIBE_MS);
}

/*
 * After each cycle of the worker of lane, which has work due at due:
 * subscribe to the keyspace notifications of every lock it renews that is
 * newly held, unsubscribe from those no longer held, and subscribe again
 * where a subscriber connection was lost.  Each target's round is bounded
 * by RL_WATCH_SUBSCRIBE_MS and by what is left until due (round_budget_ms),
 * so a slow subscription never makes a renewal late; nothing is waited for
 * when nothing changed.
 */
void
rl_watch_events_sync(RLLane lane, TimestampTz due)
{
	List	   *gone = NIL;
	List	   *todo[RL_MAX_TARGETS];
	HASH_SEQ_STATUS seq;
	WatchedKey *w;
	TimestampTz now = GetCurrentTimestamp();
	int			tidx;

	if (watched == NULL)
		watch_init();
	match_slots(lane, &gone);
	if (gone != NIL)
		unsubscribe_keys(gone);

	/* what is not subscribed: new, or its connection was lost since */
	memset(todo, 0, sizeof(todo));
	hash_seq_init(&seq, watched);
	while ((w = hash_seq_search(&seq)) != NULL)
		if (!subscribed(w) && retry_at[w->target] <= now)
			todo[w->target] = lappend(todo[w->target], w);
	for (tidx = 0; tidx < RL_MAX_TARGETS; tidx++)
	{
		RLSharedTarget target;
		int			budget_ms = round_budget_ms(due);

		if (todo[tidx] == NIL || budget_ms == 0)
			continue;
		LWLockAcquire(rl_shared->lock, LW_SHARED);
		memcpy(&target, &rl_shared->targets[tidx], sizeof(target));
		LWLockRelease(rl_shared->lock);
		subscribe_target(todo[tidx], tidx, &target, budget_ms);
		/* the passwords stay only as long as they are needed */
		explicit_bzero(&target, sizeof(target));
	}
}

/* A key gone: remember it for check_gone_keys */
static void
note_gone(const char *key, void *arg)
{
	List	  **keys = (List **) arg;

	*keys = lappend(*keys, pstrdup(key));
}

/*
 * The held slots of the keys in list keys are renewed at the worker's next
 * cycle, whatever their renewal period: the renewal finds out whether the
 * key is still ours.  Another target's slot of the same name is renewed
 * too, which is only early.
 */
static void
check_gone_keys(List *keys)
{
	HASHCTL		ctl;
	HTAB	   *set;
	ListCell   *lc;
	int			i;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = RL_MAX_KEY_LEN + 1;
	ctl.entrysize = RL_MAX_KEY_LEN + 1;
	ctl.hcxt = CurrentMemoryContext;
	set = hash_create("redis_lock gone keys", 16, &ctl,
					  HASH_ELEM | RL_HASH_STRINGS | HASH_CONTEXT);
	foreach(lc, keys)
	{
		char		k[RL_MAX_KEY_LEN + 1];

		strlcpy(k, lfirst(lc), sizeof(k));
		(void) hash_search(set, k, HASH_ENTER, NULL);
	}

	LWLockAcquire(rl_shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < rl_shared->nslots; i++)
	{
		RLSlot	   *s = &rl_shared->slots[i];

		if (watch_of[i] != NULL && s->state == SLOT_HELD &&
			hash_search(set, s->key, HASH_FIND, NULL) != NULL)
			s->check_now = true;
	}
	LWLockRelease(rl_shared->lock);
	hash_destroy(set);
}

/*
 * The worker's sleep between cycles: up to sleep_ms, until its latch is
 * set, or until a notification says a watched key is gone (its slots are
 * then due at once, see check_gone_keys).
 */
void
rl_watch_events_wait(long sleep_ms)
{
	RLConn	   *conns[RL_WATCH_CONNS_MAX];
	int			n = 0;
	List	   *keys = NIL;
	HASH_SEQ_STATUS seq;
	WatchedKey *w;

	if (watched != NULL)
	{
		hash_seq_init(&seq, watched);
		while ((w = hash_seq_search(&seq)) != NULL)
		{
			int			k;

			for (k = 0; k < w->nsubs; k++)
			{
				int			j;

				for (j = 0; j < n && conns[j] != w->subs[k]; j++)
					;
				if (j == n && n < RL_WATCH_CONNS_MAX)
					conns[n++] = w->subs[k];
			}
		}
	}
	(void) rl_wait_keyspace_gone(conns, n, sleep_ms, note_gone, &keys);
	if (keys != NIL)
		check_gone_keys(keys);
}
