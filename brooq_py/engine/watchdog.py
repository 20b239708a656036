"""Watchdog: fires attempt timeouts, gives up at the hard ceiling, reports hung handlers (SPEC C4, C5)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from brooq_py.engine.attempt import Attempt
from brooq_py.engine.clock import Clock
from brooq_py.engine.ticker import Ticker
from brooq_py.queue import AttemptTimeout

TICK = 0.05


class Watchdog(Ticker):
    """Checks every running attempt against its deadlines on each tick.

    - attempt_timeout reached: cancel ctx with ``AttemptTimeout``;
    - max_execution_timeout reached: ``on_give_up`` (the engine stops waiting);
    - still running ``grace`` seconds after its ctx was cancelled: ``on_hung``.
    """

    name = "watchdog"

    def __init__(
        self,
        running: Callable[[], Sequence[Attempt]],
        grace: float,
        clock: Clock,
        on_give_up: Callable[[Attempt], None],
        on_hung: Callable[[Attempt], None],
        log: logging.Logger,
        *,
        period: float = TICK,
    ) -> None:
        super().__init__(period, log)
        self.grace = grace
        self._running = running
        self._clock = clock
        self._on_give_up = on_give_up
        self._on_hung = on_hung

    def tick(self) -> None:
        now = self._clock.monotonic()
        for a in self._running():
            if a.finished:
                continue
            if not a.abandoned:
                if now >= a.hard_deadline:
                    self._on_give_up(a)
                elif not a.ctx.done() and now >= a.soft_deadline:
                    timeout = a.kind.options.td("attempt_timeout").total_seconds()
                    a.ctx.cancel(AttemptTimeout(f"attempt_timeout of {timeout:g}s elapsed"))
            cancelled = a.cancelled_at
            if not a.hung and cancelled is not None and now - cancelled >= self.grace and not a.finished:
                self._on_hung(a)
