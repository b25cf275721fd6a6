/*-------------------------------------------------------------------------
 *
 * base.h
 *	  The bottom of redis_lock's stack: the limits every subsystem shares,
 *	  the settings (settings.c: GUCs, redis_lock.url, the password file)
 *	  and the counters and wait events (stats.c).
 *
 * Subsystems, top to bottom.  Each is a folder of src/ with one public
 * header of its name (and, where its files share more, a <name>_int.h no
 * other folder includes); each calls only the subsystems below it:
 *
 *	interface/  the module's entry point and hooks, the SQL-callable
 *				functions, the fence guard trigger
 *	lock/		the backend's table of held locks: acquire, release, extend,
 *				transactions, doubts, losses
 *	wait/		server-local wait queues and the deadlock check
 *	worker/		the shared registry of every backend's locks and the
 *				background worker that renews them
 *	redis/		what is sent to Redis for each operation and how each reply
 *				is read; one operation over every node of a target
 *	net/		connections, TLS, pipelined round trips, subscriptions, where
 *				a key lives
 *	base/		limits, settings, counters
 *
 * doc/architecture.md draws them and names every file.
 *
 * Owns: the settings' values and the shared counters.  Must not: call any
 * other subsystem.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/base/base.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_BASE_H
#define RL_BASE_H

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

/* ----------------------------------------------------------------
 * From stats:
 *	  The counters behind redis_lock_stats() and the wait events shown in
 *	  pg_stat_activity (stats.c).
 * ----------------------------------------------------------------
 */
typedef enum RLStatId
{
	RL_STAT_ACQUIRED,
	RL_STAT_FAILED,
	RL_STAT_TIMED_OUT,
	RL_STAT_WAITS,
	RL_STAT_WAIT_US,
	RL_STAT_RENEWALS,
	RL_STAT_LOST,
	RL_STAT_RECONNECTS,
	RL_STAT_RELEASED,
	RL_STAT_INTERRUPTED,		/* statements failed because a lock was lost */
	RL_STAT_COUNT
} RLStatId;

typedef struct RLStats
{
	uint64		value[RL_STAT_COUNT];
} RLStats;

/*
 * What a wait of ours is for.  On PostgreSQL 17 and later each kind is a
 * named wait event of its own (RedisLockConnect, ...); before 17 all of
 * them show as the generic "Extension".
 */
typedef enum RLWaitKind
{
	RL_WAIT_CONNECT,			/* TCP connect and TLS handshake to Redis */
	RL_WAIT_REPLY,				/* a round trip: replies to sent commands */
	RL_WAIT_RELEASE,			/* a held lock's release message, or a poll */
	RL_WAIT_RETRY,				/* pause before resending (cluster TRYAGAIN) */
	RL_WAIT_WATCHDOG,			/* the watchdog worker between cycles */
	RL_WAIT_QUEUE,				/* behind another local waiter for the lock */
	RL_WAIT_KIND_COUNT
} RLWaitKind;

extern Size rl_stats_shmem_size(void);
extern void rl_stats_shmem_init(void *area, bool found);
extern void rl_stats_add(RLStatId id, uint64 n);
extern void rl_stats_read(RLStats *out);
extern uint32 rl_wait_event(RLWaitKind kind);

/* ----------------------------------------------------------------
 * From settings:
 *	  redis_lock.* settings, redis:// URLs and durations in messages
 *	  (settings.c).
 * ----------------------------------------------------------------
 */
/*
 * Wire layout of one lock.  redis_lock.protocol chooses among the first
 * three for exclusive locks; the read and the write hold of a read-write
 * lock always use Redisson's RReadWriteLock layout, whatever that setting
 * says.
 */
typedef enum RLProtocol
{
	RL_PROTOCOL_SIMPLE,
	RL_PROTOCOL_REDISSON,
	RL_PROTOCOL_REDISSON_FAIR,
	RL_PROTOCOL_RW_READ,
	RL_PROTOCOL_RW_WRITE,
	RL_PROTOCOL_SEM_REDISSON,	/* a semaphore's permits: Redisson's
								 * RPermitExpirableSemaphore (RSemaphore
								 * shares its counter and channel) */
	RL_PROTOCOL_SEM_NPM			/* a semaphore's permits: redis-semaphore's
								 * (npm) sorted set */
} RLProtocol;

#define RL_PROTOCOL_IS_RW(p) ((p) == RL_PROTOCOL_RW_READ || (p) == RL_PROTOCOL_RW_WRITE)
#define RL_PROTOCOL_IS_SEM(p) ((p) == RL_PROTOCOL_SEM_REDISSON || (p) == RL_PROTOCOL_SEM_NPM)

/* What the holder is made to do when the worker finds its lock lost */
typedef enum RLOnLost
{
	RL_ON_LOST_WARN,			/* a WARNING at its next redis_lock call */
	RL_ON_LOST_ERROR,			/* its running statement fails (40001) */
	RL_ON_LOST_TERMINATE		/* its backend is ended */
} RLOnLost;

extern char *rl_url;
extern char *rl_password;
extern char *rl_password_file;
extern char *rl_key_prefix;
extern char *rl_release_channel_prefix;
extern int	rl_lease_time_ms;
extern int	rl_wait_timeout_ms;
extern int	rl_connect_timeout_ms;
extern int	rl_command_timeout_ms;
extern int	rl_protocol;
extern int	rl_semaphore_protocol;
extern int	rl_on_lost;
extern bool rl_scripting;
extern bool rl_redisson_token_counter;
extern bool rl_verify_on_commit;
extern bool rl_session_locks;
extern int	rl_max_locks;
extern int	rl_max_locks_per_session;
extern int	rl_max_locks_per_role;
extern char *rl_nodes;
extern char *rl_sentinels;
extern char *rl_sentinel_master;
extern bool rl_cluster;
extern int	rl_wait_replicas;
extern int	rl_wait_replicas_timeout_ms;
extern bool rl_sharded_pubsub;
extern int	rl_node_timeout_ms;
extern char *rl_sentinel_password;
extern char *rl_tls_ca_file;
extern char *rl_tls_cert_file;
extern char *rl_tls_key_file;
extern int	rl_tls_verify;

typedef enum RLTlsVerify
{
	RL_TLS_VERIFY_FULL,			/* CA chain and the URL's host name or IP */
	RL_TLS_VERIFY_CA,			/* CA chain only */
	RL_TLS_VERIFY_NONE			/* encrypt without verifying */
} RLTlsVerify;

/* Bumped whenever a setting that changes where or how we connect changes */
extern uint64 rl_settings_generation;

/* One Redis server address, as parsed from a redis:// URL */
typedef struct RLEndpoint
{
	char		host[256];
	int			port;
	int			db;
	char		user[128];		/* ACL user, "" for none */
	bool		tls;			/* rediss:// */
	bool		sentinel;		/* a Sentinel: its own password, no SELECT */
} RLEndpoint;

extern void rl_define_settings(void);
extern bool rl_parse_url(const char *url, RLEndpoint *ep, char **errmsg);
extern char *rl_endpoint_label(const RLEndpoint *ep);
extern char *rl_password_file_lookup(const RLEndpoint *ep);
extern const char *rl_protocol_name(RLProtocol p);
extern char *rl_format_ms(int64 ms);
extern int	rl_session_lock_limit(void);
extern int	rl_role_lock_limit(void);

/* ----------------------------------------------------------------
 * What the subsystems above pass through one another: the handles they
 * hand on by pointer (each defined in its own subsystem's header, as
 * "struct X"), and the two small types they share by value.  A header
 * that needs no more than these includes base.h alone.
 * ----------------------------------------------------------------
 */
typedef struct RLStream RLStream;	/* net.h: the bytes of one connection */
typedef struct RLConn RLConn;	/* net.h: a cached connection */
typedef struct RLReply RLReply; /* net.h: a copied reply */
typedef struct RLCall RLCall;	/* net.h: one command and its outcome */
typedef struct RLTarget RLTarget;	/* net.h: where a lock lives */
typedef struct RLLockOp RLLockOp;	/* redis.h: one lock operation */
typedef struct RLManyOp RLManyOp;	/* redis.h: several locks at once */
typedef struct RLHeld RLHeld;	/* lock.h: an entry of the lock table */
typedef struct RLRegistryHold RLRegistryHold;	/* worker.h: a hold of a lock
												 * waited for */

/* What a round trip does with a transport failure */
typedef enum RLRunMode
{
	RL_RUN_HARD,				/* the first one is an ERROR */
	RL_RUN_SOFT					/* each is recorded in its RLCall */
} RLRunMode;

/* Names of everything one lock touches in Redis */
typedef struct RLLockNames
{
	RLProtocol	protocol;
	char	   *key;
	size_t		keylen;
	char	   *fence_key;
	char	   *channel;
	char	   *release_channel;	/* simple layout: where a release also
									 * publishes the key (the
									 * redis_lock.release_channel_prefix of
									 * when it was built, then the key), or
									 * NULL */
	/* token or hash field of this grant, made by rl_mint_owner */
	char		owner[RL_OWNER_LEN + 1];

	/*
	 * a read hold's: the owner value of the session's write hold of the lock
	 * when the read was tried (its field lets the read in), or ""
	 */
	char		writer[RL_OWNER_LEN + 1];
	bool		script_free;	/* simple layout without Lua scripts
								 * (redis_lock.scripting off when built) */
	int			permits;		/* semaphores: how many permits the holder
								 * takes; their ids are named from owner */
	int			max_permits;	/* redis_semaphore: the limit each client
								 * passes (none is stored in Redis) */
	bool		name_counter;	/* redisson layouts: fencing tokens also
								 * count Redisson's per-name counter
								 * (redis_lock.redisson_token_counter on
								 * when built) */
} RLLockNames;

#endif							/* RL_BASE_H */
