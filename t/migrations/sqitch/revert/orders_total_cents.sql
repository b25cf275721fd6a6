BEGIN;
SELECT redis_lock_acquire('migrate:orders', xact => true);
ALTER TABLE orders DROP COLUMN total_cents;
COMMIT;
