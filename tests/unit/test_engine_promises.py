"""The engine's promises against what its own code cannot control (SPEC P1', X2', C4', C11'): fake repo.

Whatever a handler or a callback raises, an attempt settles; a given-up handler
keeps its lease until it ends; attempts are held by claim token; a cancel the
heartbeat finds is an operator's, told as such.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from brooq_py.engine import Engine
from brooq_py.engine.services.cleanup import Reaper
from brooq_py.queue import Claim, Context, Job, JobCanceledByOperator, KindOptions, LeaseLost, State
from brooq_py.queue.port import EngineProof, HeldLease
from tests.polling import wait_for
from tests.unit.conftest import FAST
from tests.unit.fake_repo import FakeRepo

RAISED: list[type[BaseException]] = [SystemExit, KeyboardInterrupt, GeneratorExit, RuntimeError]


@pytest.mark.parametrize("exc", RAISED, ids=lambda t: t.__name__)
@pytest.mark.parametrize("where", ["handler", "on_succeeded", "chain building", "async handler"])
def test_c11_whatever_a_handler_or_callback_raises_the_attempt_settles(
    repo: FakeRepo,
    make_engine: Callable[..., Engine],
    monkeypatch: pytest.MonkeyPatch,
    exc: type[BaseException],
    where: str,
) -> None:
    """A BaseException (SystemExit, KeyboardInterrupt, GeneratorExit) from the handler, its
    on_succeeded or the chained enqueues of its closing transaction is a failed attempt like any
    other: the row never stays processing behind the live engine, the lease is no longer held."""
    e = make_engine(lease=30)

    def boom(*_: Any) -> None:
        raise exc("boom")

    def handler(ctx: Context, claim: Claim) -> None:
        if where == "handler":
            boom()
        if where == "on_succeeded":
            claim.on_succeeded(boom)
        if where == "chain building":
            claim.chain(Job("child"))
            monkeypatch.setattr(repo, "enqueue_tx", boom)

    async def async_handler(ctx: Context, claim: Claim) -> None:
        boom()

    e.register_kind("t", async_handler if where == "async handler" else handler, KindOptions(max_attempts=1))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state.terminal, what="the attempt settled", timeout=10)
    assert repo.row(jid).state is State.DEAD
    assert exc.__name__ in (repo.row(jid).last_error or "")
    wait_for(lambda: not e.inflight.held(), what="the lease let go")
    e.stop(timeout=2)
    assert repo.row(jid).history == [State.PROCESSING, State.DEAD]


def test_c4_a_given_up_attempt_keeps_its_lease_until_its_handler_ends(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """max_execution_timeout gives up on a handler that ignores its ctx: its slot is freed, but
    the row stays processing under this claim (renewed) until the handler ends; only then is the
    failure written and the job run again: two runs of one job never overlap."""
    e = make_engine(workers=2, lease=0.9, watchdog_grace=30)
    spans: list[list[float]] = []
    lock = threading.Lock()

    def handler(ctx: Context, claim: Claim) -> None:
        with lock:
            spans.append([time.monotonic(), float("inf")])
            i = len(spans) - 1
        if i == 0:
            time.sleep(1.5)  # ignores its ctx, past max_execution_timeout and beyond a lease
        with lock:
            spans[i][1] = time.monotonic()

    e.register_kind(
        "t", handler, KindOptions(attempt_timeout=0.1, max_execution_timeout=0.2, max_attempts=3, **FAST)
    )
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.DONE, what="done on the second attempt", timeout=20)
    assert len(spans) == 2
    assert spans[1][0] >= spans[0][1]  # the retry started after the given-up handler ended
    r = repo.row(jid)
    assert r.history == [State.PROCESSING, State.FAILED, State.PENDING, State.PROCESSING, State.DONE]
    assert "MaxExecutionExceeded" in (r.last_error or "")
    assert not e.registry.get_sample_value("brooq_lease_lost_total", {"topic": "t"})


def test_c4_c5_a_given_up_handler_declared_hung_lets_the_job_run_again(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """A given-up handler that never ends is declared hung after watchdog_grace (C5): only then is
    the failure written and the job free to run again."""
    e = make_engine(workers=2, lease=0.9, watchdog_grace=0.6)
    release = threading.Event()
    runs: list[float] = []

    def handler(ctx: Context, claim: Claim) -> None:
        runs.append(time.monotonic())
        if len(runs) == 1:
            release.wait(30)

    e.register_kind(
        "t", handler, KindOptions(attempt_timeout=0.1, max_execution_timeout=0.2, max_attempts=3, **FAST)
    )
    jid = e.enqueue(Job("t")).id
    try:
        e.start()
        wait_for(lambda: repo.row(jid).state is State.DONE, what="done after the hung verdict", timeout=20)
        assert len(runs) == 2 and runs[1] - runs[0] >= 0.6  # not before the hung verdict
        assert e.registry.get_sample_value("brooq_hung_workers_total", {"topic": "t"}) == 1
    finally:
        release.set()


def test_p1_a_job_claimed_again_under_a_new_token_tells_the_old_attempt_at_once(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """Cancel then retry at once, no NOTIFY to tell (notify off): the same engine claims the job
    again while its first handler runs. Attempts are held by claim token: the claim itself tells
    the first attempt (its ctx cancelled), long before any heartbeat (lease 120 s)."""
    e = make_engine(workers=2, lease=120, notify=False)
    causes: dict[int, BaseException | None] = {}
    second = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        n = len(causes) + 1
        causes[n] = None
        if n == 2:
            second.set()
        ctx.wait(30)
        causes[n] = ctx.cause

    e.register_kind("t", handler, KindOptions(attempt_timeout=300, max_execution_timeout=600))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: causes, what="the first attempt running")
    assert repo.cancel(jid) and repo.retry(jid)
    assert second.wait(10)
    wait_for(lambda: causes.get(1) is not None, what="the first attempt told", timeout=10)
    assert isinstance(causes[1], LeaseLost)
    assert causes[2] is None and len(e.inflight.held()) == 1


@pytest.mark.parametrize("told_by", ["the cancel notification", "the heartbeat"])
def test_x2_a_cancel_tells_the_handler_an_operator_canceled_it(
    repo: FakeRepo, make_engine: Callable[..., Engine], told_by: str
) -> None:
    """With NOTIFY the cancel reaches the handler at once, whatever the lease (120 s here, so no
    heartbeat within the test). Without it the heartbeat is the fallback: a row canceled under
    this claim is an operator's cancel too (JobCanceledByOperator), not a lease lost to a reaper
    or another claim. Nothing is written over the canceled row."""
    notify = told_by == "the cancel notification"
    e = make_engine(lease=120 if notify else 3, notify=notify)
    seen: list[BaseException | None] = []
    started = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        started.set()
        ctx.wait(30)
        seen.append(ctx.cause)

    e.register_kind("t", handler)
    jid = e.enqueue(Job("t")).id
    e.start()
    assert started.wait(10)  # running (a job canceled before its handler starts never starts)
    assert repo.cancel(jid)
    wait_for(lambda: seen, what="the handler told", timeout=10)
    assert isinstance(seen[0], JobCanceledByOperator)
    wait_for(lambda: not e.inflight.held(), what="settled")
    assert repo.row(jid).history == [State.PROCESSING, State.CANCELED]


def test_x2_a_cancel_notified_while_the_listener_is_down_is_told_when_it_is_back(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """Lease 120 s (no heartbeat within the test). The listener's connection breaks and the job is
    canceled before it reconnects: that notification is lost. Once LISTEN is back the engine must
    look at its held claims at once (a renewal), and tell the handler an operator canceled it."""
    e = make_engine(lease=120)
    seen: list[BaseException | None] = []

    def handler(ctx: Context, claim: Claim) -> None:
        ctx.wait(30)
        seen.append(ctx.cause)

    e.register_kind("t", handler)
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.PROCESSING)
    listens = repo.calls["listen"]
    repo.listen_broken = True
    wait_for(lambda: repo.calls["listen"] > listens, what="the listener trying to reconnect")
    assert repo.cancel(jid)  # no listener hears it
    repo.listen_broken = False
    wait_for(lambda: seen, what="the handler told after the reconnect", timeout=10)
    assert isinstance(seen[0], JobCanceledByOperator)
    wait_for(lambda: not e.inflight.held(), what="settled")
    assert repo.row(jid).history == [State.PROCESSING, State.CANCELED]


def test_p1_the_reaper_takes_a_claim_only_from_an_engine_whose_proof_of_life_is_stale(
    repo: FakeRepo,
) -> None:
    """A claim stays its engine's while the engine's row is fresh, whatever its row's own lease
    says; once the engine's proof is older than lease + margin the claim goes back, its attempt
    given back and counted as a crash (P1'', L5')."""
    jid = repo.enqueue(Job("t")).id
    [row] = repo.claim(["t"], 1, "w", timedelta(seconds=30))
    proof = EngineProof("w", "host", 1, timedelta(seconds=30), timedelta(seconds=10))
    repo.beat(proof, [HeldLease(jid, row.claim_token)])
    repo.row(jid).locked_until = repo.now() - 1  # the row's own lease says nothing any more
    reaped: list[str] = []
    reaper = Reaper(0.05, repo.reap, reaped.append, logging.getLogger("t"))
    reaper.run_once()
    assert reaped == [] and repo.row(jid).state is State.PROCESSING
    repo.expire(jid)  # the engine's row stale
    reaper.run_once()
    assert reaped == ["t"] and repo.row(jid).state is State.PENDING
    assert repo.row(jid).attempts == 0 and repo.row(jid).crashes == 1


def test_p1_a_claim_its_engine_dropped_goes_back_at_once(repo: FakeRepo) -> None:
    jid = repo.enqueue(Job("t")).id
    [row] = repo.claim(["t"], 1, "w", timedelta(seconds=30))
    proof = EngineProof("w", "host", 1, timedelta(seconds=30), timedelta(seconds=10))
    repo.beat(proof, [HeldLease(jid, row.claim_token, dropped=True)])
    assert repo.reap() == [(jid, "t")]
    assert repo.row(jid).state is State.PENDING and repo.row(jid).crashes == 1
