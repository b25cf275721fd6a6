"""index on orders.customer, built concurrently"""
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade():
    # CREATE INDEX CONCURRENTLY cannot run in a transaction: an autocommit
    # block, a session-scoped lock, released also when the build fails.
    with op.get_context().autocommit_block():
        op.execute("SELECT redis_lock_acquire('migrate:orders')")
        try:
            op.create_index("orders_customer_idx", "orders", ["customer"],
                            postgresql_concurrently=True)
        finally:
            op.execute("SELECT redis_lock_release('migrate:orders')")
