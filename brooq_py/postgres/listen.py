"""A LISTEN subscription on its own autocommit connection, the engine's wake-up (SPEC Z3, X2', L3).

A probe sent from a second connection right after LISTEN tells a connection that delivers no
notifications (a transaction-pooling proxy): the subscription says so once and polling carries the work.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import psycopg

from brooq_py.postgres.session.connections import deadline, statement_budget
from brooq_py.postgres.session.errors import translated
from brooq_py.postgres.session.statements import Queries, cancel_channel_for, channel_for, stage_channel_for

log = logging.getLogger("brooq_py.postgres")

# Seconds the probe may take before LISTEN is declared dead on this connection.
PROBE_TIMEOUT = 5.0


class PgListener:
    """Wait for NOTIFYs on the schema's channels, on a connection opened at construction
    (StoreUnavailable if the database cannot be reached). *topics*: the wake-ups that count (None:
    all); ``wait()`` calls *on_scheduled* for a scheduled job of them and *on_cancel* with the id and
    claim token of each processing job canceled, LISTENing on those channels too."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        queries: Queries,
        on_close: Callable[[PgListener], None] | None = None,
        *,
        topics: Sequence[str] | None = None,
        on_scheduled: Callable[[], None] | None = None,
        on_cancel: Callable[[str, str], None] | None = None,
        probe_timeout: float | None = PROBE_TIMEOUT,
        ping_every: timedelta | None = None,
    ) -> None:
        self._lock = threading.Lock()
        # A silent LISTEN connection looks like a quiet queue: every lease/3 the LISTEN is repeated.
        self._listen = queries["listen"]
        self._ping_every = ping_every
        self._pinged = time.monotonic()
        self._on_close = on_close
        self._topics = None if topics is None else frozenset(topics)
        self._on_scheduled = on_scheduled
        self._stage_channel = stage_channel_for(queries.schema)
        self._on_cancel = on_cancel
        self._cancel_channel = cancel_channel_for(queries.schema)
        self._refused = False
        self._probe = f"brooq-probe:{uuid.uuid4()}"
        self._probe_deadline: float | None = None
        self._backlog: deque[psycopg.Notify] = deque()
        self._woken: set[str] = set()  # the wanted payloads since ``woken()`` (''; any topic)
        # A standby refuses LISTEN during recovery (25006): an outage, retried with backoff.
        with translated("opening the LISTEN connection", own=True):
            self._conn = connect()
            try:
                self._conn.execute(queries["listen"].composed)
                if on_scheduled is not None:
                    self._conn.execute(queries["listen_stage"].composed)
                if on_cancel is not None:
                    self._conn.execute(queries["listen_cancel"].composed)
                if probe_timeout is not None:
                    with connect() as other:
                        other.execute(queries["listen_probe"].composed, {"payload": self._probe})
                    self._probe_deadline = time.monotonic() + probe_timeout
            except BaseException:
                self._conn.close()
                raise
        self._channel = channel_for(queries.schema)
        # Only a notification of these proves LISTEN works here: behind a transaction-pooling proxy a
        # server connection another client LISTENed on delivers that client's channels to this one.
        self._channels = frozenset((self._channel, self._stage_channel, self._cancel_channel))

    @property
    def refused(self) -> bool:
        """True once the probe showed that this connection does not deliver notifications."""
        return self._refused

    def _wanted(self, payload: str) -> bool:
        return payload == "" or self._topics is None or payload in self._topics

    def wait(self, timeout: float) -> bool:
        """Block up to *timeout* seconds; return True if a wake-up for our topics arrived. Raise
        StoreUnavailable when the connection is broken or closed."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            remaining = deadline - time.monotonic()
            if self._refused:
                time.sleep(max(0.0, remaining))
                return False
            if remaining <= 0:
                return False
            note = self._next(remaining)
            if note is None:
                if self._probe_deadline is not None and time.monotonic() >= self._probe_deadline:
                    self._refuse()
                else:
                    self._ping_if_due()
                return False
            if note.channel not in self._channels:
                continue  # another session's LISTEN, met through a proxy: no proof, no wake-up
            self._probe_deadline = None  # something arrived: LISTEN works here
            if note.payload == self._probe:
                continue
            if note.channel == self._cancel_channel:
                if self._on_cancel is not None:
                    job_id, _, token = note.payload.partition(" ")
                    self._on_cancel(job_id, token)
                continue
            if note.channel == self._stage_channel:
                if self._on_scheduled is not None and self._wanted(note.payload):
                    self._on_scheduled()
                continue
            if self._wanted(note.payload):
                self._woken.add(note.payload)
                return True

    def woken(self) -> set[str]:
        """The topics ``wait()`` returned True for since the last call ('' when a topic's name was too
        long for its notification: any of ours); from the thread that waits."""
        woken, self._woken = self._woken, set()
        return woken

    def _next(self, timeout: float) -> psycopg.Notify | None:
        if self._backlog:
            return self._backlog.popleft()
        with translated("waiting for notifications", own=True):
            # to its end: notifications of one packet come together, and leaving early drops the rest
            self._backlog.extend(self._conn.notifies(timeout=timeout, stop_after=1))
        return self._backlog.popleft() if self._backlog else None

    def _ping_if_due(self) -> None:
        lease = self._ping_every
        if self._probe_deadline is not None:
            # The probe is judged on a silent connection: behind a transaction-pooling proxy a
            # statement of ours may land on the server connection that LISTENs, and bring its
            # notifications here as if LISTEN worked.
            return
        if lease is None or time.monotonic() - self._pinged < max(lease.total_seconds() / 3, 1.0):
            return
        with (
            translated("pinging the LISTEN connection", own=True),
            deadline(self._conn, statement_budget(lease)),
        ):
            self._conn.execute(self._listen.composed)
        self._pinged = time.monotonic()

    def _refuse(self) -> None:
        self._refused = True
        self._probe_deadline = None
        log.error(
            "LISTEN on %s delivers no notifications (a transaction-pooling proxy such as PgBouncer?): "
            "wake-ups are off and the engine polls every poll_interval; give the Store a direct "
            "conninfo for LISTEN, or set Config(notify=False)",
            self._channel,
        )
        with self._lock:
            self._conn.close()

    def close(self) -> None:
        """Close the connection; safe to repeat."""
        with self._lock:
            self._conn.close()
        if self._on_close is not None:
            self._on_close(self)
            self._on_close = None
