"""Watchdog: timeouts, give-ups, hung handlers and self-fencing, checked every tick (SPEC C4, C5, F0)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from brooq_py.engine.attempt.attempt import Attempt
from brooq_py.engine.attempt.outcome import HandlerState, Phase
from brooq_py.engine.clock import Clock
from brooq_py.engine.services.heartbeat import Fence
from brooq_py.engine.services.ticker import Ticker

TICK = 0.05


class Watchdog(Ticker):
    """Checks every attempt against its deadlines on each tick.

    - attempt_timeout reached: ``on_timeout`` (ctx cancelled with ``AttemptTimeout``);
    - max_execution_timeout reached: ``on_give_up`` (the engine stops waiting);
    - handler still running ``grace`` seconds after its ctx was cancelled: ``on_hung``;
    - no heartbeat succeeded for ``lease - margin`` since the send time of the
      last one that did: every running attempt is fenced (``Fence.check``, F0).
      This check does not depend on the heartbeat's statement returning: a
      heartbeat stuck on a silent socket fences all the same.
    """

    name = "watchdog"

    def __init__(
        self,
        running: Callable[[], Sequence[Attempt]],
        held: Callable[[], Sequence[Attempt]],
        grace: float,
        fence: Fence,
        clock: Clock,
        on_timeout: Callable[[Attempt], None],
        on_give_up: Callable[[Attempt], None],
        on_hung: Callable[[Attempt], None],
        log: logging.Logger,
        *,
        period: float = TICK,
    ) -> None:
        super().__init__(period, log)
        self.grace = grace
        self.fence = fence
        self._running = running
        self._held = held
        self._clock = clock
        self._on_timeout = on_timeout
        self._on_give_up = on_give_up
        self._on_hung = on_hung

    def tick(self) -> None:
        now = self._clock.monotonic()
        self.fence.check(self._held(), now)
        for a in self._running():
            if a.phase is Phase.RUNNING:
                if now >= a.hard_deadline:
                    self._on_give_up(a)
                elif not a.ctx.done() and now >= a.soft_deadline:
                    self._on_timeout(a)
            cancelled = a.cancelled_at
            if (
                a.handler in (HandlerState.RUNNING, HandlerState.ABANDONED)
                and cancelled is not None
                and now - cancelled >= self.grace
            ):
                self._on_hung(a)
