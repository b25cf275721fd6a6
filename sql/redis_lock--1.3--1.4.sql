/* redis_lock--1.3--1.4.sql — security fixes, lost locks stop their work (CHANGELOG.md, 1.4) */

\echo Use "ALTER EXTENSION redis_lock UPDATE TO '1.4'" to load this file. \quit

-- redis_lock_fence_guard() was a SECURITY DEFINER PL/pgSQL function that
-- read the written row with to_jsonb(NEW): the writer's own casts and output
-- functions then ran with the extension owner's rights, so any role that
-- could create a table could run code as a superuser.  It is now a C
-- function with the rights of whoever writes the row, and only the plain
-- values it read reach redis_lock_fence_advance (src/interface/fenceguard.c).
-- CREATE OR REPLACE keeps the function's OID, so existing triggers use the
-- new body at once; it also drops SECURITY DEFINER and the SET clause.
CREATE OR REPLACE FUNCTION redis_lock_fence_guard()
RETURNS pg_catalog.trigger
AS 'MODULE_PATHNAME', 'redis_lock_fence_guard'
LANGUAGE C VOLATILE;

-- redis_lock_fence_check() called redis_lock_fence_advance(0, ...) with an
-- integer where the function takes a regclass: a function of that name
-- taking an integer, which any role that may create in the extension's
-- schema could add, was the better match and ran with the owner's rights.
-- The argument now has the exact type.
CREATE OR REPLACE FUNCTION redis_lock_fence_check(lock_name pg_catalog.text, fence bigint)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@.redis_lock_fence_advance(0::pg_catalog.regclass, $1, $2) $$;

-- The function behind redis_lock_locks was executable by PUBLIC while the
-- view was granted to pg_monitor only: both are for monitoring roles now.
REVOKE EXECUTE ON FUNCTION @extschema@.redis_lock_all_locks() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.redis_lock_all_locks() TO pg_monitor;

-- A lost lock stops the work it protected (issue 34): a check without a
-- round trip, and the count of statements failed because of a loss.
CREATE FUNCTION redis_lock_check(lock_name pg_catalog.text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_check'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_check(pg_catalog.text) IS
'true while this session holds the Redis lock and it was not found lost; an error (40001) once it was; no round trip';

DROP FUNCTION @extschema@.redis_lock_stats();
CREATE FUNCTION redis_lock_stats(OUT acquired bigint,
                                 OUT failed bigint,
                                 OUT timed_out bigint,
                                 OUT waits bigint,
                                 OUT wait_time_ms double precision,
                                 OUT renewals bigint,
                                 OUT lost bigint,
                                 OUT reconnects bigint,
                                 OUT released bigint,
                                 OUT shared boolean,
                                 OUT interrupted bigint)
RETURNS pg_catalog.record
AS 'MODULE_PATHNAME', 'redis_lock_stats'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_stats() IS
'counters since server start (with preloading) or since session start';

-- Semaphores shared with services (issue 36, doc/semaphores.md): at most N
-- permits taken at once across SQL and Redisson / redis-semaphore clients.
CREATE FUNCTION redis_semaphore_acquire(semaphore_name pg_catalog.text,
                                        permits integer DEFAULT 1,
                                        ttl interval DEFAULT NULL,
                                        wait interval DEFAULT NULL,
                                        xact boolean DEFAULT false,
                                        max_permits integer DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_semaphore_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_semaphore_acquire(pg_catalog.text, integer, interval, interval, boolean, integer) IS
'take permits of a Redis semaphore, waiting up to wait; 55P03 when not obtained';

CREATE FUNCTION redis_semaphore_try_acquire(semaphore_name pg_catalog.text,
                                            permits integer DEFAULT 1,
                                            ttl interval DEFAULT NULL,
                                            wait interval DEFAULT '0',
                                            xact boolean DEFAULT false,
                                            max_permits integer DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_semaphore_try_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_semaphore_try_acquire(pg_catalog.text, integer, interval, interval, boolean, integer) IS
'take permits of a Redis semaphore if they can be had within wait';

CREATE FUNCTION redis_semaphore_release(semaphore_name pg_catalog.text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_semaphore_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_semaphore_release(pg_catalog.text) IS
'give back this session''s session-scoped permits of a Redis semaphore';

CREATE FUNCTION redis_semaphore_extend(semaphore_name pg_catalog.text,
                                       ttl interval DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_semaphore_extend'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_semaphore_extend(pg_catalog.text, interval) IS
'restart the lease of this session''s permits of a Redis semaphore';

CREATE FUNCTION redis_semaphores_held(OUT semaphore_name pg_catalog.text,
                                      OUT scope pg_catalog.text,
                                      OUT permits integer,
                                      OUT permit_ids pg_catalog.text[],
                                      OUT acquired_at pg_catalog.timestamptz,
                                      OUT lease interval,
                                      OUT watchdog boolean,
                                      OUT lost boolean,
                                      OUT redis_key pg_catalog.text,
                                      OUT protocol pg_catalog.text)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'redis_semaphores_held'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_semaphores_held() IS
'the Redis semaphore permits this session holds';

CREATE FUNCTION redis_semaphore_status(semaphore_name pg_catalog.text,
                                       max_permits integer DEFAULT NULL,
                                       ttl interval DEFAULT NULL,
                                       OUT initialized boolean,
                                       OUT available bigint,
                                       OUT taken bigint,
                                       OUT held_by_me integer,
                                       OUT redis_key pg_catalog.text)
RETURNS pg_catalog.record
AS 'MODULE_PATHNAME', 'redis_semaphore_status'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_semaphore_status(pg_catalog.text, integer, interval) IS
'what Redis says of a semaphore now: whether it exists, permits available and taken';

CREATE FUNCTION redis_semaphore_init(semaphore_name pg_catalog.text, permits integer)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_semaphore_init'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_semaphore_init(pg_catalog.text, integer) IS
'administrative: give a Redisson semaphore its permits if it has none yet (trySetPermits)';

-- A semaphore's key is a plain integer (Redisson) or sorted set
-- (redis-semaphore) that no check can tell from another application's: taking
-- permits decrements the integer, or drops the set's members older than the
-- lease, and the status reads the key.  These are granted by a superuser to
-- the roles whose key prefix holds semaphores (doc/security.md); releasing,
-- extending and listing act only on the session's own permits.  Whoever sets
-- a semaphore's permits first sets the limit of every application sharing it.
REVOKE EXECUTE ON FUNCTION @extschema@.redis_semaphore_acquire(pg_catalog.text, integer, interval, interval, boolean, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @extschema@.redis_semaphore_try_acquire(pg_catalog.text, integer, interval, interval, boolean, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @extschema@.redis_semaphore_status(pg_catalog.text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @extschema@.redis_semaphore_init(pg_catalog.text, integer) FROM PUBLIC;

-- Who waits for whom through Redis locks (issue 45, doc/stuck.md): every
-- backend of this server waiting for a Redis lock, read or write hold or
-- semaphore permits, once per holder Redis reports now, and the backends of
-- this server that hold what one backend waits for.  Pids and lock names of
-- every session are for monitoring roles only, as redis_lock_locks.
CREATE FUNCTION redis_lock_all_waits(OUT pid integer,
                                     OUT lock_name pg_catalog.text,
                                     OUT mode pg_catalog.text,
                                     OUT redis_key pg_catalog.text,
                                     OUT waiting_since pg_catalog.timestamptz,
                                     OUT holder_kind pg_catalog.text,
                                     OUT holder_pid integer,
                                     OUT holder pg_catalog.text,
                                     OUT holder_ttl interval)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'redis_lock_all_waits'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE VIEW redis_lock_waits AS
  SELECT w.pid, w.lock_name, w.mode, w.redis_key, w.waiting_since,
         w.holder_kind, w.holder_pid, w.holder, w.holder_ttl
  FROM @extschema@.redis_lock_all_waits() w;

COMMENT ON VIEW @extschema@.redis_lock_waits IS
'backends of this server waiting for a Redis lock, one row per holder Redis reports now (needs shared_preload_libraries)';

CREATE FUNCTION redis_lock_blocking_pids(pid integer)
RETURNS integer[]
AS 'MODULE_PATHNAME', 'redis_lock_blocking_pids'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_blocking_pids(integer) IS
'the backends of this server holding the Redis locks a backend waits for, as pg_blocking_pids() does for PostgreSQL locks';

REVOKE EXECUTE ON FUNCTION @extschema@.redis_lock_all_waits() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.redis_lock_all_waits() TO pg_monitor;
GRANT SELECT ON @extschema@.redis_lock_waits TO pg_monitor;
REVOKE EXECUTE ON FUNCTION @extschema@.redis_lock_blocking_pids(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.redis_lock_blocking_pids(integer) TO pg_monitor;
