"""Backoff (SPEC C7): d = min(base * 2^(attempts-1), max), the delay uniform in [d/2, d]."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brooq_py.engine.attempt.outcome import backoff_ceiling, backoff_delay

S = timedelta(seconds=1)


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [(1, 1), (2, 2), (3, 4), (4, 8), (5, 16), (6, 32), (7, 60), (8, 60), (100, 60)],
)
def test_c7_ceiling_doubles_from_base_and_caps_at_max(attempt: int, ceiling: int) -> None:
    assert backoff_ceiling(attempt, S, 60 * S) == ceiling * S


def test_c7_base_above_one_second() -> None:
    assert [backoff_ceiling(a, 3 * S, 20 * S) for a in (1, 2, 3, 4)] == [3 * S, 6 * S, 12 * S, 20 * S]


@pytest.mark.parametrize("attempt", [1024, 1025, 10_000, 10**9, 10**100])
def test_c7_huge_attempt_gives_backoff_max_without_error(attempt: int) -> None:
    assert backoff_ceiling(attempt, S, 60 * S) == 60 * S
    delay = backoff_delay(attempt, S, 60 * S, random.Random(1))
    assert 30 * S <= delay <= 60 * S


def test_c7_tiny_base_huge_cap_no_overflow() -> None:
    base, cap = timedelta(microseconds=1), timedelta(days=999_999_999)
    assert backoff_ceiling(10_000, base, cap) == cap


def test_c7_delay_is_seeded_and_reproducible() -> None:
    a = [backoff_delay(5, S, 60 * S, random.Random(7)) for _ in range(3)]
    b = [backoff_delay(5, S, 60 * S, random.Random(7)) for _ in range(3)]
    assert a == b


def test_c7_delays_spread_over_the_range() -> None:
    rng = random.Random(42)
    delays = [backoff_delay(6, S, 60 * S, rng) for _ in range(500)]
    assert all(16 * S <= d <= 32 * S for d in delays)
    assert min(delays) < 18 * S and max(delays) > 30 * S  # equal jitter, not a constant


durations = st.integers(min_value=1, max_value=10**12).map(lambda us: timedelta(microseconds=us))


@given(
    attempt=st.integers(min_value=-5, max_value=10**6),
    base=durations,
    cap=durations,
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_c7_delay_always_within_half_ceiling_and_ceiling(
    attempt: int, base: timedelta, cap: timedelta, seed: int
) -> None:
    base, cap = min(base, cap), max(base, cap)  # K1: base <= max
    d = backoff_ceiling(attempt, base, cap)
    assert timedelta(0) < d <= cap
    assert d >= min(base, cap)
    delay = backoff_delay(attempt, base, cap, random.Random(seed))
    assert d / 2 <= delay <= d


@given(attempt=st.integers(min_value=1, max_value=200), base=durations, cap=durations)
def test_c7_ceiling_is_monotonic_in_attempts(attempt: int, base: timedelta, cap: timedelta) -> None:
    base, cap = min(base, cap), max(base, cap)
    assert backoff_ceiling(attempt, base, cap) <= backoff_ceiling(attempt + 1, base, cap)
