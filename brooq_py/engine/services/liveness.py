"""Liveness: the heartbeat, the fence and the watchdog (SPEC P1'', F0, W0, C3-C5, X2', V4).

The heartbeat writes the engine's own row each period (which nothing done to job
rows can block) and reads what became of its claims. The claims stay the engine's
while its row is younger than ``lease + margin`` on the database clock; the engine
fences itself ``lease - margin`` after its last good heartbeat's send time, so a
stalled engine stops its handlers before another may take their jobs. A proof covers a
claim along an unbroken chain of beats only (``Fence.proof_of``): a beat answered after the
proof before it ran out proves the engine, not the claims it did not name. The watchdog
checks the fence too, so a heartbeat stuck on a silent socket fences all the same.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from brooq_py.engine.attempt.attempt import Attempt
from brooq_py.engine.attempt.handover import Supervisor
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.engine.attempt.outcome import HandlerState, Phase
from brooq_py.engine.clock import Clock
from brooq_py.engine.services.ticker import Ticker
from brooq_py.queue.port import EngineProof, HeldLease, Renewal

WATCHDOG_TICK = 0.05
# Once a lease (every fourth beat), a beat looks for claims of this engine no attempt holds.
ORPHAN_LOOK = 4


class Fence:
    """When this engine last proved itself alive (the send time of a good heartbeat), and its verdict
    past ``lease - margin``: attempts fenced, no claim until a heartbeat named their dropped claims."""

    def __init__(self, within: float, clock: Clock, on_fence: Callable[[Attempt], None]) -> None:
        self.within = within  # how long a heartbeat's proof holds after its send time: lease - margin
        self._clock = clock
        self._on_fence = on_fence
        self.proven_at = float("-inf")  # no claim before the first heartbeat wrote the engine's row
        # (chain_since, proven_at), one value so that a reader on another thread sees both of one
        # beat: chain_since is the send time of the first beat of the unbroken chain of proofs that
        # ends in proven_at (each answer came while the proof before it held: the row never went stale).
        self.chain = (float("-inf"), float("-inf"))
        self._lock = threading.Lock()
        self.fenced = False  # set by a fence: no claim until a heartbeat named every dropped claim
        self.on_proven: Callable[[], None] = lambda: None  # the dispatcher may claim again

    def proof_of(self, a: Attempt) -> float:
        """The proof of life that covers *a*'s claim: the engine's latest, when the claim was made
        under a proof of the current chain or a beat of it found the claim held; else its own."""
        since, proven = self.chain
        return proven if a.proven_at >= since else a.proven_at

    def check(self, attempts: Sequence[Attempt], now: float) -> None:
        """Fence every running attempt of *attempts* whose proof is older than ``within``."""
        if now - self.proven_at >= self.within:
            with self._lock:
                self.fenced = True
        for a in attempts:
            if a.phase is Phase.RUNNING and now - self.proof_of(a) >= self.within:
                self._on_fence(a)

    def proven(self, sent: float, complete: bool) -> None:
        """A heartbeat sent at *sent* succeeded; *complete*: it named every claim dropped so far.
        An answer that comes once the proof before it ran out starts a new chain at *sent*: a claim
        made under an older proof may have been reaped meanwhile, and this beat did not name it."""
        with self._lock:
            was = not self.may_claim()
            since = sent if self._clock.monotonic() - self.proven_at >= self.within else self.chain[0]
            self.proven_at = max(self.proven_at, sent)
            self.chain = (since, self.proven_at)
            if complete:
                self.fenced = False
        if was and self.may_claim():
            self.on_proven()

    def may_claim(self) -> bool:
        return not self.fenced and self._clock.monotonic() - self.proven_at < self.within


class Heartbeat(Ticker):
    """Renews the engine's proof of life every period and tells each held attempt what its row says.
    A failed beat cancels no handler (the fence does, on its own clock); the base retries it."""

    name = "heartbeat"

    def __init__(
        self,
        period: float,
        proof: EngineProof,
        inflight: InFlight,
        beat: Callable[[EngineProof, Sequence[HeldLease], bool, Sequence[str]], Renewal],
        fence: Fence,
        supervisor: Supervisor,
        log: logging.Logger,
        clock: Clock,
        write_progress: Callable[[Sequence[HeldLease]], frozenset[str]] | None = None,
    ) -> None:
        super().__init__(period, log)
        self.backoff_base = self.period / 4  # a blip is retried soon, never slower than the period
        self.proof = proof
        self._write_progress = write_progress
        self._inflight = inflight
        self._beat = beat
        self.fence = fence
        self._supervisor = supervisor
        self._clock = clock
        self._beats = 0  # every ORPHAN_LOOK-th beat also looks for claims whose answer was lost

    def tick(self) -> None:
        attempts = self._inflight.held()
        dropped = self._inflight.dropped()
        # taken before the claims: a handler that ends in between is still named, never the reverse
        running = self._inflight.running_tokens()
        sent = self._clock.monotonic()
        leases, taken = self._leases(attempts)
        leases += [HeldLease(job_id, token, dropped=True) for token, job_id in dropped.items()]
        self._beats += 1
        try:
            renewal = self._beat(self.proof, leases, self._beats % ORPHAN_LOOK == 1, running)
        except BaseException:
            for a, progress in taken:  # kept for the next beat, unless newer values came meanwhile
                a.ctx.give_back_progress(progress)
            raise
        # A stall between two good beats longer than the proof holds fences before anything else.
        self.fence.check(attempts, sent)
        self._inflight.forget_dropped(t for t in dropped if t not in renewal.held)
        for token, job_id in renewal.orphans:  # claimed here, its answer lost: no attempt runs it
            if self._inflight.drop_orphan(token, job_id):
                self.log.warning(
                    "job id=%s: claimed by this engine but never run here; dropped for the reaper", job_id
                )
        for a in attempts:  # found held by a beat sent at *sent*: the claim is proven from then
            if a.row.claim_token in renewal.held:
                a.proven_at = max(a.proven_at, sent)
        for a, progress in taken:
            if a.row.claim_token in renewal.locked:  # not written this time: sent again
                a.ctx.give_back_progress(progress)
        for a in attempts:
            token = a.row.claim_token
            if token not in renewal.held and a.phase is Phase.RUNNING:
                s = self._supervisor
                (s.canceled if token in renewal.canceled else s.lease_lost)(a)
        # Claims fenced since the send are named by the next beat, at once, before any new claim.
        complete = self._inflight.dropped().keys() <= dropped.keys()
        self.fence.proven(sent, complete)
        self._progress([(a, p) for a, p in taken if a.row.claim_token in renewal.held - renewal.locked])
        if not complete:
            self.wake()

    def _progress(self, taken: list[tuple[Attempt, tuple[float | None, str | None]]]) -> None:
        """Write the progress of the claims still held, once the proof of life is recorded: a lock on
        the job table (an operator's CREATE INDEX) delays the progress, never the proof. What is not
        written is kept for the next beat."""
        if not taken or self._write_progress is None:
            return
        try:
            written = self._write_progress([HeldLease(a.id, a.row.claim_token, *p) for a, p in taken])
        except Exception as exc:
            self.log.info("heartbeat: progress not written now (%s); sent again with the next beat", exc)
            written = frozenset()
        for a, progress in taken:
            if a.row.claim_token not in written:
                a.ctx.give_back_progress(progress)

    @staticmethod
    def _leases(
        attempts: Sequence[Attempt],
    ) -> tuple[list[HeldLease], list[tuple[Attempt, tuple[float | None, str | None]]]]:
        """The claims to send, with the progress each handler reported since the last beat."""
        leases: list[HeldLease] = []
        taken: list[tuple[Attempt, tuple[float | None, str | None]]] = []
        for a in attempts:
            progress = a.ctx.take_progress()
            leases.append(HeldLease(a.id, a.row.claim_token, *(progress or (None, None))))
            if progress is not None:
                taken.append((a, progress))
        return leases, taken


class Watchdog(Ticker):
    """Each tick: the fence's check, then each running attempt's deadlines and hung verdict."""

    name = "watchdog"

    def __init__(
        self, inflight: InFlight, supervisor: Supervisor, fence: Fence, clock: Clock, log: logging.Logger
    ) -> None:
        super().__init__(WATCHDOG_TICK, log)
        self._inflight = inflight
        self._supervisor = supervisor
        self.fence = fence
        self._clock = clock

    def tick(self) -> None:
        now = self._clock.monotonic()
        self.fence.check(self._inflight.held(), now)
        s = self._supervisor
        for a in self._inflight.running():
            if a.phase is Phase.RUNNING:
                if now >= a.hard_deadline:
                    s.give_up(a)
                elif not a.ctx.done() and now >= a.soft_deadline:
                    s.timeout(a)
            cancelled = a.cancelled_at
            if (
                a.handler in (HandlerState.RUNNING, HandlerState.ABANDONED)
                and cancelled is not None
                and now - cancelled >= s.grace
            ):
                s.declare_hung(a)
