"""Adapt a caller's transaction to the queue's ``Tx`` port, and back to psycopg."""

from __future__ import annotations

import sys
from typing import Any

import psycopg


class WrapTx:
    """A psycopg Connection, inside the caller's transaction, as a ``queue.Tx``.

    It wraps and opens nothing: the connection, its transaction and its commit
    stay the caller's. ``psycopg`` gives back the very same connection.
    """

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
        """Wrap the psycopg 3 connection behind a SQLAlchemy 2 ``Connection`` or ``Session``.

        A Session joins its own transaction (``session.connection()``), so an
        enqueue through the result commits or rolls back with the session.
        Raise TypeError for anything else, or for a driver other than psycopg 3.
        """
        sa = sys.modules.get("sqlalchemy")
        if sa is None:  # no SQLAlchemy loaded: it cannot be one of its objects
            raise TypeError(f"not a SQLAlchemy Connection or Session: {type(conn_or_session).__name__}")
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
            raise TypeError(f"not a SQLAlchemy Connection or Session: {type(conn_or_session).__name__}")
        driver = connection.connection.driver_connection
        if not isinstance(driver, psycopg.Connection):
            raise TypeError(f"the SQLAlchemy driver connection is {type(driver).__name__}, not psycopg 3")
        return cls(driver)

    @classmethod
    def from_django(cls, using: str = "default") -> WrapTx:
        """Wrap the psycopg 3 connection behind Django's database connection *using*.

        The enqueue joins whatever ``transaction.atomic()`` block is open on that
        connection (outside one, Django's autocommit commits it at once). Raise
        TypeError when the connection's driver is not psycopg 3 (Django's
        ``django.db.backends.postgresql`` with psycopg 3 installed).
        """
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
    """Return the psycopg connection behind *tx*, or None.

    A WrapTx gives its connection (None once that connection is closed); a
    bare psycopg Connection is returned as is; anything else (a foreign Tx,
    None) gives None.
    """
    if isinstance(tx, WrapTx):
        conn = tx.psycopg
        return None if conn.closed else conn
    if isinstance(tx, psycopg.Connection):
        return tx
    return None
