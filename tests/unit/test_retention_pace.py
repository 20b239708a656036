"""Retention's pace on a fake clock (SPEC Z1'): at most a tenth of one connection, for any retention_batch."""

from __future__ import annotations

import logging
import random
from datetime import timedelta

import pytest

from brooq_py.engine.services.cleanup import Retention

# The pause a statement of the usual speed may need (docs/guarantees.md Z1').
BOUND = 1.0


class Backlog:
    """An endless backlog on a fake clock: a statement of n rows costs ``overhead + per_row * n`` seconds."""

    def __init__(self, overhead: float, per_row: float, jitter: random.Random | None = None) -> None:
        self.now = 0.0
        self.overhead = overhead
        self.per_row = per_row
        self.jitter = jitter
        self.busy: list[float] = []
        self.pauses: list[float] = []
        self.sizes: list[int] = []

    def delete(self, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        took = self.overhead + self.per_row * batch
        if self.jitter is not None:  # a statement now and then far slower (a lock, a pool wait, I/O)
            took *= self.jitter.choice([0.5, 1, 1, 1, 2, 20])
        self.now += took
        self.busy.append(took)
        self.sizes.append(batch)
        return [("id", "t")] * batch

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def run(self, batch: int, ticks: int = 4) -> Retention:
        r = Retention(
            3600, timedelta(days=1), batch, self.delete, lambda t, n: None, logging.getLogger("r"),
            monotonic=lambda: self.now, pause=self.pause,
        )  # fmt: skip
        for _ in range(ticks):
            r.run_once()
            assert r.behind and r.next_delay() == 0.0  # an endless backlog: the next tick at once
        return r


@pytest.mark.parametrize("batch", [100, 1000, 5000, 10_000, 60_000])
@pytest.mark.parametrize("per_row", [2e-6, 2e-5, 1e-4, 1e-3])
def test_z1_retention_busy_at_most_a_tenth_for_any_batch(batch: int, per_row: float) -> None:
    b = Backlog(overhead=0.002, per_row=per_row)
    b.run(batch)
    assert len(b.pauses) == len(b.busy) >= 40
    busy = sum(b.busy)
    assert busy / (busy + sum(b.pauses)) <= 0.1 + 1e-9
    for took, paused in zip(b.busy, b.pauses, strict=True):
        assert took / (took + paused) <= 0.1 + 1e-9  # each statement on its own, too
    # Statements are sized so that, once one is timed, no pause needs to exceed the bound.
    assert max(b.pauses[1:]) <= BOUND
    assert max(b.sizes) <= batch


def test_z1_a_fast_database_gets_the_whole_batch_per_statement() -> None:
    b = Backlog(overhead=0.001, per_row=1e-6)
    b.run(60_000)
    assert b.sizes[-1] == 60_000 and max(b.pauses) <= BOUND


def test_z1_statements_slow_at_random_still_keep_the_ratio() -> None:
    b = Backlog(overhead=0.002, per_row=2e-5, jitter=random.Random(19))
    b.run(60_000, ticks=12)
    for took, paused in zip(b.busy, b.pauses, strict=True):
        assert took / (took + paused) <= 0.1 + 1e-9
    busy = sum(b.busy)
    assert busy / (busy + sum(b.pauses)) <= 0.1 + 1e-9


class History(Backlog):
    """Backlog's clock and costs, with a mover whose backlog ends after *moves* full statements."""

    def __init__(self, moves: int) -> None:
        super().__init__(overhead=0.002, per_row=2e-5)
        self.moves_left = moves
        self.calls: list[str] = []

    def move(self, after: timedelta, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        self.calls.append("move")
        rows = self.delete(ttl, batch)
        self.moves_left -= 1
        return rows if self.moves_left >= 0 else rows[: batch // 2]

    def drop(self, ttl: timedelta) -> list[tuple[str, dict[str, int]]]:
        self.calls.append("drop")
        return [("20260101", {"t": 3, "u": 2})]

    def delete_few(self, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        self.calls.append("delete")
        return [("id", "t")] * 3


def test_b2_z1_retention_moves_drops_and_deletes_each_tick_paced_to_a_tenth() -> None:
    """A mover's backlog never holds off the deletes of rows past the ttl (they run every tick), and
    moves are paced as deletes are."""
    h = History(moves=100)
    r = Retention(
        3600, timedelta(days=1), 1000, h.delete_few, lambda t, n: None, logging.getLogger("r"),
        monotonic=lambda: h.now, pause=h.pause,
        history=timedelta(hours=1), move=h.move, drop=h.drop,
    )  # fmt: skip
    for _ in range(4):
        r.run_once()
    assert r.behind  # the mover's backlog: the next tick at once
    assert h.calls.count("drop") == 4 and h.calls.count("delete") == 4
    assert [c for c in h.calls if c != "move"] == ["delete", "drop"] * 4
    busy = sum(h.busy)
    assert busy / (busy + sum(h.pauses)) <= 0.1 + 1e-9
    while r.behind:
        r.run_once()
    assert h.moves_left < 0


def test_b2_retention_without_a_history_never_moves() -> None:
    h = History(moves=5)
    r = Retention(
        3600, timedelta(days=1), 1000, h.delete_few, lambda t, n: None, logging.getLogger("r"),
        monotonic=lambda: h.now, pause=h.pause,
    )  # fmt: skip
    r.run_once()
    assert h.calls == ["delete"] and not r.behind


def test_b2_t1_with_the_history_off_the_days_already_made_are_still_dropped_and_counted() -> None:
    """history_after 0 (turned off, or a ttl under a week): nothing moves, and the days made while it
    was on still go at the ttl; the jobs of a dropped day count as deleted, by topic."""
    h = History(moves=5)
    deleted: list[tuple[str, int]] = []
    r = Retention(
        3600, timedelta(days=1), 1000, h.delete_few, lambda t, n: deleted.append((t, n)),
        logging.getLogger("r"), monotonic=lambda: h.now, pause=h.pause,
        history=timedelta(0), move=h.move, drop=h.drop,
    )  # fmt: skip
    r.run_once()
    assert h.calls == ["delete", "drop"] and not r.behind
    assert deleted == [("t", 3), ("t", 3), ("u", 2)]
