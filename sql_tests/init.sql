-- Install the extension and a helper that shows an error's SQLSTATE,
-- message and hint (psql's verbose mode would add unstable source lines).
-- install the first release and upgrade, as an existing user would
CREATE EXTENSION redis_lock VERSION '1.0';
ALTER EXTENSION redis_lock UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'redis_lock';

CREATE FUNCTION try(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  st text; msg text; hint text; det text;
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                          hint = PG_EXCEPTION_HINT, det = PG_EXCEPTION_DETAIL;
  -- the test bed's Redis port (from postgresql.conf) changes from run to run
  msg := replace(msg, '127.0.0.1:' || substring(
           (SELECT reset_val FROM pg_settings WHERE name = 'redis_lock.url')
           FROM ':([0-9]+)/'), '127.0.0.1:<port>');
  msg := regexp_replace(msg, 'script: ([0-9a-f]{40}, )?on @user_script:[0-9]+', 'script: <sha1>, on @user_script:<line>');
  det := replace(det, '127.0.0.1:' || substring(
           (SELECT reset_val FROM pg_settings WHERE name = 'redis_lock.url')
           FROM ':([0-9]+)/'), '127.0.0.1:<port>');
  det := regexp_replace(det, 'script: ([0-9a-f]{40}, )?on @user_script:[0-9]+', 'script: <sha1>, on @user_script:<line>');
  -- fencing tokens start at the Redis clock in microseconds
  msg := regexp_replace(msg, '[0-9]{13,}', '<token>', 'g');
  det := regexp_replace(det, '[0-9]{13,}', '<token>', 'g');
  RETURN st || ': ' || msg
         || CASE WHEN det <> '' THEN E'\nDETAIL: ' || det ELSE '' END
         || CASE WHEN hint <> '' THEN E'\nHINT: ' || hint ELSE '' END;
END $$;

-- every function of the contract is there, force_release not for PUBLIC
SELECT p.proname, pg_get_function_arguments(p.oid) AS args,
       pg_get_function_result(p.oid) AS result
FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'
ORDER BY 1;
SELECT pg_describe_object(classid, objid, objsubid) AS member
FROM pg_depend WHERE refobjid = (SELECT oid FROM pg_extension WHERE extname = 'redis_lock')
  AND classid <> 'pg_proc'::regclass
  -- the row types of its tables and views (and their arrays), which
  -- PostgreSQL 17 and later also record as members
  AND NOT (classid = 'pg_type'::regclass AND objid IN (
        SELECT oid FROM pg_type WHERE typrelid <> 0
        UNION SELECT a.oid FROM pg_type a JOIN pg_type r ON a.typelem = r.oid
              WHERE r.typrelid <> 0))
ORDER BY 1;

SELECT has_function_privilege('public', 'redis_lock_force_release(text)', 'execute') AS public_may_force;

-- the test bed points redis_lock.url at its own Redis
\! redis-cli -p $RL_REDIS_PORT ping
\! redis-cli -p $RL_REDIS_PORT flushall
