"""Alembic environment: the database URL comes from DATABASE_URL; each
revision runs in its own transaction, as Flyway and Liquibase run theirs."""
import os

from alembic import context
from sqlalchemy import create_engine, pool

engine = create_engine(os.environ["DATABASE_URL"], poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()
