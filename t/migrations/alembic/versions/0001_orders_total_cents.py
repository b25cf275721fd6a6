"""orders.total_cents"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade():
    # In this revision's transaction: the lock is held until it commits or
    # rolls back, and nothing has to release it.
    op.execute("SELECT redis_lock_acquire('migrate:orders', xact => true)")
    op.add_column("orders", sa.Column("total_cents", sa.BigInteger))
    op.execute("UPDATE orders SET total_cents = total * 100")
