"""Cleanup: the reaper and retention, which take rows back from the past.

The reaper (SPEC R1, P1'', L5') returns to pending, counted as a crash, every
processing job whose engine's proof of life is older than lease plus margin or
whose engine dropped the claim (hung, fenced).

Retention (SPEC T1-T3, Z1, Z1') deletes expired terminal rows in short SKIP LOCKED
transactions, a backlog with no period's wait; each full statement is followed by
a pause of ``PACE`` times its duration, so it takes at most a tenth of a connection.
Statements are sized to about ``BUSY_TARGET`` rather than the pause cut short
(which made big batches 33 % busy at 60,000 rows a statement).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

from brooq_py.engine.services.events import EventBus
from brooq_py.engine.services.ticker import Ticker
from brooq_py.queue.port import Repo


class Reaper(Ticker):
    """Every period: return the claims of gone engines (of any topic) to pending."""

    name = "reaper"

    def __init__(
        self,
        period: timedelta | float,
        reap: Callable[[], list[tuple[str, str]]],
        on_reaped: Callable[[str], None],
        log: logging.Logger,
    ) -> None:
        super().__init__(period, log)
        self._reap = reap
        self._on_reaped = on_reaped

    def tick(self) -> None:
        rows = self._reap()
        if not rows:
            return
        for _, topic in rows:
            self._on_reaped(topic)
        by_topic = Counter(topic for _, topic in rows)
        self.log.info(
            "reaper: returned %d jobs of gone engines to pending topics=%s",
            len(rows),
            ",".join(f"{t}:{n}" for t, n in sorted(by_topic.items())),
        )


def reap(repo: Repo, events: EventBus) -> list[tuple[str, str]]:
    """Reap the claims of gone engines; each row is a ``requeued`` event (attempt 0: not known here)."""
    rows = repo.reap()
    if events.active:
        for job_id, topic in rows:
            events.emit("requeued", job_id, topic, 0)
    return rows


# Batches a tick deletes before it reports (metrics, stop check).
MAX_BATCHES_PER_TICK = 10
# Back to back, the deletes halved a 4-worker drain beside them (bench RET: 0.43-0.51 x); at PACE 9
# it kept 0.82-0.94 x while still deleting 590,000-740,000 rows a minute.
PACE = 9.0
# The pause a statement of the usual speed needs at most.
PAUSE_BOUND = 1.0
BUSY_TARGET = PAUSE_BOUND / (PACE + 1.0)
# The smallest statement retention sizes down to (or retention_batch when that is smaller).
MIN_ROWS = 100
# The first statement's size, before any has been timed.
FIRST_ROWS = 1000


class Retention(Ticker):
    """Deletes batches while they come back full, paced, with no period's wait while a backlog lasts.
    With a history (SPEC B2: *history* > 0 and *move* given), each tick then moves the terminal rows
    ended more than *history* ago to their days' tables, paced the same way. With *drop*, it drops
    the days older than the ttl whole, the history on or not (days made while it was on go too);
    each drop's jobs are counted as deleted."""

    name = "retention"

    def __init__(
        self,
        period: timedelta,
        ttl: timedelta,
        batch: int,
        delete: Callable[[timedelta, int], list[tuple[str, str]]],
        on_deleted: Callable[[str, int], None],
        log: logging.Logger,
        monotonic: Callable[[], float] = time.monotonic,
        pause: Callable[[float], object] | None = None,
        history: timedelta = timedelta(0),
        move: Callable[[timedelta, timedelta, int], list[tuple[str, str]]] | None = None,
        drop: Callable[[timedelta], list[tuple[str, dict[str, int]]]] | None = None,
    ) -> None:
        super().__init__(period, log)
        self._monotonic = monotonic
        self._pause = pause if pause is not None else self._stop.wait  # returns at once on stop()
        if ttl <= timedelta(0):
            raise ValueError("retention: ttl must be > 0 (0 disables retention: do not start it)")
        self.ttl = ttl
        self.batch = batch
        self._delete = delete
        self._on_deleted = on_deleted
        self.history = history if move is not None else timedelta(0)
        self._move = move
        self._drop = drop
        self.behind = False  # the last tick ended on its cap: more expired rows remain
        self.rows = min(batch, FIRST_ROWS)  # the next statement's size: see size_next()
        self._drained: Counter[str] = Counter()  # deleted since the last tick that was not behind
        self._moved: Counter[str] = Counter()  # moved since the last tick that was not behind

    def size_next(self, rows: int, busy: float) -> None:
        """Size the next statement to take ``BUSY_TARGET`` at the speed of the last (*rows* in *busy*
        seconds), within [``MIN_ROWS``, ``batch``], at most four times the last (one timed too fast)."""
        low = min(self.batch, MIN_ROWS)
        fit = self.batch if busy <= 0 else int(rows * BUSY_TARGET / busy)
        self.rows = max(low, min(self.batch, fit, 4 * rows))

    def next_delay(self) -> float:
        return 0.0 if self.behind else self.period

    def _batches(self, run: Callable[[int], list[tuple[str, str]]], total: Counter[str]) -> bool:
        """Run statements of ``self.rows`` rows while they come back full (at most
        ``MAX_BATCHES_PER_TICK``), paced; count each row's topic in *total*; whether the last was full."""
        full = False
        for _ in range(MAX_BATCHES_PER_TICK):
            if self._stop.is_set():
                break
            asked = self.rows
            started = self._monotonic()
            rows = run(asked)
            busy = max(0.0, self._monotonic() - started)
            for _, topic in rows:
                total[topic] += 1
            full = len(rows) >= asked
            if not full:
                break
            self.size_next(asked, busy)
            self._pause(PACE * busy)
        return full

    def tick(self) -> None:
        self.behind = False  # a failing statement waits a period, never loops at once
        first = not self._drained and not self._moved  # no backlog reported yet
        # First what is past the ttl row by row: it never waits for the moves (nor for a move or a
        # drop that fails)
        total: Counter[str] = Counter()
        try:
            full = self._batches(lambda n: self._delete(self.ttl, n), total)
        finally:  # batches committed before a failing one are counted and reported too
            for topic, n in total.items():
                self._on_deleted(topic, n)
            self._drained.update(total)
        try:
            if self._move is not None and self.history > timedelta(0):
                move = self._move
                moved: Counter[str] = Counter()
                try:
                    full = self._batches(lambda n: move(self.history, self.ttl, n), moved) or full
                finally:
                    self._moved.update(moved)
        finally:  # a failing move never keeps the days past the ttl, nor a failing drop the moves
            for day, jobs in self._drop(self.ttl) if self._drop is not None else ():
                for topic, n in jobs.items():
                    self._on_deleted(topic, n)
                self.log.info("retention: dropped the history of %s whole (%d jobs)", day, sum(jobs.values()))
        if full and first:
            self.log.info("retention: a backlog of expired terminal jobs; deleting batch after batch")
        self.behind = full
        if not full and self._moved:
            self.log.info(
                "retention: moved %d terminal jobs ended more than %gs ago to history topics=%s",
                sum(self._moved.values()),
                self.history.total_seconds(),
                ",".join(f"{t}:{n}" for t, n in sorted(self._moved.items())),
            )
            self._moved.clear()
        if not full and self._drained:
            self.log.info(
                "retention: deleted %d terminal jobs older than %gs topics=%s",
                sum(self._drained.values()),
                self.ttl.total_seconds(),
                ",".join(f"{t}:{n}" for t, n in sorted(self._drained.items())),
            )
            self._drained.clear()
