"""Ticker: the small base every background service runs on."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta


def worth_logging(failures: int) -> bool:
    """Whether the *failures*-th failure in a row deserves a log line: the 1st, 5th, 50th, then every 500th."""
    return failures in (1, 5, 50) or failures % 500 == 0


class Ticker:
    """A daemon thread that calls ``tick()`` every *period*.

    ``start()`` is idempotent; ``stop()`` is safe before ``start()`` and twice.
    The first tick runs at once when *initial_tick* is set. An exception from a
    tick is logged and the loop goes on. ``run_once()`` runs one tick in the
    caller's thread, for tests.
    """

    name = "ticker"

    def __init__(
        self, period: timedelta | float, logger: logging.Logger, *, initial_tick: bool = True
    ) -> None:
        seconds = period.total_seconds() if isinstance(period, timedelta) else float(period)
        if seconds <= 0:
            raise ValueError(f"{self.name}: period must be > 0")
        self.period = seconds
        self.log = logger
        self._initial_tick = initial_tick
        self._stop = threading.Event()
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

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the loop and wait up to *timeout* seconds for the current tick to end."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _wait(self, seconds: float) -> bool:
        """Sleep up to *seconds*; return True if asked to stop."""
        return self._stop.wait(seconds)

    def _loop(self) -> None:
        if self._initial_tick and not self._stop.is_set():
            self._safe_tick()
        while not self._wait(self.next_delay()):
            self._safe_tick()

    def next_delay(self) -> float:
        """Seconds until the next tick (the period unless a service says otherwise)."""
        return self.period

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except Exception as exc:
            self._failures += 1
            if self._failures == 1:
                self.log.exception("%s tick failed; retrying every %gs", self.name, self.period)
            elif worth_logging(self._failures):
                self.log.warning("%s tick failed %d times in a row: %s", self.name, self._failures, exc)
            return
        if self._failures:
            self.log.info("%s works again after %d failed ticks", self.name, self._failures)
        self._failures = 0
