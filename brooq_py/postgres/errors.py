"""Translate psycopg's connection errors at the Store's edge; never leak a DSN password."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import psycopg

from brooq_py.queue import BrooqError, StoreUnavailable
from brooq_py.redact import mask_secrets

# Server-side states that mean "the connection is gone or cannot be had", as opposed to
# a statement's own failure (a statement timeout is an OperationalError too, 57014).
_CONNECTION_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})


def is_connection_error(exc: BaseException) -> bool:
    """Return True if *exc* says the database cannot be reached or the connection broke."""
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg.OperationalError):
        state = exc.sqlstate
        return state is None or state.startswith("08") or state in _CONNECTION_STATES
    return False


def unavailable(exc: BaseException, doing: str) -> StoreUnavailable:
    """Return a StoreUnavailable for *exc* (the caller raises it ``from exc``)."""
    detail = mask_secrets(str(exc).strip()) or type(exc).__name__
    return StoreUnavailable(f"database unavailable while {doing}: {type(exc).__name__}: {detail}")


@contextmanager
def translated(doing: str) -> Iterator[None]:
    """Raise StoreUnavailable (chained) for a psycopg connection error inside the block."""
    try:
        yield
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        if not is_connection_error(exc):
            raise
        raise unavailable(exc, doing) from exc


_F = TypeVar("_F", bound=Callable[..., Any])
_MISSING = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName)


def _missing_tables(exc: BaseException) -> bool:
    """True when *exc*, or what it wraps (SQLAlchemy's ``orig``, Django's cause), says a table or
    schema does not exist."""
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            return False
        if isinstance(seen, _MISSING):
            return True
        orig = getattr(seen, "orig", None)
        seen = orig if isinstance(orig, BaseException) else (seen.__cause__ or seen.__context__)
    return False


def not_migrated(schema: str) -> BrooqError:
    return BrooqError(
        f"schema {schema!r} has no brooq_py tables (it is not migrated): "
        f"run `brooq-py migrate up --schema {schema}`"
    )


def names_migration(fn: _F) -> _F:
    """Decorate a Store/AsyncStore method: a statement on a schema without brooq's tables raises
    BrooqError naming ``migrate up --schema S`` (chained), not a bare UndefinedTable.

    Nothing more is run: the caller's transaction is left as that one failed statement left it.
    """
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(self, *args, **kwargs)
            except Exception as exc:
                if _missing_tables(exc):
                    raise not_migrated(self.schema) from exc
                raise

        return cast(_F, run_async)

    @functools.wraps(fn)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:
            if _missing_tables(exc):
                raise not_migrated(self.schema) from exc
            raise

    return cast(_F, run)
