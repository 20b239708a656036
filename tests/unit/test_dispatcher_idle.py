"""The dispatcher of an idle engine claims only when a claim is due: a rate-limited topic's token
whose wait is over is no longer due, and an owed read survives a claim that failed before it
(Capacity, ClaimHeads and Dispatcher together, without a database; SPEC F1, B1)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from brooq_py.engine.attempt.intake import Capacity
from brooq_py.engine.attempt.runner import SlotPool
from brooq_py.engine.services.dispatcher import Dispatcher
from brooq_py.postgres.worker.heads import ClaimHeads
from brooq_py.queue.port import LimitedClaim

LEASE = timedelta(seconds=30)


class Repo:
    """A rate-limited topic "r" (its answers scripted) and a common topic "a" read through ClaimHeads."""

    def __init__(self, answers: list[LimitedClaim], heads: ClaimHeads | None = None) -> None:
        self.answers = answers
        self.heads = heads or ClaimHeads()
        self.claims = 0
        self.fail_limited = False

    def claim_limited(self, topic: str, limit: int, worker: str, lease: timedelta) -> LimitedClaim:
        self.claims += 1
        if self.fail_limited:
            raise OSError("connection lost")
        return self.answers.pop(0) if self.answers else LimitedClaim()

    def claim(self, topics: Sequence[str], limit: int, worker: str, lease: timedelta) -> list[Any]:
        self.claims += 1
        sent, _ = self.heads.params(topics)
        self.heads.advance(topics, sent, [])
        return []


def spent(wait: float | None) -> LimitedClaim:
    got = LimitedClaim()
    got.next_token_in = wait
    return got


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_rate_limited_topic_whose_token_came_to_nothing_leaves_the_dispatcher_waiting() -> None:
    """Out of tokens (the next in 0.05 s); then its claim finds nothing to take: no token is awaited
    any more. The past due time, kept, made next_due_in() 0 for ever: a claim loop."""
    cap = Capacity({}, 3600.0, time.monotonic)
    cap.set_limited(["r"])
    repo = Repo([spent(0.05), spent(None)])

    def next_due() -> float | None:
        dues = [cap.next_due_in(), repo.heads.owed_in(["r", "a"])]
        return min((d for d in dues if d is not None), default=None)

    d = Dispatcher(
        lambda n: cap.claim(repo, ["r", "a"], n, "w", LEASE),  # type: ignore[arg-type]
        SlotPool(4),
        lambda rows: None,
        3600.0,
        logging.getLogger("t"),
        next_due=next_due,
        owed=lambda: repo.heads.take_owed(["r", "a"]),
        claim_only=lambda n, only: cap.claim(repo, only, n, "w", LEASE),  # type: ignore[arg-type]
    )
    d.start()
    try:
        time.sleep(1.5)
    finally:
        d.stop()
    assert repo.claims < 20
    assert cap.next_due_in() is None


def test_an_owed_read_outlives_a_claim_that_failed_before_reaching_its_topic() -> None:
    """A claim woken for other reasons fails in the limited topic's statement, before the common
    one: the common topic's owed read is still owed (only a claim of it alone takes it)."""
    clock = Clock()
    cap = Capacity({}, 3600.0, clock)
    cap.set_limited(["r"])
    repo = Repo([], ClaimHeads(clock))
    cap.claim(repo, ["r", "a"], 4, "w", LEASE)  # type: ignore[arg-type]  # start-up: a read whole
    clock.now = 0.5
    cap.claim(repo, ["r", "a"], 4, "w", LEASE)  # type: ignore[arg-type]  # a NOTIFY: a read narrow
    clock.now = 1.0
    assert repo.heads.owed_in(["r", "a"]) == 0.0
    repo.fail_limited = True
    cap._due["r"] = 0.0  # r is due too
    with pytest.raises(OSError):
        cap.claim(repo, ["r", "a"], 4, "w", LEASE)  # type: ignore[arg-type]
    assert repo.heads.take_owed(["r", "a"]) == ["a"]
