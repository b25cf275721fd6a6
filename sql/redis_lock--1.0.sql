/* redis_lock--1.0.sql — the SQL functions (doc/reference.md, "Functions") */

\echo Use "CREATE EXTENSION redis_lock" to load this file. \quit

CREATE FUNCTION redis_lock_acquire(lock_name pg_catalog.text,
                                   ttl interval DEFAULT NULL,
                                   wait interval DEFAULT NULL,
                                   xact boolean DEFAULT false)
RETURNS bigint
AS 'MODULE_PATHNAME', 'redis_lock_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_acquire(pg_catalog.text, interval, interval, boolean) IS
'take a Redis lock, waiting up to wait; returns its fencing token';

CREATE FUNCTION redis_lock_try_acquire(lock_name pg_catalog.text,
                                       ttl interval DEFAULT NULL,
                                       wait interval DEFAULT '0',
                                       xact boolean DEFAULT false)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_try_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_try_acquire(pg_catalog.text, interval, interval, boolean) IS
'take a Redis lock if it can be had within wait; false otherwise';

CREATE FUNCTION redis_lock_release(lock_name pg_catalog.text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_release(pg_catalog.text) IS
'drop one session-scoped hold of a Redis lock';

CREATE FUNCTION redis_lock_release_all()
RETURNS integer
AS 'MODULE_PATHNAME', 'redis_lock_release_all'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_release_all() IS
'release every session-scoped Redis lock of this session';

CREATE FUNCTION redis_lock_with_lock(lock_name pg_catalog.text,
                                     query pg_catalog.text,
                                     ttl interval DEFAULT NULL,
                                     wait interval DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'redis_lock_with_lock'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_with_lock(pg_catalog.text, pg_catalog.text, interval, interval) IS
'run query while holding a Redis lock; returns rows processed';

CREATE FUNCTION redis_lock_extend(lock_name pg_catalog.text, ttl interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_extend'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_extend(pg_catalog.text, interval) IS
'reset the lease of a held Redis lock';

CREATE FUNCTION redis_lock_fence(lock_name pg_catalog.text)
RETURNS bigint
AS 'MODULE_PATHNAME', 'redis_lock_fence'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_fence(pg_catalog.text) IS
'fencing token of a Redis lock this session holds, NULL if not held';

CREATE FUNCTION redis_lock_held(OUT lock_name pg_catalog.text,
                                OUT scope pg_catalog.text,
                                OUT hold_count integer,
                                OUT fence bigint,
                                OUT acquired_at pg_catalog.timestamptz,
                                OUT lease interval,
                                OUT watchdog boolean,
                                OUT lost boolean,
                                OUT redis_key pg_catalog.text,
                                OUT protocol pg_catalog.text)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'redis_lock_held'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_held() IS
'Redis locks held by this session, one row per lock and scope';

CREATE FUNCTION redis_lock_status(lock_name pg_catalog.text,
                                  OUT locked boolean,
                                  OUT held_by_me boolean,
                                  OUT ttl interval,
                                  OUT owner pg_catalog.text,
                                  OUT redis_key pg_catalog.text,
                                  OUT redis_type pg_catalog.text)
RETURNS pg_catalog.record
AS 'MODULE_PATHNAME', 'redis_lock_status'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_status(pg_catalog.text) IS
'what Redis says about a lock right now';

CREATE FUNCTION redis_lock_force_release(lock_name pg_catalog.text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_force_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_force_release(pg_catalog.text) IS
'administrative: delete a Redis lock whoever holds it and wake its waiters';

REVOKE EXECUTE ON FUNCTION @extschema@.redis_lock_force_release(pg_catalog.text) FROM PUBLIC;
