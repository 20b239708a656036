"""The batcher's gathering (SPEC BD1, C11): a stop starts what still waits for a fuller batch,
and a claim taken in after the stop began runs at once instead of waiting batch_wait."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from brooq_py.engine.attempt.batch import Batcher


class Here:
    def run(self, fn: Callable[[], None]) -> None:
        fn()


class FakeRunner:
    def __init__(self) -> None:
        self.threads = Here()
        self.settlers = Here()
        self.loop = None
        self.batches: list[list[str]] = []

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
        ctx=SimpleNamespace(deadline=None),
        result=None,
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
