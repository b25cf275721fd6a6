/*-------------------------------------------------------------------------
 *
 * common.h
 *	  The bottom of redis_lock's stack: the limits every layer shares.
 *	  Declarations only; the wait events all layers use are in stats.h.
 *
 * Layering, top to bottom; each file calls only into the layers below it,
 * and each layer's header includes only the header of the layer below:
 *
 *	functions.c   SQL-callable functions: argument checks, result shaping
 *	fenceguard.c  beside it: the fence guard trigger, which calls no other
 *				  layer (PostgreSQL only)
 *	lockmany.c    beside the lock table: several locks acquired at once,
 *				  all or nothing; keeps the table only through the rl_many_*
 *				  interface of locktable.h (lockacquire.c, lockrelease.c)
 *	lockxact.c    the lock table's transaction, subtransaction and
 *				  backend-exit callbacks (registered by locktable.c)
 *	lockrelease.c release, extend, release of every session hold, dropping
 *				  the holds of a scope
 *	lockacquire.c acquire: attempts, reentrancy, the wait for a busy lock,
 *				  the rl_many_* interface lockmany.c acquires through
 *	locklost.c    what a holder does once the worker found its lock lost
 *	lockdoubts.c  releases sent without waiting, doubts, rl_safe_point
 *	locktable.c   per-backend table of held locks: entries, their holds and
 *				  registry slots, operations on their nodes (what the five
 *				  lock*.c files share is in locktable_int.h)
 *	deadlock.c    deadlocks through Redis locks among this server's backends:
 *				  what each waiter waits for, in shared memory, and the check
 *				  a waiter runs from deadlock_timeout on
 *	waitqueue.c   server-local queues of the backends waiting for the same
 *				  lock in shared memory: one contends in Redis, the rest sleep
 *	watchdog.c    the background worker that renews every backend's locks
 *				  and cleans up what exited backends left, from the registry
 *	watchevents.c the worker's subscriptions to the keyspace notifications
 *				  of the locks it renews: a key gone is renewed at once
 *	registry.c    the shared-memory registry of every backend's locks
 *				  (its layout, shared with watchdog.c only, is registry_int.h)
 *	lockop.c      one lock operation over every node of a target, with the
 *				  per-node answers counted by majority
 *	scripts.c     the wire layouts' Lua scripts, EVALSHA with NOSCRIPT
 *				  recovery, the scripted form of each operation, and the
 *				  choice of form (rl_build_unit)
 *	scriptfree.c  the script-free forms (redis_lock.scripting off) and what
 *				  each server offers of them
 *	replies.c     decoding the replies of either form
 *	protocol.c    key and channel names, owner tokens, pub/sub commands:
 *				  what every form uses (shared with the three above through
 *				  protocol_int.h)
 *	topology.c    where a key lives: single node, Redlock masters, Sentinel,
 *				  Cluster slot map
 *	pubsub.c      subscriber connections: subscribe, unsubscribe, wait on
 *				  the latch for a release message
 *	transport.c   pipelined round trips over one or many connections, with
 *				  each connection's (re)connect and handshake
 *	owed.c        calls sent without waiting, and the replies their
 *				  connections owe
 *	connection.c  the cache of connections to Redis servers, latch waits on
 *				  their sockets, reply copies, calls and their failures
 *				  (what the four share is in transport_int.h)
 *	stream.c      the bytes of one connection: socket, TLS (OpenSSL), the
 *				  hiredis RESP codec
 *	resolve.c     host names to addresses (c-ares), waited for on the latch
 *	settings.c    GUCs, parsing of redis_lock.url, the password file,
 *				  durations for messages
 *	stats.c       the counters of redis_lock_stats(), the wait events
 *
 * module.c, the entry point, sits above them all.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/common/common.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_COMMON_H
#define RL_COMMON_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "utils/timestamp.h"

/*
 * hash_create() flag of a table keyed by C strings: HASH_STRINGS since
 * PostgreSQL 14, what a table without HASH_BLOBS was before
 */
#if PG_VERSION_NUM >= 140000
#define RL_HASH_STRINGS		HASH_STRINGS
#else
#define RL_HASH_STRINGS		0
#endif

/* Longest lock name accepted, in bytes (doc/reference.md, "Functions") */
#define RL_MAX_NAME_LEN		512
/* Longest key_prefix accepted, in bytes */
#define RL_MAX_PREFIX_LEN	256
/* Largest Redis key we build: prefix + name */
#define RL_MAX_KEY_LEN		(RL_MAX_PREFIX_LEN + RL_MAX_NAME_LEN)
/*
 * Owner values (protocol.c, rl_mint_owner): simple = "pgrl:" + 32 hex chars;
 * Redisson's layouts "<uuid>:<pid>", ":write" added for a write hold
 */
#define RL_OWNER_LEN		64
/*
 * What redis_lock_status() takes for a lock of any client (protocol.c,
 * rl_is_lock_value, rl_is_holder_field): a string value of at most this many
 * bytes, a hash of at most this many fields ("mode" included)
 */
#define RL_LOCK_VALUE_MAX	128
#define RL_LOCK_FIELDS_MAX	64
/* Most Redis servers one lock lives on (Redlock masters) */
#define RL_MAX_NODES		16
/* Largest lease or wait, in milliseconds (fits a signed 32-bit int) */
#define RL_MAX_MS			((int64) PG_INT32_MAX)

/*
 * A case that falls through to the next: PostgreSQL 19 builds with
 * -Wimplicit-fallthrough=5, where only the attribute counts, and defines
 * pg_fallthrough in c.h; for 13-18 it is defined here the same way.
 */
#ifndef pg_fallthrough
#if defined(__has_attribute)
#if __has_attribute(fallthrough)
#define pg_fallthrough __attribute__((fallthrough))
#endif
#endif
#endif
#ifndef pg_fallthrough
#define pg_fallthrough ((void) 0)
#endif

/*
 * The extension's version, as redis_lock.control's default_version: what
 * PostgreSQL 18's pg_get_loaded_modules() shows (module.c).
 */
#define RL_VERSION			"1.4"

/*
 * The longest any wait for Redis may last while interrupts are held (on the
 * paths that must not fail: COMMIT, ABORT, ROLLBACK TO SAVEPOINT, error
 * paths, DISCARD), counted from its start, whatever
 * redis_lock.connect_timeout and command_timeout say: a cancel or terminate
 * that comes meanwhile, or the one already served that caused the abort,
 * is held off no longer.  With preloading those paths do not wait at all
 * (their work goes to the watchdog worker); without it, this bounds them.
 * Backend exit has its own bound (lockxact.c).
 */
#define RL_HELD_WAIT_CUT_MS 300

/*
 * Must a wait for Redis that begins now end within RL_HELD_WAIT_CUT_MS?
 * Whenever interrupts are held, except during backend exit, whose waits are
 * bounded by the exit's own timeouts.
 */
static inline bool
rl_held_wait_bounded(void)
{
	return InterruptHoldoffCount > 0 && !proc_exit_inprogress;
}

/*
 * A function that never returns.  PostgreSQL 18 replaced the trailing
 * pg_attribute_noreturn() by the leading pg_noreturn; before it, the same
 * attribute leads the declaration (GCC and Clang accept it there).
 */
#ifndef pg_noreturn
#define pg_noreturn pg_attribute_noreturn()
#endif

#endif							/* RL_COMMON_H */
