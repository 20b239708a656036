"""Runner: runs one attempt's handler and routes its ending to the right outcome write."""

from __future__ import annotations

import inspect
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from brooq_py.engine.attempt import Attempt
from brooq_py.engine.completer import Completer
from brooq_py.engine.inflight import InFlight
from brooq_py.engine.metrics import Metrics
from brooq_py.engine.outcome import Ending, decide, describe_error
from brooq_py.engine.repo import Outcome, Repo
from brooq_py.engine.slots import AsyncRunner
from brooq_py.queue import LeaseLost, MustCancelTask, MustDelay, MustPreserveAttempt, State
from brooq_py.queue.errors import find_signal


class _NotOurs(Exception):
    """The closing transaction found the row no longer this claim's."""


class Runner:
    """Runs handlers (sync in the slot thread, async on the engine's loop) and settles them.

    A plain outcome goes to the Completer (batched). A success that carries
    ``chain``/``on_succeeded`` closes in its own transaction: done, child
    enqueues and callbacks, all or nothing (SPEC C9).
    """

    def __init__(
        self,
        repo: Repo,
        inflight: InFlight,
        metrics: Metrics,
        async_runner: AsyncRunner,
        log: logging.Logger,
        rng: random.Random | None = None,
    ) -> None:
        self.repo = repo
        self.inflight = inflight
        self.metrics = metrics
        self.async_runner = async_runner
        self.log = log
        self.rng = rng
        self.completer: Completer | None = None  # None: write each outcome at once (run_once)

    # --- running ---------------------------------------------------------

    def invoke(self, a: Attempt) -> BaseException | None:
        """Call the handler; return the exception it ended with, or None."""
        kind, ctx, claim = a.kind, a.ctx, a.claim
        try:
            if kind.is_async:
                self._await(a, kind.handler(ctx, claim))
            else:
                result = kind.handler(ctx, claim)
                if inspect.isawaitable(result):
                    self._await(a, result)
        except BaseException as exc:
            return exc
        return None

    def _await(self, a: Attempt, awaitable: Any) -> None:
        async def main() -> Any:
            return await awaitable

        def on_cancel(cancel: Callable[[], object]) -> None:
            def on_ctx(_cause: BaseException) -> None:
                cancel()

            a.ctx.add_callback(on_ctx)

        self.async_runner.run(main(), on_cancel)

    def run(self, a: Attempt) -> None:
        """The slot's job: run the handler, then write its outcome unless the engine gave up on it."""
        busy = self.metrics.child(self.metrics.busy, a.topic)
        busy.inc()
        t0 = time.monotonic()
        try:
            error = self.invoke(a)
        finally:
            busy.dec()
            self.metrics.child(self.metrics.duration, a.topic).observe(time.monotonic() - t0)
        try:
            if not a.finish():
                self._late_return(a, error)
                return
            self.settle(a, Ending(error=error, cause=a.ctx.cause))
        finally:
            self.inflight.end(a)

    def _late_return(self, a: Attempt, error: BaseException | None) -> None:
        how = "returned" if error is None else f"raised {describe_error(error)}"
        self.log.warning(
            "job id=%s topic=%s attempt=%d: handler %s after the engine gave up on it; nothing written",
            a.id,
            a.topic,
            a.claim.attempt,
            how,
        )

    # --- settling --------------------------------------------------------

    def decide(self, a: Attempt, ending: Ending) -> Outcome | None:
        return decide(
            id=a.id,
            claim_token=a.row.claim_token,
            topic=a.topic,
            attempt=a.claim.attempt,
            options=a.kind.options,
            ending=ending,
            rng=self.rng,
        )

    def settle(self, a: Attempt, ending: Ending) -> None:
        if isinstance(ending.cause, LeaseLost) or a.lost:
            self.inflight.drop(a)
            self.log.info(
                "job id=%s topic=%s attempt=%d: lease lost; the handler's ending is not written",
                a.id,
                a.topic,
                a.claim.attempt,
            )
            return
        if ending.error is None and a.claim.has_closing_work and not ending.gave_up:
            self._close_success(a)
            return
        if ending.error is not None:
            self._log_failure(a, ending.error)
        outcome = self.decide(a, ending)
        if outcome is not None:
            self.put(outcome)

    def put(self, outcome: Outcome) -> None:
        if self.completer is not None:
            self.completer.put(outcome)
        else:
            batch = [outcome]
            self.on_written(batch, self.repo.settle_many(batch))

    def on_written(self, batch: list[Outcome] | Any, written: set[str]) -> None:
        settled: Counter[tuple[str, str]] = Counter()
        for o in batch:
            self.inflight.drop_outcome(o)
            if o.id in written:
                if o.state is not State.PENDING:
                    settled[(o.topic, str(o.state))] += 1
            else:
                self.log.info(
                    "job id=%s topic=%s: %s not written: the row was no longer this claim's",
                    o.id,
                    o.topic,
                    o.state,
                )
        for (topic, state), n in settled.items():  # one counter update per (topic, outcome) a batch
            self.metrics.child(self.metrics.settled, topic, state).inc(n)

    def _close_success(self, a: Attempt) -> None:
        claim = a.claim
        done = Outcome(id=a.id, claim_token=a.row.claim_token, state=State.DONE, topic=a.topic)
        try:
            with self.repo.begin() as tx:
                if not self.repo.settle_tx(tx, done):
                    raise _NotOurs
                for job in claim.chained:
                    self.repo.enqueue_tx(tx, job)
                for fn in claim.callbacks:
                    fn(tx)
        except _NotOurs:
            self.inflight.drop(a)
            self.log.info("job id=%s topic=%s: done not written: the row was no longer ours", a.id, a.topic)
            return
        except Exception as exc:
            self.log.error(
                "job id=%s topic=%s attempt=%d: closing transaction failed; recording a failed attempt",
                a.id,
                a.topic,
                claim.attempt,
                exc_info=exc,
            )
            outcome = self.decide(a, Ending(error=exc, cause=a.ctx.cause))
            if outcome is not None:
                self.put(outcome)
            return
        self.inflight.drop(a)
        self.metrics.child(self.metrics.settled, a.topic, "done").inc()
        for job in claim.chained:
            self.metrics.child(self.metrics.enqueued, job.topic).inc()

    def _log_failure(self, a: Attempt, error: BaseException) -> None:
        if any(find_signal(error, s) is not None for s in (MustCancelTask, MustDelay, MustPreserveAttempt)):
            self.log.info(
                "job id=%s topic=%s attempt=%d: handler signalled %s",
                a.id,
                a.topic,
                a.claim.attempt,
                describe_error(error),
            )
            return
        self.log.error(
            "job id=%s topic=%s attempt=%d/%d failed: %s",
            a.id,
            a.topic,
            a.claim.attempt,
            a.claim.max_attempts,
            describe_error(error),
            exc_info=error,
        )
