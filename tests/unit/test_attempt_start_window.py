"""A handler's start against an ending told on another thread (SPEC F0, P1).

An attempt's fence or lost lease is recorded first (its ending), then logged and counted, then its
context is cancelled. A start check on another thread in between (an async handler's on the
loop, a batch's on its caller) finds the attempt ended and its context not yet cancelled: the
handler must not start all the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from brooq_py.engine.attempt.attempt import Attempt, Hooks, Kind, unstarted
from brooq_py.engine.attempt.outcome import Phase
from brooq_py.queue import Claim, Context, KindOptions, LeaseLost
from brooq_py.queue.port import ClaimedJob


class _SlowTelling(Hooks):
    """Hooks whose telling of an ending (a log line, a counter) waits until released."""

    def __init__(self) -> None:
        super().__init__()
        self.telling = threading.Event()
        self.release = threading.Event()

    def _wait(self) -> None:
        self.telling.set()
        self.release.wait(10)

    def tell_fenced(self, a: Attempt, lease: float) -> None:
        self._wait()

    def tell_lost(self, a: Attempt, cause: BaseException) -> None:
        self._wait()


def _attempt(hooks: Hooks) -> Attempt:
    row = ClaimedJob(
        id="00000000-0000-0000-0000-000000000001",
        topic="t",
        payload={},
        attempts=1,
        priority=0,
        claim_token="tok",
        locked_by="w",
        locked_until=datetime.now(UTC),
    )

    def handler(ctx: Context, claim: Claim) -> None:
        return None

    return Attempt(row, Kind.build("t", handler, KindOptions()), 0.0, Context(), hooks=hooks)


ENDS: dict[str, Callable[[Attempt], object]] = {
    "fenced": lambda a: a.fenced(2.0),
    "lost": lambda a: a.lost(LeaseLost("reaped")),
}


@pytest.mark.parametrize("end", sorted(ENDS))
def test_f0_a_handler_never_starts_while_another_thread_tells_its_attempt_ended(end: str) -> None:
    hooks = _SlowTelling()
    a = _attempt(hooks)
    a.start()
    other = threading.Thread(target=ENDS[end], args=(a,))
    other.start()  # the watchdog's fence, the heartbeat's lost lease
    try:
        assert hooks.telling.wait(10)
        assert a.ctx.cause is None  # the window: ended, its context not cancelled yet
        assert a.fenced(2.0) is None  # the start's own fence check finds it ended: nothing to do
        cause = unstarted(a)
        assert isinstance(cause, LeaseLost), "the handler would start for a claim no longer held"
    finally:
        hooks.release.set()
        other.join(10)
    assert isinstance(a.ctx.cause, LeaseLost)


def test_f0_a_running_attempt_with_no_ending_starts() -> None:
    a = _attempt(Hooks())
    a.start()
    assert unstarted(a) is None
    a.ctx.cancel(TimeoutError("a timeout is the handler's to see"))
    assert unstarted(a) is None


class _Counting(Hooks):
    def __init__(self) -> None:
        super().__init__()
        self.hung: list[str] = []
        self.unstarted: list[str] = []

    def tell_hung(self, a: Attempt, grace: float) -> None:
        self.hung.append(a.id)

    def tell_unstarted(self, a: Attempt, grace: float) -> None:
        self.unstarted.append(a.id)


def test_c5_an_attempt_never_called_is_handed_back_unrun_not_hung() -> None:
    """The watchdog's verdict on an attempt whose start stalled past its timeout and the grace: no
    handler hangs, so none is counted; the row goes back pending with its attempt given back (not to
    the reaper as a crash), and the start that comes later never calls the handler."""
    hooks = _Counting()
    a = _attempt(hooks)
    a.start()
    outcome = a.declared_hung(1.0)
    assert outcome is not None and outcome.state == "pending" and outcome.give_back
    assert (hooks.hung, hooks.unstarted) == ([], [a.id])
    assert isinstance(a.call(), LeaseLost) and not a.called


def test_c5_an_attempt_called_before_the_verdict_is_hung() -> None:
    hooks = _Counting()
    a = _attempt(hooks)
    a.start()
    assert a.call() is None and a.called
    assert a.declared_hung(1.0) is None  # its claim dropped for the reaper, as before
    assert (hooks.hung, hooks.unstarted) == ([a.id], [])


def test_c5_p1_the_start_and_the_watchdogs_verdict_race_one_wins_whole() -> None:
    """call() and declared_hung() on two threads, many times: either the handler was called and the
    attempt ended hung, or it was never called and ended unrun; never a handler called for a row
    handed back (another engine could run it at the same time)."""

    def start(a: Attempt, go: threading.Barrier, answers: list[object]) -> None:
        go.wait()
        answers.append(a.call())

    for _ in range(300):
        hooks = _Counting()
        a = _attempt(hooks)
        a.start()
        go = threading.Barrier(2)
        answers: list[object] = []
        starter = threading.Thread(target=start, args=(a, go, answers))
        starter.start()
        go.wait()
        a.declared_hung(1.0)
        starter.join(10)
        (cause,) = answers
        if a.called:
            assert cause is None and a.ending is Phase.HUNG and hooks.hung == [a.id]
        else:
            assert isinstance(cause, LeaseLost) and a.ending is Phase.UNRUN and hooks.unstarted == [a.id]
