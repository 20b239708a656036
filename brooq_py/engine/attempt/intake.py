"""Intake: from a claim to attempts under way, the first rooms an attempt walks through.

The dispatcher asks it to ``claim`` rows (within each topic's room), then to
``launch_all`` of them: each row becomes an Attempt, held in the in-flight
set and started, on a slot the dispatcher counted free, and the runner takes
it from there. A row that must not run (a poisoned one, one of an unknown
topic, one claimed while the engine stops) ends here: dead, or handed back.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence

from brooq_py.engine.attempt.attempt import Attempt, Hooks, Kind, Phase
from brooq_py.engine.attempt.capacity import Capacity, CountingInFlight
from brooq_py.engine.attempt.handover import Handover
from brooq_py.engine.attempt.outcome import POISON_ERROR, Ending, decide
from brooq_py.engine.attempt.runner import Runner
from brooq_py.engine.attempt.slots import SlotPool
from brooq_py.engine.attempt.supervisor import Supervisor
from brooq_py.engine.clock import Clock
from brooq_py.engine.config import Config
from brooq_py.engine.metrics import Metrics
from brooq_py.queue import Context
from brooq_py.queue.port import ClaimedJob, Repo

# A cancel NOTIFY that arrives before its claim's attempt is built is kept this long (X2').
CANCEL_MEMORY = 60.0


def poison(row: ClaimedJob, max_crashes: int, max_attempts: int) -> str | None:
    """Why *row* must not run again but end dead (SPEC L5'), or None. A crash gives its attempt
    back, so attempts past max_attempts come only from rows an older release reaped."""
    if row.crashes >= max_crashes:
        return POISON_ERROR.format(crashes=row.crashes)
    if row.attempts > max_attempts:
        return (
            f"claimed for attempt {row.attempts} of {max_attempts}: earlier attempts ended without an outcome"
        )
    return None


class Intake:
    """Claims rows of the registered topics (*kinds*, the engine's own dict) and starts their attempts."""

    def __init__(
        self,
        repo: Repo,
        config: Config,
        kinds: dict[str, Kind],
        capacity: Capacity,
        inflight: CountingInFlight,
        runner: Runner,
        handover: Handover,
        hooks: Hooks,
        metrics: Metrics,
        clock: Clock,
        worker_id: str,
        log: logging.Logger,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.repo = repo
        self.config = config
        self.kinds = kinds
        self.capacity = capacity
        self.inflight = inflight
        self.runner = runner
        self.handover = handover
        self.hooks = hooks
        self.metrics = metrics
        self.clock = clock
        self.worker_id = worker_id
        self.log = log
        self.slots: SlotPool | None = None  # the engine's, from start()
        self.supervisor = supervisor
        # Claim tokens canceled while no attempt of ours held them yet: a claim's answer and its
        # cancel's NOTIFY travel on different connections (X2').
        self._canceled: dict[str, float] = {}
        self._canceled_lock = threading.Lock()

    def claim(self, limit: int) -> list[ClaimedJob]:
        if not self.kinds:
            return []
        rows = self.capacity.claim(self.repo, list(self.kinds), limit, self.worker_id, self.config.lease_td)
        for topic, n in Counter(r.topic for r in rows).items():  # one counter update per topic a claim
            self.metrics.child(self.metrics.claimed, topic).inc(n)
        events = self.handover.events
        if events is not None and events.active:
            for r in rows:
                events.emit("claimed", r.id, r.topic, r.attempts)
        return rows

    def open(self, row: ClaimedJob) -> Attempt | None:
        """Build, hold and start the attempt of a claimed row; None when it must not run.

        A row of an unregistered topic (cannot happen: claims name only our
        topics) is handed back unrun; a poisoned row (``max_crashes`` engines stopped
        while running it, SPEC L5') ends dead without running.
        """
        kind = self.kinds.get(row.topic)
        if kind is None:
            self.log.error(
                "engine: claimed job id=%s of unregistered topic %r; handing it back", row.id, row.topic
            )
            self.hand_back([row])
            return None
        ctx = Context(deadline=self.clock.now() + kind.options.td("attempt_timeout"))
        a = Attempt(
            row, kind, self.clock.monotonic(), ctx, parents=self.repo.parent_results, hooks=self.hooks
        )
        older = self.inflight.latest(row.id)
        if older is not None and older.row.claim_token != row.claim_token and self.supervisor is not None:
            # Claimed again under a new token (canceled and retried, or reaped): the older attempt
            # is no longer the row's; tell it now, not at its next renewal (P1').
            self.supervisor.lease_lost(older)
        self.inflight.add(a)
        why = poison(row, kind.options.max_crashes, kind.options.max_attempts)
        if why is not None:
            self.log.error("job id=%s topic=%s: %s (L5')", row.id, row.topic, why)
            self.handover.settle(a, a.poisoned(why))
            return None
        clock = self.clock

        def mark(_cause: BaseException) -> None:
            a.cancelled_at = clock.monotonic()

        ctx.add_callback(mark)
        a.start()
        if self._was_canceled(row.claim_token) and self.supervisor is not None:
            self.supervisor.canceled(a)
        return a

    def on_cancel(self, job_id: str, claim_token: str) -> None:
        """A processing job was canceled (the cancel channel's NOTIFY): tell the attempt holding that
        claim at once with ``JobCanceledByOperator`` (X2'); remember a claim not held yet."""
        a = self.inflight.by_token(claim_token) if claim_token else self.inflight.latest(job_id)
        if a is not None:
            if self.supervisor is not None:
                self.supervisor.canceled(a)
            return
        if not claim_token:
            return
        now = self.clock.monotonic()
        with self._canceled_lock:
            self._canceled[claim_token] = now
            if len(self._canceled) > 1000:
                self._canceled = {t: at for t, at in self._canceled.items() if now - at < CANCEL_MEMORY}

    def _was_canceled(self, claim_token: str) -> bool:
        if not self._canceled:
            return False
        with self._canceled_lock:
            return self._canceled.pop(claim_token, None) is not None

    def launch_all(self, rows: Sequence[ClaimedJob]) -> None:
        """Start the attempts of a claim's rows, each on a slot the dispatcher counted free."""
        assert self.slots is not None
        attempts = []
        for row in rows:
            a = self.open(row)
            if a is not None:
                self.slots.take()
                attempts.append(a)
        self.runner.launch_many(attempts)

    def hand_back(self, rows: list[ClaimedJob]) -> None:
        """Give claimed rows back unrun (pending, attempt given back): the engine stops or cannot run them."""
        outcomes = []
        for row in rows:
            kind = self.kinds.get(row.topic)
            options = kind.options if kind is not None else self.config.kind_defaults()
            outcome = decide(
                id=row.id,
                claim_token=row.claim_token,
                topic=row.topic,
                attempt=row.attempts,
                options=options,
                ending=Ending(Phase.UNRUN),
            )
            if outcome is not None:
                outcomes.append(outcome)
        try:
            self.repo.settle_many(outcomes)
        except Exception as exc:
            self.log.warning(
                "engine: handing back %d claimed rows failed (%s); the reaper returns them", len(rows), exc
            )
