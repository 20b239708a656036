"""The Store's producer part: the enqueue plans driven on its pool or in a caller's transaction
(SPEC E1-E6, X1, D3, D6, F2, Q4')."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from brooq_py.contrib.otel import traced_enqueue
from brooq_py.postgres.enqueue import jobs as enqueueing
from brooq_py.postgres.enqueue import plans
from brooq_py.postgres.enqueue.plans import as_sequence
from brooq_py.postgres.enqueue.unique import FirstTries
from brooq_py.postgres.flow.caps import RoomWait, TopicCaps, checked_wait, no_wait_in_tx
from brooq_py.postgres.session.connections import Session
from brooq_py.postgres.session.errors import names_migration, translated
from brooq_py.postgres.session.tx import as_psycopg, drive, in_block, on_tx
from brooq_py.queue import EnqueueResult, GroupResult, Job, JobRow, QueueFull, State, Tx
from brooq_py.queue.claim import Parent

# The bounds of a periodic tick's transaction (sql/schedule_tick_bounds.sql): a session that stops
# between the advance and the commit holds the schedule's row 5 s at most, and an advance waits 1 s.
TICK_BOUNDS = {"lock": "1s", "statement": "10s", "idle": "5s"}


class Producer:
    """Enqueue, read and cancel jobs through *session*; *caps*: the depth caps its Store caches."""

    def __init__(self, session: Session, caps: TopicCaps) -> None:
        self.session = session
        self.schema = session.q.schema
        self._q = session.q
        self._caps = caps
        self._first_tries = FirstTries()  # which topics' new unique jobs try the plain insert first

    @traced_enqueue("job")
    @names_migration
    def enqueue(self, job: Job, *, wait: float | timedelta | None = None) -> EnqueueResult:
        """Enqueue *job* in its own autocommit statement; return its id and whether this call created
        it. Idempotent on (topic, key) for the life of the row; InvalidJob before anything is written.
        *wait*: a full topic (QueueFull) is waited on up to this long, one bounded probe of its room
        per step (SPEC F3), before QueueFull is raised."""
        if wait is None:  # QueueFull raised as the statement raised it, the caller's context kept
            return self.session.drive(
                "enqueueing", enqueueing.enqueue_own(self._q, job, self._caps, self._first_tries)
            )
        room = RoomWait(checked_wait(wait))
        while True:
            plan = enqueueing.enqueue_own(self._q, job, self._caps, self._first_tries)
            try:
                return self.session.drive("enqueueing", plan)
            except QueueFull as full:
                while True:
                    time.sleep(room.pause(full))
                    params = {"topic": full.topic, "cap": full.depth, "n": 1}
                    if self.session.run("probing a topic's room", self._q["topic_room"], params)[0][0]:
                        break

    @traced_enqueue("job")
    @names_migration
    def enqueue_tx(self, tx: Tx, job: Job, *, wait: float | timedelta | None = None) -> EnqueueResult:
        """Enqueue *job* inside the caller's transaction *tx* (a WrapTx, a psycopg Connection, or any
        object with ``execute(query, params)`` taking ``%(name)s`` parameters); the caller commits.
        A duplicate never aborts the transaction at READ COMMITTED (under REPEATABLE READ or
        SERIALIZABLE one whose key's row was written after the snapshot, by a concurrent enqueue or
        an engine's claim or settle of it, fails it, as any conflicting write does: retry it). An asyncio
        connection raises TypeError naming AsyncStore. *wait* is refused here (InvalidJob)."""
        no_wait_in_tx(wait)
        plan = enqueueing.enqueue_one(self._q, job, self._caps)
        with translated("enqueueing", as_psycopg(tx)):
            return drive(plan, on_tx(tx))

    @traced_enqueue("jobs")
    @names_migration
    def enqueue_many(self, jobs: Iterable[Job], tx: Tx | None = None) -> list[EnqueueResult]:
        """Enqueue *jobs* (any iterable) in one statement, in *tx* when given; results in input order.
        One bad job refuses the batch (InvalidJob, nothing written); a key repeated inside it creates
        one job."""
        jobs = as_sequence(jobs)
        run = on_tx(tx) if tx is not None else None  # a wrong tx is refused even for no jobs
        plan = enqueueing.enqueue_many(self._q, jobs, self._caps)
        if not jobs:
            return []
        if run is None:
            return self.session.drive("enqueueing a batch", plan)
        with translated("enqueueing a batch", as_psycopg(tx)):
            return drive(plan, run)

    @traced_enqueue("jobs", "then", "finally_")
    def enqueue_group(
        self,
        jobs: Sequence[Job] | Mapping[str, Job],
        then: Job | None = None,
        tx: Tx | None = None,
        *,
        finally_: Job | None = None,
    ) -> GroupResult:
        """Enqueue *jobs*, then *then* waiting for every one of them (and its own parents), and
        *finally_* waiting for every one of them to end in any state, in one transaction: *tx*, else
        one of its own on the pool. A mapping names the jobs (``Claim.parent_results(by="name")``).
        InvalidJob before anything is written."""
        run = on_tx(tx) if tx is not None else None
        plan = enqueueing.enqueue_group(self._q, jobs, then, self._caps, finally_)
        with translated("enqueueing a group"):
            if run is not None:
                return drive(plan, run)
            with self.session.begin() as own:
                return drive(plan, on_tx(own))

    def enqueue_tick(self, schedule: str, tick: datetime, job: Job) -> EnqueueResult | None:
        """Enqueue *job* as *tick* of *schedule* in the transaction that advances the schedule's last
        tick to it; None when the tick was not ahead (enqueued already, its job maybe gone since)."""
        plan = enqueueing.enqueue_one(self._q, job, self._caps)
        with self.session.begin() as tx:
            run = on_tx(tx)
            run(self._q["schedule_tick_bounds"], TICK_BOUNDS)
            if not run(self._q["schedule_tick_advance"], {"name": schedule, "tick": tick}):
                return None
            return drive(plan, run)

    def parents(self, job_id: str) -> list[Parent]:
        """Each parent of *job_id* in the order it names them, with its result, state and name, in
        one statement (``Claim.parent_results``, ``Claim.parent_states``)."""
        rows = self.session.run(
            "reading parent results", self._q["job_parent_results"], {"id": uuid.UUID(job_id)}
        )
        return [Parent(str(r[0]), r[3], State(r[2]), r[1]) for r in rows]

    def parent_results(self, job_id: str) -> dict[str, Any]:
        """Each parent's result of *job_id* by parent id, in one statement."""
        return {p.id: p.result for p in self.parents(job_id)}

    def cancel(self, job_id: str) -> bool:
        """Cancel a pending, scheduled, failed, blocked or processing job, and its blocked descendants;
        False for terminal, unknown or malformed ids (never an error)."""
        return self.session.drive("canceling a job", plans.by_id(self._q["job_cancel"], job_id))

    def signal(self, job_id: str, name: str, payload: Any = None, tx: Tx | None = None) -> bool:
        """Record the signal *name* for the job, in *tx* when given, and wake it if it waits for it
        (SPEC DS4); False when that name was signalled already or the job has ended. Its row is
        read, never locked: the caller's transaction never waits on it nor aborts for it (in a
        transaction block the insert runs in a savepoint, see ``plans.signal``)."""
        if tx is None:
            return self.session.drive("signalling a job", plans.signal(self._q, job_id, name, payload))
        conn = as_psycopg(tx)
        plan = plans.signal(self._q, job_id, name, payload, savepoint=in_block(conn))
        with translated("signalling a job", conn):
            return drive(plan, on_tx(tx))

    def get(self, job_id: str) -> JobRow | None:
        """Return the job's row; None for an unknown or malformed id."""
        return self.session.drive("reading a job", plans.get(self._q, job_id))

    def get_tx(self, tx: Tx, job_id: str) -> JobRow | None:
        """Return the job's row as the caller's transaction *tx* sees it; None for an unknown or malformed id."""
        with translated("reading a job", as_psycopg(tx)):
            return drive(plans.get(self._q, job_id), on_tx(tx))

    def next_retry(self, topics: Sequence[str]) -> float | None:
        """Seconds until the earliest failed job of *topics* is retried (<= 0: due; None: none waits)."""
        if not topics:
            return None
        rows = self.session.run("reading the next retry", self._q["job_next_retry"], {"topics": list(topics)})
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def due_now(self, topics: Sequence[str]) -> None:
        """Make the scheduled and failed jobs of *topics* due at once (a test's drain skips their wait)."""
        if topics:
            self.session.run("making jobs due", self._q["job_due_now"], {"topics": list(topics)})
