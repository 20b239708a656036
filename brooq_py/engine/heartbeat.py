"""Heartbeat: one statement renews every lease this engine holds, every lease/3 (SPEC C3)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import timedelta

from brooq_py.engine.attempt import Attempt
from brooq_py.engine.repo import HeldLease
from brooq_py.engine.ticker import Ticker

RETRY_AFTER_ERROR = 1.0


class Heartbeat(Ticker):
    """Renews the leases of ``held()``; a lease that does not come back is lost.

    A renewal that fails (a connection blip) is logged and retried soon; it
    never cancels a handler.
    """

    name = "heartbeat"

    def __init__(
        self,
        period: timedelta,
        held: Callable[[], Sequence[Attempt]],
        renew: Callable[[Sequence[HeldLease]], set[str]],
        on_lost: Callable[[Attempt], None],
        log: logging.Logger,
    ) -> None:
        super().__init__(period, log)
        self._held = held
        self._renew = renew
        self._on_lost = on_lost
        self._failing = False

    def next_delay(self) -> float:
        return min(RETRY_AFTER_ERROR, self.period) if self._failing else self.period

    def tick(self) -> None:
        attempts = list(self._held())
        if not attempts:
            self._failing = False
            return
        try:
            alive = self._renew([HeldLease(a.id, a.row.claim_token) for a in attempts])
        except Exception as exc:
            if not self._failing:
                self.log.warning("heartbeat: renewing %d leases failed: %s; retrying", len(attempts), exc)
            self._failing = True
            return
        if self._failing:
            self.log.info("heartbeat: renewing leases works again")
        self._failing = False
        for a in attempts:
            if a.id not in alive:
                self._on_lost(a)
