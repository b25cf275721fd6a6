SELECT redis_lock_acquire('migrate:orders');
DROP INDEX CONCURRENTLY orders_customer_idx;
SELECT redis_lock_release('migrate:orders');
