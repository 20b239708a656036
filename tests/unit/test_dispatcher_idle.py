"""The dispatcher of an idle engine claims only when a claim is due: a rate-limited topic's token
whose wait is over is no longer due, and an owed read survives a claim that failed before it
(Capacity, ClaimHeads and Dispatcher together, without a database; SPEC F1, B1)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
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


def test_a_limited_topics_failed_claim_leaves_the_others_claimed_and_is_reported() -> None:
    """A claim woken for other reasons fails in the limited topic's statement (a row lock waited
    out, a lost connection): the common topics are claimed all the same (their owed read taken by
    that claim), the limited one is put off, and the failure reaches the dispatcher when nothing
    was claimed."""
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
    before = repo.claims
    with pytest.raises(OSError):
        cap.claim(repo, ["r", "a"], 4, "w", LEASE)  # type: ignore[arg-type]
    assert repo.claims == before + 2  # r failed, a claimed after it
    assert repo.heads.take_owed(["r", "a"]) == []
    assert cap._due["r"] > clock.now  # put off as a topic at its limit


def full_claims_counted(
    full: threading.Event, next_due: Callable[[], float | None], owed: Callable[[], list[str]]
) -> Dispatcher:
    """A dispatcher polling once an hour whose full claims set *full* (its claims of owed topics
    alone take nothing)."""
    return Dispatcher(
        lambda n: (full.set(), [])[1],
        SlotPool(4),
        lambda rows: None,
        3600.0,
        logging.getLogger("t"),
        next_due=next_due,
        owed=owed,
        claim_only=lambda n, only: [],
    )


def test_a_wake_up_while_the_owed_topics_are_taken_is_kept_for_a_full_claim() -> None:
    """A NOTIFY that lands after the wait for an owed read timed out, while the owed topics are
    taken: the claim of them alone must not swallow it (the new job would wait for the poll)."""
    full = threading.Event()
    owed_due: list[float | None] = [0.5]
    d: Dispatcher

    def owed() -> list[str]:
        owed_due[0] = None
        d.wake()  # the NOTIFY of a new job of another topic lands here
        return ["a"]

    d = full_claims_counted(full, lambda: owed_due[0], owed)
    d.start()
    try:
        time.sleep(0.2)  # the start-up full claim
        full.clear()
        assert full.wait(5.0), "the wake-up was swallowed: no full claim until the poll interval"
    finally:
        d.stop()


def drained(rows: int) -> LimitedClaim:
    got = LimitedClaim([None] * rows)  # type: ignore[list-item]
    got.drained = True
    return got


def test_a_notify_has_a_drained_limited_topic_claimed_again_and_no_other() -> None:
    clock = Clock()
    cap = Capacity({}, 3600.0, clock)
    cap.set_limited(["r", "l"])
    repo = Repo([drained(0), LimitedClaim()])  # r: no more ready rows; l: at its limit
    cap.claim(repo, ["r", "l"], 4, "w", LEASE)  # type: ignore[arg-type]
    assert cap._plan(["r", "l"], 4)[2] == []  # both wait retry_after
    cap.notified(["l"])
    assert cap._plan(["r", "l"], 4)[2] == []  # at its limit: a NOTIFY changes nothing
    cap.notified(["r"])
    assert cap._plan(["r", "l"], 4)[2] == [("r", 4)]  # drained: claimed again at once
    repo.answers = [LimitedClaim()]
    cap.claim(repo, ["r"], 4, "w", LEASE)  # type: ignore[arg-type]  # not drained this time
    cap.notified([""])  # a topic whose name was too long for its notification: any
    assert cap._plan(["r", "l"], 4)[2] == []


class Racing(Repo):
    """The limited topic's statement ran; *meanwhile* (before the engine books its answer) runs."""

    def __init__(self, answer: LimitedClaim, meanwhile: Callable[[], None]) -> None:
        super().__init__([])
        self.answer = answer
        self.meanwhile = meanwhile

    def claim_limited(self, topic: str, limit: int, worker: str, lease: timedelta) -> LimitedClaim:
        self.meanwhile()
        return self.answer


def test_a_notify_landing_while_a_drained_topics_claim_runs_has_it_claimed_again() -> None:
    cap = Capacity({}, 3600.0, Clock())
    cap.set_limited(["r"])
    cap.claim(Racing(drained(0), lambda: cap.notified(["r"])), ["r"], 4, "w", LEASE)  # type: ignore[arg-type]
    assert cap._plan(["r"], 4)[2] == [("r", 4)]


def test_a_settle_landing_while_a_claim_at_the_limit_runs_has_it_claimed_again() -> None:
    cap = Capacity({}, 3600.0, Clock())
    cap.set_limited(["r"])
    woken: list[int] = []
    cap.wake = lambda: woken.append(1)
    cap.claim(Racing(LimitedClaim(), lambda: cap.settled(["r"])), ["r"], 4, "w", LEASE)  # type: ignore[arg-type]
    assert cap._plan(["r"], 4)[2] == [("r", 4)]
    assert woken  # the dispatcher turns again (the settle found r not held yet: it woke no one)


def test_a_notify_landing_while_a_claim_at_the_limit_runs_changes_nothing() -> None:
    cap = Capacity({}, 3600.0, Clock())
    cap.set_limited(["r"])
    cap.claim(Racing(LimitedClaim(), lambda: cap.notified(["r"])), ["r"], 4, "w", LEASE)  # type: ignore[arg-type]
    assert cap._plan(["r"], 4)[2] == []


class RacyEvent(threading.Event):
    """Its wait times out, and a set() lands before the dispatcher's next line."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def wait(self, timeout: float | None = None) -> bool:
        woken = super().wait(timeout)
        if not woken and self.armed:
            self.armed = False
            self.set()
        return woken


def test_a_wake_up_just_after_a_due_wait_timed_out_is_kept() -> None:
    full = threading.Event()
    dues = iter([0.3])  # one due wait of 0.3 s; then the next is 5 s off (made elsewhere)
    d = full_claims_counted(full, lambda: next(dues, 5.0), lambda: [])
    event = RacyEvent()
    d._wake = event
    d.start()
    try:
        time.sleep(0.1)  # the start-up claim
        full.clear()
        event.armed = True
        assert full.wait(2.0), "the wake-up set just after the due wait timed out was lost"
    finally:
        d.stop()


@pytest.mark.parametrize("answer", ["busy", "out_of_tokens"])
def test_a_settle_landing_while_a_claim_that_can_take_nothing_now_runs_wakes_no_one(answer: str) -> None:
    """The lock held by another engine's claim, or no token left: a turn now would claim nothing
    of the topic, so the settle that outran the claim does not bring one (only the BUSY_RETRY or
    the token's time does)."""
    cap = Capacity({}, 3600.0, Clock())
    cap.set_limited(["r"])
    got = LimitedClaim()
    if answer == "busy":
        got.busy = True
    else:
        got.next_token_in = 0.5
    woken: list[int] = []
    cap.wake = lambda: woken.append(1)
    cap.claim(Racing(got, lambda: cap.settled(["r"])), ["r"], 4, "w", LEASE)  # type: ignore[arg-type]
    assert woken == []
    assert cap.next_due_in() is not None  # its own time brings the next claim
