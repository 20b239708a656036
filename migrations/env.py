"""Alembic environment for brooq_py's schema.

Run through ``brooq_py.postgres.migrations`` (``upgrade``/``downgrade``/``current``),
which hands over an engine and the target schema in ``config.attributes``.

The whole run is one transaction on our own connection: first an advisory
lock derived from "brooq" and the schema (so two concurrent upgrades of one
schema apply each revision once), then ``CREATE SCHEMA IF NOT EXISTS``, then
``SET LOCAL search_path`` so the raw SQL of each revision creates its objects
in the target schema. The version table, ``brooq_alembic_version``, lives in
that schema too, so an application's own alembic history is untouched.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from brooq_py.postgres.migrations import VERSION_TABLE, lock_key


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def run() -> None:
    config = context.config
    engine = config.attributes["engine"]
    schema: str = config.attributes["schema"]
    with engine.connect() as connection, connection.begin():
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": lock_key(schema)})
        connection.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
        connection.exec_driver_sql(f"SET LOCAL search_path TO {quote_ident(schema)}")
        context.configure(
            connection=connection,
            version_table=VERSION_TABLE,
            version_table_schema=schema,
            transaction_per_migration=False,
        )
        with context.begin_transaction():
            context.run_migrations()


run()
