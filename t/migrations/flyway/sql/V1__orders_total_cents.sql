-- Flyway runs this migration in a transaction: the lock is held until it
-- commits or rolls back, and nothing has to release it.
SELECT redis_lock_acquire('migrate:orders', xact => true);

ALTER TABLE orders ADD COLUMN total_cents bigint;
UPDATE orders SET total_cents = total * 100;
