/* redis_lock--1.4.sql — every SQL object of version 1.4 (doc/reference.md, "Functions") */

\echo Use "CREATE EXTENSION redis_lock" to load this file. \quit

-- A fresh install of 1.4.  An existing installation gets to the same objects
-- through redis_lock--1.0--1.1.sql, redis_lock--1.1--1.2.sql,
-- redis_lock--1.2--1.3.sql and redis_lock--1.3--1.4.sql; the test suite
-- compares the two (t/test_upgrade.py).
--
-- Every type, table, view, operator and function these scripts refer to
-- (rather than create) is named with its schema, pg_catalog or @extschema@,
-- and each operator takes operands of its exact types, so that nothing
-- another role created in the extension's schema or in the installing
-- session's pg_temp can stand in for it; function bodies run with
-- search_path pinned to pg_catalog, pg_temp (doc/security.md, "Install and
-- upgrade scripts").

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

CREATE FUNCTION redis_lock_check(lock_name pg_catalog.text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_check'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_check(pg_catalog.text) IS
'true while this session holds the Redis lock and it was not found lost; an error (40001) once it was; no round trip';

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

CREATE FUNCTION redis_lock_held(OUT lock_name pg_catalog.text,
                                OUT scope pg_catalog.text,
                                OUT hold_count integer,
                                OUT fence bigint,
                                OUT acquired_at pg_catalog.timestamptz,
                                OUT lease interval,
                                OUT watchdog boolean,
                                OUT lost boolean,
                                OUT redis_key pg_catalog.text,
                                OUT protocol pg_catalog.text,
                                OUT mode pg_catalog.text)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'redis_lock_held'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_held() IS
'Redis locks held by this session, one row per lock, mode and scope';

CREATE FUNCTION redis_lock_all_locks(OUT pid integer,
                                     OUT dbid pg_catalog.oid,
                                     OUT lock_name pg_catalog.text,
                                     OUT scope pg_catalog.text,
                                     OUT hold_count integer,
                                     OUT fence bigint,
                                     OUT acquired_at pg_catalog.timestamptz,
                                     OUT last_renewed_at pg_catalog.timestamptz,
                                     OUT lease interval,
                                     OUT watchdog boolean,
                                     OUT lost boolean,
                                     OUT redis_key pg_catalog.text,
                                     OUT mode pg_catalog.text)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'redis_lock_all_locks'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE VIEW redis_lock_locks AS
  SELECT l.pid, d.datname AS database, l.lock_name, l.mode, l.scope,
         l.hold_count, l.fence, l.acquired_at, l.last_renewed_at, l.lease,
         l.watchdog, l.lost, l.redis_key
  FROM @extschema@.redis_lock_all_locks() l
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) l.dbid;

COMMENT ON VIEW @extschema@.redis_lock_locks IS
'Redis locks held by every backend (needs shared_preload_libraries; otherwise this session only)';

-- Every backend's lock names and pids are for monitoring roles only: the
-- function behind the view as much as the view (doc/operations.md,
-- "Who may call what").  A session sees its own locks in redis_lock_held().
REVOKE EXECUTE ON FUNCTION @extschema@.redis_lock_all_locks() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.redis_lock_all_locks() TO pg_monitor;
GRANT SELECT ON @extschema@.redis_lock_locks TO pg_monitor;

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

-- Fencing: the highest token accepted so far per protected table (0: none,
-- for redis_lock_fence_check), Redis key prefix and lock name
CREATE TABLE redis_lock_fence_marks (
    lock_name       pg_catalog.text NOT NULL,
    fence           bigint NOT NULL,
    updated_at      pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    protected_table pg_catalog.regclass NOT NULL DEFAULT 0,
    key_prefix      pg_catalog.text NOT NULL DEFAULT '',
    CONSTRAINT redis_lock_fence_marks_pkey
      PRIMARY KEY (protected_table, key_prefix, lock_name)
);
REVOKE ALL ON @extschema@.redis_lock_fence_marks FROM PUBLIC;
GRANT SELECT ON @extschema@.redis_lock_fence_marks TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.redis_lock_fence_marks', '');

COMMENT ON TABLE @extschema@.redis_lock_fence_marks IS
'highest fencing token accepted per protected table (0: redis_lock_fence_check), key prefix and lock name';

-- The one place a mark advances.  Not executable by PUBLIC.
CREATE FUNCTION redis_lock_fence_advance(protected_table pg_catalog.regclass,
                                         lock_name pg_catalog.text, fence bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  prefix text := COALESCE(current_setting('redis_lock.key_prefix', true), '');
  accepted bigint;
  highest bigint;
BEGIN
  IF lock_name IS NULL OR fence IS NULL THEN
    RAISE EXCEPTION 'a fenced write needs a lock name and a fencing token'
      USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass the token returned by redis_lock_acquire or redis_lock_fence.';
  END IF;
  INSERT INTO @extschema@.redis_lock_fence_marks AS m
         (protected_table, key_prefix, lock_name, fence)
  VALUES ($1, prefix, $2, $3)
  ON CONFLICT ON CONSTRAINT redis_lock_fence_marks_pkey
  DO UPDATE SET fence = EXCLUDED.fence, updated_at = now()
     WHERE m.fence <= EXCLUDED.fence
  RETURNING m.fence INTO accepted;
  IF accepted IS NULL THEN
    SELECT m.fence INTO highest FROM @extschema@.redis_lock_fence_marks m
    WHERE m.protected_table = $1 AND m.key_prefix = prefix AND m.lock_name = $2;
    RAISE EXCEPTION 'stale fencing token % for Redis lock "%"', $3, $2
      USING ERRCODE = 'serialization_failure',
            DETAIL = format('A write carrying token %s was already accepted; the lock has changed hands since this token was issued.', highest),
            HINT = 'Acquire the lock again and redo the work with the new token.';
  END IF;
  RETURN accepted;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.redis_lock_fence_advance(pg_catalog.regclass, pg_catalog.text, bigint) FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.redis_lock_fence_advance(pg_catalog.regclass, pg_catalog.text, bigint) IS
'advance the fence mark of a protected table (0: none) for the caller''s key prefix and a lock name';

CREATE FUNCTION redis_lock_fence_check(lock_name pg_catalog.text, fence bigint)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@.redis_lock_fence_advance(0::pg_catalog.regclass, $1, $2) $$;
REVOKE ALL ON FUNCTION @extschema@.redis_lock_fence_check(pg_catalog.text, bigint) FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.redis_lock_fence_check(pg_catalog.text, bigint) IS
'reject a write whose fencing token is older than one already accepted for the lock';

-- Trigger helper: BEFORE INSERT OR UPDATE ... FOR EACH ROW EXECUTE FUNCTION
-- redis_lock_fence_guard('lock name'[, 'token column', default 'fence']).
-- It runs with the rights of whoever writes the row (src/interface/fenceguard.c): only
-- the plain values it read (table, lock name, token) reach
-- redis_lock_fence_advance.  Whoever may write the table may advance the
-- table's own mark; a trigger on another table advances that table's mark,
-- never this one's.
CREATE FUNCTION redis_lock_fence_guard()
RETURNS pg_catalog.trigger
AS 'MODULE_PATHNAME', 'redis_lock_fence_guard'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.redis_lock_fence_guard() IS
'trigger: reject rows whose fencing token is older than one already accepted';

-- A dropped table's marks go with it: its OID may be reused by a new table,
-- which must not inherit them.
CREATE FUNCTION redis_lock_fence_marks_forget_dropped()
RETURNS pg_catalog.event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  DELETE FROM @extschema@.redis_lock_fence_marks m
  USING pg_event_trigger_dropped_objects() d
  WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0
    AND m.protected_table::oid = d.objid;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.redis_lock_fence_marks_forget_dropped() FROM PUBLIC;

CREATE EVENT TRIGGER redis_lock_fence_marks_drop ON sql_drop
  WHEN TAG IN ('DROP TABLE', 'DROP SCHEMA', 'DROP OWNED')
  EXECUTE FUNCTION @extschema@.redis_lock_fence_marks_forget_dropped();

-- Read-write locks: shared and exclusive holds of one name, on Redisson's
-- RReadWriteLock layout whatever redis_lock.protocol says.
CREATE FUNCTION redis_lock_acquire_read(lock_name pg_catalog.text,
                                        ttl interval DEFAULT NULL,
                                        wait interval DEFAULT NULL,
                                        xact boolean DEFAULT false)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_acquire_read'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_acquire_read(pg_catalog.text, interval, interval, boolean) IS
'take a shared (read) hold of a Redis read-write lock, waiting up to wait; 55P03 when not obtained';

CREATE FUNCTION redis_lock_try_acquire_read(lock_name pg_catalog.text,
                                            ttl interval DEFAULT NULL,
                                            wait interval DEFAULT '0',
                                            xact boolean DEFAULT false)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_try_acquire_read'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_try_acquire_read(pg_catalog.text, interval, interval, boolean) IS
'take a shared (read) hold of a Redis read-write lock if it can be had within wait';

CREATE FUNCTION redis_lock_release_read(lock_name pg_catalog.text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_release_read'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_release_read(pg_catalog.text) IS
'drop one session-scoped shared (read) hold of a Redis read-write lock';

CREATE FUNCTION redis_lock_acquire_write(lock_name pg_catalog.text,
                                         ttl interval DEFAULT NULL,
                                         wait interval DEFAULT NULL,
                                         xact boolean DEFAULT false)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_acquire_write'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_acquire_write(pg_catalog.text, interval, interval, boolean) IS
'take the exclusive (write) hold of a Redis read-write lock, waiting up to wait; 55P03 when not obtained';

CREATE FUNCTION redis_lock_try_acquire_write(lock_name pg_catalog.text,
                                             ttl interval DEFAULT NULL,
                                             wait interval DEFAULT '0',
                                             xact boolean DEFAULT false)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_try_acquire_write'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_try_acquire_write(pg_catalog.text, interval, interval, boolean) IS
'take the exclusive (write) hold of a Redis read-write lock if it can be had within wait';

CREATE FUNCTION redis_lock_release_write(lock_name pg_catalog.text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'redis_lock_release_write'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_release_write(pg_catalog.text) IS
'drop one session-scoped exclusive (write) hold of a Redis read-write lock';

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
