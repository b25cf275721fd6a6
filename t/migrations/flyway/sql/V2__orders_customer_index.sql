-- Not in a transaction (V2__orders_customer_index.sql.conf): a session-scoped
-- lock, released when the index is built.  If the build fails, Flyway stops
-- and the lock goes with its connection.
SELECT redis_lock_acquire('migrate:orders');

CREATE INDEX CONCURRENTLY orders_customer_idx ON orders (customer);

SELECT redis_lock_release('migrate:orders');
