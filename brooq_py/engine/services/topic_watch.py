"""TopicWatch: reads the operator's topic settings every poll interval (SPEC Q2, Q3).

One small statement (the settings table holds a row per touched topic) per
poll interval, never per claim: pause and limits are enforced by the claim
statements themselves, so what the engine learns here only decides which
topics it claims on the limited path (a global or a rate limit), and the
brooq_topic_paused, brooq_topic_limit and brooq_topic_rate_tokens gauges.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from brooq_py.engine.attempt.intake import Capacity
from brooq_py.engine.services.ticker import Ticker
from brooq_py.queue.port import TopicSetting


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
            limit = s.limit if s is not None else None
            tokens = s.tokens if s is not None else None
            self._gauges(
                t,
                bool(s and s.paused),
                math.inf if limit is None else float(limit),
                math.inf if tokens is None else tokens,
            )
