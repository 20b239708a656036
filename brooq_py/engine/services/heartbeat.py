"""Heartbeat: one statement renews every lease this engine holds, every lease/3 (SPEC C3, L3)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import timedelta

from brooq_py.engine.attempt.attempt import Attempt, Phase
from brooq_py.engine.clock import Clock
from brooq_py.engine.repo import HeldLease
from brooq_py.engine.services.ticker import Ticker


class Heartbeat(Ticker):
    """Renews the leases of ``held()``; a running attempt whose lease does not come back is lost.

    A renewal confirms each lease as of the moment it was sent (``renewed_at``,
    what self-fencing measures from, L4). A renewal that fails (a connection
    blip) raises: the base logs it and retries with backoff capped at the
    period; it never cancels a handler. A settling attempt whose row does not
    come back is no lost lease: its outcome write is on its way and its guard
    decides (SPEC C3).
    """

    name = "heartbeat"

    def __init__(
        self,
        period: timedelta,
        held: Callable[[], Sequence[Attempt]],
        renew: Callable[[Sequence[HeldLease]], set[str]],
        on_lost: Callable[[Attempt], None],
        log: logging.Logger,
        clock: Clock,
    ) -> None:
        super().__init__(period, log)
        self.backoff_base = self.period / 4  # a blip is retried soon, never slower than the period
        self._held = held
        self._renew = renew
        self._on_lost = on_lost
        self._clock = clock

    def tick(self) -> None:
        attempts = list(self._held())
        if not attempts:
            return
        sent = self._clock.monotonic()
        alive = self._renew([HeldLease(a.id, a.row.claim_token) for a in attempts])
        for a in attempts:
            if a.id in alive:
                a.renewed_at = max(a.renewed_at, sent)
            elif a.phase is Phase.RUNNING:
                self._on_lost(a)
