"""Stager: due scheduled and failed rows become pending, so claims read ready rows only (SPEC S7).

One statement per batch (SKIP LOCKED, bounded), repeated while a batch comes
back full. Between ticks it sleeps until the earliest due time it knows, at
most the poll interval; a scheduled enqueue of one of its topics wakes it to
read that time again. Whenever it promoted rows it wakes the dispatcher.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from brooq_py.engine.services.ticker import Ticker
from brooq_py.queue.port import Staged

STAGE_BATCH = 1000
# A due time is met a little late rather than early (an early statement finds nothing due).
_MARGIN = 0.001
# How often a sleeping stager looks at its stop flag.
_STOP_SLICE = 0.25


def stage_due(stage: Callable[[Sequence[str], int], Staged], topics: Sequence[str], batch: int) -> Staged:
    """Run the stager statement until a batch comes back short; return the last result, totals summed."""
    promoted: dict[str, int] = {}
    while True:
        staged = stage(topics, batch)
        for topic, n in staged.promoted.items():
            promoted[topic] = promoted.get(topic, 0) + n
        if staged.total < batch:
            return Staged(promoted, staged.next_due_in)


class Stager(Ticker):
    """Promotes due rows of *topics* and calls *on_promoted* when it did."""

    name = "stager"

    def __init__(
        self,
        poll_interval: float,
        topics: Sequence[str],
        stage: Callable[[Sequence[str], int], Staged],
        next_due: Callable[[Sequence[str]], float | None],
        on_promoted: Callable[[], None],
        log: logging.Logger,
        *,
        batch: int = STAGE_BATCH,
    ) -> None:
        super().__init__(poll_interval, log)
        if batch < 1:
            raise ValueError("stager: batch must be >= 1")
        self.topics = tuple(topics)
        self.batch = batch
        self._stage = stage
        self._next_due = next_due
        self._on_promoted = on_promoted
        self._poke = threading.Event()
        self._due_at: float | None = None  # monotonic time of the earliest due row known

    def wake(self) -> None:
        """A job of one of our topics was scheduled: read the earliest due time again."""
        self._poke.set()

    def tick(self) -> None:
        if not self.topics:
            return
        poked = self._poke.is_set()
        self._poke.clear()
        due = self._due()
        # Forget the due time until a statement succeeds: a failing database is retried
        # every poll interval, never in a busy loop on a due time already past.
        self._due_at = None
        if poked and not due:
            self._learn(self._next_due(self.topics))
            if not self._due():
                return
            self._due_at = None
        total = 0
        while not self._stop.is_set():
            staged = self._stage(self.topics, self.batch)
            if staged.total:
                total += staged.total
                self._on_promoted()
            self._learn(staged.next_due_in)
            if staged.total < self.batch:
                break
        if total:
            self.log.debug("stager: %d due jobs made pending", total)

    def _learn(self, due_in: float | None) -> None:
        self._due_at = None if due_in is None else time.monotonic() + max(0.0, due_in) + _MARGIN

    def _due(self) -> bool:
        return self._due_at is not None and self._due_at <= time.monotonic()

    def next_delay(self) -> float:
        """Until the earliest due time known, at most the poll interval."""
        if self._due_at is None:
            return self.period
        return max(0.0, min(self.period, self._due_at - time.monotonic()))

    def halt(self) -> None:
        self._stop.set()
        self._poke.set()  # after the stop flag: the wait below ends and sees it

    def _wait(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while not self._stop.is_set():
            left = end - time.monotonic()
            if left <= 0 or self._poke.wait(min(left, _STOP_SLICE)):
                return self._stop.is_set()
        return True
