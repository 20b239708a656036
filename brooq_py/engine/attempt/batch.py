"""Batch delivery (SPEC BD1): the attempts of a batch kind run as one call of its handler.

Each claim stays an ``Attempt`` of its own, on a slot of its own: its lease, cancel,
watchdog and outcome are the same as a job run alone, so a job canceled during the
batch, a worker killed during it, or a late answer are handled as they are for one job.
What differs is the call: the attempts of one topic that a claim brought (up to
``batch_size``, gathered for at most ``batch_wait``) are given to one call
``handler(ctx, claims)``, and its answer is spread back, one result or exception per
claim in claim order. Their outcomes reach the completer together, so one statement
settles the batch.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from brooq_py.engine.attempt.attempt import Attempt
from brooq_py.queue import BrooqError, Context


class _Threads(Protocol):
    def run(self, fn: Callable[[], None]) -> None: ...


class _Loop(Protocol):
    def spawn_many(
        self, handlers: Sequence[tuple[Callable[[], Any], Callable[[BaseException | None], None]]]
    ) -> None: ...

    def wait(self, awaitable: Any) -> Any: ...


class Runner(Protocol):
    """What the batcher uses of ``runner.Runner`` (which imports this module)."""

    @property
    def threads(self) -> _Threads: ...

    @property
    def settlers(self) -> _Threads: ...

    @property
    def loop(self) -> _Loop: ...

    @property
    def before_start(self) -> Callable[[Attempt], None]: ...

    def encode(self, value: Any) -> str | None: ...

    def finish_batch(
        self, batch: Sequence[Attempt], errors: Sequence[BaseException | None], t0: float
    ) -> None: ...


class BatchAnswerMismatch(BrooqError, TypeError):
    """A batch handler's answer is not one result or exception per claim: every job of it failed."""


def spread(
    batch: Sequence[Attempt], answer: Any, encode: Callable[[Any], str | None]
) -> list[BaseException | None]:
    """Set each attempt's result from *answer*; return each one's error (None: it returned)."""
    n = len(batch)
    if isinstance(answer, str | bytes | dict) or not isinstance(answer, Sequence):
        mismatch: BaseException = BatchAnswerMismatch(
            f"a batch handler must return a list of one result or exception per claim, "
            f"got {type(answer).__name__}"
        )
        return [mismatch] * n
    if len(answer) != n:
        mismatch = BatchAnswerMismatch(f"the batch handler returned {len(answer)} results for {n} claims")
        return [mismatch] * n
    errors: list[BaseException | None] = []
    for a, item in zip(batch, answer, strict=True):
        if isinstance(item, BaseException):
            errors.append(item)
            continue
        try:
            a.result = encode(item)
        except BaseException as exc:  # a value the row cannot hold fails that job only
            errors.append(exc)
            continue
        errors.append(None)
    return errors


def _merge(
    batch: Sequence[Attempt], live: Sequence[Attempt], left_out: dict[int, BaseException], answer: Any
) -> Any:
    """*answer* to the call of *live* as an answer to *batch*: each left-out claim's cause in its place.
    An answer that does not fit *live* is passed on as it is (``spread`` reports it for every job)."""
    if isinstance(answer, str | bytes | dict) or not isinstance(answer, Sequence) or len(answer) != len(live):
        return answer
    given = {id(a): item for a, item in zip(live, answer, strict=True)}
    return [left_out[id(a)] if id(a) in left_out else given[id(a)] for a in batch]


def call_handler(batch: Sequence[Attempt]) -> Any:
    """Call the batch kind's handler with a Context of the earliest deadline of the batch's attempts,
    cancelled once every attempt's own context is (a stop; each job canceled or timed out), never
    by one alone: the call cannot tell which job a cancel was for, so a job canceled while it runs
    keeps its slot and its claim (a sequence's turn) until the call returns, and the watchdog's
    grace of each job starts when the call is told."""
    deadlines = [a.ctx.deadline for a in batch if a.ctx.deadline is not None]
    ctx = Context(deadline=min(deadlines) if deadlines else None)

    def told(_cause: BaseException) -> None:
        at = max(a.ctx_cancelled_at or 0.0 for a in batch)
        for a in batch:
            if a.cancelled_at is None:
                a.cancelled_at = at

    def one_cancelled(cause: BaseException) -> None:
        if all(a.ctx.done() for a in batch):
            ctx.cancel(cause)

    ctx.add_callback(told)
    for a in batch:
        a.ctx.add_callback(one_cancelled)
    return batch[0].kind.handler(ctx, [a.claim for a in batch])  # type: ignore[arg-type]


class Batcher:
    """Gathers the attempts of batch kinds by topic and starts one handler call per batch."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._lock = threading.Lock()
        self._waiting: dict[str, list[Attempt]] = {}
        self._timers: dict[str, threading.Timer] = {}
        self._stopped = False  # from stop() on, nothing waits for a fuller batch

    def add(self, attempts: Sequence[Attempt]) -> None:
        """Take a claim's attempts: full batches start now, the rest after ``batch_wait``."""
        for batch in self._gather(attempts, flush=False):
            self._start(batch)

    def run_here(self, attempts: Sequence[Attempt]) -> None:
        """Run *attempts* (of batch kinds) in this thread, in batches by topic (``Engine.run_once``)."""
        for batch in self._gather(attempts, flush=True):
            self._run_thread(batch, time.monotonic())

    def _gather(self, attempts: Sequence[Attempt], *, flush: bool) -> list[list[Attempt]]:
        with self._lock:
            for a in attempts:
                self._waiting.setdefault(a.topic, []).append(a)
            return [b for t in dict.fromkeys(a.topic for a in attempts) for b in self._take(t, flush=flush)]

    def _take(self, topic: str, *, flush: bool) -> list[list[Attempt]]:
        """The batches of *topic* to start now (the lock held); arms the wait for the rest."""
        waiting = self._waiting.get(topic, [])
        if not waiting:
            return []
        options = waiting[0].kind.options
        size = options.batch_size or len(waiting)
        wait = options.td("batch_wait").total_seconds()
        flush = flush or self._stopped  # a claim taken in while the engine stops runs now
        out = []
        while len(waiting) >= size:
            out.append(waiting[:size])
            del waiting[:size]
        if waiting and (flush or wait <= 0):
            out.append(waiting[:])
            waiting.clear()
        if waiting and topic not in self._timers:
            timer = threading.Timer(wait, self._due, (topic,))
            timer.daemon = True
            self._timers[topic] = timer
            timer.start()
        return out

    def waiting(self, topic: str) -> int:
        """How many attempts of *topic* wait for a fuller batch."""
        with self._lock:
            return len(self._waiting.get(topic, ()))

    def _due(self, topic: str) -> None:
        with self._lock:
            self._timers.pop(topic, None)
            ready = self._take(topic, flush=True)
        for batch in ready:
            self._start(batch)

    def _start(self, batch: list[Attempt]) -> None:
        runner = self._runner
        t0 = time.monotonic()
        if not batch[0].kind.is_async:
            runner.threads.run(functools.partial(self._run_thread, batch, t0))
            return
        spread_errors: list[list[BaseException | None]] = []

        async def call() -> None:
            answer = self._call(batch)
            if inspect.isawaitable(answer):
                answer = await answer
            spread_errors.append(spread(batch, answer, self._runner.encode))

        def on_done(error: BaseException | None) -> None:
            # On the loop's thread: each end recorded at once (the watchdog never calls it hung), the
            # outcomes written on a settler thread.
            for a in batch:
                a.code_ended()
            errors = spread_errors[0] if error is None and spread_errors else [error] * len(batch)
            runner.settlers.run(lambda: runner.finish_batch(batch, errors, t0))

        runner.loop.spawn_many([(call, on_done)])

    def _run_thread(self, batch: list[Attempt], t0: float) -> None:
        try:
            answer = self._call(batch)
            if inspect.isawaitable(answer):
                answer = self._runner.loop.wait(answer)
            errors = spread(batch, answer, self._runner.encode)
        except BaseException as exc:  # raising fails every job of the batch
            errors = [exc] * len(batch)
        self._runner.finish_batch(batch, errors, t0)

    def _call(self, batch: list[Attempt]) -> Any:
        """The engine's fence check on each attempt first (``Runner.before_start``); the call gets
        only the claims still this engine's (``Attempt.call``: not fenced, lost or canceled), and is not
        made when none is. The answer comes back in *batch*'s order, each left-out claim's cause in
        its place (an awaitable for an async handler)."""
        for a in batch:
            self._runner.before_start(a)
        left_out = {id(a): cause for a in batch if (cause := a.call()) is not None}
        if not left_out:
            return call_handler(batch)
        live = [a for a in batch if id(a) not in left_out]
        if not live:
            return [left_out[id(a)] for a in batch]
        answer = call_handler(live)
        if inspect.isawaitable(answer):
            pending = answer

            async def merged() -> Any:
                return _merge(batch, live, left_out, await pending)

            return merged()
        return _merge(batch, live, left_out, answer)

    def stop(self) -> None:
        """Start every batch still waiting (the engine stops: its attempts end as the engine says)."""
        with self._lock:
            self._stopped = True
            topics = list(self._waiting)
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
            ready = [b for t in topics for b in self._take(t, flush=True)]
        for batch in ready:
            self._start(batch)
