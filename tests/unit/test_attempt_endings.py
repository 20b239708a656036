"""The Attempt owns its moves: told how it ended, it answers the outcome to write or None (SPEC L1, C3-C5).

The runner reports a handler's return or raise, the supervisor its verdicts; the
attempt moves through its tables, asks decide() and says what to write, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from brooq_py.engine import Engine
from brooq_py.engine.attempt.attempt import Attempt, Hooks
from brooq_py.engine.attempt.outcome import Phase
from brooq_py.queue import Claim, Context, Job, KindOptions, LeaseLost, State
from tests.polling import wait_for
from tests.unit.conftest import FAST
from tests.unit.fake_repo import FakeRepo
from tests.unit.test_attempt_states import attempt


class Recorded:
    """Hooks whose effects are counted: the handler's end told, leases let go, slots freed."""

    def __init__(self) -> None:
        self.hooks = Hooks()
        self.left: list[Attempt] = []
        self.let_go: list[Attempt] = []
        self.freed = 0
        self.hooks.left_running = self.left.append
        self.hooks.let_go = self.let_go.append
        self.hooks.release_slot = self._free

    def _free(self) -> None:
        self.freed += 1

    def attempt(self) -> Attempt:
        bare = attempt()  # the row and kind of the state machine's own tests
        a = Attempt(bare.row, bare.kind, 0.0, Context(), hooks=self.hooks)
        a.start()
        return a


def test_l1_a_return_answers_done_and_its_own_end_frees_the_slot_once() -> None:
    r = Recorded()
    a = r.attempt()
    out = a.returned()
    assert out is not None and out.state is State.DONE
    assert a.phase is Phase.SETTLING and r.left == [a]  # settled once the write is done
    a.free_slot()
    a.free_slot()
    assert r.freed == 1


def test_c6_a_raise_answers_a_failed_attempt() -> None:
    r = Recorded()
    out = r.attempt().raised(ValueError("boom"))
    assert out is not None and out.state is State.FAILED
    assert out.last_error == "ValueError: boom"


def test_c3_lost_answers_nothing_and_a_later_return_writes_nothing() -> None:
    r = Recorded()
    a = r.attempt()
    assert a.lost(LeaseLost("taken")) is None
    assert isinstance(a.ctx.cause, LeaseLost) and a.phase is Phase.SETTLED and r.let_go == [a]
    assert a.returned() is None  # the first ending won
    a.free_slot()
    assert r.freed == 1  # the handler's own end still frees its slot


def test_c4_a_given_up_attempt_answers_its_failure_when_its_handler_returns() -> None:
    r = Recorded()
    a = r.attempt()
    assert a.given_up() is None
    assert r.freed == 1  # the give-up freed the slot
    out = a.returned()
    assert out is not None and out.state is State.FAILED
    assert "MaxExecutionExceeded" in (out.last_error or "")
    a.free_slot()
    assert r.freed == 1  # not twice


def test_c4_c5_a_given_up_attempt_is_answered_once_by_its_hung_verdict_or_its_end() -> None:
    r = Recorded()
    a = r.attempt()
    a.given_up()
    out = a.declared_hung(0.5)
    assert out is not None and out.state is State.FAILED
    assert a.returned() is None  # the verdict came first
    assert r.freed == 1


def test_c5_hung_while_running_answers_nothing_and_frees_the_slot() -> None:
    r = Recorded()
    a = r.attempt()
    assert a.call() is None  # its handler runs
    assert a.declared_hung(0.5) is None
    assert a.hung and a.phase is Phase.SETTLED and r.let_go == [a] and r.freed == 1
    assert a.returned() is None
    assert r.freed == 1  # its late end frees nothing more


def test_c4_an_async_handler_given_up_that_returns_later_is_settled(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """An async handler past max_execution_timeout that ignores its cancel and then returns: its
    return is reported on the loop's thread (the completer has room) like any other, and the
    failure is written: the job runs again and the lease is let go, not renewed for ever."""
    e = make_engine(workers=2, lease=0.9, watchdog_grace=30)
    runs: list[float] = []

    async def handler(ctx: Context, claim: Claim) -> None:
        runs.append(time.monotonic())
        if len(runs) > 1:
            return
        end = time.monotonic() + 1.5
        while time.monotonic() < end:  # ignores its ctx and the task's cancel
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)

    e.register_kind(
        "t", handler, KindOptions(attempt_timeout=0.1, max_execution_timeout=0.2, max_attempts=3, **FAST)
    )
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.DONE, what="done on the second attempt", timeout=20)
    r = repo.row(jid)
    assert r.history == [State.PROCESSING, State.FAILED, State.PENDING, State.PROCESSING, State.DONE]
    assert "MaxExecutionExceeded" in (r.last_error or "")
    wait_for(lambda: not e.inflight.held(), what="the lease let go")


def test_c5_a_handler_returning_as_it_is_called_hung_writes_nothing() -> None:
    """The verdict is one move: a return told while the watchdog reports it (the handler released
    the moment it was counted hung) finds the attempt ended, and writes no done."""
    r = Recorded()
    a = r.attempt()
    assert a.call() is None  # its handler runs
    answers: list[object] = []
    told = r.hooks.tell_hung
    r.hooks.tell_hung = lambda at, grace: (answers.append(at.returned()), told(at, grace))  # type: ignore[method-assign]
    assert a.declared_hung(0.5) is None
    assert answers == [None] and a.ending is Phase.HUNG
    assert r.freed == 1
