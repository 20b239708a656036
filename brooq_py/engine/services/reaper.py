"""Reaper: expired processing rows go back to pending, attempts unchanged (SPEC R1)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

from brooq_py.engine.services.ticker import Ticker


class Reaper(Ticker):
    """Every period: return rows whose lease expired (of any topic) to pending."""

    name = "reaper"

    def __init__(
        self,
        period: timedelta,
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
        by_topic = Counter(topic for _, topic in rows)
        for topic, n in by_topic.items():
            for _ in range(n):
                self._on_reaped(topic)
        self.log.info(
            "reaper: returned %d expired jobs to pending topics=%s",
            len(rows),
            ",".join(f"{t}:{n}" for t, n in sorted(by_topic.items())),
        )
