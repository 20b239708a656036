"""The batcher's gathering (SPEC BD1, C11): a stop starts what still waits for a fuller batch,
and a claim taken in after the stop began runs at once instead of waiting batch_wait."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from brooq_py.engine.attempt.batch import Batcher
from brooq_py.queue import Context


class Here:
    def run(self, fn: Callable[[], None]) -> None:
        fn()


class FakeRunner:
    def __init__(self) -> None:
        self.threads = Here()
        self.settlers = Here()
        self.loop = None
        self.batches: list[list[str]] = []
        self.before_start = lambda a: None

    def encode(self, value: Any) -> str | None:
        return None if value is None else str(value)

    def finish_batch(self, batch: Sequence[Any], errors: Sequence[BaseException | None], t0: float) -> None:
        self.batches.append([a.claim.id for a in batch])


def attempt(job_id: str, calls: list[list[str]]) -> Any:
    def handler(ctx: Any, claims: list[Any]) -> list[None]:
        calls.append([c.id for c in claims])
        return [None] * len(claims)

    options = SimpleNamespace(batch_size=10, td=lambda name: timedelta(seconds=300))
    kind = SimpleNamespace(options=options, is_async=False, handler=handler)
    return SimpleNamespace(
        topic="b",
        kind=kind,
        claim=SimpleNamespace(id=job_id),
        ctx=Context(),
        result=None,
        cancelled_at=None,
        ctx_cancelled_at=None,
        ending=None,
        call=lambda: None,  # Attempt.call: still this engine's, its handler about to be called
    )


def test_bd1_c11_a_stop_starts_the_waiting_batch() -> None:
    runner, calls = FakeRunner(), []  # type: ignore[var-annotated]
    b = Batcher(runner)  # type: ignore[arg-type]
    b.add([attempt("j1", calls)])
    assert calls == []  # one of ten: it waits for more (batch_wait 300 s)
    b.stop()
    assert calls == [["j1"]] and runner.batches == [["j1"]]


def test_bd1_c11_a_claim_taken_in_after_the_stop_runs_at_once() -> None:
    """The claim committed before the stop, its attempts reached the batcher after it: waiting
    batch_wait for company would outlast the stop's bound and hand the job back unrun."""
    runner, calls = FakeRunner(), []  # type: ignore[var-annotated]
    b = Batcher(runner)  # type: ignore[arg-type]
    b.stop()
    b.add([attempt("j2", calls)])
    assert calls == [["j2"]] and runner.batches == [["j2"]]


def test_bd1_the_call_is_told_once_every_job_of_it_is_cancelled_and_its_grace_starts_then() -> None:
    """One job's cancel reaches neither the call's context nor the watchdog's grace (the call cannot
    see it); the last one's does both, the grace counted from that cancel."""
    from brooq_py.engine.attempt.batch import call_handler

    seen: list[Any] = []
    a, b = attempt("j1", []), attempt("j2", [])

    def handler(ctx: Any, claims: list[Any]) -> list[None]:
        seen.append(ctx)
        return [None] * len(claims)

    a.kind.handler = handler
    call_handler([a, b])
    [ctx] = seen
    a.ctx_cancelled_at = 10.0
    a.ctx.cancel(RuntimeError("canceled by an operator"))
    assert not ctx.done() and a.cancelled_at is None and b.cancelled_at is None
    b.ctx_cancelled_at = 12.5
    b.ctx.cancel(RuntimeError("the engine is stopping"))
    assert ctx.done() and str(ctx.cause) == "the engine is stopping"
    assert (a.cancelled_at, b.cancelled_at) == (12.5, 12.5)
