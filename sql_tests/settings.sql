-- Settings: defaults, units, validation, and who may change or read them.
SELECT name, setting, unit, context FROM pg_settings
WHERE name LIKE 'redis_lock.%' AND name NOT IN ('redis_lock.url')
ORDER BY name;

-- URL validation (22023 with a detail)
SELECT try($$SET redis_lock.url = 'http://example.com'$$);
SELECT try($$SET redis_lock.url = 'redis://user:secret@127.0.0.1:6379/0'$$);
SELECT try($$SET redis_lock.url = 'redis://127.0.0.1:99999/0'$$);
SELECT try($$SET redis_lock.url = 'redis://127.0.0.1:6379/x'$$);
-- rediss:// is TLS (t/test_tls.py); the other schemes are refused
SELECT try($$SET redis_lock.url = 'rediss://127.0.0.1:6379/0'$$);
SELECT try($$SET redis_lock.url = 'rediss://user@[::1]/3'$$);
SELECT try($$SET redis_lock.tls_verify = 'sometimes'$$);
SELECT try($$SET redis_lock.url = 'redis://'$$);
SELECT try($$SET redis_lock.url = 'redis://[::1]:6379/2'$$);
SELECT try($$SET redis_lock.nodes = 'redis://a:1, nonsense'$$);
SELECT try($$SET redis_lock.protocol = 'zookeeper'$$);
SELECT try($$SELECT set_config('redis_lock.key_prefix', repeat('p', 257), false)$$);
-- a brace in the prefix must open a whole hash tag (the fence counter shares the lock's slot)
SELECT try($$SET redis_lock.key_prefix = 't{'$$);
SELECT try($$SET redis_lock.key_prefix = 'a{}'$$);
SET redis_lock.key_prefix = 'tenant{7}:';
RESET redis_lock.key_prefix;
-- below the 100 ms floor: 22023 with our bounds.  The sentence is
-- PostgreSQL's, and newer majors name the unit after each bound
-- ("(100 ms .. 2147483647 ms)"): that unit is taken out, the bounds kept
SELECT regexp_replace(try($$SET redis_lock.lease_time = '10ms'$$),
                      '\((\d+) ms \.\. (\d+) ms\)$', '(\1 .. \2)') AS try;

-- non-superusers: may tune waits and leases, may not redirect or read secrets
CREATE ROLE regress_rl_user;
-- a password is not stored where every role reads it (pg_db_role_setting,
-- pg_proc), and the refusal does not repeat it (t/test_security_secrets.py)
SELECT try($$ALTER ROLE regress_rl_user SET redis_lock.password = 'top-secret'$$);
SELECT try($$CREATE FUNCTION regress_rl_f() RETURNS int LANGUAGE sql
             SET redis_lock.sentinel_password = 'top-secret' AS 'SELECT 1'$$);
ALTER ROLE regress_rl_user SET redis_lock.password = '';
ALTER ROLE regress_rl_user RESET redis_lock.password;
SET redis_lock.password = 'top-secret';
SET ROLE regress_rl_user;
SELECT try($$SET redis_lock.url = 'redis://evil:6379/0'$$);
SELECT try($$SET redis_lock.key_prefix = 'other-tenant:'$$);
SELECT try($$SET redis_lock.scripting = off$$);
SELECT try($$SET redis_lock.password = 'x'$$);
-- reading the password is refused (42501), pointing at pg_read_all_settings,
-- and the refusal does not show it; PostgreSQL words the refusal
-- differently on 13, 15 and 16+, so its parts are checked, not its wording
SELECT split_part(r, ':', 1) AS sqlstate,
       r LIKE '%"redis_lock.password"%' AS names_the_setting,
       r LIKE '%pg_read_all_settings%' AS names_the_role,
       position('top-secret' IN r) = 0 AS hides_the_value
FROM try($$SHOW redis_lock.password$$) AS r;
SELECT count(*) AS password_rows FROM pg_settings WHERE name = 'redis_lock.password';
SELECT try($$SET redis_lock.lease_time = '5s'$$);
SELECT try($$SET redis_lock.wait_timeout = '1s'$$);
SELECT try($$SET redis_lock.protocol = 'redisson'$$);
SELECT try($$SELECT redis_lock_force_release('x')$$);
RESET ROLE;
RESET redis_lock.password;
DROP ROLE regress_rl_user;
