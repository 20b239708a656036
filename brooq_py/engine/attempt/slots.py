"""Worker slots, the daemon threads of sync handlers, and the one event loop of async ones (SPEC L2).

A slot is a unit of the engine's capacity (``workers``), not a thread: a sync
handler takes a slot and a thread, an ``async def`` handler takes a slot and a
task on the engine's loop, and no thread at all.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from queue import SimpleQueue
from typing import Any

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

    @property
    def busy(self) -> int:
        with self._cond:
            return self.size - self._free

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
            if self._free <= 0:
                self._cond.wait_for(lambda: self._free > 0, timeout)
            return self._free

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no slot is busy; return False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._free >= self.size, timeout)


class Threads:
    """Daemon threads that run the functions handed to them, grown on demand.

    With *max_threads* None a function never waits for a thread: an idle one
    takes it or a new one starts (a thread stuck in a hung handler is simply
    never idle again). With a bound, functions queue for the threads there are.
    Daemons under the engine's control, so a hung handler never blocks exit.
    """

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

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._threads)

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
    """One event loop, on its own daemon thread, for every ``async def`` handler.

    A handler runs as a task there; nothing ever cancels it by force (SPEC L2):
    its own ending is reported to *on_done* on the loop's thread, which must not
    block (the engine hands it to a settling thread).
    """

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
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

    def spawn(
        self,
        make: Callable[[], Any],
        on_done: Callable[[BaseException | None], None],
    ) -> None:
        """Run ``await make()`` as a task on the loop; then call ``on_done(error or None)`` there."""
        self.spawn_many([(make, on_done)])

    def spawn_many(
        self, handlers: Sequence[tuple[Callable[[], Any], Callable[[BaseException | None], None]]]
    ) -> None:
        """``spawn`` each ``(make, on_done)``: one wake-up of the loop for the whole batch of a claim."""
        if not handlers:
            return
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
        error: BaseException | None
        if task.cancelled():
            error = asyncio.CancelledError("the handler's task was cancelled")
        else:
            error = task.result()
        on_done(error)

    def wait(self, awaitable: Any) -> Any:
        """Await *awaitable* on the loop from another thread and return its result (never cancelled)."""

        async def main() -> Any:
            return await awaitable

        fut = asyncio.run_coroutine_threadsafe(main(), self._ensure())
        return fut.result()

    def on_loop(self) -> bool:
        """Whether the calling thread is the loop's."""
        return self._thread is not None and threading.current_thread() is self._thread

    @property
    def tasks(self) -> int:
        return len(self._tasks)

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
