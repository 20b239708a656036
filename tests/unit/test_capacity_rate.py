"""Capacity with rate limits (SPEC F1): a claim that found the tokens spent is not tried again before
the next token, however often the dispatcher asks; the dispatcher is told when that is."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from brooq_py.engine.attempt.intake import BUSY_RETRY, Capacity
from brooq_py.queue.port import LimitedClaim

LEASE = timedelta(seconds=30)


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


class Repo:
    """Answers limited claims from a script; the common claim takes nothing."""

    def __init__(self, answers: list[LimitedClaim]) -> None:
        self.answers = answers
        self.limited_calls = 0

    def claim_limited(self, topic: str, limit: int, worker: str, lease: timedelta) -> LimitedClaim:
        self.limited_calls += 1
        return self.answers.pop(0)

    def claim(self, topics: Sequence[str], limit: int, worker: str, lease: timedelta) -> list[Any]:
        return []


def spent(wait: float | None, busy: bool = False) -> LimitedClaim:
    got = LimitedClaim()
    got.next_token_in, got.busy = wait, busy
    return got


def test_f1_no_claim_before_the_next_token_and_the_dispatcher_knows_when() -> None:
    clock, held = Clock(), []
    cap = Capacity({}, 1.0, clock)
    cap.on_rate_held = held.append
    cap.set_limited(["r"])
    repo = Repo([spent(0.25), spent(None)])
    assert cap.next_due_in() is None
    cap.claim(repo, ["r"], 8, "w", LEASE)  # type: ignore[arg-type]
    due = cap.next_due_in()
    assert held == ["r"] and due is not None and abs(due - 0.25) < 1e-9
    for _ in range(5):  # woken early (a NOTIFY, another topic): the rated topic is not claimed
        cap.claim(repo, ["r"], 8, "w", LEASE)  # type: ignore[arg-type]
    assert repo.limited_calls == 1
    clock.t += 0.25
    assert cap.next_due_in() == 0.0
    cap.claim(repo, ["r"], 8, "w", LEASE)  # type: ignore[arg-type]
    assert repo.limited_calls == 2


def test_f1_a_lock_held_by_another_engine_is_tried_again_shortly() -> None:
    clock = Clock()
    cap = Capacity({}, 1.0, clock)
    cap.set_limited(["r"])
    repo = Repo([spent(None, busy=True), spent(None)])
    cap.claim(repo, ["r"], 8, "w", LEASE)  # type: ignore[arg-type]
    due = cap.next_due_in()
    assert due is not None and abs(due - BUSY_RETRY) < 1e-9
    clock.t += BUSY_RETRY
    cap.claim(repo, ["r"], 8, "w", LEASE)  # type: ignore[arg-type]
    assert repo.limited_calls == 2


def test_f1_a_token_seen_in_the_settings_ends_the_wait_for_the_old_rates_next_token() -> None:
    """Out of tokens at 1 per hour, then the rate raised: the settings read shows a token now."""
    clock, woken = Clock(), []
    cap = Capacity({}, 1.0, clock)
    cap.wake = lambda: woken.append(True)
    cap.set_limited(["r"])
    repo = Repo([spent(3600.0), spent(None)])
    cap.claim(repo, ["r"], 8, "w", LEASE)  # type: ignore[arg-type]
    assert cap.next_due_in() == 3600.0
    woken.clear()
    cap.set_limited(["r"])  # the next settings read, no token yet: still waiting
    cap.claim(repo, ["r"], 8, "w", LEASE)  # type: ignore[arg-type]
    assert repo.limited_calls == 1 and woken == []
    cap.set_limited(["r"], ready=["r"])
    assert woken == [True] and cap.next_due_in() is None
    cap.claim(repo, ["r"], 8, "w", LEASE)  # type: ignore[arg-type]
    assert repo.limited_calls == 2
