"""Intake: from a claim to attempts under way, the first rooms an attempt walks through.

The dispatcher asks it to ``claim`` rows (within each topic's room), then to
``launch_all`` of them: each row becomes an Attempt, held in the in-flight
set and started, on a slot the dispatcher counted free, and the runner takes
it from there. A row that must not run (a poisoned one, one of an unknown
topic, one claimed while the engine stops) ends here: dead, or handed back.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from brooq_py.engine.attempt.attempt import Attempt, Kind, Phase
from brooq_py.engine.attempt.capacity import Capacity, CountingInFlight
from brooq_py.engine.attempt.outcome import Ending, decide
from brooq_py.engine.attempt.runner import Runner
from brooq_py.engine.attempt.slots import SlotPool
from brooq_py.engine.clock import Clock
from brooq_py.engine.config import Config
from brooq_py.engine.metrics import Metrics
from brooq_py.engine.repo import ClaimedJob, Repo
from brooq_py.queue import Context


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
        metrics: Metrics,
        clock: Clock,
        worker_id: str,
        log: logging.Logger,
    ) -> None:
        self.repo = repo
        self.config = config
        self.kinds = kinds
        self.capacity = capacity
        self.inflight = inflight
        self.runner = runner
        self.metrics = metrics
        self.clock = clock
        self.worker_id = worker_id
        self.log = log
        self.slots: SlotPool | None = None  # the engine's, from start()

    def claim(self, limit: int) -> list[ClaimedJob]:
        if not self.kinds:
            return []
        rows = self.capacity.claim(self.repo, list(self.kinds), limit, self.worker_id, self.config.lease_td)
        for topic, n in Counter(r.topic for r in rows).items():  # one counter update per topic a claim
            self.metrics.child(self.metrics.claimed, topic).inc(n)
        events = self.runner.events
        if events is not None and events.active:
            for r in rows:
                events.emit("claimed", r.id, r.topic, r.attempts)
        return rows

    def open(self, row: ClaimedJob) -> Attempt | None:
        """Build, hold and start the attempt of a claimed row; None when it must not run.

        A row of an unregistered topic (cannot happen: claims name only our
        topics) is handed back unrun; a poisoned row (attempts past
        max_attempts, SPEC L5) ends dead without running.
        """
        kind = self.kinds.get(row.topic)
        if kind is None:
            self.log.error(
                "engine: claimed job id=%s of unregistered topic %r; handing it back", row.id, row.topic
            )
            self.hand_back([row])
            return None
        ctx = Context(deadline=self.clock.now() + kind.options.td("attempt_timeout"))
        a = Attempt(row, kind, self.clock.monotonic(), ctx, parents=self.repo.parent_results)
        self.inflight.add(a)
        if row.attempts > kind.options.max_attempts:
            a.end(Phase.POISONED)
            self.inflight.end(a)
            self.log.error(
                "job id=%s topic=%s: claimed for attempt %d of %d: earlier attempts hung or died "
                "without an outcome; not run again, dead (L5)",
                row.id,
                row.topic,
                row.attempts,
                kind.options.max_attempts,
            )
            self.runner.settle(a)
            return None
        clock = self.clock

        def mark(_cause: BaseException) -> None:
            a.cancelled_at = clock.monotonic()

        ctx.add_callback(mark)
        a.start()
        return a

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
