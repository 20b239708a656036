"""A LISTEN subscription on its own autocommit connection (the engine's wake-up)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from brooq_py.postgres.bounds import deadline, statement_budget
from brooq_py.postgres.errors import is_connection_error, translated, unavailable
from brooq_py.postgres.queries import Query


class PgListener:
    """Wait for NOTIFYs on the schema's channel.

    The connection is opened and LISTENs at construction (raise
    StoreUnavailable if the database cannot be reached).
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        listen: Query,
        on_close: Callable[[PgListener], None] | None = None,
        ping_every: timedelta | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._on_close = on_close
        # A silent LISTEN connection looks like a quiet queue: ping it every lease/3 (SPEC L3), by
        # repeating the LISTEN (a no-op for the server, and the session still shows LISTEN).
        self._listen = listen
        self._ping_every = ping_every
        self._pinged = time.monotonic()
        with translated("opening the LISTEN connection"):
            self._conn = connect()
            try:
                self._conn.execute(listen.composed)
            except BaseException:
                self._conn.close()
                raise

    def wait(self, timeout: float) -> bool:
        """Block up to *timeout* seconds; return True if a notification arrived.

        Raise StoreUnavailable when the connection is broken or closed.
        """
        try:
            for _ in self._conn.notifies(timeout=max(0.0, timeout), stop_after=1):
                return True
            self._ping_if_due()
            return False
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if not is_connection_error(exc):
                raise
            raise unavailable(exc, "waiting for notifications") from exc

    def _ping_if_due(self) -> None:
        lease = self._ping_every
        if lease is None or time.monotonic() - self._pinged < max(lease.total_seconds() / 3, 1.0):
            return
        with deadline(self._conn, statement_budget(lease)):
            self._conn.execute(self._listen.composed)
        self._pinged = time.monotonic()

    def close(self) -> None:
        """Close the connection; safe to repeat."""
        with self._lock:
            self._conn.close()
        if self._on_close is not None:
            self._on_close(self)
            self._on_close = None
