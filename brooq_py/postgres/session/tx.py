"""Run a named statement on a psycopg connection or on a caller's transaction; drive plans.

A plan is a generator that yields ``(query, params)`` for every statement it needs and receives its
rows back, run by ``drive`` or ``drive_async``, so the rules cannot drift apart between the two stores.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import uuid
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

import psycopg
from psycopg import postgres, pq
from psycopg.rows import tuple_row
from psycopg.types.json import JsonbBinaryLoader, JsonbLoader

from brooq_py.postgres.session.statements import Query

Rows = list[tuple[Any, ...]]
Runner = Callable[[Query, dict[str, Any]], Rows]


_JSONB = postgres.types["jsonb"].oid


def own_json(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """Decode jsonb on *cur* with psycopg's own loader, whatever the caller's connection set up
    (Django registers a text loader for jsonb on its connections); only that cursor is touched."""
    if cur.adapters.get_loader(_JSONB, pq.Format.TEXT) is not JsonbLoader:
        cur.adapters.register_loader("jsonb", JsonbLoader)
        cur.adapters.register_loader("jsonb", JsonbBinaryLoader)


def _has_rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement returned rows (``description`` would build a Column per field to say so)."""
    res = cur.pgresult
    return res is not None and res.status == pq.ExecStatus.TUPLES_OK


def callers(exc: psycopg.Error) -> psycopg.Error:
    """Mark *exc* as raised by a statement of the caller's (queued in its pipeline before ours): it
    is passed on as it is, never read as a sign of an unmigrated schema (``errors.names_migration``)."""
    exc.brooq_callers = True  # type: ignore[attr-defined]
    return exc


def _pipelined(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether *conn* is in psycopg's pipeline mode, where a statement's result comes at a sync."""
    return bool(conn.pgconn.pipeline_status)


def on_connection(conn: psycopg.Connection[Any]) -> Runner:
    """Return a runner on *conn*, with tuple rows (and decoded jsonb) whatever the connection's
    settings; a statement without rows (``Query.rows``) answers ``[(its row count,)]``. On a
    connection in pipeline mode each statement is synced (a nested pipeline block) before its
    result is read: the answer may decide the next statement."""

    def execute(cur: psycopg.Cursor[Any], query: Query, params: dict[str, Any]) -> None:
        if not _pipelined(conn):
            cur.execute(query.composed, params)
            return
        with contextlib.ExitStack() as stack:
            try:  # entering syncs what the caller queued before: an error there is the caller's own
                stack.enter_context(conn.pipeline())
            except psycopg.Error as exc:
                raise callers(exc) from None
            cur.execute(query.composed, params)

    def run(query: Query, params: dict[str, Any]) -> Rows:
        if not query.rows:
            with conn.cursor() as cur:
                execute(cur, query, params)
                return [(cur.rowcount,)]
        with conn.cursor(row_factory=tuple_row) as cur:
            own_json(cur)
            execute(cur, query, params)
            return cur.fetchall() if _has_rows(cur) else []

    return run


def _plain(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def on_foreign(tx: Any) -> Runner:
    """Return a runner on a foreign Tx: ``tx.execute(text, params)`` with psycopg's ``%(name)s`` style;
    rows are read from what ``execute`` returns, else from *tx* itself (a DB-API cursor)."""

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
    """Return the runner for a caller's *tx*: its psycopg connection when it has one. Raise TypeError
    for an asyncio connection (it belongs to AsyncStore) and for an object without ``execute``."""
    conn = as_psycopg(tx)
    if conn is not None:
        return on_connection(conn)
    refuse_async(tx)
    if not callable(getattr(tx, "execute", None)):
        raise TypeError(f"not a transaction (no execute method): {type(tx).__name__}")
    return on_foreign(tx)


# --- a caller's transaction: WrapTx ---------------------------------------------------------------


class WrapTx:
    """A psycopg Connection, inside the caller's transaction, as a ``queue.Tx``: it wraps and opens
    nothing (the connection, its transaction and its commit stay the caller's)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        if isinstance(conn, psycopg.AsyncConnection):
            raise TypeError("WrapTx needs a sync psycopg.Connection; wrap an AsyncConnection in AsyncWrapTx")
        if not isinstance(conn, psycopg.Connection):
            raise TypeError(f"WrapTx needs a psycopg.Connection, got {type(conn).__name__}")
        self._conn = conn

    @property
    def psycopg(self) -> psycopg.Connection[Any]:
        """Return the wrapped connection itself."""
        return self._conn

    def execute(self, query: Any, params: Any = None) -> Any:
        """Run *query* on the wrapped connection (psycopg ``Connection.execute``) and return the cursor."""
        return self._conn.execute(query, params)

    @classmethod
    def from_sqlalchemy(cls, conn_or_session: Any) -> WrapTx:
        """Wrap the psycopg 3 connection behind a SQLAlchemy 2 ``Connection`` or ``Session`` (which joins
        its own transaction: an enqueue commits or rolls back with it). Raise TypeError for anything
        else, or for a driver other than psycopg 3."""
        not_one = f"not a SQLAlchemy Connection or Session: {type(conn_or_session).__name__}"
        if sys.modules.get("sqlalchemy") is None:  # no SQLAlchemy loaded: it cannot be one of its objects
            raise TypeError(not_one)
        from sqlalchemy.engine import Connection
        from sqlalchemy.orm import Session

        if isinstance(conn_or_session, Session):
            connection = conn_or_session.connection()
        elif isinstance(conn_or_session, Connection):
            connection = conn_or_session
            if not connection.in_transaction():
                # Begin as SQLAlchemy's autobegin would, so its commit() commits our insert too.
                connection.begin()
        else:
            raise TypeError(not_one)
        driver = connection.connection.driver_connection
        if not isinstance(driver, psycopg.Connection):
            raise TypeError(f"the SQLAlchemy driver connection is {type(driver).__name__}, not psycopg 3")
        return cls(driver)

    @classmethod
    def from_django(cls, using: str = "default") -> WrapTx:
        """Wrap the psycopg 3 connection behind Django's database connection *using*: the enqueue joins
        whatever ``transaction.atomic()`` block is open on it. Raise TypeError for another driver."""
        from django.db import connections  # Django is an optional extra: imported only here

        connection = connections[using]
        connection.ensure_connection()
        driver = connection.connection
        if not isinstance(driver, psycopg.Connection):
            raise TypeError(
                f"Django connection {using!r} runs on {type(driver).__name__}, not psycopg 3 "
                "(use django.db.backends.postgresql with psycopg 3 installed)"
            )
        return cls(driver)

    def __repr__(self) -> str:
        return f"WrapTx({self._conn!r})"


def as_psycopg(tx: Any) -> psycopg.Connection[Any] | None:
    """Return the psycopg connection behind *tx*: a WrapTx's (None once it is closed), a bare psycopg
    Connection as is; None for anything else (a foreign Tx, None)."""
    if isinstance(tx, WrapTx):
        conn = tx.psycopg
        return None if conn.closed else conn
    if isinstance(tx, psycopg.Connection):
        return tx
    return None


def in_block(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None) -> bool:
    """Whether a statement on *conn* runs inside a transaction block (a savepoint can be set there):
    a transaction is open, or the connection opens one at its next statement (not autocommit). A
    foreign Tx (None) may be in one: True (its SAVEPOINT outside one is answered, 25P01)."""
    return conn is None or not conn.autocommit or conn.info.transaction_status != pq.TransactionStatus.IDLE


# --- a caller's asyncio transaction: AsyncWrapTx --------------------------------------------------


AsyncRunner = Callable[[Query, dict[str, Any]], Awaitable[Rows]]


class AsyncWrapTx:
    """A psycopg ``AsyncConnection``, inside the caller's transaction, for ``AsyncStore``: as ``WrapTx``."""

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
        """``WrapTx.from_sqlalchemy`` for a SQLAlchemy 2 ``AsyncConnection`` or ``AsyncSession`` on
        ``postgresql+psycopg://``; a sync Connection or Session raises TypeError naming ``WrapTx``."""
        not_one = f"not a SQLAlchemy AsyncConnection or AsyncSession: {type(conn_or_session).__name__}"
        if sys.modules.get("sqlalchemy") is None:  # no SQLAlchemy loaded: it cannot be one of its objects
            raise TypeError(not_one)
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
            raise TypeError(not_one)
        fairy = await connection.get_raw_connection()
        driver = fairy.driver_connection
        if not isinstance(driver, psycopg.AsyncConnection):
            raise TypeError(
                f"the SQLAlchemy driver connection is {type(driver).__name__}, not psycopg 3 async"
            )
        return cls(driver)

    def __repr__(self) -> str:
        return f"AsyncWrapTx({self._conn!r})"


def on_async_connection(conn: psycopg.AsyncConnection[Any]) -> AsyncRunner:
    """``on_connection`` for an asyncio connection: an awaitable runner."""

    async def execute(cur: psycopg.AsyncCursor[Any], query: Query, params: dict[str, Any]) -> None:
        if not _pipelined(conn):
            await cur.execute(query.composed, params)
            return
        async with contextlib.AsyncExitStack() as stack:
            try:  # entering syncs what the caller queued before: an error there is the caller's own
                await stack.enter_async_context(conn.pipeline())
            except psycopg.Error as exc:
                raise callers(exc) from None
            await cur.execute(query.composed, params)

    async def run(query: Query, params: dict[str, Any]) -> Rows:
        if not query.rows:
            async with conn.cursor() as cur:
                await execute(cur, query, params)
                return [(cur.rowcount,)]
        async with conn.cursor(row_factory=tuple_row) as cur:
            own_json(cur)
            await execute(cur, query, params)
            return await cur.fetchall() if _has_rows(cur) else []

    return run


def async_connection_of(tx: Any) -> psycopg.AsyncConnection[Any]:
    """Return the AsyncConnection behind *tx* (an AsyncWrapTx or a bare AsyncConnection); raise
    TypeError for anything else, naming ``Store`` for a sync connection (or WrapTx)."""
    if isinstance(tx, AsyncWrapTx):
        return tx.psycopg
    if isinstance(tx, psycopg.AsyncConnection):
        return tx
    if isinstance(tx, psycopg.Connection | WrapTx):
        raise TypeError("a sync psycopg Connection (or WrapTx) goes to Store, not AsyncStore")
    raise TypeError(f"AsyncStore needs an AsyncWrapTx or a psycopg.AsyncConnection, got {type(tx).__name__}")


# --- plans: statements written once, driven on a blocking or an awaitable runner ------------------


Statement = tuple[Query, dict[str, Any]]
T = TypeVar("T")
Plan = Generator[Statement, Rows, T]


def first_statement(plan: Plan[T]) -> tuple[Statement | None, T | None]:
    """Start *plan*: return its first statement, or (None, result) when it needs none (a malformed
    id): a store takes a connection only for a plan that has a statement to run."""
    try:
        return next(plan), None
    except StopIteration as done:
        return None, done.value


def drive(plan: Plan[T], run: Runner, first: Statement | None = None) -> T:
    """Run *plan* to its end on a blocking runner and return its result; a statement's error is
    raised inside the plan, which may answer it (*first*: from ``first_statement``)."""
    try:
        statement = next(plan) if first is None else first
        while True:
            try:
                rows = run(*statement)
            except Exception as exc:
                statement = plan.throw(exc)
            else:
                statement = plan.send(rows)
    except StopIteration as done:
        result: T = done.value
        return result


async def drive_async(plan: Plan[T], run: AsyncRunner, first: Statement | None = None) -> T:
    """Run *plan* to its end on an awaitable runner and return its result (as ``drive``)."""
    try:
        statement = next(plan) if first is None else first
        while True:
            try:
                rows = await run(*statement)
            except Exception as exc:
                statement = plan.throw(exc)
            else:
                statement = plan.send(rows)
    except StopIteration as done:
        result: T = done.value
        return result
