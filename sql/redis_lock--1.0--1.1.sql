/* redis_lock--1.0--1.1.sql — lease safety: cluster-wide view, counters, fencing */

\echo Use "ALTER EXTENSION redis_lock UPDATE TO '1.1'" to load this file. \quit

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
                                     OUT redis_key pg_catalog.text)
RETURNS SETOF pg_catalog.record
AS 'MODULE_PATHNAME', 'redis_lock_all_locks'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Like pg_locks: every Redis lock of every backend of this server
CREATE VIEW redis_lock_locks AS
  SELECT l.pid, d.datname AS database, l.lock_name, l.scope, l.hold_count,
         l.fence, l.acquired_at, l.last_renewed_at, l.lease, l.watchdog,
         l.lost, l.redis_key
  FROM @extschema@.redis_lock_all_locks() l
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) l.dbid;

COMMENT ON VIEW @extschema@.redis_lock_locks IS
'Redis locks held by every backend (needs shared_preload_libraries; otherwise this session only)';

CREATE FUNCTION redis_lock_stats(OUT acquired bigint,
                                 OUT failed bigint,
                                 OUT timed_out bigint,
                                 OUT waits bigint,
                                 OUT wait_time_ms double precision,
                                 OUT renewals bigint,
                                 OUT lost bigint,
                                 OUT reconnects bigint,
                                 OUT released bigint,
                                 OUT shared boolean)
RETURNS pg_catalog.record
AS 'MODULE_PATHNAME', 'redis_lock_stats'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.redis_lock_stats() IS
'counters since server start (with preloading) or since session start';

-- Fencing: the highest token accepted so far, per lock name
CREATE TABLE redis_lock_fence_marks (
    lock_name  pg_catalog.text PRIMARY KEY,
    fence      bigint NOT NULL,
    updated_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now()
);
REVOKE ALL ON @extschema@.redis_lock_fence_marks FROM PUBLIC;
GRANT SELECT ON @extschema@.redis_lock_fence_marks TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.redis_lock_fence_marks', '');

-- Accept a write carrying fencing token "fence" for lock "lock_name" only if
-- no write with a higher token was accepted before; remember the token.
-- Concurrent writers of one lock name queue on its row until commit.
CREATE FUNCTION redis_lock_fence_check(lock_name pg_catalog.text, fence bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  accepted bigint;
  highest bigint;
BEGIN
  IF lock_name IS NULL OR fence IS NULL THEN
    RAISE EXCEPTION 'a fenced write needs a lock name and a fencing token'
      USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass the token returned by redis_lock_acquire or redis_lock_fence.';
  END IF;
  INSERT INTO @extschema@.redis_lock_fence_marks AS m (lock_name, fence)
  VALUES ($1, $2)
  ON CONFLICT ON CONSTRAINT redis_lock_fence_marks_pkey
  DO UPDATE SET fence = EXCLUDED.fence, updated_at = now()
     WHERE m.fence <= EXCLUDED.fence
  RETURNING m.fence INTO accepted;
  IF accepted IS NULL THEN
    SELECT m.fence INTO highest FROM @extschema@.redis_lock_fence_marks m
    WHERE m.lock_name = $1;
    RAISE EXCEPTION 'stale fencing token % for Redis lock "%"', $2, $1
      USING ERRCODE = 'serialization_failure',
            DETAIL = format('A write carrying token %s was already accepted; the lock has changed hands since this token was issued.', highest),
            HINT = 'Acquire the lock again and redo the work with the new token.';
  END IF;
  RETURN accepted;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.redis_lock_fence_check(pg_catalog.text, bigint) FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.redis_lock_fence_check(pg_catalog.text, bigint) IS
'reject a write whose fencing token is older than one already accepted for the lock';

-- Trigger helper: BEFORE INSERT OR UPDATE ... FOR EACH ROW EXECUTE FUNCTION
-- redis_lock_fence_guard('lock name'[, 'token column', default 'fence'])
-- Whoever may write the table may advance its mark; nobody else may.
CREATE FUNCTION redis_lock_fence_guard()
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
  PERFORM @extschema@.redis_lock_fence_check(TG_ARGV[0], token);
  RETURN NEW;
END
$$;

COMMENT ON FUNCTION @extschema@.redis_lock_fence_guard() IS
'trigger: reject rows whose fencing token is older than one already accepted';
