"""Retention: terminal rows older than the TTL are deleted in batches (SPEC T1-T3)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

from brooq_py.engine.ticker import Ticker

MAX_BATCHES_PER_TICK = 100


class Retention(Ticker):
    """Deletes batches while they come back full, at most 100 a tick, then WARNs."""

    name = "retention"

    def __init__(
        self,
        period: timedelta,
        ttl: timedelta,
        batch: int,
        delete: Callable[[timedelta, int], list[tuple[str, str]]],
        on_deleted: Callable[[str, int], None],
        log: logging.Logger,
    ) -> None:
        super().__init__(period, log)
        if ttl <= timedelta(0):
            raise ValueError("retention: ttl must be > 0 (0 disables retention: do not start it)")
        self.ttl = ttl
        self.batch = batch
        self._delete = delete
        self._on_deleted = on_deleted

    def tick(self) -> None:
        total: Counter[str] = Counter()
        for _ in range(MAX_BATCHES_PER_TICK):
            rows = self._delete(self.ttl, self.batch)
            for _, topic in rows:
                total[topic] += 1
            if len(rows) < self.batch:
                break
        else:
            self.log.warning(
                "retention: %d batches of %d deleted this tick and more remain; continuing next tick",
                MAX_BATCHES_PER_TICK,
                self.batch,
            )
        for topic, n in total.items():
            self._on_deleted(topic, n)
        if total:
            self.log.info(
                "retention: deleted %d terminal jobs older than %gs topics=%s",
                sum(total.values()),
                self.ttl.total_seconds(),
                ",".join(f"{t}:{n}" for t, n in sorted(total.items())),
            )
