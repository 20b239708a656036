"""InFlight: the attempts this engine holds leases for and the handlers still running."""

from __future__ import annotations

import threading

from brooq_py.engine.attempt.attempt import Attempt, HandlerState
from brooq_py.engine.clock import Clock
from brooq_py.engine.repo import Outcome


class InFlight:
    """Two views, one lock.

    ``held``: leases the heartbeat renews, keyed by claim token (never by job
    id: a job canceled and claimed again at once is two attempts, SPEC P1'), from
    the start of an attempt until its ending is settled (an outcome written, the
    lease lost, or nothing to write). ``running``: attempts whose handler has not
    ended, including ones the engine gave up on or called hung.
    """

    def __init__(self, lease_seconds: float, clock: Clock) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Attempt] = {}
        self._running: set[Attempt] = set()
        self._latest: dict[str, Attempt] = {}  # job id -> its newest held attempt (each tells the one before)
        self.lease = lease_seconds
        self._clock = clock

    def add(self, a: Attempt) -> None:
        with self._lock:
            self._held[a.row.claim_token] = a
            self._latest[a.id] = a
            self._running.add(a)

    def held(self) -> list[Attempt]:
        with self._lock:
            return list(self._held.values())

    def running(self) -> list[Attempt]:
        with self._lock:
            return list(self._running)

    def by_token(self, claim_token: str) -> Attempt | None:
        """The held attempt of the claim *claim_token*, if any."""
        with self._lock:
            return self._held.get(claim_token)

    def latest(self, job_id: str) -> Attempt | None:
        """The newest held attempt of job *job_id*, if any."""
        with self._lock:
            return self._latest.get(job_id)

    def _forget(self, a: Attempt) -> None:
        if self._latest.get(a.id) is a:
            del self._latest[a.id]

    def held_count(self) -> int:
        with self._lock:
            return len(self._held)

    def drop(self, a: Attempt) -> bool:
        """Stop holding *a*'s lease; return False if it was no longer held."""
        with self._lock:
            if self._held.get(a.row.claim_token) is a:
                del self._held[a.row.claim_token]
                self._forget(a)
                return True
            return False

    def holds(self, a: Attempt) -> bool:
        with self._lock:
            return self._held.get(a.row.claim_token) is a

    def drop_outcome(self, o: Outcome) -> Attempt | None:
        """Stop holding the lease an outcome write ended (matched by claim token)."""
        with self._lock:
            a = self._held.pop(o.claim_token, None)
            if a is not None:
                self._forget(a)
            return a

    def fresh(self, a: Attempt) -> bool:
        """Whether the database confirmed *a*'s lease less than a lease ago (L4, L6)."""
        return self._clock.monotonic() - a.renewed_at < self.lease

    def still_held(self, o: Outcome) -> bool:
        """Whether an unwritten outcome may still be written: its lease is held and fresh (L6)."""
        with self._lock:
            a = self._held.get(o.claim_token)
        return a is not None and self.fresh(a)

    def end(self, a: Attempt) -> None:
        """The handler's code returned."""
        with self._lock:
            self._running.discard(a)

    def hung_count(self) -> int:
        with self._lock:
            return sum(1 for a in self._running if a.handler is HandlerState.HUNG)
