"""The operator's SQL of the README (SPEC O3), runnable from code: fate, in flight, depth, lag, dead jobs.

The same statements are printed in the README for psql; here they run against
one schema and return column names with rows, for the demo and for scripts.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from brooq_py.postgres.queries import load

OPS = {
    "fate": "ops_fate",
    "in_flight": "ops_in_flight",
    "depth": "ops_depth",
    "oldest_ready": "ops_oldest_ready",
    "dead": "ops_dead",
    "cancel": "ops_cancel",
}
DEMO = {
    "orders_create": "demo_orders_create",
    "order_insert": "demo_order_insert",
    "schema_drop": "demo_schema_drop",
}


def statement(name: str, schema: str) -> sql.Composed:
    """Return the named statement rendered for *schema* (``{job}`` and the demo's ``{orders}``)."""
    file = OPS.get(name) or DEMO.get(name)
    if file is None:
        raise KeyError(f"no operator query named {name!r}; known: {', '.join([*OPS, *DEMO])}")
    return sql.SQL(load(file)).format(
        job=sql.Identifier(schema, "job"),
        orders=sql.Identifier(schema, "orders"),
        schema=sql.Identifier(schema),
    )


def text(name: str) -> str:
    """Return the statement as the README prints it (unqualified table names, no comments)."""
    file = OPS.get(name) or DEMO.get(name) or name
    body = [ln for ln in load(file).splitlines() if not ln.lstrip().startswith("--")]
    return "\n".join(body).replace("{job}", "job").replace("{orders}", "orders").strip()


def pasteable(name: str, params: dict[str, str]) -> str:
    """Return ``text(name)`` with each ``%(key)s`` replaced by its value as an SQL string literal,
    so it can be pasted into psql as it stands."""
    body = text(name)
    for key, value in params.items():
        body = body.replace(f"%({key})s", "'" + value.replace("'", "''") + "'")
    return body


def run(
    conn: psycopg.Connection[Any], name: str, schema: str, params: dict[str, Any] | None = None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run the named statement on *conn*; return (column names, rows) - empty for a write."""
    cur = conn.execute(statement(name, schema), params)
    if cur.description is None:
        return [], []
    return [d.name for d in cur.description], cur.fetchall()
