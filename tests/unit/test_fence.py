"""The fence's proof of a claim (SPEC F0, P1): an engine's proof of life covers a claim only along
an unbroken chain of beats from the proof the claim was made under, or from a beat that found the
claim held. A beat whose answer came once the proof before it had run out proves the engine's row,
not the claims it did not name: those may have been reaped meanwhile."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from brooq_py.engine.attempt.outcome import Phase
from brooq_py.engine.services.liveness import Fence

WITHIN = 2.0  # lease - margin


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def monotonic(self) -> float:
        return self.t

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.t, UTC)


class Claimed:
    """What the fence reads of an attempt: its phase and the proof its claim was made under."""

    def __init__(self, proven_at: float) -> None:
        self.phase = Phase.RUNNING
        self.proven_at = proven_at


def fence() -> tuple[Fence, Clock, list[Any]]:
    clock = Clock()
    fenced: list[Any] = []
    return Fence(WITHIN, clock, fenced.append), clock, fenced


def test_a_claim_made_under_a_proof_is_covered_by_each_beat_of_its_unbroken_chain() -> None:
    f, clock, fenced = fence()
    f.proven(clock.t, complete=True)
    a = Claimed(f.proven_at)  # claimed under the first proof
    for _ in range(10):  # beats every second, each answered at once: the chain holds for 10 s
        clock.t += 1.0
        f.proven(clock.t, complete=True)
        f.check([a], clock.t + 1.5)  # type: ignore[list-item]
    assert fenced == []
    assert f.may_claim()


def test_a_claim_made_before_the_chain_broke_is_fenced_though_the_engine_is_proven_again() -> None:
    """The stalled engine (a SIGSTOP between a claim's answer and its start): the first beat after
    it proves the engine again, but it did not name the claim, which may have been reaped and run
    elsewhere meanwhile."""
    f, clock, fenced = fence()
    f.proven(clock.t, complete=True)
    a = Claimed(f.proven_at)
    clock.t += 30.0  # stopped for 15 proofs
    f.proven(clock.t, complete=True)  # sent and answered after the stop
    assert f.may_claim()  # the engine itself may claim again
    f.check([a], clock.t + 0.01)  # type: ignore[list-item]
    assert fenced == [a]


def test_a_late_answer_breaks_the_chain_even_when_its_beat_was_sent_in_time() -> None:
    """Sent while the proof held, answered after: the row may have gone stale before the beat's
    write, and claims it did not name are not covered by it."""
    f, clock, fenced = fence()
    f.proven(clock.t, complete=True)
    a = Claimed(f.proven_at)
    sent = clock.t + 1.0
    clock.t += 2.5  # the answer comes 1.5 s after the send, 0.5 s past the proof
    f.proven(sent, complete=True)
    clock.t += 0.1
    assert clock.t - f.proven_at < WITHIN  # the engine's proof holds
    f.check([a], clock.t)  # type: ignore[list-item]
    assert fenced == [a]


def test_a_claim_the_breaking_beat_found_held_is_covered_from_that_beat() -> None:
    f, clock, fenced = fence()
    f.proven(clock.t, complete=True)
    named, unnamed = Claimed(f.proven_at), Claimed(f.proven_at)
    clock.t += 30.0
    named.proven_at = clock.t  # the heartbeat found it held under its token
    f.proven(clock.t, complete=True)
    f.check([named, unnamed], clock.t + 0.5)  # type: ignore[list-item]
    assert fenced == [unnamed]


def test_a_claim_made_under_the_new_chain_is_covered_by_it() -> None:
    f, clock, fenced = fence()
    f.proven(clock.t, complete=True)
    clock.t += 30.0
    f.proven(clock.t, complete=True)
    a = Claimed(f.proven_at)
    clock.t += 1.0
    f.proven(clock.t, complete=True)
    f.check([a], clock.t + 1.5)  # type: ignore[list-item]
    assert fenced == []


def test_the_engines_own_proof_running_out_fences_every_claim_and_stops_claims() -> None:
    f, clock, fenced = fence()
    f.proven(clock.t, complete=True)
    a, b = Claimed(f.proven_at), Claimed(f.proven_at)
    clock.t += WITHIN
    f.check([a, b], clock.t)  # type: ignore[list-item]
    assert fenced == [a, b]
    assert not f.may_claim()
