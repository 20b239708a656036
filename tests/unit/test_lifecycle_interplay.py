"""Where two lifecycle rules meet at one moment, on the fake repo (SPEC C4, C8, C11, L1, L2, L5).

Each test names the moment it checks in its docstring: a stop racing another
stop or called from a handler, an outcome settled while the completer stops,
the hard ceiling on a job's last attempt, a signal raised after the stop's cancel.
"""

from __future__ import annotations

import asyncio
import threading
import time
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


# --- C11: stop against stop, against the completer, from a handler -----------------------


def test_c11_a_second_stop_returns_only_once_the_engine_stopped(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """stop() while another stop() is under way (a signal handler and the main thread's close()):
    the second call must not return before the first has flushed every outcome, or close() shuts
    the store under the first stop and the row stays processing."""
    e = make_engine()
    started = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        started.set()
        time.sleep(0.5)  # finishes well within the first stop's timeout

    e.register_kind("t", handler)
    jid = e.enqueue(Job("t")).id
    e.start()
    assert started.wait(10)
    first = threading.Thread(target=e.stop, kwargs={"timeout": 30})
    first.start()
    wait_for(lambda: not e.running, what="the first stop under way")
    e.close()
    assert repo.row(jid).state is State.DONE
    assert not repo.closed or repo.row(jid).state is State.DONE
    first.join(30)


def test_c11_an_outcome_settled_after_the_completer_stopped_is_still_written(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """A handler that returns while stop() stops the completer (a settler thread slow to run,
    a thread preempted between its return and its put): its outcome must be written, not
    appended to a buffer nobody flushes any more."""
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    e.start()
    jid = e.enqueue(Job("t")).id
    wait_for(lambda: repo.row(jid).state is State.DONE)
    other = e.enqueue(Job("other")).id
    [row] = repo.claim(["other"], 1, e.worker_id, timedelta(seconds=30))
    completer = e._completer
    assert completer is not None
    completer.stop()  # what stop() does just before it switches to writing at once
    e.runner.put(Outcome(id=row.id, claim_token=row.claim_token, state=State.DONE, topic="other"))
    assert repo.row(other).state is State.DONE


def test_c11_stop_waits_for_a_closing_transaction_under_way(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """A handler returned before the stop, but its closing transaction (chain + on_succeeded) is
    still being retried after a connection lost at COMMIT (L6) when the stop's timeout and grace
    are over: stop() must not return while that outcome is still on its way (a process exits
    right after stop(), and the daemon thread writing it dies with it)."""
    e = make_engine(watchdog_grace=0.05)
    returned = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        claim.chain(Job("child"))
        claim.on_succeeded(lambda tx: None)
        returned.set()

    e.register_kind("t", handler)
    repo.fail_close = 4  # retried with backoff for a good while, outside the fake's lock
    jid = e.enqueue(Job("t")).id
    e.start()
    assert returned.wait(10)
    e.stop(timeout=0.01)
    assert repo.row(jid).state is State.DONE and len(children(repo, "child")) == 1


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_c11_l1_stop_called_from_a_handler_does_not_hang_that_handler(
    repo: FakeRepo, make_engine: Callable[..., Engine], kind: str
) -> None:
    """A handler that calls stop() (a "shutdown" job) cannot wait for itself: stop() from a
    handler starts the stop and returns; the handler's own return is then done, like any
    handler that returns during a stop, instead of being called hung at stop and run again."""
    e = make_engine(watchdog_grace=0.2)
    stopped_from: list[str] = []

    def sync_handler(ctx: Context, claim: Claim) -> None:
        e.stop(timeout=10)
        stopped_from.append("sync")

    async def async_handler(ctx: Context, claim: Claim) -> None:
        e.stop(timeout=10)
        await asyncio.sleep(0)
        stopped_from.append("async")

    e.register_kind("t", sync_handler if kind == "sync" else async_handler)
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: stopped_from, what="the handler returned from stop()")
    e.stop()  # from the test's thread: returns once the stop is over
    row = repo.row(jid)
    assert row.state is State.DONE and row.attempts == 1
    assert e.inflight.hung_count() == 0


def test_c11_close_after_run_once_with_an_async_handler_ends_the_loop_thread(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """run_once() runs an async handler on the engine's loop without start(); close() must end
    that loop's thread too (stop() has nothing to stop), or each such engine leaks one."""
    e = make_engine()
    seen: list[threading.Thread] = []

    async def handler(ctx: Context, claim: Claim) -> None:
        seen.append(threading.current_thread())  # the loop's own thread
        claim.chain(Job("child"))

    e.register_kind("t", handler)
    jid = e.enqueue(Job("t")).id
    assert e.run_once() == 1
    assert repo.row(jid).state is State.DONE and len(children(repo, "child")) == 1
    e.close()
    wait_for(lambda: not seen[0].is_alive(), what="the loop's thread ended")


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


# --- C4: the hard ceiling against a handler's return ----------------------------------------


def test_c4_l1_give_up_from_a_stale_look_after_the_handler_returned_leaves_it_done(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """The watchdog took its list of running attempts; the handler returns (an async one: its end
    recorded on the loop, its settling queued for a settler); then the watchdog reaches it past
    max_execution_timeout. The handler was not "still running then" (C4): its return decides,
    done, not a failed attempt written over its return."""
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    e.start()
    jid = e.enqueue(Job("t")).id
    e.stop()  # nothing claims it: the test drives the attempt's moves itself
    [row] = repo.claim(["t"], 1, e.worker_id, timedelta(seconds=30))
    a = e._attempt(row)
    assert a is not None
    was = e.runner.ended(a)  # the handler returned
    e.supervisor.give_up(a)  # the watchdog, from the list it took before
    e.runner.conclude(a, None, was)  # the settler's turn
    r = repo.row(jid)
    assert r.state is State.DONE and r.last_error is None


# --- L6 meets L5 ----------------------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="L6 vs L5: a given-up outcome write on the last attempt leaves attempts at max_attempts; "
    "the reaper returns the row as it does a crash, and the next claim calls it poisoned. Telling "
    "the two apart needs a mark in the row (the reaper's or the engine's), i.e. a migration.",
)
def test_l6_l5_an_outcome_write_given_up_on_the_last_attempt_never_makes_the_job_dead(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """The handler returned on its last attempt, but the store was unreachable for a whole lease:
    the write is given up and the reaper returns the job (L6). L6 says this never makes a job
    dead; the next claim must run it again, not call it poisoned (L5)."""
    e = make_engine(lease=0.6, reaper_period=60)
    calls: list[int] = []
    e.register_kind("t", lambda ctx, claim: calls.append(claim.attempt), KindOptions(max_attempts=1, **FAST))
    repo.fail_settle = repo.fail_renew = 10**9
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: calls and not e.inflight.held(), what="the outcome given up", timeout=20)
    repo.fail_settle = repo.fail_renew = 0  # the store is back; the lease has expired meanwhile
    repo.expire(jid)
    assert repo.reap_expired() == [(jid, "t")]  # another engine's reaper, say
    wait_for(lambda: repo.row(jid).state.terminal, what="settled again")
    assert repo.row(jid).state is State.DONE
