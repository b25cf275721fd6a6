-- In BEGIN and COMMIT: the lock is held until COMMIT, or until the
-- transaction fails, and nothing has to release it.
BEGIN;
SELECT redis_lock_acquire('migrate:orders', xact => true);
ALTER TABLE orders ADD COLUMN total_cents bigint;
UPDATE orders SET total_cents = total * 100;
COMMIT;
