"""Worker slots (daemon threads) and the event loop that runs ``async def`` handlers."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Callable, Coroutine
from queue import SimpleQueue
from typing import Any

from brooq_py.engine.attempt import Attempt

_STOP = object()


class SlotPool:
    """``size`` daemon threads that run attempts handed to them.

    A slot is busy from ``submit`` until its attempt ends, or until the engine
    gives up on it (``release``): then a fresh thread takes the slot and the
    stuck one exits whenever its handler returns. Threads are daemons under the
    engine's control, so a hung handler never blocks interpreter exit.
    """

    def __init__(self, size: int, run: Callable[[Any], Attempt | None], log: logging.Logger) -> None:
        self.size = size
        self._run = run
        self._log = log
        self._queue: SimpleQueue[Any] = SimpleQueue()
        self._cond = threading.Condition()
        self._free = size
        self._threads: set[threading.Thread] = set()
        self._started = False
        self._seq = itertools.count(1)

    @property
    def free(self) -> int:
        with self._cond:
            return self._free

    @property
    def busy(self) -> int:
        with self._cond:
            return self.size - self._free

    def start(self) -> None:
        with self._cond:
            if self._started:
                return
            self._started = True
            for _ in range(self.size):
                self._spawn()

    def _spawn(self) -> None:
        t = threading.Thread(target=self._worker, name=f"brooq-worker-{next(self._seq)}", daemon=True)
        self._threads.add(t)
        t.start()

    def wait_free(self, timeout: float) -> int:
        """Wait up to *timeout* seconds for a free slot; return how many are free."""
        with self._cond:
            if self._free == 0:
                self._cond.wait_for(lambda: self._free > 0, timeout)
            return self._free

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no slot is busy; return False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._free == self.size, timeout)

    def submit(self, item: object) -> None:
        """Hand *item* to a free slot; ``run(item)`` turns it into an attempt and runs it there."""
        with self._cond:
            self._free -= 1
        self._queue.put(item)

    def release(self, attempt: Attempt) -> None:
        """Free the slot of an attempt the engine gave up on; a new thread takes its place."""
        with self._cond:
            self._free += 1
            if self._started:
                self._spawn()
            self._cond.notify_all()

    def _worker(self) -> None:
        me = threading.current_thread()
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                attempt: Attempt | None = None
                try:
                    attempt = self._run(item)
                except BaseException:  # the run function handles everything; this is a last guard
                    self._log.exception("worker: unexpected error running %r", item)
                if attempt is not None and attempt.abandoned:
                    return  # our slot was released and taken over while the handler hung
                with self._cond:
                    self._free += 1
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._threads.discard(me)

    def stop(self) -> None:
        """Ask idle threads to exit (busy ones exit after their attempt)."""
        with self._cond:
            n = len(self._threads)
            self._started = False
        for _ in range(n):
            self._queue.put(_STOP)


class AsyncRunner:
    """One event loop, on its own daemon thread, for every ``async def`` handler."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

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

    def run(self, coro: Coroutine[Any, Any, Any], on_cancel: Callable[[Callable[[], object]], None]) -> Any:
        """Run *coro* on the loop and block until it ends; return or raise its result.

        *on_cancel* receives a function that cancels the task (thread-safe).
        """
        loop = self._ensure()
        fut: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(coro, loop)
        on_cancel(fut.cancel)
        return fut.result()

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
            thread, self._thread = self._thread, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(5)
            if not loop.is_running():
                loop.close()
