/*-------------------------------------------------------------------------
 *
 * settings.h
 *	  redis_lock.* settings, redis:// URLs and durations in messages
 *	  (settings.c).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/common/settings.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_SETTINGS_H
#define RL_SETTINGS_H

#include "stats.h"

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

#endif							/* RL_SETTINGS_H */
