"""Backoff (SPEC C7): d = min(base * 2^(attempts-1), max), the delay uniform in [d/2, d]."""

from __future__ import annotations

import random
from datetime import timedelta

# The engine's own generator: drawing a jitter never moves the caller's global random state
# (a seeded simulation, or a property-based test drawing while an engine runs beside it).
_RNG = random.Random()


def backoff_ceiling(attempt: int, base: timedelta, cap: timedelta) -> timedelta:
    """Return d = min(base * 2^(attempt-1), cap), guarding overflow before the power."""
    if attempt <= 1:
        return min(base, cap)
    base_s, cap_s = base.total_seconds(), cap.total_seconds()
    if base_s <= 0:
        return timedelta(0)
    # 2^(attempt-1) >= cap/base already: answer the cap without computing the power.
    ratio = cap_s / base_s
    exp = attempt - 1
    if exp >= 1024 or 2.0**exp >= ratio:
        return cap
    return timedelta(seconds=base_s * 2.0**exp)


def backoff_delay(
    attempt: int, base: timedelta, cap: timedelta, rng: random.Random | None = None
) -> timedelta:
    """Return a delay drawn uniformly from [d/2, d] (equal jitter)."""
    d = backoff_ceiling(attempt, base, cap).total_seconds()
    r = (rng or _RNG).uniform(d / 2, d)
    return timedelta(seconds=r)
