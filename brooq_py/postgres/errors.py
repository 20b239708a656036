"""Translate psycopg's connection errors at the Store's edge; never leak a DSN password."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from brooq_py.queue import StoreUnavailable
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
