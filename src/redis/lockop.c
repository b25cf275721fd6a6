/*-------------------------------------------------------------------------
 *
 * lockop.c
 *	  Owns lock operations over a target's nodes: one unit of calls per
 *	  node the target puts the key on (one, or every Redlock master) -- a
 *	  script, or the commands of its script-free form -- all sent in one
 *	  round trip, and the answers counted into one decision by majority
 *	  (yes >= quorum, or no > nodes - quorum).  Also what a failed call
 *	  means: not run (a refusal, replies.c says which), or an outcome
 *	  nobody knows; and whether a refusal would come again.  A release can
 *	  also be sent without waiting (rl_lock_ops_send) and counted once its
 *	  replies are in (rl_lock_op_answered).  And, from an inspect, whether an
 *	  owner value holds a lock (rl_op_held_by).  What rides behind a
 *	  node's unit in the same pipeline: WAIT after an acquire
 *	  (redis_lock.wait_replicas), PUBLISH of the key after a release
 *	  (RLLockNames.release_channel), whose answer decides nothing.
 *
 *	  Must not: build scripts or names (scripts.c, protocol.c do), keep
 *	  state about held locks (locktable.c does), raise for a node's failure
 *	  in soft mode.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/redis/lockop.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <hiredis/hiredis.h>

#include "utils/memutils.h"

#include "net/net.h"
#include "redis/redis_int.h"

/* ----------------------------------------------------------------
 * Operations over a target's nodes
 * ----------------------------------------------------------------
 */

/*
 * A node whose first answer asks for a second round trip (script-free forms
 * only): an acquire that found our own token, whose lease is then restarted
 * (RL_OP_EXTEND); a force release that saw a token, deleted if the key
 * still holds it (rl_build_force_delete).
 */
typedef struct FollowUp
{
	RLLockOp   *op;
	RLConn	   *conn;
	char	   *token;			/* force: the token seen */
	int64		fence;			/* acquire: the fencing token counted */
	RLCall	   *unit;			/* its calls in the second round */
	int			ncalls;
} FollowUp;

typedef struct FollowUps
{
	FollowUp   *items;
	int			n;
	int			cap;
} FollowUps;

static void
add_follow_up(FollowUps *f, RLLockOp *op, RLConn *conn, char *token, int64 fence)
{
	if (f->n == f->cap)
	{
		f->cap = Max(8, f->cap * 2);
		f->items = f->items == NULL ? palloc(sizeof(FollowUp) * f->cap) :
			repalloc(f->items, sizeof(FollowUp) * f->cap);
	}
	f->items[f->n].op = op;
	f->items[f->n].conn = conn;
	f->items[f->n].token = token;
	f->items[f->n].fence = fence;
	f->n++;
}

/* The calls of a unit are about the op's key, on its target */
static void
mark_unit(RLLockOp *op, RLCall *unit, int n)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		unit[i].target = op->target;
		unit[i].key = op->names->key;
		unit[i].keylen = op->names->keylen;
	}
}

/* No usable answer from this node: unit[0 .. n) */
static void
count_failure(RLLockOp *op, RLCall *unit, int n)
{
	RLCall	   *blame = rl_unit_failure(op->kind, unit, n);

	op->failed++;
	if (op->failure == NULL)
		op->failure = blame;
	if (rl_unit_may_have_run(unit, n))
		op->maybe_ran = true;
	if (rl_unit_refused_for_good(op->kind, unit, n))
		op->refused++;
}

/*
 * A release whose first send's reply was lost and that was sent again on
 * a fresh connection (RLCall.resent) and found the lock not ours: did the
 * first send delete it?  Nothing in Redis tells, but the lease does: while
 * it surely lasts (op->ours_until, at the time this answer is in, which is
 * after the first send), the key can only have stopped being ours by a
 * delete -- ours, or another client's, which no answer could tell apart
 * from ours.  Then it counts as released.  After that time the first send
 * may have found the lease run out: not ours, as a first answer would say;
 * but while the key may have outlived ours_until (op->may_outlive: a
 * renewal that ran in Redis unanswered, or a first send that went while
 * the lease surely lasted), the first send may as well have deleted it:
 * a "no" that may be our own delete (op->no_unsure).
 *
 * Extend, verify and renew need no such reading: their first send can
 * only restart our lease, so a repeat that finds the lock not ours finds
 * it lost, and one that finds it ours finds it ours.
 */
static bool
release_resent(RLLockOp *op, RLCall *unit, int n)
{
	int			i;

	if (op->kind != RL_OP_RELEASE || op->ours_until == 0)
		return false;
	for (i = 0; i < n && !unit[i].resent; i++)
		;
	return i < n;
}

/*
 * Count one node's answer, unit[0 .. n); a node that needs a second round
 * trip goes to follow instead.
 */
static void
count_answer(RLLockOp *op, RLCall *unit, int n, FollowUps *follow)
{
	if (op->kind == RL_OP_ACQUIRE)
	{
		RLAcquireResult r;

		rl_parse_acquire(unit, n, &r);
		switch (r.outcome)
		{
			case RL_ACQ_GRANTED:
				op->yes++;
				op->fence_value = r.fence;
				return;
			case RL_ACQ_OURS:
				add_follow_up(follow, op, unit->conn, NULL, r.fence);
				return;
			case RL_ACQ_BUSY:
				op->no++;
				if (r.pttl > 0 && (op->pttl <= 0 || r.pttl < op->pttl))
					op->pttl = r.pttl;
				op->holder_publishes |= r.holder_publishes;
				return;
			case RL_ACQ_WRONGTYPE:
				op->no++;
				op->wrongtype = r.type;
				return;
			case RL_ACQ_FAILED:
				break;
		}
	}
	else if (op->kind == RL_OP_INSPECT)
	{
		if (rl_inspect_reply(unit, n) != NULL)
		{
			op->yes++;
			return;
		}
	}
	else if (op->kind == RL_OP_SEM_STATUS || op->kind == RL_OP_SEM_SETUP)
	{
		char	   *type;

		if (rl_sem_reply(op->kind, unit, &type) != NULL)
		{
			op->yes++;
			return;
		}
		if (type != NULL)
		{
			op->no++;
			op->wrongtype = type;
			return;
		}
	}
	else
	{
		char	   *text;

		switch (rl_parse_flag(op->kind, unit, n, &text))
		{
			case RL_FLAG_YES:
				op->yes++;
				return;
			case RL_FLAG_NO:
				if (!release_resent(op, unit, n))
					op->no++;
				else if (GetCurrentTimestamp() < op->ours_until)
					op->yes++;
				else
				{
					op->no++;
					op->no_unsure += op->may_outlive ? 1 : 0;
				}
				return;
			case RL_FLAG_WRONGTYPE:
				op->no++;
				op->wrongtype = text;
				return;
			case RL_FLAG_SEEN:
				add_follow_up(follow, op, unit->conn, text, 0);
				return;
			case RL_FLAG_FAILED:
				break;
		}
	}
	count_failure(op, unit, n);
}

/* An op whose nodes are unknown (topology not learnt): all of it failed */
static void
fail_unrouted(RLLockOp *op, char *error)
{
	RLCall	   *c = palloc0(sizeof(RLCall));

	c->key = op->names->key;
	c->keylen = op->names->keylen;
	rl_call_fail(c, RL_FAIL_ROUTE, ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
				 error);
	op->calls = c;
	op->nodes = op->failed = 1;
	op->failure = c;
	op->unit_calls = op->stride = 1;
	/* an earlier round of this op may have reached Redis: assume it did */
	op->maybe_ran = true;
}

/* WAIT numreplicas after a node's acquire, in the same pipeline */
void
rl_add_wait_call(RLCall *call, RLConn *conn, RLTarget *target)
{
	char	   *n = psprintf("%d", rl_wait_replicas);
	char	   *t = psprintf("%d", rl_wait_replicas_timeout_ms);
	const char *argv[3] = {"WAIT", n, t};

	rl_call_set(call, conn, 3, argv, NULL);
	call->target = target;
	call->follows = true;
	call->extra_ms = rl_wait_replicas_timeout_ms;
}

/*
 * PUBLISH of the released key on the lock's release channel, after a
 * node's release in the same pipeline (redis_lock.release_channel_prefix):
 * sent whatever the release finds, as a spurious message only makes a
 * waiter look again.
 */
static void
add_publish_call(RLCall *call, RLConn *conn, RLLockOp *op)
{
	const char *argv[3] = {"PUBLISH", op->names->release_channel, op->names->key};

	rl_call_set(call, conn, 3, argv, NULL);
	call->target = op->target;
	call->key = op->names->key;
	call->keylen = op->names->keylen;
	call->follows = true;
}

/* Does a PUBLISH ride behind op's unit on each node? */
static bool
publishes_release(const RLLockOp *op)
{
	return op->kind == RL_OP_RELEASE && op->names->release_channel != NULL;
}

/* Calls per node of op: its unit, and WAIT or PUBLISH behind it */
static int
op_stride(const RLLockOp *op)
{
	if (op->kind == RL_OP_ACQUIRE && rl_wait_replicas > 0)
		return op->unit_calls + 1;
	if (publishes_release(op))
		return op->unit_calls + 1;
	return op->unit_calls;
}

/*
 * The answer of a release's PUBLISH: only an error reply (an ACL that
 * denies the channel or the command) is told, once per session, as a
 * WARNING; the release itself is counted from its unit alone.  Never
 * raises.
 */
static void
note_publish_answer(RLLockOp *op, RLCall *unit)
{
	static bool warned = false;
	RLReply    *r;

	if (!publishes_release(op) || warned)
		return;
	r = unit[op->unit_calls].reply;
	if (r == NULL || r->type != REDIS_REPLY_ERROR)
		return;
	warned = true;
	ereport(WARNING,
			(errcode(rl_error_reply_sqlstate(r)),
			 errmsg("could not publish the release of Redis key \"%s\" on channel \"%s\"",
					op->names->key, op->names->release_channel),
			 errdetail_internal("Redis answered: %s", r->str),
			 errhint("The release itself is done; waiters on that channel find it "
					 "when they next look.  A refused publish is reported once per "
					 "session.")));
}

static void
reset_op(RLLockOp *op, RLCall *calls)
{
	op->nodes = op->yes = op->no = op->failed = op->refused = 0;
	op->maybe_ran = op->holder_publishes = false;
	op->failure = NULL;
	op->wrongtype = NULL;
	op->fence_value = op->pttl = 0;
	op->replicas_short = 0;
	op->calls = calls;
}

/*
 * The nodes of op's key into conns (how many; -1 with *error set when its
 * topology could not be learnt), and for a script-free op what each of them
 * offers (why[], rl_learn_offers).  In hard mode what stops the op before
 * anything is sent raises here instead: a topology that cannot be learnt, a
 * server without the commands of script-free locks.
 */
static int
route_op(RLLockOp *op, RLRunMode mode, RLConn **conns, RLCall **why,
		 char **error)
{
	int			n;

	if (mode == RL_RUN_SOFT)
		n = rl_target_nodes(op->target, op->names->key, op->names->keylen,
							conns, false, error);
	else
		n = rl_target_nodes_or_raise(op->target, op->names->key,
									 op->names->keylen, conns, false);
	if (n > 0 && op->names->script_free)
		rl_learn_offers(conns, n, op->target, op->names->key,
						op->names->keylen, mode, !op->routed, why);
	return n;
}

/*
 * Raise now what running ops in hard mode would raise before sending
 * anything (route_op), for a caller that counts an op as a doubt from when
 * it may be sent: an error here leaves nothing to doubt.  What is learnt
 * (connections, topology, what servers offer) stays with the connections,
 * so the run that follows pays no round trip for it again, nor asks again:
 * it cannot raise what this did not.  A server that did not answer the
 * question raises its own failure here when it alone decides the op; among
 * independent masters the run asks it again, and counts it as failed.
 */
void
rl_lock_ops_route(RLLockOp *ops, int nops)
{
	RLConn	   *conns[RL_MAX_NODES];
	RLCall	   *why[RL_MAX_NODES];
	int			i;

	rl_wait_site = __func__;
	for (i = 0; i < nops; i++)
	{
		RLLockOp   *op = &ops[i];
		int			n;
		int			j;

		op->routed = false;
		n = route_op(op, RL_RUN_HARD, conns, why, NULL);
		op->routed = true;
		if (!op->names->script_free)
			continue;
		for (j = 0; j < n; j++)
		{
			if (why[j] == NULL)
				continue;
			/* a server that did not answer: its failure, where it decides */
			if (n == 1)
				rl_raise_call_error(why[j]);
			/* among independent masters the run asks it again */
			op->routed = false;
		}
	}
}

/*
 * Build the calls of every op into calls[], stride per node (its unit, and
 * a WAIT after an acquire); returns how many.  An op whose nodes could not
 * be learnt is failed and marked in unrouted[]; its topology is not asked
 * again this round.  A script-free unit for a node that does not offer its
 * commands, or did not say, is held back (held[]) with that failure.
 */
static int
build_round(RLLockOp *ops, int nops, RLRunMode mode, RLCall *calls, bool *unrouted,
			bool *held)
{
	RLTarget  **lost_targets = palloc(sizeof(RLTarget *) * nops);
	char	  **lost_errors = palloc(sizeof(char *) * nops);
	int			nlost = 0;
	int			k = 0;
	int			i;

	for (i = 0; i < nops; i++)
	{
		RLLockOp   *op = &ops[i];
		RLConn	   *conns[RL_MAX_NODES];
		RLCall	   *why[RL_MAX_NODES];
		char	   *error = NULL;
		int			j;

		reset_op(op, &calls[k]);
		for (j = 0; j < nlost && lost_targets[j] != op->target; j++)
			;
		if (j < nlost)
		{
			fail_unrouted(op, lost_errors[j]);
			unrouted[i] = true;
			continue;
		}
		op->nodes = route_op(op, mode, conns, why, &error);
		if (op->nodes < 0)
		{
			lost_targets[nlost] = op->target;
			lost_errors[nlost++] = error;
			fail_unrouted(op, error);
			unrouted[i] = true;
			continue;
		}
		for (j = 0; j < op->nodes; j++)
		{
			RLCall	   *unit = &calls[k];
			int			c;

			rl_build_unit(unit, conns[j], op->kind, op->names, op->lease_ms,
						  op->fence, op->queue_wait_ms);
			mark_unit(op, unit, op->unit_calls);
			if (op->kind == RL_OP_ACQUIRE && op->stride > op->unit_calls)
				rl_add_wait_call(&unit[op->unit_calls], conns[j], op->target);
			else if (publishes_release(op))
				add_publish_call(&unit[op->unit_calls], conns[j], op);
			if (op->names->script_free && why[j] != NULL)
			{
				/* not sent: it answers with why it could not be */
				for (c = 0; c < op->stride; c++)
				{
					rl_call_fail(&unit[c], why[j]->failure, why[j]->sqlstate,
								 why[j]->error);
					unit[c].target = NULL;
					held[k + c] = true;
				}
			}
			k += op->stride;
		}
	}
	pfree(lost_targets);
	pfree(lost_errors);
	return k;
}

/*
 * Run the calls not held back (held[i]), in one round, as rl_script_run
 * does (cluster redirections, NOSCRIPT).
 */
static void
run_round(RLCall *calls, int ncalls, const bool *held)
{
	RLCall	   *send;
	int			nsend = 0;
	int			i;

	for (i = 0; i < ncalls && !held[i]; i++)
		;
	if (i == ncalls)
	{
		rl_script_run(calls, ncalls, RL_RUN_SOFT);
		return;
	}
	send = palloc(sizeof(RLCall) * ncalls);
	for (i = 0; i < ncalls; i++)
		if (!held[i])
			send[nsend++] = calls[i];
	if (nsend > 0)
		rl_script_run(send, nsend, RL_RUN_SOFT);
	nsend = 0;
	for (i = 0; i < ncalls; i++)
		if (!held[i])
			calls[i] = send[nsend++];
	pfree(send);
}

/* Count the answers of every routed op */
static void
count_round(RLLockOp *ops, int nops, const bool *unrouted, TimestampTz start,
			FollowUps *follow)
{
	int			i;

	for (i = 0; i < nops; i++)
	{
		RLLockOp   *op = &ops[i];
		int			j;

		if (unrouted[i])
			continue;
		op->elapsed_ms = (GetCurrentTimestamp() - start) / 1000;
		for (j = 0; j < op->nodes; j++)
		{
			RLCall	   *unit = &op->calls[j * op->stride];

			count_answer(op, unit, op->unit_calls, follow);
			note_publish_answer(op, unit);
			if (op->kind == RL_OP_ACQUIRE && op->stride > op->unit_calls)
			{
				RLReply    *w = unit[op->unit_calls].reply;

				if (!rl_reply_fits(w, "i") ||
					w->integer < rl_wait_replicas)
					op->replicas_short++;
			}
		}
	}
}

/*
 * The second round trip of the nodes that asked for one, all at once, and
 * their answers counted into their ops.  An acquire whose refresh failed
 * may hold the lock (our token is there): it counts as maybe run.
 */
static void
follow_up_round(FollowUps *f, TimestampTz start)
{
	RLCall	   *calls = palloc0(sizeof(RLCall) * f->n * 2);
	int			k = 0;
	int			i;

	for (i = 0; i < f->n; i++)
	{
		FollowUp   *fu = &f->items[i];
		RLLockOp   *op = fu->op;

		fu->unit = &calls[k];
		if (op->kind == RL_OP_ACQUIRE)
		{
			fu->ncalls = rl_unit_calls(RL_OP_EXTEND, op->names, false);
			rl_build_unit(fu->unit, fu->conn, RL_OP_EXTEND, op->names,
						  op->lease_ms, false, 0);
		}
		else
			fu->ncalls = rl_build_force_delete(fu->unit, fu->conn, op->names,
											   fu->token);
		mark_unit(op, fu->unit, fu->ncalls);
		k += fu->ncalls;
	}
	rl_script_run(calls, k, RL_RUN_SOFT);
	for (i = 0; i < f->n; i++)
	{
		FollowUp   *fu = &f->items[i];
		RLLockOp   *op = fu->op;
		char	   *text;

		op->elapsed_ms = (GetCurrentTimestamp() - start) / 1000;
		switch (rl_parse_flag(op->kind == RL_OP_ACQUIRE ? RL_OP_EXTEND : RL_OP_RELEASE,
							  fu->unit, fu->ncalls, &text))
		{
			case RL_FLAG_YES:
				op->yes++;
				if (op->kind == RL_OP_ACQUIRE)
					op->fence_value = fu->fence;
				break;
			case RL_FLAG_NO:
			case RL_FLAG_WRONGTYPE:
			case RL_FLAG_SEEN:
				/* it changed hands meanwhile: busy (pttl unknown), or gone */
				op->no++;
				break;
			case RL_FLAG_FAILED:
				count_failure(op, fu->unit, fu->ncalls);
				if (op->kind == RL_OP_ACQUIRE)
					op->maybe_ran = true;
				break;
		}
	}
}

/*
 * Run ops: one unit per node of each op's target, all in one round (the
 * sockets are waited on together, so N masters cost the slowest one, not
 * the sum), then count answers per op; script-free ops that need it take a
 * second round (FollowUp).  In soft mode a Redis failure of any kind (also
 * while learning the topology) is counted in the op, never raised; in hard
 * mode a topology that cannot be learnt, or a server without the commands
 * of a script-free op, raises before anything is sent.  Interrupts raise
 * either way: hold them where that matters.  site names the caller
 * (rl_lock_ops_run), where a wait breaks the rule of rl_assert_may_wait.
 */
void
rl_lock_ops_run_at(RLLockOp *ops, int nops, RLRunMode mode, const char *site)
{
	RLCall	   *calls;
	bool	   *unrouted;
	bool	   *held;
	FollowUps	follow = {NULL, 0, 0};
	int			total = 0;
	int			ncalls;
	int			i;
	TimestampTz start;

	rl_wait_site = site;
	for (i = 0; i < nops; i++)
	{
		RLLockOp   *op = &ops[i];

		op->unit_calls = rl_unit_calls(op->kind, op->names, op->fence);
		/* WAIT or PUBLISH rides in the same pipeline, after the unit */
		op->stride = op_stride(op);
		total += rl_target_max_nodes(op->target) * op->stride;
	}
	calls = palloc0(sizeof(RLCall) * Max(total, 1));
	held = palloc0(sizeof(bool) * Max(total, 1));
	unrouted = palloc0(sizeof(bool) * nops);

	start = GetCurrentTimestamp();
	ncalls = build_round(ops, nops, mode, calls, unrouted, held);
	if (ncalls > 0)
		run_round(calls, ncalls, held);
	count_round(ops, nops, unrouted, start, &follow);
	if (follow.n > 0)
		follow_up_round(&follow, start);
	pfree(unrouted);
	pfree(held);
}

/*
 * Send ops (releases, fair-queue leaves: nothing depends on their answers
 * now) without
 * waiting for the answers; sent[i] tells which went.  An op goes only when
 * its nodes are known, each node's connection can take it at once (open
 * and in step, see rl_conn_ready_to_send) and, script-free, each node's
 * commands are known; any other is left to the caller, to run as usual.
 * The ops (and the names they point to) must live until
 * rl_lock_op_answered says they are answered; what is built here lives in
 * rl_owed_context().  Only the writes are waited for: interrupts raise
 * there unless held.  Never raises for a Redis failure.
 */
void
rl_lock_ops_send(RLLockOp *ops, int nops, bool *sent)
{
	MemoryContext old = MemoryContextSwitchTo(rl_owed_context());
	RLCall	   *calls;
	RLCall	  **send;
	bool	   *unrouted;
	bool	   *held;
	int			total = 0;
	int			ncalls;
	int			nsend = 0;
	int			timeout = rl_command_timeout_ms;
	RLConn	  **conns;
	bool	   *ready;
	int			nconns = 0;
	int			i;
	int			c;

	for (i = 0; i < nops; i++)
	{
		RLLockOp   *op = &ops[i];

		Assert(op->kind == RL_OP_RELEASE || op->kind == RL_OP_DEQUEUE);
		op->unit_calls = rl_unit_calls(op->kind, op->names, op->fence);
		op->stride = op_stride(op);
		op->goes_again = false;
		total += rl_target_max_nodes(op->target) * op->stride;
	}
	calls = palloc0(sizeof(RLCall) * Max(total, 1));
	held = palloc0(sizeof(bool) * Max(total, 1));
	unrouted = palloc0(sizeof(bool) * Max(nops, 1));
	ncalls = build_round(ops, nops, RL_RUN_SOFT, calls, unrouted, held);
	send = palloc(sizeof(RLCall *) * Max(ncalls, 1));

	/*
	 * Which connections are ready, each asked once, then which ops can go:
	 * every connection they need is ready.
	 */
	conns = palloc(sizeof(RLConn *) * Max(ncalls, 1));
	ready = palloc(sizeof(bool) * Max(ncalls, 1));
	for (c = 0; c < ncalls; c++)
	{
		int			j;

		if (calls[c].conn == NULL)
			continue;
		for (j = 0; j < nconns && conns[j] != calls[c].conn; j++)
			;
		if (j == nconns)
			conns[nconns++] = calls[c].conn;
	}
	for (c = 0; c < nconns; c++)
		ready[c] = rl_conn_ready_to_send(conns[c]);
	for (i = 0; i < nops; i++)
	{
		RLLockOp   *op = &ops[i];
		int			first = op->calls - calls;

		sent[i] = !unrouted[i] && op->nodes > 0;
		for (c = 0; sent[i] && c < op->nodes * op->stride; c++)
		{
			int			j;

			for (j = 0; j < nconns && conns[j] != op->calls[c].conn; j++)
				;
			if (held[first + c] || j == nconns || !ready[j])
				sent[i] = false;
		}
		for (c = 0; sent[i] && c < op->nodes * op->stride; c++)
			send[nsend++] = &op->calls[c];
		if (sent[i])
			timeout = Min(timeout, rl_target_timeout(op->target));
	}
	if (nsend > 0)
		rl_send(send, nsend, timeout);
	pfree(conns);
	pfree(ready);
	pfree(send);
	pfree(held);
	pfree(unrouted);
	MemoryContextSwitchTo(old);
}

/*
 * Has every reply a sent op owes come, or failed?  Then its answers are
 * counted into it as rl_lock_ops_run counts them (yes, no, failed,
 * maybe_ran, failure), and goes_again tells that a node answered that it
 * did not run the command where rl_lock_ops_run would have sent it again
 * (a redirection, a node no longer master, NOSCRIPT): whoever settles the
 * op runs it again then.  Does nothing else; never raises.
 */
bool
rl_lock_op_answered(RLLockOp *op)
{
	FollowUps	follow = {NULL, 0, 0};
	MemoryContext old;
	int			j;
	int			c;

	for (c = 0; c < op->nodes * op->stride; c++)
		if (op->calls[c].owed)
			return false;
	old = MemoryContextSwitchTo(rl_owed_context());
	op->yes = op->no = op->failed = op->refused = 0;
	op->maybe_ran = op->goes_again = false;
	op->failure = NULL;
	op->wrongtype = NULL;
	for (j = 0; j < op->nodes; j++)
	{
		RLCall	   *unit = &op->calls[j * op->stride];

		for (c = 0; c < op->unit_calls; c++)
			if (rl_reply_goes_again(unit[c].reply) ||
				rl_reply_is_error(unit[c].reply, "NOSCRIPT"))
				op->goes_again = true;
		count_answer(op, unit, op->unit_calls, &follow);
		note_publish_answer(op, unit);
	}
	/* a release never asks for a second round; were it to, run it again */
	if (follow.n > 0)
		op->goes_again = true;
	MemoryContextSwitchTo(old);
	return true;
}

/*
 * Did an acquire op grant the lock?  A majority said yes and, for Redlock,
 * the lease left after the round trip and a clock-drift allowance
 * (1% of the lease + 2 ms) is still positive.
 */
bool
rl_op_granted(RLLockOp *op)
{
	if (!RL_OP_YES(op))
		return false;
	if (op->target->kind == RL_TOPO_REDLOCK)
		return op->lease_ms - op->elapsed_ms - (op->lease_ms / 100 + 2) > 0;
	return true;
}

/*
 * An extend or renew that said "ours": the least any node had left of the
 * lease before it, in ms (-1: none known).  Less than the lease's remainder
 * means another client cut it short (a Redisson reader's renewal does).
 */
int64
rl_op_found_ttl(RLLockOp *op)
{
	int64		least = -1;
	int			j;

	for (j = 0; j < op->nodes; j++)
	{
		int64		t = rl_extend_found_ttl(op->kind, &op->calls[j * op->stride],
										op->unit_calls);

		if (t >= 0 && (least < 0 || t < least))
			least = t;
	}
	return least;
}

/*
 * Node's answer to an inspect op in the inspect script's form, {type} or,
 * for a lock, {type, pttl, value or holder fields}, or NULL when it gave
 * none.
 */
RLReply *
rl_op_inspect_reply(RLLockOp *op, int node)
{
	if (op->kind == RL_OP_SEM_STATUS || op->kind == RL_OP_SEM_SETUP)
	{
		char	   *type;

		return rl_sem_reply(op->kind, &op->calls[node * op->stride], &type);
	}
	return rl_inspect_reply(&op->calls[node * op->stride], op->unit_calls);
}

/*
 * After an inspect op: the holders node's answer shows, into holders (room
 * for RL_LOCK_FIELDS_MAX), and the lock's TTL into *pttl.  A lock's holders
 * are its value (a string's) or its holder fields (a hash's), in the forms
 * rl_inspect_reply let through; a key that is no lock, or a node that gave
 * no answer, shows none.  Returns how many.
 */
int
rl_op_inspect_holders(RLLockOp *op, int node, const char **holders,
					  int64 *pttl)
{
	RLReply    *r = rl_op_inspect_reply(op, node);
	RLReply    *v;
	int			n = 0;
	size_t		k;

	Assert(op->kind == RL_OP_INSPECT);
	/* {type} (not a lock) or {type, pttl, value or holder fields} */
	if (r == NULL || r->elements != 3)
		return 0;
	v = r->element[2];
	*pttl = r->element[1]->integer;
	if (v->type == REDIS_REPLY_STRING)
		holders[n++] = v->str;
	else
		for (k = 0; k < v->elements && n < RL_LOCK_FIELDS_MAX; k++)
			holders[n++] = v->element[k]->str;
	return n;
}

/*
 * After an inspect op: does owner hold the lock on a majority of its nodes
 * (one node: on it)?  A node holds it when one of the holders its answer
 * shows is owner.  Read only: how the deadlock check asks whether a hold
 * some backend of this server has is still in Redis.
 */
bool
rl_op_held_by(RLLockOp *op, const char *owner)
{
	const char *holders[RL_LOCK_FIELDS_MAX];
	int64		pttl;
	int			held = 0;
	int			j;
	int			n;

	for (j = 0; j < op->nodes; j++)
	{
		n = rl_op_inspect_holders(op, j, holders, &pttl);
		while (--n >= 0)
			if (strcmp(holders[n], owner) == 0)
			{
				held++;
				break;
			}
	}
	return held >= rl_target_quorum(op->target);
}
