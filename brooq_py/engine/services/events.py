"""Events: what happened to a job, delivered to listeners after its commit (SPEC N1).

``emit`` never blocks nor raises (a full queue drops and counts the event); one
daemon thread calls the listeners in order, and one that raises stops nothing.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from brooq_py.queue import Event
from brooq_py.queue.job import EventKind

DEFAULT_MAX_QUEUE = 10_000
_STOP = object()


class EventBus:
    """Listeners, a bounded queue and the thread that delivers events to them."""

    def __init__(
        self,
        log: logging.Logger,
        *,
        max_queue: int = DEFAULT_MAX_QUEUE,
        on_dropped: Callable[[], None] = lambda: None,
        on_listener_error: Callable[[], None] = lambda: None,
    ) -> None:
        self._log = log
        self._listeners: list[Callable[[Event], None]] = []
        self._queue: queue.Queue[Event | object] = queue.Queue(maxsize=max_queue)
        self._on_dropped = on_dropped
        self._on_listener_error = on_listener_error
        self._thread: threading.Thread | None = None
        self._delivering: threading.Thread | None = None  # kept through stop(), which clears _thread
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return bool(self._listeners)

    def add(self, fn: Callable[[Event], None]) -> None:
        if not callable(fn):
            raise TypeError(f"on_event takes a callable, got {type(fn).__name__}")
        self._listeners.append(fn)

    def emit(self, kind: EventKind, job_id: str, topic: str, attempt: int, error: str | None = None) -> None:
        """Queue one event for the listeners; never blocks, never raises."""
        if not self._listeners:
            return
        event = Event(kind, job_id, topic, attempt, error, datetime.now(UTC))
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._on_dropped()

    def owns_current(self) -> bool:
        """Whether this is the thread that calls the listeners (during the stop's drain too)."""
        return self._delivering is threading.current_thread()

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or not self._listeners:
                return
            self._thread = threading.Thread(target=self._loop, name="brooq-events", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is queued (for up to *timeout* seconds), then end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        while True:
            try:
                self._queue.put(_STOP, timeout=timeout)
                break
            except queue.Full:  # a listener slower than the engine: drop the oldest to make room
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()
                    self._on_dropped()
        thread.join(timeout)
        if thread.is_alive():
            self._log.warning("events: a listener still runs %.1fs after stop; left behind", timeout)

    def _loop(self) -> None:
        self._delivering = threading.current_thread()
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            assert isinstance(item, Event)
            self._deliver(item)

    def _deliver(self, event: Event) -> None:
        for fn in self._listeners:
            try:
                fn(event)
            except BaseException as exc:  # a listener never stops delivery, nor the engine
                self._on_listener_error()
                self._log.error(
                    "events: listener %r raised on %s of job id=%s",
                    fn,
                    event.kind,
                    event.job_id,
                    exc_info=exc,
                )
