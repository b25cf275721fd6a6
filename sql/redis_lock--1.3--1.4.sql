/* redis_lock--1.3--1.4.sql — security fixes (CHANGELOG.md, 1.4) */

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
