"""Context: the cancellation a handler is handed, with its cause and deadline."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from datetime import datetime


class Context:
    """Cancellation for one attempt.

    The engine cancels it with a cause (``LeaseLost``, ``AttemptTimeout``,
    ``MaxExecutionExceeded`` or ``EngineStopping``); the first cause wins.
    Thread-safe; ``wait_async`` serves ``async def`` handlers.
    """

    __slots__ = ("_callbacks", "_cause", "_deadline", "_event", "_lock")

    def __init__(self, deadline: datetime | None = None) -> None:
        # The Event is made on the first wait(): most attempts end without anyone waiting,
        # and an Event (a Condition and two locks) per job is measurable at thousands a second.
        self._event: threading.Event | None = None
        self._lock = threading.Lock()
        self._cause: BaseException | None = None
        self._deadline = deadline
        self._callbacks: list[Callable[[BaseException], None]] = []

    def done(self) -> bool:
        """Return True once the context was cancelled."""
        return self._cause is not None

    @property
    def cause(self) -> BaseException | None:
        """Why the context was cancelled, or None while it runs."""
        return self._cause

    @property
    def deadline(self) -> datetime | None:
        """When attempt_timeout fires (UTC), or None."""
        return self._deadline

    def wait(self, timeout: float | None = None) -> bool:
        """Block up to *timeout* seconds (None: forever); return True once cancelled."""
        with self._lock:
            if self._cause is not None:
                return True
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        return event.wait(timeout)

    async def wait_async(self, timeout: float | None = None) -> bool:
        """Wait without blocking the event loop; return True once cancelled."""
        if self._cause is not None:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def wake(_: BaseException) -> None:
            loop.call_soon_threadsafe(_resolve, fut)

        self.add_callback(wake)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            pass
        finally:
            self.remove_callback(wake)
        return self._cause is not None

    def raise_if_done(self) -> None:
        """Raise the cause if the context was cancelled; return otherwise."""
        cause = self._cause
        if cause is not None:
            raise cause

    def cancel(self, cause: BaseException) -> bool:
        """Cancel with *cause*; return False if it was already cancelled (the first cause stays)."""
        with self._lock:
            if self._cause is not None:
                return False
            self._cause = cause
            if self._event is not None:
                self._event.set()
            callbacks = list(self._callbacks)
        for cb in callbacks:
            cb(cause)
        return True

    def add_callback(self, cb: Callable[[BaseException], None]) -> None:
        """Call ``cb(cause)`` on cancellation (at once if already cancelled)."""
        with self._lock:
            cause = self._cause
            if cause is None:
                self._callbacks.append(cb)
                return
        cb(cause)

    def remove_callback(self, cb: Callable[[BaseException], None]) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._callbacks.remove(cb)

    def __repr__(self) -> str:
        return f"Context(done={self.done()}, cause={self._cause!r})"


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
