--liquibase formatted sql

--changeset orders:1
-- Each changeset runs in a transaction: the lock is held until it commits
-- or rolls back, and nothing has to release it.
SELECT redis_lock_acquire('migrate:orders', xact => true);
ALTER TABLE orders ADD COLUMN total_cents bigint;
UPDATE orders SET total_cents = total * 100;

--changeset orders:2 runInTransaction:false
-- Not in a transaction: a session-scoped lock, released when the index is
-- built.  If the build fails, Liquibase stops and the lock goes with its
-- connection.
SELECT redis_lock_acquire('migrate:orders');
CREATE INDEX CONCURRENTLY orders_customer_idx ON orders (customer);
SELECT redis_lock_release('migrate:orders');
