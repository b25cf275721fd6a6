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
ALTER TABLE redis_lock_fence_marks
  ADD COLUMN protected_table regclass NOT NULL DEFAULT 0,
  ADD COLUMN key_prefix text NOT NULL DEFAULT '';
ALTER TABLE redis_lock_fence_marks DROP CONSTRAINT redis_lock_fence_marks_pkey;

-- every guarded table keeps the mark it had under its lock name
INSERT INTO redis_lock_fence_marks (lock_name, fence, updated_at, protected_table)
SELECT m.lock_name, m.fence, m.updated_at, t.tgrelid
FROM redis_lock_fence_marks m
JOIN pg_catalog.pg_trigger t
  ON t.tgfoid = 'redis_lock_fence_guard()'::pg_catalog.regprocedure
 AND t.tgnargs >= 1
 AND pg_catalog.split_part(pg_catalog.encode(t.tgargs, 'escape'), '\000', 1) = m.lock_name;

ALTER TABLE redis_lock_fence_marks
  ADD CONSTRAINT redis_lock_fence_marks_pkey
  PRIMARY KEY (protected_table, key_prefix, lock_name);

COMMENT ON TABLE redis_lock_fence_marks IS
'highest fencing token accepted per protected table (0: redis_lock_fence_check), key prefix and lock name';

-- The one place a mark advances.  Not executable by PUBLIC.
CREATE FUNCTION redis_lock_fence_advance(protected_table regclass,
                                         lock_name text, fence bigint)
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
REVOKE ALL ON FUNCTION redis_lock_fence_advance(regclass, text, bigint) FROM PUBLIC;

COMMENT ON FUNCTION redis_lock_fence_advance(regclass, text, bigint) IS
'advance the fence mark of a protected table (0: none) for the caller''s key prefix and a lock name';

CREATE OR REPLACE FUNCTION redis_lock_fence_check(lock_name text, fence bigint)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@.redis_lock_fence_advance(0, $1, $2) $$;
REVOKE ALL ON FUNCTION redis_lock_fence_check(text, bigint) FROM PUBLIC;

-- Whoever may write the table may advance the table's own mark; a trigger on
-- another table advances that table's mark, never this one's.
CREATE OR REPLACE FUNCTION redis_lock_fence_guard()
RETURNS trigger
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
  PERFORM @extschema@.redis_lock_fence_advance(TG_RELID, TG_ARGV[0], token);
  RETURN NEW;
END
$$;
