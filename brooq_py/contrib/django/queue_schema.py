"""Where Django's brooq queue lives, and its migration state: for ``manage.py migrate`` and the check.

brooq's own migrations run there on a connection of their own, opened with the Django connection's
parameters.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from brooq_py.postgres import migrations
from brooq_py.postgres.session.statements import render


def targets() -> list[tuple[str, str]]:
    """Return each (database alias, schema) of a ``BrooqBackend`` in ``TASKS``, else ``BROOQ_SCHEMA``'s."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    from brooq_py.contrib.django.backend import BrooqBackend

    found: list[tuple[str, str]] = []
    for config in getattr(settings, "TASKS", {}).values():
        path = config.get("BACKEND", "")
        cls = import_string(path) if isinstance(path, str) and path else None
        if isinstance(cls, type) and issubclass(cls, BrooqBackend):
            options = config.get("OPTIONS", {})
            pair = (options.get("database", "default"), options.get("schema", "public"))
            if pair not in found:
                found.append(pair)
    return found or [("default", getattr(settings, "BROOQ_SCHEMA", "public"))]


def dsn_of(connection: Any) -> str:
    """Return a libpq DSN with the parameters of the Django *connection* (its libpq keywords only, password included)."""
    known = {d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults()}
    params = connection.get_connection_params()
    return make_conninfo(
        "", **{k: v for k, v in params.items() if k in known and isinstance(v, str | int) and v != ""}
    )


def upgrade(connection: Any) -> None:
    """Apply brooq's migrations to every schema that belongs on *connection*'s database."""
    for alias, schema in targets():
        if alias == connection.alias:
            migrations.upgrade(dsn_of(connection), schema=schema)


def downgrade(connection: Any) -> None:
    """Remove brooq's tables from every schema that belongs on *connection*'s database (schemas stay)."""
    for alias, schema in targets():
        if alias == connection.alias:
            migrations.downgrade(dsn_of(connection), schema=schema, revision="base")


def version(connection: Any, schema: str) -> str | None:
    """Return *schema*'s brooq migration revision as *connection* sees it; None when it has none."""
    from django.db import DatabaseError, transaction

    try:
        with transaction.atomic(using=connection.alias), connection.cursor() as cur:
            cur.execute(render("schema_version", schema).text)
            row = cur.fetchone()
    except DatabaseError:  # no version table: never migrated (the atomic block keeps the connection usable)
        return None
    return None if row is None else str(row[0])
