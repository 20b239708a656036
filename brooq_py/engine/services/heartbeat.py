"""Heartbeat: one statement renews every lease this engine holds, every lease/3 (SPEC C3, L3)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta

from brooq_py.engine.attempt.attempt import Attempt, Phase
from brooq_py.engine.clock import Clock
from brooq_py.engine.repo import HeldLease, Renewal
from brooq_py.engine.services.ticker import Ticker
from brooq_py.queue import StoreUnavailable

# While a held row is locked elsewhere, renew this often: the first renewal after the lock
# is gone extends its lease well before the reaper's hold runs out (SPEC P1').
LOCKED_RETRY = 0.25


def guard_window(lease: float) -> float:
    """How long a claim whose lease ran out in the row, kept from the reaper by its guard alone
    (a lock of the heartbeat's session, P1'), is trusted after the last renewal that saw it held.

    The guard ends with that session, which the engine cannot watch between renewals: a session
    cut off silently is ended by the server's TCP keepalives (set from the lease on the Store's
    own connections: at least 4 s and about lease/3 of silence), so this stays below that; a
    renewal that finds the connection gone fences such a claim at once.
    """
    return min(lease, max(1.0, lease / 6))


class Heartbeat(Ticker):
    """Renews the leases of ``held()``; a running attempt whose lease does not come back is lost.

    A renewal confirms each lease as of the moment it was sent (``renewed_at``,
    what self-fencing measures from, L4). A renewal that fails (a connection
    blip) raises: the base logs it and retries with backoff capped at the
    period; it never cancels a handler. A settling attempt whose row does not
    come back is no lost lease: its outcome write is on its way and its guard
    decides (SPEC C3). A row locked elsewhere is still held, its lease not extended:
    renewals then come every LOCKED_RETRY seconds until it is (P1'). A row canceled
    under the claim is an operator's cancel, told as such (``on_canceled``, X2').
    ``wake()`` renews at once: a cancel's notification may have been missed (the
    listener reconnected), so the held claims are looked at now, not at the period.

    A locked row's lease is not extended: once it has run out in the row, only the
    claim's guard (a lock of the heartbeat's own session) keeps the reaper off it,
    and that goes with the session. Such a claim is confirmed for ``guard_window``
    only (the watchdog fences it then, L4), and a renewal that finds the connection
    gone fences it at once (*on_fence*): another engine may run the job from then on.
    """

    name = "heartbeat"

    def __init__(
        self,
        period: timedelta,
        held: Callable[[], Sequence[Attempt]],
        renew: Callable[[Sequence[HeldLease]], Renewal],
        on_lost: Callable[[Attempt], None],
        log: logging.Logger,
        clock: Clock,
        on_canceled: Callable[[Attempt], None] | None = None,
        *,
        lease: float | None = None,
        on_fence: Callable[[Attempt], None] | None = None,
    ) -> None:
        super().__init__(period, log)
        self.backoff_base = self.period / 4  # a blip is retried soon, never slower than the period
        self._held = held
        self._renew = renew
        self._on_lost = on_lost
        self._on_canceled = on_canceled or on_lost
        self._clock = clock
        self._locked = False
        # Claim tokens a renewal found locked (guarded by the store, P1') and not renewed since:
        # the engine's stop releases their guards, whatever became of their attempts.
        self.guarded: set[str] = set()
        self._lease = lease
        self._on_fence = on_fence
        self._poke = threading.Event()  # set by wake() and by stop()

    def wake(self) -> None:
        """Renew now (once, however many calls come before the renewal starts)."""
        self._poke.set()

    def halt(self) -> None:
        self._stop.set()
        self._poke.set()  # after the stop flag: the loop's wait ends and sees it

    def _wait(self, seconds: float) -> bool:
        self._poke.wait(seconds)
        self._poke.clear()  # a wake() after this is seen by the renewal that follows
        return self._stop.is_set()

    def next_delay(self) -> float:
        return min(self.period, LOCKED_RETRY) if self._locked else self.period

    @staticmethod
    def _leases(
        attempts: Sequence[Attempt],
    ) -> tuple[list[HeldLease], list[tuple[Attempt, tuple[float | None, str | None]]]]:
        """The leases to renew, with the progress each handler reported since the last renewal (V4)."""
        leases: list[HeldLease] = []
        taken: list[tuple[Attempt, tuple[float | None, str | None]]] = []
        for a in attempts:
            progress = a.ctx.take_progress()
            if progress is None:
                leases.append(HeldLease(a.id, a.row.claim_token))
            else:
                leases.append(HeldLease(a.id, a.row.claim_token, progress[0], progress[1]))
                taken.append((a, progress))
        return leases, taken

    def tick(self) -> None:
        attempts = list(self._held())
        self._locked = False
        if not attempts:
            self._renew([])  # nothing to renew; the store may let go what it kept for ended claims
            return
        sent = self._clock.monotonic()
        leases, taken = self._leases(attempts)
        try:
            renewal = self._renew(leases)
        except BaseException as exc:
            for a, progress in taken:  # kept for the next renewal, unless newer values came meanwhile
                a.ctx.give_back_progress(progress)
            if isinstance(exc, StoreUnavailable):
                self._fence_unguarded(attempts)
            raise
        for a, progress in taken:
            if a.row.claim_token in renewal.locked:  # its row was not written this time
                a.ctx.give_back_progress(progress)
        self._locked = bool(renewal.locked)
        self.guarded = (self.guarded | renewal.locked) - (renewal.held - renewal.locked)
        lease = self._lease
        for a in attempts:
            token = a.row.claim_token
            if token in renewal.held:
                if token not in renewal.locked:
                    a.extended_at = max(a.extended_at, sent)
                    a.renewed_at = max(a.renewed_at, sent)
                elif lease is None:
                    a.renewed_at = max(a.renewed_at, sent)
                else:  # fenced at its lease's end in the row, or guard_window from now if later
                    a.renewed_at = max(a.renewed_at, sent + guard_window(lease) - lease)
            elif a.phase is Phase.RUNNING:
                (self._on_canceled if token in renewal.canceled else self._on_lost)(a)

    def _fence_unguarded(self, attempts: Sequence[Attempt]) -> None:
        """The heartbeat's connection is gone, and with its session the guards: a running claim
        whose lease has run out in the row is kept from the reaper no more (P1')."""
        lease, fence = self._lease, self._on_fence
        if lease is None or fence is None:
            return
        now = self._clock.monotonic()
        for a in attempts:
            if a.phase is Phase.RUNNING and now - a.extended_at >= lease:
                fence(a)
