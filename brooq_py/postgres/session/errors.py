"""Translate psycopg's connection errors at the store's edge; never leak a DSN password.

A broken connection, one that could not be had, and a standby's refusal (25006, SPEC H1) become a
retryable ``StoreUnavailable``; a read-only server's connection is closed rather than reused, so the
next one (``target_session_attrs=read-write``) lands on the server that accepts writes now.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import psycopg
import psycopg_pool

from brooq_py.queue import BrooqError, InvalidUsage, StoreUnavailable
from brooq_py.redact import mask_secrets

# States that mean the connection is gone or cannot be had (57P03: recovery, starting up), unlike
# a statement's own failure (a statement timeout is an OperationalError too, 57014).
_CONNECTION_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})

# read_only_sql_transaction: "cannot execute INSERT in a read-only transaction" on a hot
# standby, "cannot execute LISTEN during recovery", a server with default_transaction_read_only.
READ_ONLY_STATE = "25006"


def is_connection_error(exc: BaseException) -> bool:
    """Return True if *exc* says the database cannot be reached or the connection broke."""
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg.OperationalError):
        state = exc.sqlstate
        return state is None or state.startswith("08") or state in _CONNECTION_STATES
    return False


def is_read_only_refusal(exc: BaseException | None) -> bool:
    """Return True if *exc* is a statement refused because its transaction was read-only (25006)."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate == READ_ONLY_STATE


def server_is_read_only(conn: Any) -> bool:
    """Whether *conn*'s server reports itself a hot standby or read-only by default (PostgreSQL 14
    and later, no round trip); one that reports neither is taken for read-only."""
    info = getattr(conn, "info", None)
    if info is None:
        return True
    reported = [info.parameter_status(name) for name in ("in_hot_standby", "default_transaction_read_only")]
    return "on" in reported or all(value is None for value in reported)


def on_read_only_server(exc: BaseException | None, conn: Any) -> bool:
    """Return True if *exc* is a 25006 refusal and *conn* is on a standby or a read-only server (not
    in a transaction the caller made read-only: that is its own error). No *conn* to ask: False."""
    return conn is not None and is_read_only_refusal(exc) and server_is_read_only(conn)


def is_outage(exc: BaseException, conn: Any = None) -> bool:
    """Return True if *exc* on *conn* is no fault of the statement: retry on another connection."""
    return is_connection_error(exc) or on_read_only_server(exc, conn)


def is_own_outage(exc: BaseException | None) -> bool:
    """``is_outage`` for a statement in a transaction the library opened itself, never read-only by
    choice: any 25006 is the server's refusal, whatever the server reports by the time it is asked (a
    standby promoted meanwhile already reports read-write)."""
    return exc is not None and (is_connection_error(exc) or is_read_only_refusal(exc))


def unavailable(exc: BaseException, doing: str) -> StoreUnavailable | InvalidUsage:
    """Return a StoreUnavailable for *exc* (the caller raises it ``from exc``); InvalidUsage for a pool
    never opened, the calling code's mistake."""
    if isinstance(exc, psycopg_pool.PoolClosed) and "not open yet" in str(exc):
        return InvalidUsage(
            f"the connection pool given to the Store is not open ({doing}): open the pool first "
            "(pool.open(), or `with pool:` / `async with pool:`; ConnectionPool(..., open=False) "
            "leaves it closed)"
        )
    detail = mask_secrets(str(exc).strip()) or type(exc).__name__
    return StoreUnavailable(f"database unavailable while {doing}: {type(exc).__name__}: {detail}")


@contextmanager
def translated(doing: str, conn: Any = None, *, own: bool = False) -> Iterator[None]:
    """Raise StoreUnavailable (chained) for a psycopg connection error inside the block, and for a
    read-only server's refusal on *conn* (the block's connection, when known; never closed here);
    *own*: the block runs on a connection of the library's own, where any 25006 is the server's."""
    try:
        yield
    except psycopg.Error as exc:
        if not (is_own_outage(exc) if own else is_outage(exc, conn)):
            raise
        raise unavailable(exc, doing) from exc


def refused_by_read_only(exc: BaseException, conn: Any, own: bool = False) -> bool:
    """Whether *exc* (a psycopg error, or a StoreUnavailable raised from one) is a read-only server's
    refusal; *own*: in a transaction the library opened itself (any 25006 is then the server's)."""
    cause = exc.__cause__ if isinstance(exc, StoreUnavailable) else exc
    return is_read_only_refusal(cause) if own else on_read_only_server(cause, conn)


@contextmanager
def dropped_if_read_only(conn: psycopg.Connection[Any], doing: str, own: bool = False) -> Iterator[None]:
    """Close *conn* when the block was refused by a read-only server, and raise StoreUnavailable: the
    pool's next connection goes where ``target_session_attrs`` says (the server accepting writes).
    *own*: the block's statements are the library's alone (see ``refused_by_read_only``)."""
    try:
        yield
    except Exception as exc:
        if not refused_by_read_only(exc, conn, own):
            raise
        conn.close()
        if isinstance(exc, StoreUnavailable):
            raise
        raise unavailable(exc, doing) from exc


_F = TypeVar("_F", bound=Callable[..., Any])
_MISSING = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName)


def _missing(exc: BaseException) -> BaseException | None:
    """The error in *exc* or what it wraps (SQLAlchemy's ``orig``, a cause) saying a table or schema
    is missing, or None."""
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            return None
        if isinstance(seen, _MISSING):
            return seen
        orig = getattr(seen, "orig", None)
        seen = orig if isinstance(orig, BaseException) else (seen.__cause__ or seen.__context__)
    return None


# Tables of the migrations after 0010: one missing says the schema is behind, not unmigrated.
_LATER_TABLES = frozenset(
    {
        "job_wait",
        "engine",
        "job_step",
        "job_signal",
        "job_sequence_due",
        "job_sequence_halt",
        "job_sequence_hold",
        "tenant_setting",
        "tenant_topic",
    }
)


def _a_later_table(exc: BaseException) -> bool:
    """Whether the missing relation is a table of a migration after 0010."""
    missing = _missing(exc)
    if not isinstance(missing, psycopg.errors.UndefinedTable):
        return False
    found = re.search(r'relation "([^"]+)" does not exist', missing.diag.message_primary or "")
    return found is not None and found.group(1).rsplit(".", 1)[-1] in _LATER_TABLES


def not_migrated(schema: str) -> BrooqError:
    return BrooqError(
        f"schema {schema!r} has no brooq_py tables (it is not migrated): "
        f"run `brooq-py migrate up --schema {schema}`"
    )


def behind(schema: str) -> BrooqError:
    return BrooqError(
        f"schema {schema!r} is older than this brooq_py (a column it writes is missing): "
        f"run `brooq-py migrate up --schema {schema}`"
    )


def _schema_error(schema: str, exc: BaseException) -> BrooqError | None:
    """The error naming ``migrate up`` for a schema without brooq's tables, or older than this code
    (a column missing); None for any other error, and for one of the caller's own statements."""
    if getattr(exc, "brooq_callers", False):
        return None
    if _missing(exc) is not None:
        return behind(schema) if _a_later_table(exc) else not_migrated(schema)
    if isinstance(exc, psycopg.errors.UndefinedColumn) or isinstance(
        exc.__cause__ or exc.__context__, psycopg.errors.UndefinedColumn
    ):
        return behind(schema)
    return None


def names_migration(fn: _F) -> _F:
    """Decorate a store's method: a statement on a schema without brooq's tables raises BrooqError
    naming ``migrate up --schema S`` (chained), not a bare UndefinedTable; nothing more is run."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(self, *args, **kwargs)
            except Exception as exc:
                if (error := _schema_error(self.schema, exc)) is not None:
                    raise error from exc
                raise

        return cast(_F, run_async)

    @functools.wraps(fn)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:
            if (error := _schema_error(self.schema, exc)) is not None:
                raise error from exc
            raise

    return cast(_F, run)
