"""Held poison verdicts: answers handed over later (SPEC L5, L6').

A claim past ``max_attempts`` is not run and ends dead (L5), but not at once: the
engine that ran the last attempt may have returned its handler while it could not
write the done, and writes it later under that attempt's claim, over this claim
(``services/late.py``, L6'). So the verdict is held back a lease, its lease renewed
meanwhile, then written by the late-outcomes ticker.

A verdict due while another transaction holds its row locked (an operator in psql)
is held back again: the late done may be waiting on that same lock, backing off up
to LATE_LOCKED_MAX between tries, and must come first once the lock goes. So the
row is looked at every HELD_PROBE seconds, without waiting and without writing,
until the lock is gone; the verdict then waits 2 * LATE_LOCKED_MAX more. At stop
every held verdict goes to the completer, which writes it while its lease is held.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from brooq_py.engine.attempt.attempt import Attempt
from brooq_py.engine.repo import Outcome

if TYPE_CHECKING:
    from brooq_py.engine.attempt.handover import Handover

# A lost done whose row another transaction holds locked is tried again at most this far apart
# (services/late.py); a held verdict that met such a lock waits twice this long once it is gone.
LATE_LOCKED_MAX = 5.0
# How often a held verdict that met its row locked looks at the row until the lock is gone.
HELD_PROBE = 0.25


class HeldVerdicts:
    """The poison verdicts of one engine held back, and their hand-over when due."""

    def __init__(self, handover: Handover) -> None:
        self._handover = handover
        # (when, attempt, verdict, probing): probing, it met its row locked, the lock not seen gone since.
        self._held: list[tuple[float, Attempt, Outcome, bool]] = []
        self._lock = threading.Lock()
        self._releasing = threading.Lock()  # one hand-over at a time: the ticker's, the stop's

    def hold(self, a: Attempt, verdict: Outcome, seconds: float) -> None:
        with self._lock:
            self._held.append((time.monotonic() + seconds, a, verdict, False))

    def release(self, everything: bool = False) -> int:
        """Hand over the verdicts whose time came (*everything*: all of them, at stop: to the
        completer). A stop waits for a hand-over under way, so that none is held back again behind
        it, unwritten once the engine stopped (C11)."""
        with self._releasing:
            now = time.monotonic()
            with self._lock:
                due = [h for h in self._held if everything or h[0] <= now]
                if not due:
                    return 0
                self._held = [h for h in self._held if not (everything or h[0] <= now)]
            for _, a, verdict, probing in due:
                if everything:
                    self._handover.settle(a, verdict)
                    continue
                try:
                    again = self._again(a, verdict, probing)
                except Exception:  # its own hand-over failed: held and tried again, the others go on
                    self._handover.log.exception("job id=%s: handing over a held poison verdict failed", a.id)
                    again = HELD_PROBE, probing
                if again is not None:
                    with self._lock:
                        self._held.append((time.monotonic() + again[0], a, verdict, again[1]))
            return len(due)

    def _again(self, a: Attempt, verdict: Outcome, probing: bool) -> tuple[float, bool] | None:
        """Write *verdict*, or look at its row after it met a lock; None: handed over, else
        (seconds, probing) until it is due again."""
        h = self._handover
        if not probing:
            if self._written(a, verdict):
                return None
            h.log.info(
                "job id=%s topic=%s: poison verdict held back again: its row is locked by another "
                "transaction; written %gs after the lock is gone, unless the done of the attempt "
                "before comes meanwhile (L6')",
                a.id,
                a.topic,
                2 * LATE_LOCKED_MAX,
            )
            return HELD_PROBE, True
        try:
            row = h.repo.row_lock(verdict)
        except Exception as exc:  # the store: looked at again while the lease is held
            if h.inflight.still_held(verdict):
                h.log.debug("job id=%s: the row of a held verdict not looked at (%s)", a.id, exc)
                return HELD_PROBE, True
            h.on_dropped([verdict])
            return None
        if row == "ours":  # the lock is gone: the late done of the attempt before comes first
            return 2 * LATE_LOCKED_MAX, False
        if row == "locked" and h.inflight.still_held(verdict):
            return HELD_PROBE, True
        h.on_written([verdict], set())  # no longer the claim's, or its lease lost: nothing written
        return None

    def _written(self, a: Attempt, verdict: Outcome) -> bool:
        """Write *verdict* now; False when its row was locked elsewhere (nothing written)."""
        h = self._handover
        try:
            written = h.repo.settle_many([verdict])
        except Exception:  # the store: the completer writes it, trying again as it does
            h.settle(a, verdict)
            return True
        locked: frozenset[str] = getattr(written, "locked", frozenset())
        if verdict.claim_token in locked and h.inflight.still_held(verdict):
            return False
        h.on_written([verdict], written)
        return True
