/*-------------------------------------------------------------------------
 *
 * interface.h
 *	  The SQL interface: the module's entry point and hooks (module.c),
 *	  the extension's shared memory (shmem.c), the SQL-callable functions
 *	  (functions.c, statusfunctions.c, semfunctions.c, waits.c) and the
 *	  fence guard trigger (fenceguard.c).  What the files of this folder
 *	  share; no other subsystem includes it.
 *
 *	  Owns: argument checks and result shaping.  Must not: keep lock state
 *	  (lock/ does), or reach Redis but through lock/ and redis/'s operations
 *	  (the status functions inspect through rl_lock_ops_run).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/interface/interface.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_INTERFACE_H
#define RL_INTERFACE_H

#include "base/base.h"
#include "fmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

/* ----------------------------------------------------------------
 * From functions_int:
 *	  What the files of SQL-callable functions share: argument checks and
 *	  result helpers (functions.c, statusfunctions.c), used by the lock
 *	  functions, the status functions and the semaphore functions
 *	  (semfunctions.c).  Nothing else includes it.
 * ----------------------------------------------------------------
 */
extern char *rl_fn_arg_name(FunctionCallInfo fcinfo, int argno);
extern char *rl_fn_arg_semaphore_name(FunctionCallInfo fcinfo, int argno);
extern int64 rl_fn_arg_interval_ms(FunctionCallInfo fcinfo, int argno,
								   const char *what, bool zero_ok);
extern bool rl_fn_arg_bool(FunctionCallInfo fcinfo, int argno, const char *what);
extern Datum rl_fn_mode_datum(RLProtocol protocol);
extern Interval *rl_fn_ms_to_interval(int64 ms);
extern void rl_fn_materialize(FunctionCallInfo fcinfo, Tuplestorestate **ts,
							  TupleDesc *td);
extern void rl_fn_check_scope(bool xact);

/* ----------------------------------------------------------------
 * From shmem:
 *	  The extension's one shared-memory area and its hooks (shmem.c),
 *	  set up from _PG_init (module.c).
 * ----------------------------------------------------------------
 */
extern void rl_shmem_init(void);

#endif							/* RL_INTERFACE_H */
