"""Reaper: claims of gone engines go back to pending, their attempt given back (SPEC R1, P1'', L5').

One statement a period decides everything from rows: a processing job whose
engine's proof of life is older than its lease plus its margin, or whose engine
dropped the claim (hung, fenced), goes back to pending, counted as a crash. A
row locked elsewhere (an operator's transaction) is skipped and taken at a
later tick; it is never waited on.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

from brooq_py.engine.services.ticker import Ticker


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
        by_topic = Counter(topic for _, topic in rows)
        for topic, n in by_topic.items():
            for _ in range(n):
                self._on_reaped(topic)
        self.log.info(
            "reaper: returned %d jobs of gone engines to pending topics=%s",
            len(rows),
            ",".join(f"{t}:{n}" for t, n in sorted(by_topic.items())),
        )
