"""Runner: runs one attempt's handler on a slot and reports how it ended (SPEC C4-C11, L1, L2, L6, V1).

A slot is a unit of the engine's capacity (``workers``), not a thread: a sync
handler takes a slot and a daemon thread, an ``async def`` one a slot and a task
on the engine's one event loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from queue import SimpleQueue
from typing import Any

from brooq_py.contrib.otel import run_span
from brooq_py.engine.attempt.attempt import Attempt
from brooq_py.engine.attempt.batch import Batcher
from brooq_py.engine.attempt.handover import Handover
from brooq_py.engine.metrics import Metrics
from brooq_py.queue import BrooqError, InvalidJob
from brooq_py.queue.job import encode_payload
from brooq_py.queue.port import Outcome

_STOP = object()


async def _main(make: Callable[[], Any]) -> BaseException | None:
    """Await one handler; return how it ended (None: it returned) instead of raising."""
    try:
        await make()
    except BaseException as exc:  # the handler's own ending, whatever it is
        return exc
    return None


class SlotPool:
    """``size`` slots: taken by the dispatcher for each claimed row, freed exactly once per attempt."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._cond = threading.Condition()
        self._free = size

    @property
    def free(self) -> int:
        with self._cond:
            return self._free

    def take(self) -> None:
        with self._cond:
            self._free -= 1

    def release(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()

    def wait_free(self, timeout: float) -> int:
        """Wait up to *timeout* seconds for a free slot; return how many are free."""
        with self._cond:
            self._cond.wait_for(lambda: self._free > 0, timeout)
            return self._free

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no slot is busy; return False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._free >= self.size, timeout)


class Threads:
    """Daemon threads (a hung handler never blocks exit), grown on demand; with *max_threads* None a
    function never waits behind a hung one, as a new thread starts when none is idle."""

    def __init__(self, name: str, log: logging.Logger, max_threads: int | None = None) -> None:
        self._name = name
        self._log = log
        self._max = max_threads
        self._queue: SimpleQueue[Any] = SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads: set[threading.Thread] = set()
        self._seq = itertools.count(1)

    def run(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # that thread is now promised to this function
            elif self._max is None or len(self._threads) < self._max:
                self._spawn()
        self._queue.put(fn)

    def owns_current(self) -> bool:
        """Whether the calling thread is one of these."""
        with self._lock:
            return threading.current_thread() in self._threads

    def _spawn(self) -> None:
        t = threading.Thread(target=self._worker, name=f"brooq-{self._name}-{next(self._seq)}", daemon=True)
        self._threads.add(t)
        t.start()

    def _worker(self) -> None:
        me = threading.current_thread()
        try:
            while True:
                fn = self._queue.get()
                if fn is _STOP:
                    return
                try:
                    fn()
                except BaseException:  # the functions handle their own errors; this is a last guard
                    self._log.exception("%s: unexpected error", self._name)
                with self._lock:
                    self._idle += 1
        finally:
            with self._lock:
                self._threads.discard(me)

    def stop(self) -> None:
        """Ask every thread to exit once it is idle (a hung one never is: it dies with the process)."""
        with self._lock:
            n = len(self._threads)
            self._idle = 0
        for _ in range(n):
            self._queue.put(_STOP)


class AsyncRunner:
    """One event loop, on its own daemon thread, for every ``async def`` handler: a task there that
    nothing ever cancels by force; its ending is told on the loop's thread, which must not block."""

    def __init__(self, log: logging.Logger) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name="brooq-async", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def spawn_many(
        self, handlers: Sequence[tuple[Callable[[], Any], Callable[[BaseException | None], None]]]
    ) -> None:
        """Run each ``(make, on_done)`` as a task, then ``on_done(error or None)``; one wake-up a batch."""
        batch = list(handlers)

        def create() -> None:
            loop = asyncio.get_running_loop()
            for make, on_done in batch:
                task = loop.create_task(_main(make))
                self._tasks.add(task)
                task.add_done_callback(functools.partial(self._done, on_done))

        self._ensure().call_soon_threadsafe(create)

    def _done(
        self, on_done: Callable[[BaseException | None], None], task: asyncio.Task[BaseException | None]
    ) -> None:
        self._tasks.discard(task)
        on_done(
            asyncio.CancelledError("the handler's task was cancelled") if task.cancelled() else task.result()
        )

    def wait(self, awaitable: Any) -> Any:
        """Await *awaitable* on the loop from another thread and return its result (never cancelled)."""

        async def main() -> Any:
            return await awaitable

        fut = asyncio.run_coroutine_threadsafe(main(), self._ensure())
        return fut.result()

    def on_loop(self) -> bool:
        """Whether the calling thread is the loop's."""
        return self._thread is not None and threading.current_thread() is self._thread

    def close(self) -> None:
        """Stop the loop; a hung handler's task is left behind with it (it cannot be killed)."""
        with self._lock:
            loop, self._loop = self._loop, None
            thread, self._thread = self._thread, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(5)
            if not loop.is_running():
                loop.close()  # a hung handler's task stays pending, never resumed


class ResultRejected(BrooqError, ValueError):
    """The handler's return value cannot be stored (not JSON, or too large): the attempt's failure."""


def encode_result(value: Any, max_bytes: int) -> str | None:
    """*value* as JSON text for the row's ``result`` (None stays NULL); ResultRejected for a value
    jsonb cannot hold (bytes included) or longer than *max_bytes*."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        raise ResultRejected("the handler's return value is bytes, which is not JSON-serialisable")
    try:
        text = encode_payload(value, "the handler's return value")
    except InvalidJob as exc:
        raise ResultRejected(str(exc)) from None
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > max_bytes:
        raise ResultRejected(
            f"the handler's return value is {size} bytes of JSON, more than result_max_bytes ({max_bytes})"
        )
    return text


async def run_async(a: Attempt, max_bytes: int, before: Callable[[Attempt], None] = lambda a: None) -> None:
    """Await an async handler and encode its return value on the loop, where it ran; *before* first
    (the engine's fence check), and a cancelled attempt's handler never starts."""
    before(a)
    if (cause := a.call()) is not None:
        raise cause
    with run_span(a.topic, a.id, a.claim.attempt, a.claim.meta):  # a no-op without OpenTelemetry
        a.result = encode_result(await a.kind.handler(a.ctx, a.claim), max_bytes)


class Runner:
    """Runs handlers: sync ones on ``threads``, ``async def`` ones as tasks on ``loop``."""

    def __init__(self, handover: Handover, metrics: Metrics, loop: AsyncRunner, log: logging.Logger) -> None:
        self.handover = handover
        self.metrics = metrics
        self.loop = loop
        self.threads = Threads("worker", log)
        self.settlers = Threads("settler", log, max_threads=4)
        self.result_max_bytes = 1024 * 1024  # the largest result a handler may return
        # SPEC F0, P1: called on each attempt right before its handler starts (the engine's fence
        # check): an engine stopped between its claim and the start (SIGSTOP, a frozen VM) may find
        # its proof of life gone and the claim reaped; the attempt is then fenced and never run.
        self.before_start: Callable[[Attempt], None] = lambda a: None
        self.batcher = Batcher(self)

    def launch_many(self, attempts: Sequence[Attempt]) -> None:
        """Start each attempt's handler; the async ones reach the loop in one hand-over."""
        tasks = []
        batched = []
        for a in attempts:
            self._busy(a, +1)
            if a.kind.batch:
                batched.append(a)
            elif a.kind.is_async:
                tasks.append(
                    (
                        functools.partial(run_async, a, self.result_max_bytes, self.before_start),
                        self._on_task_done(a),
                    )
                )
            else:
                self.threads.run(functools.partial(self._run_thread, a, time.monotonic()))
        if tasks:
            self.loop.spawn_many(tasks)
        if batched:
            self.batcher.add(batched)

    def encode(self, value: Any) -> str | None:
        """A handler's return value as the row's result text (``encode_result``)."""
        return encode_result(value, self.result_max_bytes)

    def finish_batch(
        self, batch: Sequence[Attempt], errors: Sequence[BaseException | None], t0: float
    ) -> None:
        """A batch handler's call ended: the answers are handed over together, for one settle."""
        answers = []
        try:
            for a, error in zip(batch, errors, strict=True):
                self._observe(a, t0)
                answers.append((a, a.returned() if error is None else a.raised(error)))
            self.handover.hand_over_many(answers)
        finally:
            for a in batch:
                a.free_slot()

    def _run_thread(self, a: Attempt, t0: float) -> None:
        error = self._call_here(a)
        self._observe(a, t0)
        self.finish(a, error)

    def _on_task_done(self, a: Attempt) -> Callable[[BaseException | None], None]:
        t0 = time.monotonic()

        def on_done(error: BaseException | None) -> None:
            # On the loop's thread: the end is recorded at once, so the watchdog never calls it hung;
            # a plain return is reported here when that cannot block, the rest on a settler thread.
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
                self.settlers.run(lambda: self._write_then_free(a, outcome))
                return
        except BaseException:
            a.free_slot()
            raise
        a.free_slot()

    def _write_then_free(self, a: Attempt, outcome: Outcome) -> None:
        try:
            self.handover.write(outcome)
        finally:
            a.free_slot()

    def run_batches_here(self, attempts: Sequence[Attempt]) -> None:
        """Run the attempts of batch kinds in this thread, one call per batch (``Engine.run_once``)."""
        for a in attempts:
            self._busy(a, +1)
        self.batcher.run_here(attempts)

    def run_here(self, a: Attempt) -> None:
        """Run *a*'s handler in this thread and settle it (``Engine.run_once``)."""
        self._busy(a, +1)
        self._run_thread(a, time.monotonic())

    def _call_here(self, a: Attempt) -> BaseException | None:
        """Run the handler in this thread (an async one awaited on the loop); return what it raised."""
        try:
            if a.kind.is_async:
                self.loop.wait(run_async(a, self.result_max_bytes, self.before_start))
                return None
            self.before_start(a)
            if (cause := a.call()) is not None:
                return cause
            with run_span(a.topic, a.id, a.claim.attempt, a.claim.meta):  # a no-op without OpenTelemetry
                result = a.kind.handler(a.ctx, a.claim)
                if inspect.isawaitable(result):
                    result = self.loop.wait(result)
                a.result = encode_result(result, self.result_max_bytes)  # on the handler's thread
        except BaseException as exc:
            return exc
        return None

    def _busy(self, a: Attempt, n: int) -> None:
        self.metrics.child(self.metrics.busy, a.topic).inc(n)

    def _observe(self, a: Attempt, t0: float) -> None:
        self._busy(a, -1)
        if a.called:  # an attempt ended before its start ran no handler
            self.metrics.child(self.metrics.duration, a.topic).observe(time.monotonic() - t0)

    def finish(self, a: Attempt, error: BaseException | None) -> None:
        """The handler's code ended: report how to the attempt, hand its answer over, free the slot."""
        try:
            self.handover.hand_over(a, a.returned() if error is None else a.raised(error))
        finally:
            a.free_slot()  # only if its own end took the handler out of RUNNING
