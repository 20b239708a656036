"""Run a named statement on a psycopg connection or on a caller's foreign ``Tx``."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import postgres, pq
from psycopg.rows import tuple_row
from psycopg.types.json import JsonbBinaryLoader, JsonbLoader

from brooq_py.postgres.queries import Query
from brooq_py.postgres.wraptx import as_psycopg

Rows = list[tuple[Any, ...]]
Runner = Callable[[Query, dict[str, Any]], Rows]


_JSONB = postgres.types["jsonb"].oid


def own_json(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """Decode jsonb on *cur* with psycopg's own loader, whatever the caller's connection set up.

    Django, for one, registers a text loader for jsonb on its connections; a
    payload must still come back decoded. Only that cursor is touched.
    """
    if cur.adapters.get_loader(_JSONB, pq.Format.TEXT) is not JsonbLoader:
        cur.adapters.register_loader("jsonb", JsonbLoader)
        cur.adapters.register_loader("jsonb", JsonbBinaryLoader)


def on_connection(conn: psycopg.Connection[Any]) -> Runner:
    """Return a runner on *conn*, with tuple rows (and decoded jsonb) whatever the connection's settings."""

    def run(query: Query, params: dict[str, Any]) -> Rows:
        if not query.rows:
            execute(conn, query, params)
            return []
        with conn.cursor(row_factory=tuple_row) as cur:
            own_json(cur)
            cur.execute(query.composed, params)
            return cur.fetchall() if cur.description is not None else []

    return run


def execute(conn: psycopg.Connection[Any], query: Query, params: dict[str, Any]) -> int:
    """Run *query*, a statement that returns no rows, on *conn* (the one-statement fast path).

    Return the number of rows it wrote (the command's row count).
    """
    with conn.cursor() as cur:
        cur.execute(query.composed, params)
        return cur.rowcount


def _plain(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def on_foreign(tx: Any) -> Runner:
    """Return a runner on a foreign Tx: ``tx.execute(text, params)`` with psycopg's ``%(name)s`` style.

    Rows are read from what ``execute`` returns, else from *tx* itself (a DB-API cursor).
    """

    def run(query: Query, params: dict[str, Any]) -> Rows:
        result = tx.execute(query.text, {k: _plain(v) for k, v in params.items()})
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # never awaited: close it rather than leave a warning behind
            raise TypeError(_ASYNC_TX.format(name=type(tx).__name__))
        if not query.rows:
            return []  # a DB-API cursor refuses fetchall() after a statement without rows
        for source in (result, tx):
            fetchall = getattr(source, "fetchall", None)
            if callable(fetchall):
                return [tuple(row) for row in fetchall()]
        return []

    return run


_ASYNC_TX = "{name} is an asyncio transaction: enqueue through AsyncStore (and AsyncWrapTx), not Store"


def refuse_async(tx: Any) -> None:
    """Raise TypeError naming AsyncStore when *tx* is an asyncio connection, wrapper or session."""
    if (
        isinstance(tx, psycopg.AsyncConnection)
        or isinstance(getattr(tx, "psycopg", None), psycopg.AsyncConnection)
        or inspect.iscoroutinefunction(getattr(tx, "execute", None))
    ):
        raise TypeError(_ASYNC_TX.format(name=type(tx).__name__))


def on_tx(tx: Any) -> Runner:
    """Return the runner for a caller's *tx*: its psycopg connection when it has one.

    Raise TypeError for an asyncio connection (it belongs to AsyncStore) and for
    an object without ``execute``.
    """
    conn = as_psycopg(tx)
    if conn is not None:
        return on_connection(conn)
    refuse_async(tx)
    if not callable(getattr(tx, "execute", None)):
        raise TypeError(f"not a transaction (no execute method): {type(tx).__name__}")
    return on_foreign(tx)
