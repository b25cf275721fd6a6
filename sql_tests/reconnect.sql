-- Connections are re-opened transparently; scripts reload after NOSCRIPT.

SELECT redis_lock_acquire('rc') > 0 AS got;
-- Redis drops our connection: the next call reconnects by itself
\! redis-cli -p $RL_REDIS_PORT client kill type normal skipme no > /dev/null
SELECT redis_lock_release('rc');
\! echo "released: $(redis-cli -p $RL_REDIS_PORT exists rc)"

-- the script cache is flushed (as after a Redis restart): EVALSHA gets
-- NOSCRIPT, the script is sent again, the caller sees nothing
\! redis-cli -p $RL_REDIS_PORT script flush > /dev/null
SELECT redis_lock_acquire('rc') > 0 AS got;
\! redis-cli -p $RL_REDIS_PORT script flush > /dev/null
SELECT redis_lock_release('rc');
\! echo "released: $(redis-cli -p $RL_REDIS_PORT exists rc)"

-- both at once, with a lock held across them
SELECT redis_lock_acquire('rc2') > 0 AS got;
\! redis-cli -p $RL_REDIS_PORT script flush > /dev/null
\! redis-cli -p $RL_REDIS_PORT client kill type normal skipme no > /dev/null
SELECT redis_lock_extend('rc2', '20s');
SELECT redis_lock_release('rc2');
\! echo "released: $(redis-cli -p $RL_REDIS_PORT exists rc2)"

-- our connection is named after the backend in CLIENT LIST
SELECT redis_lock_acquire('rc3') > 0 AS got;
SELECT pg_backend_pid() AS pid \gset
\setenv BACKEND_PID :pid
\! redis-cli -p $RL_REDIS_PORT client list | grep -c "name=redis_lock:$BACKEND_PID "
SELECT redis_lock_release('rc3');
