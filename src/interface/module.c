/*-------------------------------------------------------------------------
 *
 * module.c
 *	  Module entry point: defines the settings, prepares the scripts and,
 *	  when loaded through shared_preload_libraries, the watchdog worker and
 *	  the shared memory (shmem.c); installs the hooks (DISCARD
 *	  ALL, and with preloading the statement check of locklost.c and its
 *	  error-context callback around what runs a statement).  Opens no
 *	  connection.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/interface/module.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/executor.h"
#include "fmgr.h"
#include "nodes/parsenodes.h"
#include "parser/analyze.h"
#include "tcop/utility.h"
#include "utils/elog.h"

#include "redis/redis.h"
#include "worker/worker.h"
#include "lock/lock.h"
#include "interface/interface.h"

#ifdef PG_MODULE_MAGIC_EXT
PG_MODULE_MAGIC_EXT(.name = "redis_lock",.version = RL_VERSION);
#else
PG_MODULE_MAGIC;
#endif

void		_PG_init(void);

static ProcessUtility_hook_type prev_ProcessUtility = NULL;
static ExecutorStart_hook_type prev_ExecutorStart = NULL;
static ExecutorRun_hook_type prev_ExecutorRun = NULL;
static ExecutorFinish_hook_type prev_ExecutorFinish = NULL;
static post_parse_analyze_hook_type prev_post_parse_analyze = NULL;

/*
 * Does a utility statement go on with the transaction (so that a lock lost
 * while it was idle fails it first)?  Not ROLLBACK and its kin.
 */
static bool
continues_transaction(Node *stmt)
{
	if (IsA(stmt, TransactionStmt))
	{
		TransactionStmtKind kind = ((TransactionStmt *) stmt)->kind;

		return kind == TRANS_STMT_COMMIT || kind == TRANS_STMT_PREPARE ||
			kind == TRANS_STMT_SAVEPOINT || kind == TRANS_STMT_RELEASE;
	}
	return true;
}

/*
 * ProcessUtility_hook: after DISCARD ALL, release this session's
 * session-scoped Redis locks, as DISCARD ALL releases advisory locks (a
 * connection pooler's reset must not hand them to the next client).  With
 * preloading, a lock lost while it runs (a CALL, a DO block, COMMIT) fails
 * it first, or is raised where the worker's cancel is (rl_lost_push_context).
 */
#if PG_VERSION_NUM < 140000
#define readOnlyTree_arg
#else
#define readOnlyTree_arg readOnlyTree,
#endif

static void
redis_lock_ProcessUtility(PlannedStmt *pstmt, const char *queryString,
#if PG_VERSION_NUM >= 140000
						  bool readOnlyTree,
#endif
						  ProcessUtilityContext context,
						  ParamListInfo params, QueryEnvironment *queryEnv,
						  DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;
	bool		discard_all = IsA(stmt, DiscardStmt) &&
		((DiscardStmt *) stmt)->target == DISCARD_ALL;
	ErrorContextCallback loss_context;

	if (continues_transaction(stmt))
		rl_lost_check_statement();
	rl_lost_push_context(&loss_context);
	if (prev_ProcessUtility)
		prev_ProcessUtility(pstmt, queryString, readOnlyTree_arg context,
							params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree_arg context,
								params, queryEnv, dest, qc);
	rl_lost_pop_context(&loss_context);
	if (discard_all)
		rl_discard_session_locks();
}

/*
 * post_parse_analyze_hook: every statement, simple or extended protocol,
 * is analysed outside any PG_TRY block, where the loss callback put at the
 * bottom of error_context_stack stays until the next error's recovery
 * (rl_lost_keep_context): so the worker's cancel that lands while the
 * statement is planned, in ExecutorStart or ExecutorEnd, or in its commit
 * is the loss too.
 */
#if PG_VERSION_NUM >= 190000
#define rl_jumble_const const
#else
#define rl_jumble_const
#endif

#if PG_VERSION_NUM >= 140000
static void
redis_lock_post_parse_analyze(ParseState *pstate, Query *query,
							  rl_jumble_const JumbleState *jstate)
{
	rl_lost_keep_context();
	if (prev_post_parse_analyze)
		prev_post_parse_analyze(pstate, query, jstate);
}
#else
static void
redis_lock_post_parse_analyze(ParseState *pstate, Query *query)
{
	rl_lost_keep_context();
	if (prev_post_parse_analyze)
		prev_post_parse_analyze(pstate, query);
}
#endif

/*
 * ExecutorStart_hook: a lock lost while the session was idle in its
 * transaction fails the transaction before the statement runs
 * (rl_lost_check_statement; O(1) while no lock was found lost).
 */
static void
redis_lock_ExecutorStart(QueryDesc *queryDesc, int eflags)
{
	if ((eflags & EXEC_FLAG_EXPLAIN_ONLY) == 0)
		rl_lost_check_statement();
	if (prev_ExecutorStart)
		prev_ExecutorStart(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

/*
 * ExecutorRun_hook and ExecutorFinish_hook (which fires AFTER triggers): a
 * cancel the worker sent because a lock was lost is raised as that loss
 * where it is raised (rl_lost_push_context).  Only with preloading.
 */
#if PG_VERSION_NUM >= 180000
#define execute_once_param
#define execute_once_arg
#else
#define execute_once_param , bool execute_once
#define execute_once_arg , execute_once
#endif

static void
redis_lock_ExecutorRun(QueryDesc *queryDesc, ScanDirection direction,
					   uint64 count execute_once_param)
{
	ErrorContextCallback loss_context;

	rl_lost_push_context(&loss_context);
	if (prev_ExecutorRun)
		prev_ExecutorRun(queryDesc, direction, count execute_once_arg);
	else
		standard_ExecutorRun(queryDesc, direction, count execute_once_arg);
	rl_lost_pop_context(&loss_context);
}

static void
redis_lock_ExecutorFinish(QueryDesc *queryDesc)
{
	ErrorContextCallback loss_context;

	rl_lost_push_context(&loss_context);
	if (prev_ExecutorFinish)
		prev_ExecutorFinish(queryDesc);
	else
		standard_ExecutorFinish(queryDesc);
	rl_lost_pop_context(&loss_context);
}

/*
 * Module load: settings, scripts and, when preloading, the watchdog worker
 * and the shared memory (the counters, the registry, the local wait queues,
 * the deadlock records and the published waits: shmem.c).  Nothing here
 * talks to Redis.
 */
void
_PG_init(void)
{
	rl_define_settings();
	rl_scripts_init();
	rl_watchdog_init();
	rl_shmem_init();
	prev_ProcessUtility = ProcessUtility_hook;
	ProcessUtility_hook = redis_lock_ProcessUtility;
	/* only the worker finds locks lost while their holder works */
	if (process_shared_preload_libraries_in_progress)
	{
		prev_ExecutorStart = ExecutorStart_hook;
		ExecutorStart_hook = redis_lock_ExecutorStart;
		prev_ExecutorRun = ExecutorRun_hook;
		ExecutorRun_hook = redis_lock_ExecutorRun;
		prev_ExecutorFinish = ExecutorFinish_hook;
		ExecutorFinish_hook = redis_lock_ExecutorFinish;
		prev_post_parse_analyze = post_parse_analyze_hook;
		post_parse_analyze_hook = redis_lock_post_parse_analyze;
	}
}
