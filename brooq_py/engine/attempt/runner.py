"""Runner: runs one attempt's handler (a thread or a task) and reports how it ended (SPEC C4-C11, L1, L6).

The runner executes and hands over, nothing more: it runs the handler and
encodes its return value on the handler's thread (``Attempt.result``, SPEC V1;
one that cannot be stored is the handler's raise), the Attempt answers each
ending with the outcome to write (``Attempt.returned``/``raised``), the handover
takes that answer where it is written, and the slot is freed once it is on its way.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable, Sequence

from brooq_py.contrib.otel import run_span
from brooq_py.engine.attempt.attempt import Attempt, HandlerState
from brooq_py.engine.attempt.handover import Handover
from brooq_py.engine.attempt.results import encode_result
from brooq_py.engine.attempt.slots import AsyncRunner, Threads
from brooq_py.engine.metrics import Metrics
from brooq_py.queue.port import Outcome


async def run_async(a: Attempt, max_bytes: int) -> None:
    """Await an async handler; encode its return value on the loop, where it ran (a result that
    cannot be stored raises ResultRejected: the attempt's failure)."""
    with run_span(a.topic, a.id, a.claim.attempt, a.claim.meta):  # a no-op without OpenTelemetry
        a.result = encode_result(await a.kind.handler(a.ctx, a.claim), max_bytes)


class Runner:
    """Runs handlers: sync ones on ``threads``, ``async def`` ones as tasks on ``loop``.

    An async handler's end is recorded on the loop's thread at once; its ending is
    reported there too when that cannot block (a plain return, the completer has
    room), else on ``settlers`` (no database call on the loop's thread).
    """

    def __init__(self, handover: Handover, metrics: Metrics, loop: AsyncRunner, log: logging.Logger) -> None:
        self.handover = handover
        self.metrics = metrics
        self.loop = loop
        self.log = log
        self.threads = Threads("worker", log)
        self.settlers = Threads("settler", log, max_threads=4)
        self.result_max_bytes = 1024 * 1024  # the largest result a handler may return (SPEC V1)

    # --- running ---------------------------------------------------------

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
        if tasks:
            self.loop.spawn_many(tasks)

    def _run_thread(self, a: Attempt, t0: float) -> None:
        error = self._call_sync(a)
        self._observe(a, t0)
        self.finish(a, error)

    def _on_task_done(self, a: Attempt) -> Callable[[BaseException | None], None]:
        t0 = time.monotonic()

        def on_done(error: BaseException | None) -> None:
            # On the loop's thread: the handler's end is recorded at once (the watchdog must not
            # call a finished handler hung while it waits for a settler). A plain return is reported
            # here when that cannot block (the completer has room); the rest goes to a settler thread.
            self._observe(a, t0)
            a.code_ended()
            if error is None and not a.claim.has_closing_work and self.handover.has_room():
                self._returned_on_loop(a)
                return
            self.settlers.run(lambda: self.finish(a, error))

        return on_done

    def _returned_on_loop(self, a: Attempt) -> None:
        """Report a plain return without blocking (the loop's thread): the answer offered to the
        completer; if it filled up meanwhile, a settler waits for room, the slot taken until then."""
        try:
            outcome = a.returned()
            if outcome is not None and not self.handover.offer(outcome):
                self.settlers.run(lambda: self._put_then_free(a, outcome))
                return
        except BaseException:
            a.free_slot()
            raise
        a.free_slot()

    def _put_then_free(self, a: Attempt, outcome: Outcome) -> None:
        try:
            self.handover.put(outcome)
        finally:
            a.free_slot()

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

    # --- reporting the end -------------------------------------------------

    def finish(self, a: Attempt, error: BaseException | None) -> None:
        """The handler's code ended: report how to the attempt, hand its answer over, free the slot."""
        try:
            self.handover.settle(a, a.returned() if error is None else a.raised(error))
        finally:
            a.free_slot()  # only if its own end took the handler out of RUNNING

    def ended(self, a: Attempt) -> HandlerState | None:
        """Record that the handler's code ended (before ``conclude``); return its state before."""
        return a.code_ended()

    def conclude(self, a: Attempt, error: BaseException | None, was: HandlerState | None = None) -> None:
        """Report the ending of a handler whose end ``ended`` recorded (the attempt knows whether
        the slot is its to free: *was* is not needed)."""
        self.finish(a, error)

    def put(self, outcome: Outcome) -> None:
        """Hand *outcome* to be written (``Handover.put``)."""
        self.handover.put(outcome)
