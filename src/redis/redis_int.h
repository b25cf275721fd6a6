/*-------------------------------------------------------------------------
 *
 * redis_int.h
 *	  What the files of redis/ share, and no other subsystem sees
 *	  (its public header is redis/redis.h).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/redis/redis_int.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef RL_REDIS_INT_H
#define RL_REDIS_INT_H

#include "redis/redis.h"

/* ----------------------------------------------------------------
 * From protocol_int:
 *	  What the files of the wire layouts share among themselves: protocol.c
 *	  (names, tokens), scripts.c, lockscripts.c, semscripts.c, scriptfree.c
 *	  and replies.c.  Nothing
 *	  outside them includes this; the rest of the extension uses
 *	  redis.h.
 * ----------------------------------------------------------------
 */
/* Prefix of our simple-protocol tokens: lets waiters tell that the holder
 * publishes on release (foreign clients such as redis-py do not). */
#define RL_TOKEN_MARKER "pgrl:"

/* What every fence counter's name has after the key prefix */
#define RL_FENCE_MARKER "redis_lock:fence:"

/* lockop.c: WAIT numreplicas behind an acquire (manyop.c too) */
extern void rl_add_wait_call(RLCall *call, RLConn *conn, RLTarget *target);

/* protocol.c: names, tokens and arguments every form uses */
extern void rl_hex_encode(const uint8 *in, int n, char *out);
extern char *rl_ms_text(int64 ms);
extern const char *rl_publish_cmd(void);
extern int64 rl_unix_ms(void);
extern char *rl_unix_ms_text(void);
extern char *rl_fair_queue_key(const RLLockNames *n);
extern char *rl_fair_timeout_key(const RLLockNames *n);
extern char *rl_rw_read_timeout_key(const RLLockNames *n);
extern char *rl_sem_timeout_key(const RLLockNames *n);
extern char *rl_rw_timeout_prefix(const char *key);
extern char *rl_redisson_prefix_name(const char *prefix, const char *key);
extern bool rl_is_lock_value(const char *s, size_t len);
extern bool rl_is_holder_field(const char *s, size_t len, bool *writer);
extern bool rl_is_hold_count(const char *s, size_t len);
extern char *rl_name_counter_key(const RLLockNames *n);

/* One script: its name for messages, its Lua body and their SHA1 */
typedef struct RLScript
{
	const char *name;			/* for messages */
	const char *body;
	char		sha[41];
} RLScript;

/* lockscripts.c and semscripts.c: the Lua bodies of scripts.c's table */
extern void rl_lock_scripts_define(RLScript *table);
extern void rl_sem_scripts_define(RLScript *table);

/* scriptfree.c: the script-free form of an operation */
extern int	rl_free_unit(RLCall *unit, RLConn *conn, RLOpKind kind,
						 const RLLockNames *n, int64 lease_ms, bool fence);

#endif							/* RL_REDIS_INT_H */
