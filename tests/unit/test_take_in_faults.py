"""Without a database: Intake.launch_all / take_in when open() raises after the hold, and another
thread ended the attempt meanwhile (SPEC C1, Q2). The watchdog's moves are made by hand, as its tick
would make them, before or after the launched attempt's start is checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from brooq_py.engine import Engine
from brooq_py.engine.attempt.outcome import HandlerState, Phase
from brooq_py.engine.attempt.runner import SlotPool
from brooq_py.queue import Job, KindOptions
from tests.polling import wait_for
from tests.unit.fake_repo import FakeRepo


def _engine(make_engine: Callable[..., Engine], ran: list[str]) -> tuple[Engine, SlotPool]:
    e = make_engine(workers=1)
    e.register_kind("t", lambda ctx, claim: ran.append(claim.id), KindOptions(concurrency=1))
    slots = e.intake.slots = SlotPool(1)  # as start() wires them, without the services
    e.hooks.release_slot = slots.release
    return e, slots


def _watchdog_tick(e: Engine) -> None:
    """The watchdog's verdicts, with its grace past: give up, call hung."""
    for a in e.inflight.running():
        if a.phase is Phase.RUNNING:
            e.supervisor.give_up(a)
        if a.handler in (HandlerState.RUNNING, HandlerState.ABANDONED) and a.cancelled_at is not None:
            e.supervisor.declare_hung(a)


@pytest.mark.parametrize("meanwhile", ["canceled", "lease-lost", "fenced", "gave-up"])
def test_c1_q2_take_in_raising_after_another_thread_ended_the_held_attempt(
    meanwhile: str, repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """open() raises after the hold, once another thread ended the held, started attempt (a cancel's
    NOTIFY, the heartbeat's lease lost, the fence, the watchdog's give-up): the attempt goes to its
    launch, where its start's check ends it; its slot and its topic's room come back once, and no
    hung handler is left. (It was left in ``running``, never launched: the watchdog called it hung
    and freed its slot a second time.)"""
    ran: list[str] = []
    e, slots = _engine(make_engine, ran)
    e.enqueue(Job("t", {"n": 0}))
    real = e.inflight.canceled_before

    def canceled_before(a: Any) -> bool:
        if meanwhile == "canceled":
            e.supervisor.canceled(a)
        elif meanwhile == "lease-lost":
            e.supervisor.lease_lost(a)
        elif meanwhile == "fenced":
            e.supervisor.fence(a)
        else:
            a.hard_deadline = 0.0
            e.supervisor.give_up(a)
        raise RuntimeError("injected: a bug in open() after the hold")

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    rows = e.intake.claim(1)
    assert len(rows) == 1
    e.intake.launch_all(rows)
    e.inflight.canceled_before = real  # type: ignore[method-assign]
    _watchdog_tick(e)  # before or after the launched attempt's start is checked: either order
    wait_for(lambda: e.inflight.running() == [], what="the launched attempt's start checked")
    problems = []
    if slots.free > slots.size:
        problems.append(f"C1: slots free {slots.free} > workers {slots.size} (freed twice)")
    left = [(a.phase, a.handler) for a in e.inflight.running()]
    if left:
        problems.append(f"an attempt that never ran left running: {left}")
    if e.capacity._active.get("t", 0) > 0:
        problems.append(f"Q2: the topic's room never comes back: active {dict(e.capacity._active)}")
    if e.inflight.hung_count():
        problems.append(f"health: {e.inflight.hung_count()} hung handler(s) that never ran")
    assert ran == []
    assert not problems, problems


def test_take_in_raising_after_the_hold_with_no_ending_frees_slot_and_room_once(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """open() raises after the hold, nothing else ended the attempt: handed back unrun, its slot and
    its room back once."""
    ran: list[str] = []
    e, slots = _engine(make_engine, ran)
    e.enqueue(Job("t", {"n": 0}))

    def canceled_before(a: Any) -> bool:
        raise RuntimeError("injected")

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    e.intake.launch_all(e.intake.claim(1))
    _watchdog_tick(e)
    wait_for(lambda: e.inflight.running() == [], what="the launched attempt's start checked")
    assert slots.free == 1
    assert e.inflight.running() == [] and e.inflight.held() == []
    assert dict(e.capacity._active) == {}
    assert ran == []
