"""Listener: wakes the dispatcher on NOTIFY; a lost connection degrades to polling (SPEC E6, L7)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from brooq_py.engine.services.ticker import Ticker
from brooq_py.queue.port import Listener

WAIT_SLICE = 0.1  # how soon a stop is seen: one select() on the socket per slice, no round trip
RECONNECT_MAX = 30.0


class WakeListener(Ticker):
    """Holds a LISTEN subscription and calls ``wake()`` on each notification.

    Each tick is one connection's life: open, wake once (a notification may
    have been missed while disconnected), then wait in slices until stopped or
    broken. A tick that cannot connect, or whose connection breaks, raises: the
    base backs off exponentially up to RECONNECT_MAX and logs the first failure
    and the recovery once each, while polling carries on (L7).
    """

    name = "listener"
    backoff_base = 0.5
    backoff_max = RECONNECT_MAX

    def __init__(self, listen: Callable[[], Listener], wake: Callable[[], None], log: logging.Logger) -> None:
        super().__init__(1.0, log)
        self._listen = listen
        self._wake = wake

    def next_delay(self) -> float:
        return 0.0  # a connection closed at our request (stop) or cleanly: reconnect at once

    def tick(self) -> None:
        try:
            sub = self._listen()
        except Exception:
            self._wake()
            raise
        try:
            self._wake()
            while not self._stop.is_set():
                if sub.wait(WAIT_SLICE):
                    self._wake()
                self.recovered()  # once the connection has answered: a flapping one keeps backing off
        except Exception:
            self._wake()
            raise
        finally:
            try:
                sub.close()
            except Exception:
                self.log.debug("listener: closing the subscription failed", exc_info=True)
