"""The pool plumbing every part of a store runs on, and the Store's own connections.

A ``Session`` (or ``AsyncSession``) holds a store's pool and its statements rendered for its schema.
An ``OwnConnection`` (heartbeat, claims, outcome batches) saves the pool checkout, its session set up
for its one statement. Its waits are bounded by the lease (SPEC L3, L3', H1): server timeouts, TCP
keepalives, and ``deadline()``, which shuts the socket down when a statement has not answered in time
(a path gone silent behind a proxy that still ACKs).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import psycopg
import psycopg_pool

from brooq_py.postgres.session.errors import (
    dropped_if_read_only,
    is_connection_error,
    is_own_outage,
    refused_by_read_only,
    translated,
    unavailable,
)
from brooq_py.postgres.session.statements import Queries, Query
from brooq_py.postgres.session.tx import (
    AsyncWrapTx,
    Plan,
    Rows,
    WrapTx,
    drive,
    drive_async,
    first_statement,
    on_async_connection,
    on_connection,
)
from brooq_py.queue import BrooqError, StoreUnavailable

# After the server refused a connection, ``try_run`` leaves statements to the pool this long.
REOPEN_PAUSE = 1.0

T = TypeVar("T")


# Connection settings of the pool that are not libpq parameters, left out of our own connections.
NOT_LIBPQ = frozenset({"autocommit", "row_factory", "cursor_factory", "context"})

# Claim and settle sessions plan each statement once: planning cost a third of a one-row claim.
CACHED_PLAN = "-c plan_cache_mode=force_generic_plan"
# How long a claim or an outcome batch waits for a row lock before it leaves that row aside.
SETTLE_LOCK_WAIT = "250ms"
DEFAULT_LEASE = timedelta(seconds=30)


class Session:
    """A Store's pool (the caller's, or None: then whatever needs it raises BrooqError) and
    statements; its own connections are opened from *conninfo* (default: the pool's)."""

    def __init__(
        self, pool: psycopg_pool.ConnectionPool[Any] | None, schema: str, conninfo: str | None
    ) -> None:
        if isinstance(pool, psycopg_pool.AsyncConnectionPool):
            raise TypeError("an AsyncConnectionPool goes to AsyncStore, not Store")
        if pool is not None and not isinstance(pool, psycopg_pool.ConnectionPool):
            raise TypeError(f"Store needs a psycopg_pool.ConnectionPool or None, got {type(pool).__name__}")
        self.pool = pool
        self.q = Queries(check_schema(schema))
        self.conninfo = conninfo
        self.own_lease = DEFAULT_LEASE

    def connect_own(self, options: str = "") -> psycopg.Connection[Any]:
        """Open one of the Store's own autocommit connections, its waits bounded by ``own_lease``;
        *options*: server settings (``-c name=value``) for its session alone."""
        pool = self.pool
        if self.conninfo is not None:
            conninfo, extra = self.conninfo, {}
        elif pool is None:
            raise no_pool("Store", "opening its own connection")
        else:
            # The pool's settings may be callables (evaluated per connection); so are ours.
            conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
            kwargs = pool.kwargs() if callable(pool.kwargs) else (pool.kwargs or {})
            extra = {k: v for k, v in kwargs.items() if k not in NOT_LIBPQ}
        return psycopg.connect(conninfo, autocommit=True, **merged(extra, self.own_lease, options))

    @contextmanager
    def autocommit(self, doing: str, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        """Lend a pool connection in autocommit mode; put its flag back before it returns to the pool.
        (``getconn``/``putconn``: the pool's ``connection()`` costs about 30 us of CPU a call.)"""
        pool = self.pool
        if pool is None:
            raise no_pool("Store", doing)
        with translated(doing):
            conn = pool.getconn(timeout=timeout)
            try:
                saved = conn.autocommit
                if not saved:
                    conn.autocommit = True
                try:
                    with dropped_if_read_only(conn, doing, own=True):
                        yield conn
                finally:
                    if not saved and not conn.closed:
                        with contextlib.suppress(psycopg.Error):  # a broken one: the pool discards it
                            conn.autocommit = False
            finally:
                pool.putconn(conn)

    def run(self, doing: str, query: Query, params: dict[str, Any]) -> Rows:
        with self.autocommit(doing) as conn:
            return on_connection(conn)(query, params)

    def run_bounded(
        self,
        doing: str,
        query: Query,
        params: dict[str, Any],
        seconds: float,
        cut: float | None = None,
        lock_wait: str = SETTLE_LOCK_WAIT,
    ) -> Rows:
        """Run *query* in a transaction whose statement and lock timeouts are bounded, not the session's;
        *cut*: also wait at most that long for a pool connection, and shut its socket down that long
        after (a server that stopped answering never sees the timeouts)."""
        bounds = bounded(seconds, lock_wait)
        with (
            self.autocommit(doing, timeout=cut) as conn,
            deadline(conn, cut) if cut is not None else contextlib.nullcontext(),
            conn.transaction(),
        ):
            run = on_connection(conn)
            run(self.q["session_bounds"], bounds)
            return run(query, params)

    def drive(self, doing: str, plan: Plan[T], whole: bool = False) -> T:
        """Run *plan* in autocommit statements on a pool connection (none taken if it needs none);
        *whole*: in one transaction, rolled back unless the plan answers a true value."""
        first, result = first_statement(plan)
        if first is None:
            return cast(T, result)  # a plan that needs no statement has ended
        with self.autocommit(doing) as conn:
            if not whole:
                return drive(plan, on_connection(conn), first)
            with conn.transaction():
                result = drive(plan, on_connection(conn), first)
                if not result:
                    raise psycopg.Rollback()
            return result

    @contextmanager
    def begin(self) -> Iterator[WrapTx]:
        """Yield a WrapTx in a pool transaction: commit on a clean exit, rollback on an exception."""
        if self.pool is None:
            raise no_pool("Store", "opening a transaction")
        doing = "running a transaction"
        # A read-only server's refusal closes the connection after the rollback (session/errors.py).
        with (
            translated(doing),
            self.pool.connection() as conn,
            dropped_if_read_only(conn, doing),
            conn.transaction(),
        ):
            yield WrapTx(conn)


class AsyncSession:
    """An AsyncStore's pool and statements: ``Session`` for asyncio, without own connections."""

    def __init__(self, pool: psycopg_pool.AsyncConnectionPool[Any] | None, schema: str) -> None:
        if isinstance(pool, psycopg_pool.ConnectionPool):
            raise TypeError("a sync ConnectionPool goes to Store, not AsyncStore")
        if pool is not None and not isinstance(pool, psycopg_pool.AsyncConnectionPool):
            raise TypeError(
                f"AsyncStore needs a psycopg_pool.AsyncConnectionPool or None, got {type(pool).__name__}"
            )
        self.pool = pool
        self.q = Queries(check_schema(schema))

    @asynccontextmanager
    async def autocommit(self, doing: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """``Session.autocommit`` on the asyncio pool."""
        pool = self.pool
        if pool is None:
            raise no_pool("AsyncStore", doing)
        with translated(doing):
            conn = await pool.getconn()
            try:
                saved = conn.autocommit
                if not saved:
                    await conn.set_autocommit(True)
                try:
                    async with _dropped_if_read_only(conn, doing, own=True):
                        yield conn
                finally:
                    if not saved and not conn.closed:
                        with contextlib.suppress(psycopg.Error):  # a broken one: the pool discards it
                            await conn.set_autocommit(False)
            finally:
                await pool.putconn(conn)

    async def run(self, doing: str, query: Query, params: dict[str, Any]) -> Rows:
        async with self.autocommit(doing) as conn:
            return await on_async_connection(conn)(query, params)

    async def drive(self, doing: str, plan: Plan[T], whole: bool = False) -> T:
        """``Session.drive`` on the asyncio pool."""
        first, result = first_statement(plan)
        if first is None:
            return cast(T, result)  # a plan that needs no statement has ended
        async with self.autocommit(doing) as conn:
            if not whole:
                return await drive_async(plan, on_async_connection(conn), first)
            async with conn.transaction():
                result = await drive_async(plan, on_async_connection(conn), first)
                if not result:
                    raise psycopg.Rollback()
            return result

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncWrapTx]:
        """``Session.begin`` on the asyncio pool: an AsyncWrapTx."""
        if self.pool is None:
            raise no_pool("AsyncStore", "opening a transaction")
        doing = "running a transaction"
        with translated(doing):
            # A read-only server's refusal closes the connection after the rollback (session/errors.py).
            async with (
                self.pool.connection() as conn,
                _dropped_if_read_only(conn, doing),
                conn.transaction(),
            ):
                yield AsyncWrapTx(conn)

    async def connect_listen(self) -> psycopg.AsyncConnection[Any]:
        """Open an autocommit connection with the pool's settings (``wait``'s LISTEN connection)."""
        pool = self.pool
        if pool is None:
            raise no_pool("AsyncStore", "waiting for a job")
        # The pool's settings may be callables, possibly async ones (evaluated per connection).
        conninfo: Any = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
        if inspect.isawaitable(conninfo):
            conninfo = await conninfo
        kwargs: Any = pool.kwargs() if callable(pool.kwargs) else (pool.kwargs or {})
        if inspect.isawaitable(kwargs):
            kwargs = await kwargs
        extra = {k: v for k, v in kwargs.items() if k not in NOT_LIBPQ}
        return await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **extra)


@asynccontextmanager
async def _dropped_if_read_only(
    conn: psycopg.AsyncConnection[Any], doing: str, own: bool = False
) -> AsyncIterator[None]:
    """errors.dropped_if_read_only for an asyncio connection: close it on a read-only server's refusal."""
    try:
        yield
    except Exception as exc:
        if not refused_by_read_only(exc, conn, own):
            raise
        await conn.close()
        if isinstance(exc, StoreUnavailable):
            raise
        raise unavailable(exc, doing) from exc


class OwnConnection:
    """A lazily opened autocommit connection, one statement at a time, reopened after a break;
    ``try_run`` returns None rather than wait for another thread or a server that refuses it."""

    def __init__(
        self, connect: Callable[[], psycopg.Connection[Any]], budget: Callable[[], float] | None = None
    ) -> None:
        self._connect = connect
        self._budget = budget
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._reopen_at = 0.0  # try_run: no new connection before this (monotonic)

    def run(self, doing: str, query: Query, params: dict[str, Any]) -> Rows:
        with self._lock:
            try:
                return self._run_locked(doing, query, params)
            finally:
                self._close_if_asked()

    def try_run(self, doing: str, query: Query, params: dict[str, Any]) -> Rows | None:
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._closed:
                return None
            if self._conn is None or self._conn.closed:
                if time.monotonic() < self._reopen_at:
                    return None
                try:
                    self._open(doing)
                except StoreUnavailable:
                    self._reopen_at = time.monotonic() + REOPEN_PAUSE
                    return None
            return self._run_locked(doing, query, params)
        finally:
            self._close_if_asked()
            self._lock.release()

    def try_run_bounded(
        self, doing: str, bounds: Query, limits: dict[str, str], query: Query, params: dict[str, Any]
    ) -> Rows | None:
        """``try_run`` of *query* in a transaction whose waits *bounds* (session_bounds.sql) limits."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            conn = self._conn
            if self._closed or conn is None or conn.closed:
                return None  # opened by try_run, whose statements come first
            try:
                with (
                    deadline(conn, self._budget()) if self._budget else contextlib.nullcontext(),
                    conn.transaction(),
                ):
                    run = on_connection(conn)
                    run(bounds, limits)
                    return run(query, params)
            except psycopg.Error as exc:
                if not is_own_outage(exc):
                    raise
                self._close_locked()
                raise unavailable(exc, doing) from exc
        finally:
            self._close_if_asked()
            self._lock.release()

    def _close_if_asked(self) -> None:
        if self._closed:
            self._close_locked()

    def _open(self, doing: str) -> psycopg.Connection[Any]:
        """Open the connection; StoreUnavailable when the server cannot be reached or refuses it."""
        self._conn = None
        try:
            self._conn = self._connect()
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if not is_connection_error(exc):
                raise
            raise unavailable(exc, doing) from exc
        return self._conn

    def _run_locked(self, doing: str, query: Query, params: dict[str, Any]) -> Rows:
        conn = self._conn if self._conn is not None and not self._conn.closed else self._open(doing)
        try:
            with deadline(conn, self._budget()) if self._budget else contextlib.nullcontext():
                return on_connection(conn)(query, params)
        except psycopg.Error as exc:
            # broken, or on a standby: closed, so the next reopens where target_session_attrs says
            if not is_own_outage(exc):
                raise
            self._close_locked()
            raise unavailable(exc, doing) from exc

    def _close_locked(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self, wait: float = 1.0) -> None:
        """Close the connection, and the one a later ``run`` opens as its statement ends; safe to
        repeat. A statement still running after *wait* seconds closes it as it returns."""
        self._closed = True  # before the lock: a statement that holds it closes on its way out
        if self._lock.acquire(timeout=wait):
            try:
                self._close_locked()
            finally:
                self._lock.release()

    def reuse(self) -> None:
        """Keep the connection open between statements again (an engine starts on the Store)."""
        self._closed = False


# --- bounded waits on the own connections ---------------------------------------------------------


def bounded(seconds: float, lock_wait: str = SETTLE_LOCK_WAIT) -> dict[str, str]:
    """session_bounds.sql's parameters: waits for locks up to *lock_wait*, statements up to *seconds*."""
    return {"lock_timeout": lock_wait, "statement_timeout": f"{max(int(seconds * 1000), 100)}ms"}


def merged(kwargs: dict[str, Any], lease: timedelta, options: str = "") -> dict[str, Any]:
    """*kwargs* with the libpq settings of a connection that must notice trouble within *lease*/3,
    then *options*; the caller's ``options`` come first, so ours win."""
    third = max(lease.total_seconds() / 3, 1.0)
    ms = int(third * 1000)
    ours = (
        f"-c statement_timeout={ms} -c lock_timeout={max(ms // 2, 100)} "
        f"-c idle_in_transaction_session_timeout={ms * 3} -c tcp_keepalives_idle={max(1, int(third / 2))} "
        f"-c tcp_keepalives_interval={max(1, int(third / 6))} -c tcp_keepalives_count=3"
    )
    return {
        **kwargs,
        "connect_timeout": max(2, int(third)),
        "keepalives": 1,
        "keepalives_idle": max(1, int(third / 2)),
        "keepalives_interval": max(1, int(third / 6)),
        "keepalives_count": 3,
        "tcp_user_timeout": ms,
        "options": " ".join(o for o in (kwargs.get("options"), ours, options) if o),
    }


def statement_budget(lease: timedelta) -> float:
    """How long a statement on an own connection may take before its socket is shut down."""
    return max(lease.total_seconds() / 3, 1.0) + 1.0


@contextlib.contextmanager
def deadline(conn: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
    """Shut *conn*'s socket down if the block has not ended after *seconds*: the waiting call then
    fails at once with a connection error instead of blocking on a socket nobody answers. A socket
    shut down as the block ended is closed with it: the connection never goes back to a pool (or on
    to its next statement) with a dead socket, and no shutdown comes after the block."""
    lock = threading.Lock()
    done = False
    fired = False

    def expire() -> None:
        nonlocal fired
        with lock:
            if done:
                return
            fired = True
            with contextlib.suppress(Exception):
                fd = conn.pgconn.socket
                sock = socket.socket(fileno=fd)
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                finally:
                    sock.detach()  # the fd stays libpq's

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            done = True
        timer.cancel()
        if fired:
            with contextlib.suppress(Exception):
                conn.close()


# --- what both Stores check before they connect ---------------------------------------------------


# PostgreSQL cuts a longer identifier to this many bytes: two names alike in them would be one schema.
MAX_SCHEMA_BYTES = 63


def check_schema(schema: Any) -> str:
    """Return *schema*; ValueError for anything but non-empty Unicode text without NUL, of at most
    MAX_SCHEMA_BYTES bytes in UTF-8."""
    if not isinstance(schema, str) or not schema or "\x00" in schema:
        raise ValueError(f"invalid schema name: {schema!r}")
    try:
        size = len(schema.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"invalid schema name: {schema!r} is not valid Unicode text") from None
    if size > MAX_SCHEMA_BYTES:
        raise ValueError(
            f"invalid schema name: {schema!r} is {size} bytes in UTF-8; PostgreSQL keeps {MAX_SCHEMA_BYTES}"
        )
    return schema


def no_pool(store: str, doing: str) -> BrooqError:
    """Return the error of a producer-only store (built without a pool) asked to use one."""
    return BrooqError(
        f"{store} was built without a pool ({store}(None, ...)), so it cannot do this ({doing}): "
        "it only enqueues inside your own transactions (enqueue_tx, enqueue_many(tx=...)); "
        f"give {store} a pool for the rest"
    )


# --- a store made of parts ------------------------------------------------------------------------


P = ParamSpec("P")


def delegate(method: Callable[Concatenate[Any, P], T], part: str) -> Callable[Concatenate[Any, P], T]:
    """A method that calls *method* on the object in attribute *part*: ``enqueue =
    delegate(Producer.enqueue, "producer")`` (its name, signature and docstring, for help())."""
    name = method.__name__

    @functools.wraps(method)
    def forward(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        result: T = getattr(getattr(self, part), name)(*args, **kwargs)
        return result

    return forward
