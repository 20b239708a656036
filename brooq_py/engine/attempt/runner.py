"""Runner: runs one attempt's handler (a thread or a task) and settles its ending (SPEC C4-C11, L1, L6)."""

from __future__ import annotations

import functools
import inspect
import logging
import random
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from brooq_py.contrib.otel import run_span
from brooq_py.engine.attempt.attempt import Attempt, HandlerState, Phase
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.engine.attempt.outcome import Ending, decide, describe_error, what_then
from brooq_py.engine.attempt.results import encode_result, run_async
from brooq_py.engine.attempt.sink import OutcomeSink
from brooq_py.engine.attempt.slots import AsyncRunner, Threads
from brooq_py.engine.metrics import Metrics
from brooq_py.engine.repo import Outcome, Repo
from brooq_py.queue import (
    Claim,
    MaxExecutionExceeded,
    MustCancelTask,
    MustDelay,
    MustPreserveAttempt,
    State,
    StoreUnavailable,
)
from brooq_py.queue.errors import find_signal

if TYPE_CHECKING:
    from brooq_py.engine.attempt.sink import EventSink
    from brooq_py.queue.job import EventKind

# The event a written outcome is (SPEC N1): a handed-back attempt is a requeue.
EVENT_OF: dict[State, EventKind] = {
    State.DONE: "done",
    State.FAILED: "failed",
    State.DEAD: "dead",
    State.CANCELED: "canceled",
    State.PENDING: "requeued",
}

CLOSE_RETRY_FIRST = 0.05
CLOSE_RETRY_MAX = 2.0
# Without a completer (run_once): how often an outcome whose row is locked elsewhere is tried again (L3').
LOCKED_RETRY = 0.25
# Returned attempts whose outcome write was given up, remembered by job id (L6'): at most this many.
LOST_MAX = 10_000


class _NotOurs(Exception):
    """The closing transaction found the row no longer this claim's."""


class Runner:
    """Runs handlers and settles every attempt's ending exactly once.

    Sync handlers run on ``threads``; ``async def`` handlers run as tasks on
    ``loop`` and their endings are settled on ``settlers`` (no database call on
    the loop's thread). A plain outcome goes to the Completer (batched); a
    RETURNED attempt with ``chain``/``on_succeeded`` closes in its own
    transaction: chained enqueues and callbacks first, the guarded row write
    last, all or nothing (SPEC C9); chained jobs with a unique key after it.
    """

    def __init__(
        self,
        repo: Repo,
        inflight: InFlight,
        metrics: Metrics,
        loop: AsyncRunner,
        log: logging.Logger,
        rng: random.Random | None = None,
    ) -> None:
        self.repo = repo
        self.inflight = inflight
        self.metrics = metrics
        self.loop = loop
        self.log = log
        self.rng = rng
        self.threads = Threads("worker", log)
        self.settlers = Threads("settler", log, max_threads=4)
        self.completer: OutcomeSink | None = None  # None: write each outcome at once (run_once)
        self.release_slot: Callable[[], None] = lambda: None
        self.stopping: Callable[[], bool] = lambda: False
        self.sleep: Callable[[float], None] = time.sleep
        # Called after a flush wrote a failed attempt's retry time: the stager's
        # cue to read the earliest due time again, since no NOTIFY announces such a row (SPEC S7).
        self.on_waiting: Callable[[], None] = lambda: None
        self.result_max_bytes = 1024 * 1024  # the largest result a handler may return (SPEC V1)
        self.events: EventSink | None = None  # set by the engine: events after commit (SPEC N1)
        # Job id -> the claim of an attempt whose handler returned but whose done could not be
        # written before its lease ran out (L6'): a later claim of the job is its done, not poison.
        self._lost: OrderedDict[str, Claim] = OrderedDict()
        self._lost_lock = threading.Lock()

    def remember_lost(self, job_id: str, claim: Claim) -> None:
        """Remember that *job_id*'s handler returned (its done unwritten, its lease gone, L6')."""
        with self._lost_lock:
            self._lost[job_id] = claim
            while len(self._lost) > LOST_MAX:
                self._lost.popitem(last=False)

    def take_lost(self, job_id: str) -> Claim | None:
        """The claim of *job_id* whose done was lost, if this engine remembers one (then forgotten)."""
        with self._lost_lock:
            return self._lost.pop(job_id, None)

    def launch(self, a: Attempt) -> None:
        """Start *a*'s handler: a task on the loop for an async kind, else a thread."""
        self.launch_many([a])

    def launch_many(self, attempts: Sequence[Attempt]) -> None:
        """Start each attempt's handler; the async ones reach the loop in one hand-over."""
        tasks = []
        for a in attempts:
            self._busy(a, +1)
            if a.kind.is_async:
                tasks.append((functools.partial(run_async, a, self.result_max_bytes), self._on_task_done(a)))
            else:
                self.threads.run(functools.partial(self._run_thread, a, time.monotonic()))
        self.loop.spawn_many(tasks)

    def _run_thread(self, a: Attempt, t0: float) -> None:
        error = self._call_sync(a)
        self._observe(a, t0)
        self.finish(a, error)

    def _on_task_done(self, a: Attempt) -> Callable[[BaseException | None], None]:
        t0 = time.monotonic()

        def on_done(error: BaseException | None) -> None:
            # On the loop's thread: the handler's end is recorded at once (the watchdog must not
            # call a finished handler hung while it waits for a settler). A plain return is settled
            # here when that cannot block (the completer has room); the rest goes to a settler thread.
            self._observe(a, t0)
            was = self.ended(a)
            if error is None and not a.claim.has_closing_work and self._conclude_returned(a, was):
                return
            self.settlers.run(lambda: self.conclude(a, error, was))

        return on_done

    def _conclude_returned(self, a: Attempt, was: HandlerState | None) -> bool:
        """Settle a returned attempt without blocking (the loop's thread); False: nothing done yet."""
        completer = self.completer
        if completer is None or not completer.has_room():
            return False
        try:
            if not a.end(Phase.RETURNED):
                self._late(a, None)
            else:
                outcome = self.settling_outcome(a, None)
                if outcome is not None and not completer.offer(outcome):
                    # Filled up meanwhile: a settler waits for room; the slot stays taken until then.
                    self.settlers.run(lambda: self._put_then_free(outcome, was))
                    return True
        except BaseException:
            if was is HandlerState.RUNNING:
                self.release_slot()
            raise
        if was is HandlerState.RUNNING:
            self.release_slot()
        return True

    def _put_then_free(self, outcome: Outcome, was: HandlerState | None) -> None:
        try:
            self.put(outcome)
        finally:
            if was is HandlerState.RUNNING:
                self.release_slot()

    def run_here(self, a: Attempt) -> None:
        """Run *a*'s handler in this thread and settle it (``Engine.run_once``)."""
        self._busy(a, +1)
        t0 = time.monotonic()
        if a.kind.is_async:
            try:
                self.loop.wait(run_async(a, self.result_max_bytes))
                error: BaseException | None = None
            except BaseException as exc:
                error = exc
        else:
            error = self._call_sync(a)
        self._observe(a, t0)
        self.finish(a, error)

    def _call_sync(self, a: Attempt) -> BaseException | None:
        try:
            with run_span(a.topic, a.id, a.claim.attempt, a.claim.meta):  # a no-op without OpenTelemetry
                result = a.kind.handler(a.ctx, a.claim)
                if inspect.isawaitable(result):
                    result = self.loop.wait(result)
                a.result = encode_result(result, self.result_max_bytes)  # on the handler's thread (V1)
        except BaseException as exc:
            return exc
        return None

    def _busy(self, a: Attempt, n: int) -> None:
        self.metrics.child(self.metrics.busy, a.topic).inc(n)

    def _observe(self, a: Attempt, t0: float) -> None:
        self._busy(a, -1)
        self.metrics.child(self.metrics.duration, a.topic).observe(time.monotonic() - t0)

    def finish(self, a: Attempt, error: BaseException | None) -> None:
        """The handler's code ended: settle its ending unless another ending came first; free the slot."""
        self.conclude(a, error, self.ended(a))

    def ended(self, a: Attempt) -> HandlerState | None:
        """Record that the handler's code ended; return its state before (RUNNING: the slot is ours to free)."""
        was = a.handler_to(HandlerState.ENDED)
        self.inflight.end(a)
        return was

    def conclude(self, a: Attempt, error: BaseException | None, was: HandlerState | None) -> None:
        """Settle the handler's ending unless another ending came first, then free its slot."""
        try:
            if a.end(Phase.RETURNED if error is None else Phase.RAISED):
                self.settle(a, error)
            elif a.ending is Phase.GAVE_UP:
                self.settle_given_up(a)  # its lease was kept for this moment (C4')
            else:
                self._late(a, error)
        finally:
            if was is HandlerState.RUNNING:  # otherwise the engine freed the slot when it stopped waiting
                self.release_slot()

    def _late(self, a: Attempt, error: BaseException | None) -> None:
        how = "returned" if error is None else f"raised {describe_error(error)}"
        self.log.warning(
            "job id=%s topic=%s attempt=%d: handler %s after the attempt ended (%s); nothing written",
            a.id,
            a.topic,
            a.claim.attempt,
            how,
            a.phase,
        )

    def settle(self, a: Attempt, error: BaseException | None = None) -> None:
        """Settle the ending *a* just reached: exactly once, through ``decide()``."""
        outcome = self.settling_outcome(a, error)
        if outcome is None:
            return
        if outcome.state is State.DONE and a.claim.has_closing_work:
            self._close(a, outcome)
            return
        self.put(outcome)

    def settle_given_up(self, a: Attempt) -> None:
        """Write the failure of an attempt given up at max_execution_timeout, once its handler ended
        or was declared hung, whichever comes first (C4'); until then its lease was kept."""
        if not a.settling_if(Phase.GAVE_UP):
            return
        hard = a.kind.options.td("max_execution_timeout").total_seconds()
        error = MaxExecutionExceeded(f"max_execution_timeout of {hard:g}s elapsed")
        outcome = self._outcome_of(a, Phase.GAVE_UP, error)
        if outcome is not None:
            self.put(outcome)

    def settling_outcome(self, a: Attempt, error: BaseException | None) -> Outcome | None:
        """Move *a* to settling and decide its outcome; None when nothing is to be written (then settled)."""
        return self._outcome_of(a, a.settling(), error)

    def _outcome_of(self, a: Attempt, phase: Phase, error: BaseException | None) -> Outcome | None:
        ending = Ending(phase, error=error, cause=a.ctx.cause, stopping=self.stopping(), result=a.result)
        outcome = self._decide(a, ending)
        if outcome is None:
            self._nothing(a)
            return None
        if phase is Phase.RAISED and error is not None:
            self._log_failure(a, error, outcome)
        return outcome

    def _decide(self, a: Attempt, ending: Ending) -> Outcome | None:
        return decide(
            id=a.id,
            claim_token=a.row.claim_token,
            topic=a.topic,
            attempt=a.claim.attempt,
            options=a.kind.options,
            ending=ending,
            rng=self.rng,
        )

    def _nothing(self, a: Attempt) -> None:
        self.inflight.drop(a)
        a.settled()

    def put(self, outcome: Outcome) -> None:
        """Hand *outcome* to the completer; write it at once without one, or once it stopped (C11)."""
        completer = self.completer
        if completer is not None and completer.put(outcome):
            return
        batch = [outcome]
        while True:
            written = self.repo.settle_many(batch)
            locked: frozenset[str] = getattr(written, "locked", frozenset())
            if outcome.claim_token not in locked or not self.inflight.still_held(outcome):
                break
            self.sleep(LOCKED_RETRY)  # its row is locked elsewhere: never waited on, tried again (L3')
        self.on_written(batch, written)

    def on_written(self, batch: Sequence[Outcome], written: set[str]) -> None:
        settled: Counter[tuple[str, str]] = Counter()
        if any(o.id in written and o.state is State.FAILED for o in batch):
            self.on_waiting()
        events = self.events if self.events is not None and self.events.active else None
        for o in batch:
            a = self.inflight.drop_outcome(o)
            if a is not None:
                a.settled()
            if o.id in written:
                if o.state is not State.PENDING:
                    settled[(o.topic, str(o.state))] += 1
                if events is not None:
                    events.emit(
                        EVENT_OF[o.state],
                        o.id,
                        o.topic,
                        0 if a is None else a.claim.attempt,
                        o.last_error if o.state in (State.FAILED, State.DEAD) else None,
                    )
            else:
                self.log.info(
                    "job id=%s topic=%s: %s not written: the row was no longer this claim's",
                    o.id,
                    o.topic,
                    o.state,
                )
        for (topic, state), n in settled.items():  # one counter update per (topic, outcome) a batch
            self.metrics.child(self.metrics.settled, topic, state).inc(n)

    def on_dropped(self, batch: Sequence[Outcome]) -> None:
        """Outcomes the completer gave up on: their lease was lost while the write failed (L6)."""
        for o in batch:
            a = self.inflight.drop_outcome(o)
            if a is not None:
                a.settled()
                if a.ending is Phase.RETURNED:
                    self.remember_lost(a.id, a.claim)
            self.log.warning(
                "job id=%s topic=%s: %s not written: the store was unreachable for a whole lease; "
                "the reaper returns the job",
                o.id,
                o.topic,
                o.state,
            )

    def _close(self, a: Attempt, done: Outcome) -> None:
        """Done + chained enqueues + on_succeeded in one transaction, the row written last (SPEC C9, L3).

        A store that is unreachable (StoreUnavailable, the COMMIT's included) is
        not the job's failure: the transaction is retried while the lease is
        held and fresh, then nothing is written (L6). A failing callback or
        chained job is: it is recorded as a raise.
        """
        claim = a.claim
        delay = CLOSE_RETRY_FIRST
        while True:
            try:
                with self.repo.begin() as tx:
                    for job in claim.chained:
                        if job.unique_key is None:
                            self.repo.enqueue_tx(tx, job)
                    for fn in claim.callbacks:
                        fn(tx)
                    if not self.repo.settle_tx(tx, done):
                        raise _NotOurs
                    for job in [j for j in claim.chained if j.unique_key is not None]:
                        self.repo.enqueue_tx(tx, job)  # after the done, which frees this job's key (U2)
            except _NotOurs:
                self._nothing(a)
                self.log.info(
                    "job id=%s topic=%s: done not written: the row was no longer ours", a.id, a.topic
                )
                return
            except StoreUnavailable as exc:
                if not (self.inflight.holds(a) and self.inflight.fresh(a)):
                    self._give_up_close(a, exc)
                    return
                self.log.warning(
                    "job id=%s topic=%s: closing transaction failed (%s); retrying in %.2fs",
                    a.id,
                    a.topic,
                    exc,
                    delay,
                )
                self.sleep(delay)
                delay = min(delay * 2, CLOSE_RETRY_MAX)
                continue
            except BaseException as exc:  # SystemExit, KeyboardInterrupt too: the attempt settles (C11')
                self.log.error(
                    "job id=%s topic=%s attempt=%d: closing transaction failed; recording a failed attempt",
                    a.id,
                    a.topic,
                    claim.attempt,
                    exc_info=exc,
                )
                outcome = self._decide(a, Ending(Phase.RAISED, error=exc, cause=a.ctx.cause))
                if outcome is None:
                    self._nothing(a)
                else:
                    self.put(outcome)
                if not isinstance(exc, Exception) and threading.current_thread() is threading.main_thread():
                    raise  # run_once in the caller's thread: its Ctrl-C or exit goes on, the row settled
                return
            break
        self._nothing(a)
        self.metrics.child(self.metrics.settled, a.topic, "done").inc()
        if self.events is not None:
            self.events.emit("done", a.id, a.topic, claim.attempt)
        for job in claim.chained:
            self.metrics.child(self.metrics.enqueued, job.topic).inc()

    def _give_up_close(self, a: Attempt, exc: BaseException) -> None:
        self._nothing(a)
        self.remember_lost(a.id, a.claim)
        self.log.warning(
            "job id=%s topic=%s: closing transaction not written (%s) and the lease is lost; "
            "the reaper returns the job",
            a.id,
            a.topic,
            exc,
        )

    def _log_failure(self, a: Attempt, error: BaseException, outcome: Outcome) -> None:
        then = what_then(outcome)  # the last attempt's failure says the job is now dead
        if any(find_signal(error, s) is not None for s in (MustCancelTask, MustDelay, MustPreserveAttempt)):
            msg = "job id=%s topic=%s attempt=%d: handler signalled %s%s"
            self.log.info(msg, a.id, a.topic, a.claim.attempt, describe_error(error), then)
            return
        self.log.error(
            "job id=%s topic=%s attempt=%d/%d failed: %s%s",
            a.id,
            a.topic,
            a.claim.attempt,
            a.claim.max_attempts,
            describe_error(error),
            then,
            exc_info=error,
        )
