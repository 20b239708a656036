"""Listener: wakes the dispatcher on NOTIFY; a lost connection degrades to polling (SPEC E6)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from brooq_py.engine.repo import Listener
from brooq_py.engine.ticker import Ticker, worth_logging

WAIT_SLICE = 0.5
RECONNECT_MAX = 30.0


class WakeListener(Ticker):
    """Holds a LISTEN subscription and calls ``wake()`` on each notification.

    Each tick is one connection's life: open, wake once (a notification may
    have been missed while disconnected), then wait in slices until stopped or
    broken. After a failure it reconnects with backoff while polling carries on.
    """

    name = "listener"

    def __init__(self, listen: Callable[[], Listener], wake: Callable[[], None], log: logging.Logger) -> None:
        super().__init__(1.0, log)
        self._listen = listen
        self._wake = wake
        self._failures = 0

    def next_delay(self) -> float:
        return min(RECONNECT_MAX, 0.5 * float(2 ** min(self._failures, 10)))

    def tick(self) -> None:
        try:
            sub = self._listen()
        except Exception as exc:
            self._fail(exc)
            return
        try:
            if self._failures:
                self.log.info("listener: listening again after %d failed attempts", self._failures)
            self._failures = 0
            self._wake()
            while not self._stop.is_set():
                if sub.wait(WAIT_SLICE):
                    self._wake()
        except Exception as exc:
            self._fail(exc)
        finally:
            try:
                sub.close()
            except Exception:
                self.log.debug("listener: closing the subscription failed", exc_info=True)

    def _fail(self, exc: Exception) -> None:
        self._failures += 1
        self._wake()
        level = logging.WARNING if worth_logging(self._failures) else logging.DEBUG
        self.log.log(
            level,
            "listener: LISTEN connection failed (%s); polling meanwhile, reconnecting",
            type(exc).__name__,
        )
