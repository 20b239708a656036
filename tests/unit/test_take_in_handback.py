"""Without a database: take_in's failure path when what follows the fault fails too (the UNRUN
give-back's hand-over, a poisoned row's path before its dead outcome: the claim is let go for the
reaper, never held for ever), and the UNRUN ending's table and outcome."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from brooq_py.engine import Engine
from brooq_py.engine.attempt.attempt import Attempt, Kind
from brooq_py.engine.attempt.outcome import IllegalTransition, Phase
from brooq_py.engine.attempt.runner import SlotPool
from brooq_py.queue import Context, Job, KindOptions, State
from brooq_py.queue.port import ClaimedJob
from tests.polling import wait_for
from tests.unit.fake_repo import FakeRepo


def _engine(make_engine: Callable[..., Engine], ran: list[str]) -> tuple[Engine, SlotPool]:
    e = make_engine(workers=1)
    e.register_kind("t", lambda ctx, claim: ran.append(claim.id), KindOptions(concurrency=1))
    slots = e.intake.slots = SlotPool(1)  # as start() wires them, without the services
    e.hooks.release_slot = slots.release
    return e, slots


def _left_to_no_one(e: Engine) -> list[tuple[str, Phase]]:
    """Attempts still held (their claim reported held by every beat: never reaped) though nothing
    will ever write their outcome or let them go: no handler runs, no outcome is on its way."""
    return [
        (a.id, a.phase)
        for a in e.inflight.held()
        if a not in e.inflight.running() and a.phase is not Phase.SETTLED
    ]


def test_unrun_give_back_hand_over_raising_lets_the_claim_go(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """open() raises after the hold and the UNRUN give-back's hand-over raises too: the attempt is let
    go (dropped, named for the reaper), not left held with no outcome on its way, its claim reported
    held by every beat and never reaped while the engine runs."""
    ran: list[str] = []
    e, slots = _engine(make_engine, ran)
    job = e.enqueue(Job("t", {"n": 0})).id

    def canceled_before(a: Any) -> bool:
        raise RuntimeError("injected: a bug in open() after the hold")

    real = e.handover.hand_over

    def hand_over(a: Any, outcome: Any) -> None:
        if outcome is not None and outcome.state is State.PENDING:
            raise RuntimeError("injected: the give-back's write failed")
        real(a, outcome)

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    e.handover.hand_over = hand_over  # type: ignore[method-assign]
    rows = e.intake.claim(1)
    token = rows[0].claim_token
    e.intake.launch_all(rows)
    wait_for(lambda: e.inflight.running() == [], what="the launched attempt's start checked")
    assert ran == []
    assert slots.free == 1
    left = _left_to_no_one(e)
    assert left == [] or token in e.inflight.dropped(), (
        f"held for ever, never named for the reaper: {left}; row {repo.row(job).state}"
    )


def test_l5_poisoned_take_in_raising_before_its_dead_outcome_lets_the_claim_go(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """A poisoned row: ended POISONED, held; open() raises before ``a.poisoned()`` (here once its
    room was given back): the attempt is let go for the reaper, not held for ever with no dead
    outcome."""
    ran: list[str] = []
    e, slots = _engine(make_engine, ran)
    job = e.enqueue(Job("t", {"n": 0})).id
    repo.row(job).crashes = 3  # max_crashes reached: poisoned at its claim
    real = e.capacity.ended
    raised: list[str] = []

    def ended(topic: str) -> None:
        real(topic)
        if not raised:
            raised.append(topic)
            raise RuntimeError("injected: a bug in open() before the dead outcome")

    e.capacity.ended = ended  # type: ignore[method-assign]
    rows = e.intake.claim(1)
    token = rows[0].claim_token
    e.intake.launch_all(rows)
    assert raised
    assert ran == []
    assert slots.free == 1
    left = _left_to_no_one(e)
    assert left == [] or token in e.inflight.dropped(), (
        f"held for ever, never dead nor named for the reaper: {left}; row {repo.row(job).state}"
    )


@pytest.mark.parametrize("shape", ["sync", "async", "batch"])
def test_an_unrun_attempt_launched_frees_its_slot_and_room_once_and_never_runs(
    shape: str, repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """Each kind: open() raises after the hold, the UNRUN attempt is launched; its start check ends
    it: handler never called, slot and room back once, pending with its attempt given back."""
    ran: list[str] = []
    e = make_engine(workers=1)

    def one(ctx: Context, claim: Any) -> str:
        ran.append(claim.id)
        return "ok"

    async def one_async(ctx: Context, claim: Any) -> str:
        ran.append(claim.id)
        return "ok"

    def many(ctx: Context, claims: list[Any]) -> list[str]:
        ran.extend(c.id for c in claims)
        return ["ok"] * len(claims)

    if shape == "sync":
        e.register_kind("t", one, KindOptions(concurrency=1))
    elif shape == "async":
        e.register_kind("t", one_async, KindOptions(concurrency=1))
    else:
        e.register_batch("t", many, KindOptions(concurrency=1, batch_size=1))
    slots = e.intake.slots = SlotPool(1)
    e.hooks.release_slot = slots.release
    job = e.enqueue(Job("t", {"n": 0})).id

    def canceled_before(a: Any) -> bool:
        raise RuntimeError("injected")

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    e.intake.launch_all(e.intake.claim(1))
    wait_for(lambda: e.inflight.running() == [], what="the launched attempt's start checked")
    wait_for(lambda: slots.free == 1, what="the slot back")
    assert ran == []
    assert slots.free == 1
    assert e.inflight.held() == []
    assert dict(e.capacity._active) == {}
    row = repo.row(job)
    assert (row.state, row.attempts, row.crashes) == (State.PENDING, 0, 0)


def _attempt() -> Attempt:
    row = ClaimedJob(
        id="j",
        topic="t",
        payload=None,
        attempts=1,
        priority=0,
        claim_token="c",
        locked_by="w",
        locked_until=datetime.now(UTC),
    )
    kind = Kind.build("t", lambda ctx, claim: None, KindOptions())
    return Attempt(row, kind, 0.0, Context())


def test_unrun_only_from_running_and_its_outcome_is_a_give_back() -> None:
    a = _attempt()
    with pytest.raises(IllegalTransition):
        a.unrun()  # CLAIMED -> UNRUN is no move any more: every held attempt is started
    a.start()
    outcome = a.unrun()
    assert outcome is not None
    assert (outcome.state, outcome.give_back, outcome.last_error) == (State.PENDING, True, None)
    assert a.phase is Phase.SETTLING and a.ending is Phase.UNRUN
    assert a.unrun() is None  # a second ending loses
    assert a.returned() is None and a.raised(RuntimeError("late")) is None
