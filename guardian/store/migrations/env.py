"""Alembic environment for the guardian store. ``Store.open`` hands its own connection over in
``config.attributes["connection"]`` (inside a transaction, so the upgrade commits atomically); without one (the
``alembic`` command line) a short-lived engine is built from ``sqlalchemy.url``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from guardian.store.models import Base

TARGET_METADATA = Base.metadata


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=TARGET_METADATA,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of executing it (``alembic upgrade --sql``)."""
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=TARGET_METADATA,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run migrations on the connection given by the caller, or on a fresh one."""
    given = context.config.attributes.get("connection")
    if isinstance(given, Connection):
        _configure_and_run(given)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no connection given and sqlalchemy.url is not set")
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            _configure_and_run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
