"""Refresher: reads the gauges once per period and keeps them in memory for /metrics (SPEC Z2), so
N scrapers cost the database one refresh per period, not one per request."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from brooq_py.engine.clock import Clock
from brooq_py.engine.services.ticker import Ticker
from brooq_py.queue.port import DatabaseGauges, Gauges


@dataclass(frozen=True)
class GaugeSnapshot:
    """One refresh: per-topic depth and ready age, the database's vacuum blockers, when it was read."""

    topics: tuple[str, ...]
    gauges: Gauges
    database: DatabaseGauges
    taken_at: float  # Clock.monotonic() when the refresh ended


@dataclass(frozen=True)
class GaugeView:
    """What a scrape sees: the latest snapshot (None before the first success), fresh or not, its age."""

    snapshot: GaugeSnapshot | None
    fresh: bool
    age: float | None


class Refresher(Ticker):
    """Keeps the gauges read every *period*; a failed read keeps the last snapshot, marked stale."""

    name = "refresher"

    def __init__(
        self,
        period: timedelta | float,
        gauges: Callable[[Sequence[str]], Gauges],
        database: Callable[[], DatabaseGauges],
        topics: Callable[[], Sequence[str]],
        clock: Clock,
        logger: logging.Logger,
    ) -> None:
        super().__init__(period, logger)
        self._gauges = gauges
        self._database = database
        self._topics = topics
        self._clock = clock
        # (snapshot, fresh): replaced as one reference, so a reader never sees half a refresh.
        self._latest: tuple[GaugeSnapshot | None, bool] = (None, False)

    def tick(self) -> None:
        topics = tuple(self._topics())
        try:
            gauges = self._gauges(topics)
            database = self._database()
        except Exception:
            self._latest = (self._latest[0], False)
            raise
        self._latest = (GaugeSnapshot(topics, gauges, database, self._clock.monotonic()), True)

    def view(self) -> GaugeView:
        """Return the latest snapshot with its freshness and age; no I/O."""
        snapshot, fresh = self._latest
        age = None if snapshot is None else max(0.0, self._clock.monotonic() - snapshot.taken_at)
        return GaugeView(snapshot, fresh, age)
