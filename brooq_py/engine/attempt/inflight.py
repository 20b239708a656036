"""InFlight: the attempts this engine holds claims for and the handlers still running (SPEC P1', P1'')."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from brooq_py.engine.attempt.attempt import Attempt
from brooq_py.engine.attempt.outcome import HandlerState
from brooq_py.queue.port import Outcome

# A cancel NOTIFY heard before its claim's attempt is held is kept this long.
CANCEL_MEMORY = 60.0


class InFlight:
    """Three views, one lock: ``held``, the claims the heartbeat reports on, by claim token (a job
    canceled and claimed again is two attempts); ``running``, handlers not ended, each end told once
    to *on_end*; ``dropped``, claims let go while their row may still be ours (hung, fenced). An
    attempt is held and started in one move (``add``): no other thread ever finds one held and not
    started, and a cancel is either told to the held attempt or kept for its hold (``cancel``)."""

    def __init__(
        self,
        on_end: Callable[[str], None] = lambda topic: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_end = on_end
        self._monotonic = monotonic
        # A handler ended after its claim was let go (canceled, taken back): the heartbeat, woken,
        # tells at once that it no longer runs (a canceled sequence member's hold ends, SPEC Q5).
        self.on_unheld_end: Callable[[], None] = lambda: None
        self._lock = threading.Lock()
        self._held: dict[str, Attempt] = {}
        self._running: set[Attempt] = set()
        self._latest: dict[str, Attempt] = {}  # job id -> its newest held attempt (each tells the one before)
        self._dropped: dict[str, str] = {}  # claim token -> job id
        # Claims whose answer came, not taken in yet (a claim of several statements goes on): no
        # beat names them, and none may call them never received (``drop_orphan``).
        self._received: set[str] = set()
        # Claims a beat named never received (``drop_orphan``), for the engine's life: the reaper may
        # have given the job to another engine, so an answer that comes after all (late, not lost) is
        # never taken in, however long after; ``forget_dropped`` leaves them here. Only claims whose
        # answer was lost or came over a lease late land here: a few in an engine's life.
        self._orphaned: set[str] = set()
        # Claim tokens canceled before their attempt was held (the NOTIFY comes on another
        # connection, maybe before the claim's answer): the hold finds them (``canceled_before``).
        self._canceled: dict[str, float] = {}
        self._closed = False  # the engine stops: the dispatcher's take-ins hold nothing more (``close``)

    def receive(self, tokens: Iterable[str]) -> None:
        """A claim statement answered with these claims: ours, to be taken in or handed back."""
        with self._lock:
            self._received.update(tokens)

    def unreceive(self, tokens: Iterable[str]) -> None:
        """These answered claims are handed back unrun."""
        with self._lock:
            self._received.difference_update(tokens)

    def add(self, a: Attempt, dispatched: bool = False) -> bool:
        """Hold *a*'s claim and start it (CLAIMED -> RUNNING) in one move; an attempt ended before
        (poisoned) is held, never started nor running. False, holding nothing, for the dispatcher's
        take-in once ``close``d, or when the claim was dropped before or named never received by a
        beat's orphan look (named for the reaper, it may run elsewhere already)."""
        with self._lock:
            self._received.discard(a.row.claim_token)
            closed = dispatched and self._closed
            if closed or a.row.claim_token in self._dropped or a.row.claim_token in self._orphaned:
                return False
            if a.ending is None:
                a.start()
                self._running.add(a)
            self._held[a.row.claim_token] = a
            self._latest[a.id] = a
            return True

    def close(self) -> None:
        """The engine stops: the dispatcher's ``add`` holds nothing from now on (a take-in stalled past
        the stop's wait for it hands its row back); what is held already is the stop's to end.
        ``run_once`` after a stop holds its own claims as before."""
        with self._lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def cancel(self, job_id: str, claim_token: str) -> Attempt | None:
        """The held attempt an operator's cancel of *job_id* under *claim_token* is for (the newest of
        the job without a token); None, keeping the token for a hold to come, when none is held."""
        with self._lock:
            a = self._held.get(claim_token) if claim_token else self._latest.get(job_id)
            if a is None and claim_token:
                now = self._monotonic()
                self._canceled[claim_token] = now
                if len(self._canceled) > 1000:  # cancels of other engines' claims: forgotten in time
                    self._canceled = {t: at for t, at in self._canceled.items() if now - at < CANCEL_MEMORY}
            return a

    def canceled_before(self, a: Attempt) -> bool:
        """Whether a cancel of *a*'s claim was heard before ``add`` held it (forgotten once asked)."""
        with self._lock:
            return self._canceled.pop(a.row.claim_token, None) is not None

    def held(self) -> list[Attempt]:
        with self._lock:
            return list(self._held.values())

    def running(self) -> list[Attempt]:
        with self._lock:
            return list(self._running)

    def running_tokens(self) -> list[str]:
        """The claim tokens of the handlers still running, held or not, but for those declared hung."""
        with self._lock:
            return [a.row.claim_token for a in self._running if a.handler is not HandlerState.HUNG]

    def by_token(self, claim_token: str) -> Attempt | None:
        """The held attempt of the claim *claim_token*, if any."""
        with self._lock:
            return self._held.get(claim_token)

    def taken(self, claim_token: str) -> Attempt | None:
        """The attempt of the claim *claim_token* held or still running, if any (one let go since its
        take-in, by a cancel say, still runs until its handler's start is checked)."""
        with self._lock:
            a = self._held.get(claim_token)
            return a or next((r for r in self._running if r.row.claim_token == claim_token), None)

    def latest(self, job_id: str) -> Attempt | None:
        """The newest held attempt of job *job_id*, if any."""
        with self._lock:
            return self._latest.get(job_id)

    def _forget(self, a: Attempt) -> None:
        if self._latest.get(a.id) is a:
            del self._latest[a.id]

    def drop_claim(self, claim_token: str, job_id: str) -> None:
        """Name the claim *claim_token* of *job_id* dropped until taken back (no attempt runs it)."""
        with self._lock:
            self._dropped[claim_token] = job_id

    def drop_orphan(self, claim_token: str, job_id: str) -> bool:
        """As ``drop_claim`` for a claim a beat did not send, unless its answer came (taken in since
        the beat's list was made, or still to be: a later beat names it); True when dropped. With
        ``receive`` and ``add`` under one lock: a claim is either run here or given to the reaper."""
        with self._lock:
            if claim_token in self._held or claim_token in self._received:
                return False
            self._dropped[claim_token] = job_id
            self._orphaned.add(claim_token)
            return True

    def drop(self, a: Attempt) -> bool:
        """Stop holding *a*'s claim; return False if it was no longer held."""
        with self._lock:
            if self._held.get(a.row.claim_token) is a:
                del self._held[a.row.claim_token]
                self._forget(a)
                return True
            return False

    def dropped(self) -> dict[str, str]:
        """The claims let go with their row still ours, by claim token (job id as value)."""
        with self._lock:
            return dict(self._dropped)

    def forget_dropped(self, tokens: Iterable[str]) -> None:
        """These dropped claims are no longer ours: nothing to name any more."""
        with self._lock:
            for t in tokens:
                self._dropped.pop(t, None)

    def drop_outcome(self, o: Outcome) -> Attempt | None:
        """Stop holding the lease an outcome write ended (matched by claim token)."""
        with self._lock:
            a = self._held.pop(o.claim_token, None)
            if a is not None:
                self._forget(a)
            return a

    def end(self, a: Attempt) -> None:
        """The handler's code ended."""
        with self._lock:  # told once per attempt, however often its end is recorded
            was = a in self._running
            self._running.discard(a)
            unheld = self._held.get(a.row.claim_token) is not a
        if was:
            self._on_end(a.topic)
            if unheld:
                self.on_unheld_end()

    def hung_count(self) -> int:
        with self._lock:
            return sum(1 for a in self._running if a.handler is HandlerState.HUNG and a.called)
