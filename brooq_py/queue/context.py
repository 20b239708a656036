"""Context: the cancellation a handler is handed, with its cause and deadline, and its progress (SPEC V4)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from brooq_py.queue.errors import BrooqError

if TYPE_CHECKING:
    from brooq_py.queue.claim import Claim

# A progress note is a short status line: longer ones are cut, so a renewal stays small.
MAX_PROGRESS_NOTE = 1000


class Context:
    """Cancellation for one attempt, thread-safe; ``wait_async`` serves ``async def`` handlers.

    The engine cancels it with a cause (``LeaseLost``, ``AttemptTimeout``, ``MaxExecutionExceeded``
    or ``EngineStopping``); the first cause wins.
    """

    __slots__ = ("_callbacks", "_cause", "_claim", "_deadline", "_event", "_lock", "_progress")

    def __init__(self, deadline: datetime | None = None) -> None:
        # Made on the first wait(): an Event per job (a Condition, two locks) shows at thousands a second.
        self._event: threading.Event | None = None
        self._lock = threading.Lock()
        self._cause: BaseException | None = None
        self._deadline = deadline
        self._callbacks: list[Callable[[BaseException], None]] = []
        self._claim: Claim | None = None
        # What progress() recorded since the engine last took it: (value, note), None for "unchanged".
        self._progress: tuple[float | None, str | None] | None = None

    @property
    def claim(self) -> Claim:
        """The attempt's Claim; raise BrooqError for a Context that belongs to no attempt."""
        claim = self._claim
        if claim is None:
            raise BrooqError("this Context belongs to no attempt (it was made outside an engine)")
        return claim

    def attach(self, claim: Claim) -> None:
        """Give the Context its attempt's Claim (the engine does, before the handler runs)."""
        self._claim = claim

    def progress(self, value: float | None = None, note: str | None = None) -> None:
        """Record how far the handler is (*value*, 0.0-1.0) and/or a short *note*.

        Written with the next lease renewal (the latest call wins, field by field): never blocks,
        never raises for a database problem. Raise ValueError for a value that is not a number
        between 0 and 1, TypeError for a note that is not text.
        """
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"progress must be a number between 0 and 1, got {value!r}")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"progress must be between 0 and 1, got {value!r}")
            value = float(value)
        if note is not None:
            if not isinstance(note, str):
                raise TypeError(f"note must be a str, got {type(note).__name__}")
            note = _storable(note[:MAX_PROGRESS_NOTE])
        if value is None and note is None:
            return
        with self._lock:
            old = self._progress
            if old is not None:
                value = old[0] if value is None else value
                note = old[1] if note is None else note
            self._progress = (value, note)

    def take_progress(self) -> tuple[float | None, str | None] | None:
        """Return what ``progress`` recorded since the last call and forget it (the engine's renewal)."""
        with self._lock:
            taken, self._progress = self._progress, None
        return taken

    def give_back_progress(self, taken: tuple[float | None, str | None]) -> None:
        """Keep *taken* for the next renewal (this one failed), unless newer values came meanwhile."""
        with self._lock:
            newer = self._progress
            if newer is None:
                self._progress = taken
            else:
                self._progress = (
                    taken[0] if newer[0] is None else newer[0],
                    taken[1] if newer[1] is None else newer[1],
                )

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


def _storable(text: str) -> str:
    """Return *text* as PostgreSQL text holds it: NUL and lone surrogates escaped."""
    text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
