/*-------------------------------------------------------------------------
 *
 * module.c
 *	  Module entry point: defines the settings, prepares the scripts and,
 *	  when loaded through shared_preload_libraries, the shared counters, the
 *	  shared registry and the watchdog worker.  Opens no connection.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/module.c
 *
 *-------------------------------------------------------------------------
 */
#include "locktable.h"

#include "fmgr.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"

#ifdef PG_MODULE_MAGIC_EXT
PG_MODULE_MAGIC_EXT(.name = "redis_lock",.version = RL_VERSION);
#else
PG_MODULE_MAGIC;
#endif

void		_PG_init(void);

static ProcessUtility_hook_type prev_ProcessUtility = NULL;

/*
 * ProcessUtility_hook: after DISCARD ALL, release this session's
 * session-scoped Redis locks, as DISCARD ALL releases advisory locks (a
 * connection pooler's reset must not hand them to the next client).
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

	if (prev_ProcessUtility)
		prev_ProcessUtility(pstmt, queryString, readOnlyTree_arg context,
							params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree_arg context,
								params, queryEnv, dest, qc);
	if (discard_all)
		rl_discard_session_locks();
}

/*
 * Module load: settings, counters, scripts and, when preloading, the shared
 * registry, the watchdog worker, the local wait queues and the deadlock
 * records.  Nothing here talks to Redis.
 */
void
_PG_init(void)
{
	rl_define_settings();
	rl_stats_init();
	rl_scripts_init();
	rl_watchdog_init();
	rl_waitq_init();
	rl_deadlock_init();
	prev_ProcessUtility = ProcessUtility_hook;
	ProcessUtility_hook = redis_lock_ProcessUtility;
}
