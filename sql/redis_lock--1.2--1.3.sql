/* redis_lock--1.2--1.3.sql — several locks at once */

\echo Use "ALTER EXTENSION redis_lock UPDATE TO '1.3'" to load this file. \quit

-- redis_lock_acquire_many takes every lock of a set or none
-- (doc/reference.md, "Several locks at once"); redis_lock_release_many drops one session-scoped
-- hold of each.  Nothing else changes.
CREATE FUNCTION redis_lock_acquire_many(lock_names pg_catalog.text[],
                                        ttl interval DEFAULT NULL,
                                        wait interval DEFAULT NULL,
                                        xact boolean DEFAULT false)
RETURNS bigint[]
AS 'MODULE_PATHNAME', 'redis_lock_acquire_many'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_acquire_many(pg_catalog.text[], interval, interval, boolean) IS
'take several Redis locks, all or none, waiting up to wait; returns their fencing tokens in the order given';

CREATE FUNCTION redis_lock_release_many(lock_names pg_catalog.text[])
RETURNS integer
AS 'MODULE_PATHNAME', 'redis_lock_release_many'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_release_many(pg_catalog.text[]) IS
'drop one session-scoped hold of each of several Redis locks';
