"""Wake-ups: what makes jobs claimable and tells the dispatcher to claim (SPEC S7, Z3, E6, L7, Q2, Q3).

The ``Stager`` makes due scheduled and failed rows pending, so claims read ready
rows only; the ``WakeListener`` wakes the dispatcher on NOTIFY (a lost connection
degrades to polling); the ``TopicWatch`` reads the topic settings each poll
interval, not per claim, since the claim statements enforce pause and limits.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Sequence

from brooq_py.engine.attempt.intake import Capacity
from brooq_py.engine.config import Config
from brooq_py.engine.services.ticker import Ticker
from brooq_py.queue.port import Listener, Repo, Staged, TopicSetting

STAGE_BATCH = 1000
# A due time is met a little late rather than early (an early statement finds nothing due).
_MARGIN = 0.001


class Stager(Ticker):
    """Promotes due rows of *topics* and calls *on_promoted* when it did; ``wake()``: a job of
    one of its topics was scheduled, read the earliest due time again."""

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
        self._due_at: float | None = None  # monotonic time of the earliest due row known

    def tick(self) -> None:
        if not self.topics:
            return
        poked = self.take_wake()
        due = self._due()
        # forgotten until a statement succeeds: a failing database is retried each poll, never busily
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


WAIT_SLICE = 0.1  # how soon a stop is seen: one select() on the socket per slice, no round trip
RECONNECT_MAX = 30.0


class WakeListener(Ticker):
    """Calls *wake* on each notification of a LISTEN subscription, and once per connection (one may
    have been missed meanwhile); a tick is one connection's life, polling carries on while it fails."""

    name = "listener"
    backoff_base = 0.5
    backoff_max = RECONNECT_MAX

    def __init__(
        self,
        listen: Callable[[], Listener],
        wake: Callable[[], None],
        log: logging.Logger,
        notified: Callable[[Collection[str]], None] | None = None,
    ) -> None:
        super().__init__(1.0, log)
        self._listen = listen
        self._wake = wake
        self._notified = notified  # the topics each wake-up was for, when the subscription says

    def next_delay(self) -> float:
        return 0.0  # a connection closed at our request (stop) or cleanly: reconnect at once

    def tick(self) -> None:
        try:
            sub = self._listen()
        except Exception:
            self._wake()
            raise
        try:
            if self._notified is not None:  # NOTIFYs sent while no LISTEN was up: of any topic
                self._notified({""})
            self._wake()
            while not self._stop.is_set():
                if sub.wait(WAIT_SLICE):
                    woken = getattr(sub, "woken", None)  # a subscription of brooq_py's (listen.py)
                    if self._notified is not None and woken is not None:
                        self._notified(woken())
                    self._wake()
                self.recovered()  # once the connection has answered: a flapping one keeps backing off
        except Exception:
            self._wake()
            raise
        finally:
            try:
                sub.close()
            except Exception:
                self.log.debug("listener: closing the subscription failed", exc_info=True)


class TopicWatch(Ticker):
    name = "topic-watch"

    def __init__(
        self,
        period: float,
        read: Callable[[], list[TopicSetting]],
        topics: Callable[[], Sequence[str]],
        capacity: Capacity,
        gauges: Callable[[str, bool, float, float], None],
        log: logging.Logger,
    ) -> None:
        super().__init__(period, log)
        self._read = read
        self._topics = topics
        self._capacity = capacity
        self._gauges = gauges

    def tick(self) -> None:
        settings = {s.topic: s for s in self._read()}
        mine = self._topics()
        limited = [t for t in mine if t in settings and settings[t].limited]
        ready = [t for t in limited if (settings[t].tokens or 0.0) >= 1]
        self._capacity.set_limited(limited, ready)
        for t in mine:
            s = settings.get(t)
            limit, tokens = (None, None) if s is None else (s.limit, s.tokens)
            self._gauges(
                t,
                bool(s and s.paused),
                math.inf if limit is None else float(limit),
                math.inf if tokens is None else tokens,
            )


def stage_now(repo: Repo, cfg: Config, topics: Sequence[str]) -> None:
    """Promote every due row of *topics* now, batch after batch (``Engine.run_once``)."""
    while topics and repo.stage(topics, STAGE_BATCH, cfg.notify).total >= STAGE_BATCH:
        pass
