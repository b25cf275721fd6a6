/*-------------------------------------------------------------------------
 *
 * manyop.c
 *	  Owns the multi-key acquire over a target's nodes: one script call per
 *	  node (the node of the first key: the caller puts every key in one
 *	  slot), all in one round trip with WAIT behind each as for a single
 *	  acquire, and the answers counted into one decision by majority.
 *
 *	  Must not: build scripts or names (lockscripts.c, protocol.c do), keep
 *	  state about held locks (lockmany.c does), raise for a node's failure
 *	  in soft mode.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/redis/manyop.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <hiredis/hiredis.h>

#include "net/net.h"
#include "redis/redis_int.h"

static void
count_many_answer(RLManyOp *op, RLCall *call)
{
	RLAcquireManyResult r;

	rl_parse_acquire_many(call, op->nlocks, &r);
	switch (r.outcome)
	{
		case RL_ACQ_GRANTED:
			op->yes++;
			if (op->fences == NULL)
				op->fences = r.fences;
			return;
		case RL_ACQ_BUSY:
		case RL_ACQ_WRONGTYPE:
			op->no++;
			/* the first busy lock in the given order names the wait */
			if (op->busy_index < 0 || r.index < op->busy_index ||
				(r.index == op->busy_index && r.type != NULL))
			{
				op->busy_index = r.index;
				op->lost = r.lost;
				op->pttl = r.pttl;
				op->wrongtype = r.type;
			}
			else if (r.index == op->busy_index && r.pttl > 0 &&
					 (op->pttl <= 0 || r.pttl < op->pttl))
				op->pttl = r.pttl;
			op->holder_publishes |= r.holder_publishes;
			return;
		case RL_ACQ_OURS:		/* only the script-free form answers so */
		case RL_ACQ_FAILED:
			break;
	}
	op->failed++;
	if (op->failure == NULL)
		op->failure = call;
	if (rl_unit_may_have_run(call, 1))
		op->maybe_ran = true;
}

/*
 * The nodes of a multi-key acquire (those of its first key: the caller puts
 * all keys in one slot), as route_op; its form always has a script.
 */
static int
route_many(RLManyOp *op, RLRunMode mode, RLConn **conns, char **error)
{
	const RLLockNames *first = op->names[0];

	if (mode == RL_RUN_SOFT)
		return rl_target_nodes(op->target, first->key, first->keylen, conns,
							   false, error);
	return rl_target_nodes_or_raise(op->target, first->key, first->keylen,
									conns, false);
}

/* rl_lock_ops_route for a multi-key acquire */
void
rl_many_op_route(RLManyOp *op)
{
	RLConn	   *conns[RL_MAX_NODES];

	rl_wait_site = __func__;
	(void) route_many(op, RL_RUN_HARD, conns, NULL);
}

/*
 * Run a multi-key acquire: one script call per node of the target (the
 * node of the first key: the caller puts all keys in one slot), in one
 * round trip, WAIT numreplicas pipelined after each as for a single
 * acquire.  Failures are counted in soft mode; in hard mode a topology that
 * cannot be learnt raises.  Interrupts raise either way.  site names the
 * caller (rl_many_op_run).
 */
void
rl_many_op_run_at(RLManyOp *op, RLRunMode mode, const char *site)
{
	RLConn	   *conns[RL_MAX_NODES];
	const RLLockNames *first = op->names[0];
	char	   *error = NULL;
	TimestampTz start;
	int			k = 0;
	int			j;

	rl_wait_site = site;
	op->stride = rl_wait_replicas > 0 ? 2 : 1;
	op->nodes = op->yes = op->no = op->failed = 0;
	op->maybe_ran = op->holder_publishes = op->lost = false;
	op->failure = NULL;
	op->wrongtype = NULL;
	op->fences = NULL;
	op->busy_index = -1;
	op->pttl = 0;
	op->replicas_short = 0;
	op->calls = palloc0(sizeof(RLCall) * rl_target_max_nodes(op->target) * op->stride);

	op->nodes = route_many(op, mode, conns, &error);
	if (op->nodes < 0)
	{
		RLCall	   *c = &op->calls[0];

		c->key = first->key;
		c->keylen = first->keylen;
		rl_call_fail(c, RL_FAIL_ROUTE,
					 ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION, error);
		op->nodes = op->failed = 1;
		op->failure = c;
		op->stride = 1;
		op->maybe_ran = true;
		return;
	}
	for (j = 0; j < op->nodes; j++)
	{
		RLCall	   *c = &op->calls[k++];

		rl_call_acquire_many(c, conns[j], op->names, op->nlocks, op->lease_ms,
							 op->held, op->fence);
		c->target = op->target;
		c->key = first->key;
		c->keylen = first->keylen;
		if (op->stride == 2)
			rl_add_wait_call(&op->calls[k++], conns[j], op->target);
	}
	start = GetCurrentTimestamp();
	rl_script_run(op->calls, k, RL_RUN_SOFT);
	op->elapsed_ms = (GetCurrentTimestamp() - start) / 1000;
	for (j = 0; j < op->nodes; j++)
	{
		count_many_answer(op, &op->calls[j * op->stride]);
		if (op->stride == 2)
		{
			RLReply    *w = op->calls[j * 2 + 1].reply;

			if (!rl_reply_fits(w, "i") ||
				w->integer < rl_wait_replicas)
				op->replicas_short++;
		}
	}
}

/*
 * Did a multi-key acquire grant every lock?  As rl_op_granted: a majority
 * granted and, for Redlock, the shortest lease left after the round trip
 * and the drift allowance is still positive.
 */
bool
rl_many_op_granted(RLManyOp *op)
{
	int64		lease = PG_INT64_MAX;
	int			i;

	if (!RL_MANY_YES(op))
		return false;
	if (op->target->kind != RL_TOPO_REDLOCK)
		return true;
	for (i = 0; i < op->nlocks; i++)
		lease = Min(lease, op->lease_ms[i]);
	return lease - op->elapsed_ms - (lease / 100 + 2) > 0;
}
