"""Adapt a caller's asyncio transaction (psycopg ``AsyncConnection``) for the AsyncStore."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from brooq_py.postgres.queries import Query
from brooq_py.postgres.runner import Rows, own_json
from brooq_py.postgres.wraptx import WrapTx

AsyncRunner = Callable[[Query, dict[str, Any]], Awaitable[Rows]]


class AsyncWrapTx:
    """A psycopg ``AsyncConnection``, inside the caller's transaction, for ``AsyncStore``.

    It wraps and opens nothing: the connection, its transaction and its commit
    stay the caller's. ``psycopg`` gives back the very same connection.
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if isinstance(conn, psycopg.Connection):
            raise TypeError("AsyncWrapTx needs a psycopg.AsyncConnection; wrap a sync Connection in WrapTx")
        if not isinstance(conn, psycopg.AsyncConnection):
            raise TypeError(f"AsyncWrapTx needs a psycopg.AsyncConnection, got {type(conn).__name__}")
        self._conn = conn

    @property
    def psycopg(self) -> psycopg.AsyncConnection[Any]:
        """Return the wrapped connection itself."""
        return self._conn

    async def execute(self, query: Any, params: Any = None) -> Any:
        """Run *query* on the wrapped connection (``AsyncConnection.execute``) and return the cursor."""
        return await self._conn.execute(query, params)

    @classmethod
    async def from_sqlalchemy(cls, conn_or_session: Any) -> AsyncWrapTx:
        """Wrap the psycopg 3 connection behind a SQLAlchemy 2 ``AsyncConnection`` or ``AsyncSession``.

        The engine must use ``postgresql+psycopg://``. An AsyncSession joins its
        own transaction (``await session.connection()``), so an enqueue through
        the result commits or rolls back with the session. Raise TypeError for
        anything else (a sync Connection or Session names ``WrapTx.from_sqlalchemy``)
        or for a driver other than psycopg 3.
        """
        if sys.modules.get("sqlalchemy") is None:  # no SQLAlchemy loaded: it cannot be one of its objects
            raise TypeError(
                f"not a SQLAlchemy AsyncConnection or AsyncSession: {type(conn_or_session).__name__}"
            )
        from sqlalchemy.engine import Connection
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
        from sqlalchemy.orm import Session

        if isinstance(conn_or_session, AsyncSession):
            connection = await conn_or_session.connection()
        elif isinstance(conn_or_session, AsyncConnection):
            connection = conn_or_session
            if not connection.in_transaction():
                # Begin as SQLAlchemy's autobegin would, so its commit() commits our insert too.
                await connection.begin()
        elif isinstance(conn_or_session, Connection | Session):
            raise TypeError("a sync SQLAlchemy Connection or Session: use WrapTx.from_sqlalchemy and Store")
        else:
            raise TypeError(
                f"not a SQLAlchemy AsyncConnection or AsyncSession: {type(conn_or_session).__name__}"
            )
        fairy = await connection.get_raw_connection()
        driver = fairy.driver_connection
        if not isinstance(driver, psycopg.AsyncConnection):
            raise TypeError(
                f"the SQLAlchemy driver connection is {type(driver).__name__}, not psycopg 3 async"
            )
        return cls(driver)

    def __repr__(self) -> str:
        return f"AsyncWrapTx({self._conn!r})"


async def execute_async(conn: psycopg.AsyncConnection[Any], query: Query, params: dict[str, Any]) -> int:
    """Run *query*, a statement that returns no rows, on *conn* (the one-statement fast path).

    Return the number of rows it wrote (the command's row count).
    """
    async with conn.cursor() as cur:
        await cur.execute(query.composed, params)
        return cur.rowcount


def on_async_connection(conn: psycopg.AsyncConnection[Any]) -> AsyncRunner:
    """Return an awaitable runner on *conn*, with tuple rows (and decoded jsonb) whatever its settings."""

    async def run(query: Query, params: dict[str, Any]) -> Rows:
        if not query.rows:
            await execute_async(conn, query, params)
            return []
        async with conn.cursor(row_factory=tuple_row) as cur:
            own_json(cur)
            await cur.execute(query.composed, params)
            return await cur.fetchall() if cur.description is not None else []

    return run


def async_connection_of(tx: Any) -> psycopg.AsyncConnection[Any]:
    """Return the AsyncConnection behind *tx* (an AsyncWrapTx or a bare AsyncConnection).

    Raise TypeError for anything else; a sync connection (or WrapTx) names ``Store``.
    """
    if isinstance(tx, AsyncWrapTx):
        return tx.psycopg
    if isinstance(tx, psycopg.AsyncConnection):
        return tx
    if isinstance(tx, psycopg.Connection | WrapTx):
        raise TypeError("a sync psycopg Connection (or WrapTx) goes to Store, not AsyncStore")
    raise TypeError(f"AsyncStore needs an AsyncWrapTx or a psycopg.AsyncConnection, got {type(tx).__name__}")
