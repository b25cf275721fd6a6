/*-------------------------------------------------------------------------
 *
 * module.c
 *	  Module entry point: defines the settings, prepares the scripts and,
 *	  when loaded through shared_preload_libraries, the shared registry and
 *	  the watchdog worker.  Opens no connection.
 *
 *-------------------------------------------------------------------------
 */
#include "redis_lock.h"

#include "fmgr.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	rl_define_settings();
	rl_scripts_init();
	rl_watchdog_init();
}
