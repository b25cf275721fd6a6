/*-------------------------------------------------------------------------
 *
 * lockstate.c
 *	  Owns the life of a lock-table entry as a state (RLHeld.state): which
 *	  transitions there are, the one function that makes them
 *	  (rl_lt_set_state), what follows from the state (the table's counts of
 *	  doubts and of entries handed to the worker; lock.h's RL_HANDED and
 *	  RL_RELEASING read the state itself), and which fields are valid in
 *	  which state.  The files of
 *	  the table decide when an entry moves; it moves only here.  In builds
 *	  with assertions every transition is checked against the table below,
 *	  and the entry against the state it goes to.
 *
 *	  Must not: talk to Redis, touch the shared registry, raise, or call
 *	  into another file.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/lock/lockstate.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "redis/redis.h"
#include "lock/lock_int.h"

/*
 * The states, and which fields are valid in each (hkey, name, mode, target,
 * names and serial are valid in every state but FREE):
 *
 * FREE: not in the table.  A new entry before rl_lt_entry_create fills it,
 *	  or one removed (its memory is dynahash's again).
 *
 * DOUBT: no holds; this backend settles it.  expires_at: 0 when it was
 *	  never tried (nothing of it can be in Redis), else the time after which
 *	  nothing of it can exist there; late_grant: an acquire of it may still
 *	  land; registry_slot: ours, or -1; lost: its owner value was found gone
 *	  (nothing to release).  An acquire under way is a doubt: late_grant and
 *	  expires_at are set before it is sent, so a cancel that cuts it short
 *	  leaves the entry as it must be.
 *
 * HELD: holds > 0 (session_holds + xact_holds).  fence, lease_ms,
 *	  lease_from, watchdog, on_lost, acquired_at; registry_slot: ours (-1
 *	  without preloading); unreachable: its COMMIT verify got no answer.
 *
 * LOST: as HELD, and this backend knows Redis no longer has its owner value
 *	  (lost; lost_reported_at: the call that last said so), or the worker
 *	  presumed so (loss_presumed: no renewal answered for a lease).
 *
 * RELEASING: no holds; a release of it was sent without waiting and its
 *	  answer is owed (a PendingRelease of its serial, lockdoubts.c);
 *	  registry_slot: ours, or -1; expires_at as a doubt's.
 *
 * RELEASING_HANDED: as RELEASING, and its registry_slot is handed to the
 *	  worker (handed_gen), which releases the lock if the answer is not read
 *	  by the deadline it was given.
 *
 * HANDED: no holds; a doubt the worker settles.  registry_slot and
 *	  handed_gen are the worker's until it is taken back; release_handed:
 *	  the release of a lock it held, handed at an abort.
 *
 * The transitions, and who makes them:
 *
 *	  FREE -> DOUBT				rl_lt_entry_create
 *	  DOUBT -> HELD				its first hold (rl_lt_add_hold: a grant)
 *	  DOUBT -> HANDED			rl_lt_hand_to_worker
 *	  DOUBT -> RELEASING(_HANDED)	rl_lt_release_later: its release sent
 *	  DOUBT -> FREE				rl_lt_entry_remove: settled or forgotten
 *	  HELD -> LOST				rl_lt_set_lost: found not ours
 *	  LOST -> HELD				rl_lt_set_found_ours: a loss the worker only
 *								presumed, refuted by a round trip that
 *								finds it ours (rl_lt_found_ours)
 *	  HELD, LOST -> DOUBT		rl_lt_became_doubt: its last hold dropped
 *	  HELD, LOST -> FREE		rl_lt_entry_remove (rl_forget)
 *	  RELEASING -> DOUBT		its answer read (rl_lt_settle_pending), its
 *								lock acquired again (rl_lt_reclaim_releasing),
 *								or on its way out (rl_lt_entry_remove)
 *	  RELEASING_HANDED -> HANDED	the same
 *	  HANDED -> DOUBT			taken back (rl_lt_take_back_from_worker), or
 *								the worker keeps the old owner value
 *								(rl_lt_renew_owner, the worker settled it)
 *	  HANDED -> FREE			rl_lt_entry_leave_to_worker
 */

/* The worker has the entry's registry slot (handed_gen) */
static inline bool
state_is_handed(RLHeldState s)
{
	return s == RL_ENTRY_HANDED || s == RL_ENTRY_RELEASING_HANDED;
}

#ifdef USE_ASSERT_CHECKING

#define NSTATES (RL_ENTRY_HANDED + 1)

static const bool allowed[NSTATES][NSTATES] = {
	[RL_ENTRY_FREE] = {
		[RL_ENTRY_DOUBT] = true
	},
	[RL_ENTRY_DOUBT] = {
		[RL_ENTRY_HELD] = true,
		[RL_ENTRY_HANDED] = true,
		[RL_ENTRY_RELEASING] = true,
		[RL_ENTRY_RELEASING_HANDED] = true,
		[RL_ENTRY_FREE] = true
	},
	[RL_ENTRY_HELD] = {
		[RL_ENTRY_LOST] = true,
		[RL_ENTRY_DOUBT] = true,
		[RL_ENTRY_FREE] = true
	},
	[RL_ENTRY_LOST] = {
		[RL_ENTRY_HELD] = true,
		[RL_ENTRY_DOUBT] = true,
		[RL_ENTRY_FREE] = true
	},
	[RL_ENTRY_RELEASING] = {
		[RL_ENTRY_DOUBT] = true
	},
	[RL_ENTRY_RELEASING_HANDED] = {
		[RL_ENTRY_HANDED] = true
	},
	[RL_ENTRY_HANDED] = {
		[RL_ENTRY_DOUBT] = true,
		[RL_ENTRY_FREE] = true
	},
};

/* The lost flag says what the state says */
static bool
flags_match_state(const RLHeld *e)
{
	RLHeldState s = e->state;

	if (s == RL_ENTRY_FREE)
		return true;
	return (s != RL_ENTRY_LOST || e->lost) &&
		(s != RL_ENTRY_HELD || !e->lost) &&
		(!e->loss_presumed || e->lost);
}

/* The entry is what state to needs: its holds, and a slot to hand */
static bool
entry_fits_state(const RLHeld *e, RLHeldState to)
{
	switch (to)
	{
		case RL_ENTRY_FREE:
			/* a held entry whose holds were dropped became a doubt first */
			return (e->state != RL_ENTRY_HELD && e->state != RL_ENTRY_LOST) ||
				RL_HOLDS(e) > 0;
		case RL_ENTRY_HELD:
		case RL_ENTRY_LOST:
			return RL_HOLDS(e) > 0;
		case RL_ENTRY_HANDED:
		case RL_ENTRY_RELEASING_HANDED:
			return RL_HOLDS(e) == 0 && e->registry_slot >= 0;
		case RL_ENTRY_DOUBT:
		case RL_ENTRY_RELEASING:
			return RL_HOLDS(e) == 0;
	}
	return false;
}
#endif							/* USE_ASSERT_CHECKING */

/* The table's counts of the entries in state s change by delta */
static void
count_state(RLHeldState s, int delta)
{
	if (s == RL_ENTRY_DOUBT)
		rl_lt_ndoubts += delta;
	else if (state_is_handed(s))
		rl_lt_nhanded += delta;
}

/*
 * Move e to state to: the one place an entry's state changes.  Its handed
 * and releasing flags and the table's counts follow; leaving HANDED ends a
 * release handed at an abort; a first grant (DOUBT -> HELD) is not lost,
 * and LOST is.
 */
void
rl_lt_set_state(RLHeld *e, RLHeldState to)
{
	RLHeldState from = e->state;

	Assert(flags_match_state(e));
	Assert(allowed[from][to]);
	Assert(entry_fits_state(e, to));
	count_state(from, -1);
	count_state(to, 1);
	if (from == RL_ENTRY_HANDED)
		e->release_handed = false;
	if (to == RL_ENTRY_HELD)
		e->lost = e->loss_presumed = false;
	if (to == RL_ENTRY_LOST)
		e->lost = true;
	e->state = to;
	Assert(rl_lt_ndoubts >= 0 && rl_lt_nhanded >= 0);
}

/*
 * Redis no longer has e's owner value: a held entry is LOST; a doubt or a
 * lost one only keeps the fact (what settles it has nothing to delete).
 */
void
rl_lt_set_lost(RLHeld *e)
{
	Assert(e->state == RL_ENTRY_HELD || e->state == RL_ENTRY_LOST ||
		   e->state == RL_ENTRY_DOUBT);
	if (e->state == RL_ENTRY_HELD)
		rl_lt_set_state(e, RL_ENTRY_LOST);
	else
		e->lost = true;
}

/*
 * A loss the worker only presumed (loss_presumed), refuted: Redis answered
 * a round trip that found e's owner value there.  Held again.
 */
void
rl_lt_set_found_ours(RLHeld *e)
{
	Assert(e->state == RL_ENTRY_LOST && e->loss_presumed);
	rl_lt_set_state(e, RL_ENTRY_HELD);
}
