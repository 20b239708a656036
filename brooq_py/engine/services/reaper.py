"""Reaper: expired processing rows go back to pending, attempts unchanged (SPEC R1, P1')."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta

from brooq_py.engine.repo import ExpiredLease
from brooq_py.engine.services.ticker import Ticker

MIN_HOLD = 1.0


def reap_hold(heartbeat_period: timedelta) -> float:
    """How long a row must stay expired, unlocked and unrenewed before the reaper returns it: at
    least MIN_HOLD, four times the holder's renewal retry while its row is locked (heartbeat.LOCKED_RETRY)."""
    return max(MIN_HOLD, min(heartbeat_period.total_seconds(), 3.0))


class Reaper(Ticker):
    """Every period: return rows whose lease expired (of any topic) to pending.

    A row is returned only once the reaper has seen it expired, unlocked and
    unchanged (same claim token, same locked_until) for *hold* seconds. A lease
    can expire while an operator's transaction holds its row locked (renewals
    skip locked rows); the moment the lock is gone, the holder's next renewal
    and the reaper race for the row. The hold makes the renewal win: a holder
    whose renewal skipped a locked row renews again within LOCKED_RETRY. Rows
    locked elsewhere are never waited for nor returned (SKIP LOCKED). A dead
    holder's row comes back *hold* seconds later than its expiry, no more: the
    reaper ticks again when the first row it saw is due. A row the store did not
    return when it was due (its holder guards it: the row was locked elsewhere at
    a renewal, and the holder lives) is tried again a hold later.
    """

    name = "reaper"

    def __init__(
        self,
        period: timedelta | float,
        expired: Callable[[], Sequence[ExpiredLease]],
        reap: Callable[[Sequence[ExpiredLease]], list[tuple[str, str]]],
        on_reaped: Callable[[str], None],
        log: logging.Logger,
        *,
        hold: float = MIN_HOLD,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(period, log)
        self._expired = expired
        self._reap = reap
        self._on_reaped = on_reaped
        self.hold = hold
        self._monotonic = monotonic
        self._seen: dict[tuple[str, str, object], tuple[ExpiredLease, float]] = {}

    def next_delay(self) -> float:
        if not self._seen:
            return self.period
        due = min(at for _, at in self._seen.values()) + self.hold - self._monotonic()
        return min(self.period, max(due, 0.05))

    def tick(self) -> None:
        now = self._monotonic()
        ripe = [lease for lease, at in self._seen.values() if now - at >= self.hold]
        rows = self._reap(ripe) if ripe else []
        # Ripe but not returned, and still expired unchanged: its holder guards it (P1'). Its clock
        # restarts: tried again a hold later, not at every tick.
        reaped = {job_id for job_id, _ in rows}
        kept = {(x.id, x.claim_token, x.locked_until) for x in ripe if x.id not in reaped}
        seen: dict[tuple[str, str, object], tuple[ExpiredLease, float]] = {}
        for lease in self._expired():
            key = (lease.id, lease.claim_token, lease.locked_until)
            seen[key] = (lease, now if key in kept else self._seen.get(key, (lease, now))[1])
        self._seen = seen  # renewed, settled, reaped or locked since: forgotten, its clock restarts
        if not rows:
            return
        by_topic = Counter(topic for _, topic in rows)
        for topic, n in by_topic.items():
            for _ in range(n):
                self._on_reaped(topic)
        self.log.info(
            "reaper: returned %d expired jobs to pending topics=%s",
            len(rows),
            ",".join(f"{t}:{n}" for t, n in sorted(by_topic.items())),
        )
