-- No BEGIN: each statement on its own (x-multi-statement=true), as
-- CREATE INDEX CONCURRENTLY needs.  A session-scoped lock, released when the
-- index is built.  If the build fails, migrate stops and the lock goes with
-- its connection.
SELECT redis_lock_acquire('migrate:orders');
CREATE INDEX CONCURRENTLY orders_customer_idx ON orders (customer);
SELECT redis_lock_release('migrate:orders');
