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

PG_MODULE_MAGIC;

void		_PG_init(void);

/*
 * Module load: settings, counters, scripts and, when preloading, the shared
 * registry and the watchdog worker.  Nothing here talks to Redis.
 */
void
_PG_init(void)
{
	rl_define_settings();
	rl_stats_init();
	rl_scripts_init();
	rl_watchdog_init();
}
