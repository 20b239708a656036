"""The Attempt state machine: every transition of its two tables, and decide() for every ending (SPEC L1)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from brooq_py.engine.attempt.attempt import Attempt, Kind, Poisoned
from brooq_py.engine.attempt.outcome import (
    ENDINGS,
    HANDLER,
    PHASES,
    POISON_ERROR,
    Ending,
    HandlerState,
    IllegalTransition,
    Phase,
    decide,
)
from brooq_py.queue import (
    AttemptTimeout,
    Claim,
    Context,
    EngineStopping,
    KindOptions,
    LeaseLost,
    State,
)
from brooq_py.queue.port import ClaimedJob


def handler(ctx: Context, claim: Claim) -> None:
    return None


def attempt(attempts: int = 1, max_attempts: int = 3) -> Attempt:
    row = ClaimedJob(
        id="00000000-0000-0000-0000-000000000001",
        topic="t",
        payload={},
        attempts=attempts,
        priority=0,
        claim_token="tok",
        locked_by="w",
        locked_until=datetime.now(UTC),
    )
    kind = Kind.build("t", handler, KindOptions(max_attempts=max_attempts))
    return Attempt(row, kind, 0.0, Context())


def at(phase: Phase) -> Attempt:
    """An attempt driven by legal moves to *phase*."""
    a = attempt()
    if phase is Phase.CLAIMED:
        return a
    if phase is Phase.POISONED:
        assert a.end(phase)
        return a
    a.start()
    if phase is Phase.RUNNING:
        return a
    if phase in ENDINGS:
        assert a.end(phase)
        return a
    assert a.end(Phase.RETURNED)
    a.settling()
    if phase is Phase.SETTLED:
        a.settled()
    return a


def test_l1_every_phase_has_a_row_in_the_table() -> None:
    assert set(PHASES) == set(Phase)
    assert set(HANDLER) == set(HandlerState)


# sorted: PHASES and HANDLER hold sets, whose order changes with each interpreter's string hashes,
# and every xdist worker must collect the same tests in the same order.
@pytest.mark.parametrize(("src", "dst"), [(s, d) for s in Phase for d in sorted(PHASES[s])])
def test_l1_every_legal_phase_transition_is_taken(src: Phase, dst: Phase) -> None:
    a = at(src)
    if dst is Phase.RUNNING:
        a.start()
    elif dst in ENDINGS:
        assert a.end(dst) is True
        assert a.ending is dst
    elif dst is Phase.SETTLING:
        assert a.settling() is src
    else:
        a.settled()
    assert a.phase is dst


@pytest.mark.parametrize(
    ("src", "dst"),
    [(s, d) for s, d in itertools.product(Phase, Phase) if d not in PHASES[s] and d in ENDINGS],
)
def test_l1_a_second_ending_loses_and_an_illegal_one_raises(src: Phase, dst: Phase) -> None:
    a = at(src)
    if src in (Phase.CLAIMED, Phase.RUNNING):
        with pytest.raises(IllegalTransition):  # e.g. RETURNED before the handler started: a bug
            a.end(dst)
    else:
        assert a.end(dst) is False  # a race lost: the first ending stays
    assert a.phase is src


@pytest.mark.parametrize("src", [p for p in Phase if p not in ENDINGS])
def test_l1_settling_from_a_phase_that_is_no_ending_raises(src: Phase) -> None:
    a = at(src)
    with pytest.raises(IllegalTransition):
        a.settling()


@pytest.mark.parametrize("src", [p for p in Phase if p is not Phase.SETTLING])
def test_l1_settled_only_from_settling(src: Phase) -> None:
    with pytest.raises(IllegalTransition):
        at(src).settled()


@pytest.mark.parametrize("src", [p for p in Phase if p is not Phase.CLAIMED])
def test_l1_start_only_once_from_claimed(src: Phase) -> None:
    with pytest.raises(IllegalTransition):
        at(src).start()


def test_l1_end_rejects_a_phase_that_is_no_ending() -> None:
    a = at(Phase.RUNNING)
    for p in (Phase.SETTLING, Phase.SETTLED, Phase.RUNNING, Phase.CLAIMED):
        with pytest.raises(IllegalTransition):
            a.end(p)


def test_l1_an_attempt_is_settled_exactly_once() -> None:
    a = at(Phase.RAISED)
    assert a.settling() is Phase.RAISED
    with pytest.raises(IllegalTransition):
        a.settling()
    a.settled()
    with pytest.raises(IllegalTransition):
        a.settled()


@pytest.mark.parametrize(("src", "dst"), [(s, d) for s in HandlerState for d in sorted(HANDLER[s])])
def test_c5_every_legal_handler_transition(src: HandlerState, dst: HandlerState) -> None:
    a = attempt()
    path = {
        HandlerState.RUNNING: [],
        HandlerState.ABANDONED: [HandlerState.ABANDONED],
        HandlerState.HUNG: [HandlerState.HUNG],
        HandlerState.ENDED: [HandlerState.ENDED],
    }[src]
    for step in path:
        a.handler_to(step)
    assert a.handler_to(dst) is src
    assert a.handler is dst


def test_c5_handler_moves_that_lost_a_race_return_none() -> None:
    a = attempt()
    assert a.handler_to(HandlerState.ENDED) is HandlerState.RUNNING
    assert a.handler_to(HandlerState.HUNG) is None  # ended before the watchdog looked: not hung
    assert a.handler_to(HandlerState.ABANDONED) is None
    with pytest.raises(IllegalTransition):
        a.handler_to(HandlerState.ENDED)  # a handler ends once
    b = attempt()
    b.handler_to(HandlerState.HUNG)
    assert b.handler_to(HandlerState.ABANDONED) is None
    assert b.hung


def test_c5_only_the_first_move_out_of_running_owns_the_slot() -> None:
    a = attempt()
    assert a.handler_to(HandlerState.ABANDONED) is HandlerState.RUNNING  # frees the slot
    assert a.handler_to(HandlerState.HUNG) is HandlerState.ABANDONED  # counts hung, frees nothing
    assert a.handler_to(HandlerState.ENDED) is HandlerState.HUNG  # a late return frees nothing


# --- decide(): the one router from an ending to an outcome -----------------------------

OPTS = KindOptions(max_attempts=3, backoff_base=1, backoff_max=10)


def route(ending: Ending, attempt: int = 1) -> object:
    return decide(id="j", claim_token="tok", topic="t", attempt=attempt, options=OPTS, ending=ending)


@pytest.mark.parametrize("phase", [Phase.LOST, Phase.FENCED])
def test_c3_l4_lost_or_fenced_writes_nothing(phase: Phase) -> None:
    assert route(Ending(phase)) is None
    assert route(Ending(phase, error=ValueError("x"), stopping=True)) is None


def test_c5_hung_while_running_writes_nothing() -> None:
    assert route(Ending(Phase.HUNG, cause=AttemptTimeout())) is None


def test_c11_l1_hung_at_stop_is_pending_with_the_attempt_given_back() -> None:
    out = route(Ending(Phase.HUNG, cause=EngineStopping(), stopping=True), attempt=3)
    assert out is not None and out.state is State.PENDING and out.give_back  # type: ignore[attr-defined]


def test_c5_hung_before_the_stop_is_released_with_its_attempt_counted() -> None:
    out = route(Ending(Phase.HUNG, cause=AttemptTimeout(), stopping=True))
    assert out is not None and out.state is State.PENDING and not out.give_back  # type: ignore[attr-defined]


def test_l5_poisoned_is_dead_and_says_why() -> None:
    why = POISON_ERROR.format(crashes=3)
    out = route(Ending(Phase.POISONED, error=Poisoned(why)), attempt=1)
    assert out is not None and out.state is State.DEAD  # type: ignore[attr-defined]
    assert out.last_error == (
        "3 engines stopped while running it (crashed, stalled, hung or cut off from the database); not run again"
    )  # type: ignore[attr-defined]


def test_unrun_is_pending_with_the_attempt_given_back() -> None:
    out = route(Ending(Phase.UNRUN))
    assert out is not None and out.state is State.PENDING and out.give_back  # type: ignore[attr-defined]


def test_l1_only_returned_is_done() -> None:
    for phase in ENDINGS:
        ending = Ending(phase, error=None if phase is Phase.RETURNED else ValueError("x"))
        out = route(ending)
        assert (out is not None and out.state is State.DONE) == (phase is Phase.RETURNED)  # type: ignore[attr-defined]


def test_l1_a_lease_lost_cause_writes_nothing_even_for_returned() -> None:
    assert route(Ending(Phase.RETURNED, cause=LeaseLost())) is None
