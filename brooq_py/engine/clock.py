"""Time, injected: the engine and its services read it from a Clock so tests need no sleeping."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a monotonic scale, for deadlines and durations."""
        ...

    def now(self) -> datetime:
        """The wall clock in UTC, for what a handler is shown (Context.deadline)."""
        ...


class SystemClock:
    """The real clocks: time.monotonic and datetime.now(UTC)."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)
