/* redis_lock--1.3--1.4.sql — security fixes, lost locks stop their work (CHANGELOG.md, 1.4) */

\echo Use "ALTER EXTENSION redis_lock UPDATE TO '1.4'" to load this file. \quit

-- redis_lock_fence_guard() was a SECURITY DEFINER PL/pgSQL function that
-- read the written row with to_jsonb(NEW): the writer's own casts and output
-- functions then ran with the extension owner's rights, so any role that
-- could create a table could run code as a superuser.  It is now a C
-- function with the rights of whoever writes the row, and only the plain
-- values it read reach redis_lock_fence_advance (src/fenceguard.c).
-- CREATE OR REPLACE keeps the function's OID, so existing triggers use the
-- new body at once; it also drops SECURITY DEFINER and the SET clause.
CREATE OR REPLACE FUNCTION redis_lock_fence_guard()
RETURNS trigger
AS 'MODULE_PATHNAME', 'redis_lock_fence_guard'
LANGUAGE C VOLATILE;

-- The function behind redis_lock_locks was executable by PUBLIC while the
-- view was granted to pg_monitor only: both are for monitoring roles now.
REVOKE EXECUTE ON FUNCTION redis_lock_all_locks() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION redis_lock_all_locks() TO pg_monitor;

-- A lost lock stops the work it protected (issue 34): a check without a
-- round trip, and the count of statements failed because of a loss.
CREATE FUNCTION redis_lock_check(lock_name text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_check'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION redis_lock_check(text) IS
'true while this session holds the Redis lock and it was not found lost; an error (40001) once it was; no round trip';

DROP FUNCTION redis_lock_stats();
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
RETURNS record
AS 'MODULE_PATHNAME', 'redis_lock_stats'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION redis_lock_stats() IS
'counters since server start (with preloading) or since session start';
