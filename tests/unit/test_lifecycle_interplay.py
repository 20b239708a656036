"""Where two lifecycle rules meet at one moment, on the fake repo (SPEC C4, C8, C11, L1, L2, L5).

Each test names the moment it checks in its docstring: a stop racing another
stop or called from a handler, an outcome settled while the completer stops,
the hard ceiling on a job's last attempt, a signal raised after the stop's cancel.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from brooq_py.engine import Config, Engine
from brooq_py.engine.attempt import Phase
from brooq_py.engine.outcome import Ending, decide
from brooq_py.engine.repo import Outcome
from brooq_py.queue import (
    Claim,
    Context,
    EngineStopping,
    Job,
    KindOptions,
    MustCancelTask,
    MustDelay,
    MustPreserveAttempt,
    State,
)
from tests.polling import wait_for
from tests.unit.fake_repo import FakeRepo

FAST = {"backoff_base": 0.001, "backoff_max": 0.002}


@pytest.fixture
def repo() -> FakeRepo:
    return FakeRepo()


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set in teardown: handlers that ignore their ctx wait on it."""
    ev = threading.Event()
    yield ev
    ev.set()


@pytest.fixture
def make_engine(repo: FakeRepo) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def make(**cfg: object) -> Engine:
        params: dict[str, object] = {"workers": 2, "poll_interval": 0.05, "lease": 3, **FAST}
        params.update(cfg)
        e = Engine(repo, Config(**params))  # type: ignore[arg-type]
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.stop(timeout=1)


def children(repo: FakeRepo, topic: str) -> list[str]:
    with repo.lock:
        return [r.id for r in repo.rows.values() if r.topic == topic]


# --- C4 meets L5 ------------------------------------------------------------------------


def test_c4_l5_max_execution_on_the_last_attempt_never_makes_the_job_dead(
    repo: FakeRepo, make_engine: Callable[..., Engine], release: threading.Event
) -> None:
    """A sync handler blocked (in a database call, say) past max_execution_timeout on its last
    attempt is given up on: failed, never dead (C4). Its next claim must run it, not call it
    poisoned (L5): the given-up attempt had an outcome, it did not hang without one."""
    e = make_engine(watchdog_grace=30)
    calls: list[int] = []

    def handler(ctx: Context, claim: Claim) -> None:
        calls.append(claim.attempt)
        if len(calls) == 1:
            release.wait(30)  # blocked past the hard ceiling, ignoring ctx

    e.register_kind(
        "t", handler, KindOptions(max_attempts=1, attempt_timeout=0.05, max_execution_timeout=0.1, **FAST)
    )
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.DONE, what="run again and done")
    row = repo.row(jid)
    assert State.DEAD not in row.history and State.FAILED in row.history
    assert len(calls) == 2


# --- C8 meets C11: signals raised after each cause ----------------------------------------


def _decide(error: BaseException, cause: BaseException | None, attempt: int = 1) -> Outcome | None:
    return decide(
        id="j",
        claim_token="tok",
        topic="t",
        attempt=attempt,
        options=KindOptions(max_attempts=3, backoff_max=60),
        ending=Ending(Phase.RAISED, error=error, cause=cause, stopping=True),
    )


def test_c8_c11_must_delay_after_the_stops_cancel_keeps_its_delay_and_gives_the_attempt_back() -> None:
    """MustDelay(d) raised after EngineStopping: stopping is not the job's failure (attempt
    given back, C11) and the handler's own "not before d" still holds (C8): another engine
    must not run it at once."""
    o = _decide(MustDelay(30), EngineStopping("stop"))
    assert o is not None and o.give_back
    assert o.delay == timedelta(seconds=30)
    o = _decide(MustDelay(3600), EngineStopping("stop"), attempt=3)  # the last attempt: not dead
    assert o is not None and o.give_back and o.state is not State.DEAD
    assert o.delay == timedelta(seconds=60)  # clamped to backoff_max


def test_c8_c11_other_signals_after_the_stops_cancel() -> None:
    """MustCancelTask after the stop's cancel still cancels (the handler's word); MustPreserveAttempt
    gives the attempt back and is never dead."""
    o = _decide(MustCancelTask("no"), EngineStopping("stop"))
    assert o is not None and o.state is State.CANCELED
    o = _decide(MustPreserveAttempt("later"), EngineStopping("stop"), attempt=3)
    assert o is not None and o.give_back and o.state is not State.DEAD
