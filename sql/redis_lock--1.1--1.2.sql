/* redis_lock--1.1--1.2.sql — fence marks per protected table and key prefix */

\echo Use "ALTER EXTENSION redis_lock UPDATE TO '1.2'" to load this file. \quit

-- In 1.1 a mark was keyed by lock name alone, and the SECURITY DEFINER guard
-- took that name from its trigger argument: any role could put the guard on
-- a table of its own, insert a huge token and so block every fenced write of
-- the real holder, and tenants with different key prefixes shared marks.
-- From 1.2 a mark belongs to one protected table and one Redis key (the
-- writer's key_prefix plus the lock name): advancing it needs the right to
-- write that table.  redis_lock_fence_check() keeps table-less marks
-- (protected_table 0, shown as '-'), for the roles it is granted to.
ALTER TABLE @extschema@.redis_lock_fence_marks
  ADD COLUMN protected_table pg_catalog.regclass NOT NULL DEFAULT 0,
  ADD COLUMN key_prefix pg_catalog.text NOT NULL DEFAULT '';
ALTER TABLE @extschema@.redis_lock_fence_marks DROP CONSTRAINT redis_lock_fence_marks_pkey;

-- Like every statement of these scripts, this one names each operator,
-- function, type and table with its schema (pg_catalog or @extschema@) and
-- compares operands of the operator's exact types: an ALTER EXTENSION
-- UPDATE run by a superuser must not resolve a name to anything another role
-- could have created (doc/security.md, "Install and upgrade scripts").
-- Every guarded table keeps the mark it had under its lock name, for every
-- key prefix its writers may use: none, and each one set with ALTER ROLE /
-- ALTER DATABASE (1.1 shared one mark among all prefixes).  A table with
-- several guard triggers naming one lock gets one mark.
INSERT INTO @extschema@.redis_lock_fence_marks (lock_name, fence, updated_at, protected_table, key_prefix)
SELECT DISTINCT ON (g.relid, p.prefix, m.lock_name)
       m.lock_name, m.fence, m.updated_at, g.relid, p.prefix
FROM @extschema@.redis_lock_fence_marks m
JOIN (SELECT COALESCE(pg_catalog.pg_partition_root(t.tgrelid), t.tgrelid) AS relid,
             pg_catalog.convert_from(
               pg_catalog.substring(t.tgargs, 1,
                 pg_catalog.position(t.tgargs, '\x00'::pg_catalog.bytea)
                 OPERATOR(pg_catalog.-) 1),
               pg_catalog.getdatabaseencoding()) AS lock_name
      FROM pg_catalog.pg_trigger t
      WHERE t.tgfoid OPERATOR(pg_catalog.=)
              '@extschema@.redis_lock_fence_guard()'::pg_catalog.regprocedure::pg_catalog.oid
        AND t.tgnargs OPERATOR(pg_catalog.>=) 1) g
  ON g.lock_name OPERATOR(pg_catalog.=) m.lock_name
CROSS JOIN (SELECT '' AS prefix
            UNION
            SELECT pg_catalog.substr(c, pg_catalog.strpos(c, '=') OPERATOR(pg_catalog.+) 1)
            FROM pg_catalog.pg_db_role_setting s, pg_catalog.unnest(s.setconfig) c
            WHERE c OPERATOR(pg_catalog.~~) 'redis\_lock.key\_prefix=%') p
ORDER BY g.relid, p.prefix, m.lock_name, m.fence DESC;

ALTER TABLE @extschema@.redis_lock_fence_marks
  ADD CONSTRAINT redis_lock_fence_marks_pkey
  PRIMARY KEY (protected_table, key_prefix, lock_name);

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

CREATE OR REPLACE FUNCTION redis_lock_fence_check(lock_name pg_catalog.text, fence bigint)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@.redis_lock_fence_advance(0, $1, $2) $$;
REVOKE ALL ON FUNCTION @extschema@.redis_lock_fence_check(pg_catalog.text, bigint) FROM PUBLIC;

-- Whoever may write the table may advance the table's own mark; a trigger on
-- another table advances that table's mark, never this one's.
CREATE OR REPLACE FUNCTION redis_lock_fence_guard()
RETURNS pg_catalog.trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  col text := COALESCE(TG_ARGV[1], 'fence');
  token bigint;
BEGIN
  IF TG_NARGS < 1 THEN
    RAISE EXCEPTION 'redis_lock_fence_guard needs the lock name as its first argument'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF NOT (to_jsonb(NEW) ? col) THEN
    RAISE EXCEPTION 'table %.% has no column "%" for the fencing token', TG_TABLE_SCHEMA, TG_TABLE_NAME, col
      USING ERRCODE = 'undefined_column';
  END IF;
  token := (to_jsonb(NEW) ->> col)::bigint;
  IF token IS NULL THEN
    RAISE EXCEPTION 'write to %.% carries no fencing token in column "%"', TG_TABLE_SCHEMA, TG_TABLE_NAME, col
      USING ERRCODE = 'null_value_not_allowed',
            HINT = format('Set %I = redis_lock_fence(%L) while holding the lock.', col, TG_ARGV[0]);
  END IF;
  -- a partitioned table has one mark, whichever partition the row is in
  PERFORM @extschema@.redis_lock_fence_advance(
    COALESCE(pg_partition_root(TG_RELID), TG_RELID), TG_ARGV[0], token);
  RETURN NEW;
END
$$;

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

-- redis_lock_held() and redis_lock_locks gain a mode column:
-- exclusive, read or write.
DROP FUNCTION @extschema@.redis_lock_held();
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

DROP VIEW @extschema@.redis_lock_locks;
DROP FUNCTION @extschema@.redis_lock_all_locks();
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

-- monitoring roles may read it, as they read pg_locks
GRANT SELECT ON @extschema@.redis_lock_locks TO pg_monitor;
