/*-------------------------------------------------------------------------
 *
 * settings.c
 *	  Owns every redis_lock.* setting (GUC), their check hooks, and the
 *	  refusal of passwords stored where every role can read them.  URLs are
 *	  parsed by url.c; the password file is read by passwordfile.c, on
 *	  behalf of whoever connects (transport.c's handshake).
 *
 *	  Nothing here talks to Redis or touches the lock table.  Changing a
 *	  setting that decides where or how we connect bumps
 *	  rl_settings_generation; connection.c, transport.c and topology.c
 *	  compare it to drop what they cached.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/base/settings.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <ctype.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "miscadmin.h"
#include "storage/fd.h"
#include "utils/guc.h"

#include "base/base_int.h"

char	   *rl_url = NULL;
char	   *rl_password = NULL;
char	   *rl_password_file = NULL;
char	   *rl_key_prefix = NULL;
char	   *rl_release_channel_prefix = NULL;
int			rl_lease_time_ms = 30000;
int			rl_wait_timeout_ms = 10000;
int			rl_connect_timeout_ms = 2000;
int			rl_command_timeout_ms = 2000;
int			rl_protocol = RL_PROTOCOL_SIMPLE;
int			rl_semaphore_protocol = RL_PROTOCOL_SEM_REDISSON;
int			rl_on_lost = RL_ON_LOST_ERROR;
bool		rl_scripting = true;
bool		rl_redisson_token_counter = false;
bool		rl_verify_on_commit = true;
bool		rl_session_locks = true;
int			rl_max_locks = 1024;
int			rl_max_locks_per_session = -1;
int			rl_max_locks_per_role = -1;
char	   *rl_nodes = NULL;
char	   *rl_sentinels = NULL;
char	   *rl_sentinel_master = NULL;
bool		rl_cluster = false;
int			rl_wait_replicas = 0;
int			rl_wait_replicas_timeout_ms = 100;
bool		rl_sharded_pubsub = false;
int			rl_node_timeout_ms = 100;
char	   *rl_sentinel_password = NULL;
char	   *rl_tls_ca_file = NULL;
char	   *rl_tls_cert_file = NULL;
char	   *rl_tls_key_file = NULL;
int			rl_tls_verify = RL_TLS_VERIFY_FULL;

uint64		rl_settings_generation = 1;

/* Were the settings defined while being preloaded (inherited by backends)? */
static bool settings_preloaded = false;

static const struct config_enum_entry tls_verify_options[] = {
	{"full", RL_TLS_VERIFY_FULL, false},
	{"ca", RL_TLS_VERIFY_CA, false},
	{"none", RL_TLS_VERIFY_NONE, false},
	{NULL, 0, false}
};

static const struct config_enum_entry protocol_options[] = {
	{"simple", RL_PROTOCOL_SIMPLE, false},
	{"redisson", RL_PROTOCOL_REDISSON, false},
	{"redisson_fair", RL_PROTOCOL_REDISSON_FAIR, false},
	{NULL, 0, false}
};

static const struct config_enum_entry semaphore_protocol_options[] = {
	{"redisson", RL_PROTOCOL_SEM_REDISSON, false},
	{"redis_semaphore", RL_PROTOCOL_SEM_NPM, false},
	{NULL, 0, false}
};

static const struct config_enum_entry on_lost_options[] = {
	{"warn", RL_ON_LOST_WARN, false},
	{"error", RL_ON_LOST_ERROR, false},
	{"terminate", RL_ON_LOST_TERMINATE, false},
	{NULL, 0, false}
};

/* The redis_lock.protocol value that names p, for messages */
const char *
rl_protocol_name(RLProtocol p)
{
	switch (p)
	{
		case RL_PROTOCOL_SIMPLE:
			break;
		case RL_PROTOCOL_REDISSON:
			return "redisson";
		case RL_PROTOCOL_REDISSON_FAIR:
			return "redisson_fair";
		case RL_PROTOCOL_RW_READ:
		case RL_PROTOCOL_RW_WRITE:
			return "redisson_rwlock";
		case RL_PROTOCOL_SEM_REDISSON:
			return "redisson_semaphore";
		case RL_PROTOCOL_SEM_NPM:
			return "redis_semaphore";
	}
	return "simple";
}

/*
 * A refused URL's error.  PostgreSQL's own message would repeat the value,
 * so one that carries a password gets a message of ours that does not: the
 * URL was refused, the password still must not reach the log.
 */
static void
url_refused(const char *setting, const char *url, const char *msg)
{
	if (msg == rl_url_password_msg)
	{
		GUC_check_errmsg("a URL in parameter \"%s\" carries a password", setting);
		GUC_check_errdetail("%s", _(msg));
		GUC_check_errhint("Put the password in redis_lock.password_file or redis_lock.password.");
	}
	else if (url != NULL)
		GUC_check_errdetail("\"%s\": %s", url, _(msg));
	else
		GUC_check_errdetail("%s", _(msg));
}

static bool
check_url(char **newval, void **extra, GucSource source)
{
	RLEndpoint	ep;
	char	   *msg;

	if (!rl_parse_url(*newval, &ep, &msg))
	{
		url_refused("redis_lock.url", NULL, msg);
		return false;
	}
	return true;
}

/*
 * Comma-separated list of at most max URLs; empty is fine.  Returns false
 * with the GUC error detail set.
 */
static bool
check_url_list_of(const char *setting, const char *list, int max,
				  const char *what)
{
	char	   *copy;
	char	   *tok;
	char	   *save = NULL;
	int			n = 0;

	if (list == NULL || *list == '\0')
		return true;
	copy = pstrdup(list);
	for (tok = strtok_r(copy, ", \t", &save); tok != NULL;
		 tok = strtok_r(NULL, ", \t", &save))
	{
		RLEndpoint	ep;
		char	   *msg;

		if (!rl_parse_url(tok, &ep, &msg))
		{
			url_refused(setting, tok, msg);
			pfree(copy);
			return false;
		}
		if (++n > max)
		{
			GUC_check_errdetail("At most %d %s can be listed.", max, what);
			pfree(copy);
			return false;
		}
	}
	pfree(copy);
	if (n == 0)
	{
		GUC_check_errdetail("The list names no URL; leave it empty to not use %s.", what);
		return false;
	}
	return true;
}

/* The name goes into the target spec, whose fields "|" separates */
static bool
check_master_name(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || **newval == '\0' || strchr(*newval, '|') != NULL)
	{
		GUC_check_errdetail("The master name must be non-empty and must not contain \"|\".");
		return false;
	}
	return true;
}

/* Redlock masters: every one is asked at once, each on its own socket */
static bool
check_nodes(char **newval, void **extra, GucSource source)
{
	return check_url_list_of("redis_lock.nodes", *newval, RL_MAX_NODES,
							 "Redlock masters");
}

static bool
check_sentinels(char **newval, void **extra, GucSource source)
{
	return check_url_list_of("redis_lock.sentinels", *newval, INT_MAX,
							 "Sentinels");
}

/*
 * A prefix longer than RL_MAX_PREFIX_LEN is refused, and so is one whose
 * first "{" opens no non-empty {hash tag} inside the prefix: the tag would
 * then run into the lock name, and a lock's fence counter (prefix + a tag of
 * our own) would land in another Redis Cluster slot than the lock.
 */
static bool
check_prefix(char **newval, void **extra, GucSource source)
{
	const char *open;

	if (*newval == NULL)
		return true;
	if (strlen(*newval) > RL_MAX_PREFIX_LEN)
	{
		GUC_check_errdetail("The key prefix must not be longer than %d bytes.",
							RL_MAX_PREFIX_LEN);
		return false;
	}
	open = strchr(*newval, '{');
	if (open != NULL)
	{
		const char *close = strchr(open + 1, '}');

		if (close == NULL || close == open + 1)
		{
			GUC_check_errdetail("A \"{\" in the key prefix must open a non-empty {hash tag} closed within the prefix.");
			return false;
		}
	}
	return true;
}

/*
 * redis_lock.release_channel_prefix: no longer than a key prefix, which
 * is what a registry slot keeps of it (RLSlot.release_prefix)
 */
static bool
check_channel_prefix(char **newval, void **extra, GucSource source)
{
	if (*newval != NULL && strlen(*newval) > RL_MAX_PREFIX_LEN)
	{
		GUC_check_errdetail("The release channel prefix must not be longer than %d bytes.",
							RL_MAX_PREFIX_LEN);
		return false;
	}
	return true;
}

/*
 * Is a value of this source kept where every role can read it?  ALTER ROLE
 * and ALTER DATABASE ... SET (and ALTER ROLE ALL ... SET) store it in
 * pg_db_role_setting, CREATE and ALTER FUNCTION ... SET in pg_proc.proconfig;
 * both are readable by every role (so is pg_roles.rolconfig).  Storing is
 * validated with PGC_S_TEST; a value stored anyway (before redis_lock
 * refused it, or while the module was not loaded, when PostgreSQL checks
 * nothing) is applied at login with PGC_S_GLOBAL, _DATABASE, _USER or
 * _DATABASE_USER, and again with that source when the module is loaded
 * later in the session (define_custom_variable); PostgreSQL then reports our
 * refusal as a WARNING and keeps the previous value.  The same on 13 to 18.
 * postgresql.conf and ALTER SYSTEM (PGC_S_FILE, readable by the server's OS
 * user only), the command line, the client's startup packet and a session's
 * SET are not stored in a catalog (but see source_is_public_placeholder).  A function whose SET clause was stored
 * before this check still applies it when called (PGC_S_SESSION, which we
 * cannot tell from SET).
 */
static bool
source_is_catalog(GucSource source)
{
	switch (source)
	{
		case PGC_S_GLOBAL:
		case PGC_S_DATABASE:
		case PGC_S_USER:
		case PGC_S_DATABASE_USER:
		case PGC_S_TEST:
			return true;
		default:
			return false;
	}
}

/*
 * Is a value of this source, the server's configuration, a placeholder in
 * every session until the session loads us?  A placeholder is not
 * GUC_SUPERUSER_ONLY: any role can SHOW it.  Only preloading defines our
 * settings before a session runs a query.
 */
static bool
source_is_public_placeholder(GucSource source)
{
	if (settings_preloaded)
		return false;
	return source == PGC_S_FILE || source == PGC_S_ARGV || source == PGC_S_ENV_VAR;
}

/*
 * A password is refused where every role could read it.  The message is our
 * own: PostgreSQL's would repeat the value.
 */
static bool
check_secret(const char *setting, const char *value, GucSource source)
{
	if (value == NULL || value[0] == '\0')
		return true;
	if (source_is_catalog(source))
	{
		GUC_check_errmsg("parameter \"%s\" cannot be set per role, per database or per function",
						 setting);
		GUC_check_errdetail("Such settings are stored in pg_db_role_setting or pg_proc, which every role can read.");
		GUC_check_errhint("Put the password in the file named by redis_lock.password_file, or in postgresql.conf.");
		return false;
	}
	if (source_is_public_placeholder(source))
	{
		GUC_check_errmsg("parameter \"%s\" in the server configuration requires redis_lock in shared_preload_libraries",
						 setting);
		GUC_check_errdetail("Until a session loads redis_lock, every role can read the value with SHOW.");
		GUC_check_errhint("Add redis_lock to shared_preload_libraries, or put the password in the file named by redis_lock.password_file.");
		return false;
	}
	return true;
}

static bool
check_password(char **newval, void **extra, GucSource source)
{
	return check_secret("redis_lock.password", *newval, source);
}

static bool
check_sentinel_password(char **newval, void **extra, GucSource source)
{
	return check_secret("redis_lock.sentinel_password", *newval, source);
}

static void
bump_generation(const char *newval, void *extra)
{
	rl_settings_generation++;
}

static void
bump_generation_bool(bool newval, void *extra)
{
	rl_settings_generation++;
}

static void
bump_generation_enum(int newval, void *extra)
{
	rl_settings_generation++;
}

/* The kinds of setting PostgreSQL's DefineCustom*Variable can define */
typedef enum RLSettingKind
{
	RL_SETTING_BOOL,
	RL_SETTING_INT,
	RL_SETTING_STRING,
	RL_SETTING_ENUM,
} RLSettingKind;

/*
 * One redis_lock.* setting as rl_define_settings hands it to PostgreSQL.
 * Of the variable, default and hook fields only those of its kind are set;
 * the others stay NULL or zero.
 */
typedef struct RLSettingDesc
{
	RLSettingKind kind;
	const char *name;
	const char *short_desc;
	const char *long_desc;
	GucContext	context;
	int			flags;			/* GUC_* flags other than units */
	int			unit;			/* GUC_UNIT_* or 0 */
	bool		preload_only;	/* defined only while being preloaded */

	bool	   *bool_var;
	int		   *int_var;		/* also the variable of an enum */
	char	  **string_var;

	bool		bool_default;
	int			int_default;	/* also the default of an enum */
	int			int_min;
	int			int_max;
	const char *string_default;
	const struct config_enum_entry *enum_options;

	GucBoolCheckHook bool_check;
	GucIntCheckHook int_check;
	GucStringCheckHook string_check;
	GucEnumCheckHook enum_check;
	GucBoolAssignHook bool_assign;
	GucIntAssignHook int_assign;
	GucStringAssignHook string_assign;
	GucEnumAssignHook enum_assign;
	GucShowHook show_hook;
} RLSettingDesc;

/* Every redis_lock.* setting, in the order they are defined */
static const RLSettingDesc rl_setting_descs[] = {
	{
		.kind = RL_SETTING_STRING,
		.name = "redis_lock.url",
		.short_desc = "Redis server holding the locks, as redis://[user@]host:port/db.",
		.string_var = &rl_url,
		.string_default = "redis://127.0.0.1:6379/0",
		.context = PGC_SUSET,
		.string_check = check_url,
		.string_assign = bump_generation,
	},
	{
		.kind = RL_SETTING_STRING,
		.name = "redis_lock.password",
		.short_desc = "Password sent with AUTH (with the URL's user, ACL AUTH).",
		.string_var = &rl_password,
		.string_default = "",
		.context = PGC_SUSET,
		.flags = GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
		.string_check = check_password,
		.string_assign = bump_generation,
	},

	/*
	 * Read at each new connection by the process that connects, backend or
	 * watchdog worker alike, so it needs no shared memory; server-wide, so
	 * every process reads the same file.
	 */
	{
		.kind = RL_SETTING_STRING,
		.name = "redis_lock.password_file",
		.short_desc = "File of host:port:user:password lines (as libpq's .pgpass) for connections without redis_lock.password or sentinel_password.",
		.string_var = &rl_password_file,
		.string_default = "",
		.context = PGC_SIGHUP,
		.flags = GUC_SUPERUSER_ONLY,
		.string_assign = bump_generation,
	},
	{
		.kind = RL_SETTING_STRING,
		.name = "redis_lock.key_prefix",
		.short_desc = "Prepended to every lock name to form the Redis key.",
		.string_var = &rl_key_prefix,
		.string_default = "",
		.context = PGC_SUSET,
		.string_check = check_prefix,
	},

	/*
	 * Superuser-only, like the key prefix: it names channels other
	 * applications listen on (doc/security.md).  A PUBLISH of the key a
	 * release just deleted; a spurious message only makes a waiter look
	 * again.  Read when a lock is taken (RLLockNames.release_channel), like
	 * the key prefix, and kept in its registry slot for a release the
	 * worker makes for the session; lockop.c pipelines the PUBLISH behind
	 * the release.
	 */
	{
		.kind = RL_SETTING_STRING,
		.name = "redis_lock.release_channel_prefix",
		.short_desc = "When set, each release of a simple-layout lock also publishes the lock's Redis key on the channel named this prefix followed by the key (Spring RedisLockRegistry waiters: '<registryKey>-channel:').",
		.string_var = &rl_release_channel_prefix,
		.string_default = "",
		.context = PGC_SUSET,
		.string_check = check_channel_prefix,
	},
	{
		.kind = RL_SETTING_INT,
		.name = "redis_lock.lease_time",
		.short_desc = "Lease of locks acquired with ttl NULL; the watchdog renews it every third of it.",
		.int_var = &rl_lease_time_ms,
		.int_default = 30000,
		.int_min = 100,
		.int_max = (int) RL_MAX_MS,
		.context = PGC_USERSET,
		.unit = GUC_UNIT_MS,
	},
	{
		.kind = RL_SETTING_INT,
		.name = "redis_lock.wait_timeout",
		.short_desc = "How long an acquire waits when wait is NULL.",
		.int_var = &rl_wait_timeout_ms,
		.int_default = 10000,
		.int_min = 0,
		.int_max = (int) RL_MAX_MS,
		.context = PGC_USERSET,
		.unit = GUC_UNIT_MS,
	},
	{
		.kind = RL_SETTING_INT,
		.name = "redis_lock.connect_timeout",
		.short_desc = "How long to wait for a TCP connection to Redis.",
		.int_var = &rl_connect_timeout_ms,
		.int_default = 2000,
		.int_min = 1,
		.int_max = 3600000,
		.context = PGC_USERSET,
		.unit = GUC_UNIT_MS,
	},
	{
		.kind = RL_SETTING_INT,
		.name = "redis_lock.command_timeout",
		.short_desc = "A Redis reply later than this is treated as a connection failure.",
		.int_var = &rl_command_timeout_ms,
		.int_default = 2000,
		.int_min = 1,
		.int_max = 3600000,
		.context = PGC_USERSET,
		.unit = GUC_UNIT_MS,
	},
	{
		.kind = RL_SETTING_ENUM,
		.name = "redis_lock.protocol",
		.short_desc = "Layout of exclusive locks in Redis: simple (SET NX PX), redisson (RLock hash) or redisson_fair (RFairLock: first come, first served).",
		.int_var = &rl_protocol,
		.int_default = RL_PROTOCOL_SIMPLE,
		.enum_options = protocol_options,
		.context = PGC_USERSET,
	},
	{
		.kind = RL_SETTING_ENUM,
		.name = "redis_lock.semaphore_protocol",
		.short_desc = "Layout of semaphores in Redis: redisson (Redisson's RPermitExpirableSemaphore, shared with RSemaphore) or redis_semaphore (the npm package's sorted set).",
		.int_var = &rl_semaphore_protocol,
		.int_default = RL_PROTOCOL_SEM_REDISSON,
		.enum_options = semaphore_protocol_options,
		.context = PGC_USERSET,
	},

	/*
	 * Any role, for its own session: what it is made to do when one of its
	 * locks is lost (taken with the value at the time of the acquire).  It
	 * can only stop the session's own work.
	 */
	{
		.kind = RL_SETTING_ENUM,
		.name = "redis_lock.on_lost",
		.short_desc = "What the holder of a lock the watchdog finds lost is made to do: warn (at its next call), error (its running statement fails with 40001) or terminate (its backend ends).",
		.int_var = &rl_on_lost,
		.int_default = RL_ON_LOST_ERROR,
		.enum_options = on_lost_options,
		.context = PGC_USERSET,
	},

	/*
	 * Superuser-only: on, every lock name taken under the redisson layouts
	 * leaves a permanent key in Redis (Redisson's RFencedLock counter), so
	 * a role free to choose names could fill Redis with them.  Off, tokens
	 * come from the per-slot counters the simple layout uses (at most 16384
	 * per key prefix).  doc/clients.md says why tokens never go down
	 * either way.
	 */
	{
		.kind = RL_SETTING_BOOL,
		.name = "redis_lock.redisson_token_counter",
		.short_desc = "Under the redisson layouts, also count fencing tokens on Redisson's RFencedLock counter redisson_lock_token:{name}, a permanent key per lock name.",
		.bool_var = &rl_redisson_token_counter,
		.bool_default = false,
		.context = PGC_SUSET,
	},

	/*
	 * Superuser-only like redis_lock.url: whether Lua may be used is a fact
	 * about the server (its ACLs, its kind), not a user's preference.  A
	 * lock keeps the form it was taken with (protocol.c), so changing it
	 * needs no new connections.
	 */
	{
		.kind = RL_SETTING_BOOL,
		.name = "redis_lock.scripting",
		.short_desc = "Use Lua scripts (EVALSHA) for locks; off: the simple layout without scripts, on servers that offer DELIFEQ (Valkey 9.0+) or DELEX (Redis 8.4+).",
		.bool_var = &rl_scripting,
		.bool_default = true,
		.context = PGC_SUSET,
	},
	{
		.kind = RL_SETTING_BOOL,
		.name = "redis_lock.verify_on_commit",
		.short_desc = "Check with Redis before COMMIT that transaction-scoped locks are still held.",
		.bool_var = &rl_verify_on_commit,
		.bool_default = true,
		.context = PGC_USERSET,
	},
	{
		.kind = RL_SETTING_BOOL,
		.name = "redis_lock.session_locks",
		.short_desc = "Allow session-scoped Redis locks (off: only xact => true, for roles behind a transaction-pooling connection pooler).",
		.bool_var = &rl_session_locks,
		.bool_default = true,
		.context = PGC_SUSET,
	},

	/*
	 * A postmaster setting can only exist when we are preloaded.
	 *
	 * The default of 1024 costs 0.9 MB of shared memory: a registry slot
	 * takes 916 bytes (RLSlot, about 912, plus its free-list entry; measured
	 * by bench/run, section watchdog_scale, from pg_shmem_allocations), which
	 * is under 1% of the default shared_buffers and 10 locks for each of the
	 * default max_connections = 100.  Renewing all 1024 at once is two
	 * rounds of 1000, a few ms of the worker.  100 000 locks (92 MB) were
	 * measured renewed in about 0.8 s per full pass, within lease/3 at a
	 * 6 s lease on 2 busy shared cores except right after the worker had
	 * been stopped for lease/3; more costs memory linearly and wants a
	 * longer lease_time.
	 */
	{
		.kind = RL_SETTING_INT,
		.name = "redis_lock.max_locks",
		.short_desc = "Capacity of the watchdog's shared registry of held locks (all backends).",
		.int_var = &rl_max_locks,
		.int_default = 1024,
		.int_min = 16,
		.int_max = 1000000,
		.context = PGC_POSTMASTER,
		.preload_only = true,
	},

	/*
	 * The two limits below keep one session, or one role's sessions, from
	 * taking what the others need (doc/operations.md, "Who may call what").
	 * A superuser sets them, for everyone or per role (ALTER ROLE ... SET).
	 */
	{
		.kind = RL_SETTING_INT,
		.name = "redis_lock.max_locks_per_session",
		.short_desc = "Most Redis locks one session may hold at once (-1: an eighth of redis_lock.max_locks).",
		.long_desc = "Each name and mode counts once, however often it is held; "
		"redis_lock_acquire_many is refused whole when its set does not fit.",
		.int_var = &rl_max_locks_per_session,
		.int_default = -1,
		.int_min = -1,
		.int_max = 1000000,
		.context = PGC_SUSET,
	},
	{
		.kind = RL_SETTING_INT,
		.name = "redis_lock.max_locks_per_role",
		.short_desc = "Most slots of the shared registry the sessions of one role other than a superuser may hold (-1: half of redis_lock.max_locks).",
		.long_desc = "Locks the watchdog still has to release for the role's "
		"exited sessions count too.",
		.int_var = &rl_max_locks_per_role,
		.int_default = -1,
		.int_min = -1,
		.int_max = 1000000,
		.context = PGC_SUSET,
		.preload_only = true,
	},
	{
		.kind = RL_SETTING_STRING,
		.name = "redis_lock.nodes",
		.short_desc = "Comma-separated redis:// URLs of independent masters; when set, locks use Redlock.",
		.string_var = &rl_nodes,
		.string_default = "",
		.context = PGC_SUSET,
		.string_check = check_nodes,
		.string_assign = bump_generation,
	},
	{
		.kind = RL_SETTING_STRING,
		.name = "redis_lock.sentinels",
		.short_desc = "Comma-separated redis:// URLs of Sentinels; when set, the master is discovered through them.",
		.string_var = &rl_sentinels,
		.string_default = "",
		.context = PGC_SUSET,
		.string_check = check_sentinels,
		.string_assign = bump_generation,
	},
	{
		.kind = RL_SETTING_STRING,
		.name = "redis_lock.sentinel_password",
		.short_desc = "Password sent with AUTH to the Sentinels (the master uses redis_lock.password).",
		.string_var = &rl_sentinel_password,
		.string_default = "",
		.context = PGC_SUSET,
		.flags = GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
		.string_check = check_sentinel_password,
		.string_assign = bump_generation,
	},
	{
		.kind = RL_SETTING_INT,
		.name = "redis_lock.node_timeout",
		.short_desc = "Redlock: how long one master may take to answer one request.",
		.int_var = &rl_node_timeout_ms,
		.int_default = 100,
		.int_min = 1,
		.int_max = 60000,
		.context = PGC_USERSET,
		.unit = GUC_UNIT_MS,
	},
	{
		.kind = RL_SETTING_STRING,
		.name = "redis_lock.sentinel_master",
		.short_desc = "Name of the master the Sentinels monitor.",
		.string_var = &rl_sentinel_master,
		.string_default = "mymaster",
		.context = PGC_SUSET,
		.string_check = check_master_name,
		.string_assign = bump_generation,
	},
	{
		.kind = RL_SETTING_BOOL,
		.name = "redis_lock.cluster",
		.short_desc = "Treat redis_lock.url as a seed node of a Redis Cluster.",
		.bool_var = &rl_cluster,
		.bool_default = false,
		.context = PGC_SUSET,
		.bool_assign = bump_generation_bool,
	},
	{
		.kind = RL_SETTING_INT,
		.name = "redis_lock.wait_replicas",
		.short_desc = "After acquiring, wait until this many replicas have the lock (WAIT).",
		.int_var = &rl_wait_replicas,
		.int_default = 0,
		.int_min = 0,
		.int_max = 16,
		.context = PGC_USERSET,
	},
	{
		.kind = RL_SETTING_INT,
		.name = "redis_lock.wait_replicas_timeout",
		.short_desc = "How long WAIT may take after an acquire.",
		.int_var = &rl_wait_replicas_timeout_ms,
		.int_default = 100,
		.int_min = 1,
		.int_max = 60000,
		.context = PGC_USERSET,
		.unit = GUC_UNIT_MS,
	},
	{
		.kind = RL_SETTING_BOOL,
		.name = "redis_lock.sharded_pubsub",
		.short_desc = "Use SPUBLISH/SSUBSCRIBE for wake-ups (Redisson clusters with sharded pub/sub).",
		.bool_var = &rl_sharded_pubsub,
		.bool_default = false,
		.context = PGC_USERSET,
	},
	{
		.kind = RL_SETTING_STRING,
		.name = "redis_lock.tls_ca_file",
		.short_desc = "PEM file of the CAs trusted for rediss:// servers; empty: the system's trust store.",
		.string_var = &rl_tls_ca_file,
		.string_default = "",
		.context = PGC_SUSET,
		.flags = GUC_SUPERUSER_ONLY,
		.string_assign = bump_generation,
	},
	{
		.kind = RL_SETTING_STRING,
		.name = "redis_lock.tls_cert_file",
		.short_desc = "Client certificate (PEM) for mutual TLS.",
		.string_var = &rl_tls_cert_file,
		.string_default = "",
		.context = PGC_SUSET,
		.flags = GUC_SUPERUSER_ONLY,
		.string_assign = bump_generation,
	},
	{
		.kind = RL_SETTING_STRING,
		.name = "redis_lock.tls_key_file",
		.short_desc = "Private key of the client certificate; refused when readable by group or others.",
		.string_var = &rl_tls_key_file,
		.string_default = "",
		.context = PGC_SUSET,
		.flags = GUC_SUPERUSER_ONLY,
		.string_assign = bump_generation,
	},
	{
		.kind = RL_SETTING_ENUM,
		.name = "redis_lock.tls_verify",
		.short_desc = "How rediss:// servers are verified: full (CA and host name), ca, or none.",
		.int_var = &rl_tls_verify,
		.int_default = RL_TLS_VERIFY_FULL,
		.enum_options = tls_verify_options,
		.context = PGC_SUSET,
		.flags = GUC_SUPERUSER_ONLY,
		.enum_assign = bump_generation_enum,
	},
};

/* Hand one descriptor to PostgreSQL */
static void
define_setting(const RLSettingDesc *s)
{
	int			flags = s->flags | s->unit;

	switch (s->kind)
	{
		case RL_SETTING_BOOL:
			DefineCustomBoolVariable(s->name, s->short_desc, s->long_desc,
									 s->bool_var, s->bool_default,
									 s->context, flags,
									 s->bool_check, s->bool_assign,
									 s->show_hook);
			break;
		case RL_SETTING_INT:
			DefineCustomIntVariable(s->name, s->short_desc, s->long_desc,
									s->int_var, s->int_default,
									s->int_min, s->int_max,
									s->context, flags,
									s->int_check, s->int_assign,
									s->show_hook);
			break;
		case RL_SETTING_STRING:
			DefineCustomStringVariable(s->name, s->short_desc, s->long_desc,
									   s->string_var, s->string_default,
									   s->context, flags,
									   s->string_check, s->string_assign,
									   s->show_hook);
			break;
		case RL_SETTING_ENUM:
			DefineCustomEnumVariable(s->name, s->short_desc, s->long_desc,
									 s->int_var, s->int_default,
									 s->enum_options,
									 s->context, flags,
									 s->enum_check, s->enum_assign,
									 s->show_hook);
			break;
	}
}

/*
 * Define every redis_lock.* setting and reserve the prefix; called once from
 * _PG_init.
 */
void
rl_define_settings(void)
{
	settings_preloaded = process_shared_preload_libraries_in_progress;
	for (size_t i = 0; i < lengthof(rl_setting_descs); i++)
	{
		const RLSettingDesc *s = &rl_setting_descs[i];

		if (s->preload_only && !process_shared_preload_libraries_in_progress)
			continue;
		define_setting(s);
	}

#if PG_VERSION_NUM >= 150000
	MarkGUCPrefixReserved("redis_lock");
#else
	EmitWarningsOnPlaceholders("redis_lock");
#endif
}

/* redis_lock.max_locks_per_session in force: -1 is an eighth of max_locks */
int
rl_session_lock_limit(void)
{
	if (rl_max_locks_per_session >= 0)
		return rl_max_locks_per_session;
	return Max(1, rl_max_locks / 8);
}

/* redis_lock.max_locks_per_role in force: -1 is half of max_locks */
int
rl_role_lock_limit(void)
{
	if (rl_max_locks_per_role >= 0)
		return rl_max_locks_per_role;
	return Max(1, rl_max_locks / 2);
}

/* "5s", "250ms", "1.5s" */
char *
rl_format_ms(int64 ms)
{
	if (ms % 1000 == 0)
		return psprintf(INT64_FORMAT "s", ms / 1000);
	if (ms < 1000)
		return psprintf(INT64_FORMAT "ms", ms);
	return psprintf("%.3gs", ms / 1000.0);
}
