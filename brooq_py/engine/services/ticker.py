"""Ticker: the one lifecycle base every background service runs on: loop, stop, failures (SPEC L7)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import timedelta


def worth_logging(failures: int) -> bool:
    """Whether the *failures*-th failure in a row deserves a log line: the 1st, 5th, 50th, then every 500th."""
    return failures in (1, 5, 50) or failures % 500 == 0


class Ticker:
    """A daemon thread that calls ``tick()`` every ``next_delay()`` seconds, or ``failure_delay()``
    after one that raised; ``start()`` is idempotent, ``stop()`` safe before ``start()`` and twice."""

    name = "ticker"
    backoff_base = 0.5
    backoff_max: float | None = None

    def __init__(self, period: timedelta | float, logger: logging.Logger) -> None:
        seconds = period.total_seconds() if isinstance(period, timedelta) else float(period)
        if seconds <= 0:
            raise ValueError(f"{self.name}: period must be > 0")
        self.period = seconds
        self.log = logger
        self._stop = threading.Event()
        self._poke = threading.Event()  # set by wake() and by halt()
        self._poked = False  # a wake-up the loop's wait ended on, not yet taken by a tick
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._failures = 0

    def tick(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def run_once(self) -> None:
        """Run one tick now, in this thread; exceptions propagate."""
        self.tick()

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive() and not self._stop.is_set()

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=f"brooq-{self.name}", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """Tick now rather than after the wait (once, however many calls come before it)."""
        self._poke.set()

    def halt(self) -> None:
        """Ask the loop to stop without waiting for it: ``stop()`` then only waits, so services
        halted together stop in the time of the slowest, not the sum."""
        self._stop.set()
        self._poke.set()  # after the stop flag: the wait ends and sees it

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the loop and wait up to *timeout* seconds for the current tick to end."""
        with self._lock:
            thread, self._thread = self._thread, None
            self.halt()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def take_wake(self) -> bool:
        """Whether ``wake()`` was called since the last tick that asked (a tick that cares calls it)."""
        poked = self._poked or self._poke.is_set()
        self._poked = False
        self._poke.clear()
        return poked

    def _wait(self, seconds: float) -> bool:
        """Sleep up to *seconds*, or until woken; return True if asked to stop. The wake-up is
        consumed here (kept for ``take_wake``): one ``wake()`` is one early tick, never a loop."""
        # a wake-up a tick consumed may have been halt()'s: the stop flag is read first
        if not self._stop.is_set() and self._poke.wait(seconds):
            self._poke.clear()
            self._poked = True
        return self._stop.is_set()

    def _loop(self) -> None:
        if not self._stop.is_set():
            self._safe_tick()
        while not self._wait(self.failure_delay() if self._failures else self.next_delay()):
            self._safe_tick()

    def next_delay(self) -> float:
        """Seconds until the next tick while healthy (the period unless a service says otherwise)."""
        return self.period

    def failure_delay(self) -> float:
        """Seconds until the next tick after ``failures`` failed ticks in a row: exponential, capped."""
        cap = self.period if self.backoff_max is None else self.backoff_max
        base = min(self.backoff_base, cap)
        return float(min(cap, base * 2 ** min(max(self._failures - 1, 0), 30)))

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except Exception as exc:
            self.failed(exc)
            return
        self.recovered()

    def failed(self, exc: BaseException) -> None:
        """Count one failure and log it by the rule (the loop calls this for a tick that raises)."""
        self._failures += 1
        name, kind = self.name, type(exc).__name__
        if self._failures == 1:
            # A lost connection is expected weather, not a bug: its stack would only be noise.
            stack = None if isinstance(exc, ConnectionError) else exc
            self.log.warning("%s failed (%s: %s); retrying with backoff", name, kind, exc, exc_info=stack)
        elif worth_logging(self._failures):
            self.log.warning("%s still failing after %d attempts (%s: %s)", name, self._failures, kind, exc)
        else:
            self.log.debug("%s failed again (%s)", name, kind)

    def recovered(self) -> None:
        """End a run of failures, logging the recovery once."""
        if self._failures:
            self.log.info("%s works again after %d failures", self.name, self._failures)
        self._failures = 0


def stop_services(services: Sequence[Ticker], timeout: float = 10.0) -> None:
    """Halt every service at once, then wait for each, last started first, *timeout* seconds in
    all: a service stuck in a statement the database never answers is left behind (a daemon)."""
    for s in services:
        s.halt()
    deadline = time.monotonic() + timeout
    for s in reversed(services):
        s.stop(max(0.0, deadline - time.monotonic()))
