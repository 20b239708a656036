"""The Store's operator actions and reads: retry, list, the topics (SPEC Q1, O3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from brooq_py.postgres.enqueue.plans import list_jobs as list_plan
from brooq_py.postgres.enqueue.plans import retry
from brooq_py.postgres.flow.limits import checked_topic, rate_text
from brooq_py.postgres.session.connections import Session
from brooq_py.postgres.session.statements import parse_id
from brooq_py.queue import Job, JobRow
from brooq_py.queue.job import check_tenant

__all__ = ["Operator", "TopicOverview", "sequence_params", "topic_overview_of"]


def sequence_params(topic: str, sequence: str) -> dict[str, str]:
    """The parameters of ``job_sequence_resume``; InvalidJob for what no job could carry."""
    Job(topic, sequence=sequence)  # the same checks as a job's (InvalidJob)
    return {"topic": topic, "sequence": sequence}


@dataclass(frozen=True)
class TopicOverview:
    """One topic as the operator sees it: jobs per state, oldest ready age, paused, limit."""

    topic: str
    counts: dict[str, int]
    oldest_ready_seconds: float
    paused: bool
    limit: int | None
    rate: str | None = None  # "10/1s (burst 10)"; None: no rate limit
    tokens: float | None = None  # rate tokens left now
    max_depth: int | None = None
    tenants_waiting: int | None = None  # SPEC T1; None: no job of the topic names a tenant

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Operator:
    """The Store's operator part: retry jobs, list them, read the topics."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._q = session.q

    def retry(self, job_id: str) -> bool:
        """Put a dead or canceled job back to pending (attempts 0, due now, last_error kept) and wake
        the engines of its topic; False for any other state and for unknown or malformed ids."""
        return self.session.drive("retrying a job", retry(self._q, job_id), whole=True)

    def resume_sequence(self, topic: str, sequence: str) -> bool:
        """Release the sequence halted behind a dead member (which stays dead): the next member runs
        (SPEC Q5). False when it was not halted."""
        params = sequence_params(topic, sequence)
        rows = self.session.run("resuming a sequence", self._q["job_sequence_resume"], params)
        return bool(rows and rows[0][0])

    def retry_refusal(self, job_id: str) -> str | None:
        """Say why ``retry(job_id)`` changes nothing now, or None when it would retry the job."""
        parsed = parse_id(job_id)
        if parsed is None:
            return f"{job_id!r} is not a job id"
        rows = self.session.run("reading a job", self._q["job_retry_refusal"], {"id": parsed})
        return refusal_text(job_id, rows)

    def list_jobs(
        self,
        topic: str | None = None,
        state: str | None = None,
        limit: int = 50,
        *,
        payload: Any = None,
        tenant: str | None = None,
    ) -> list[JobRow]:
        """The newest jobs first, of *topic* and in *state* when given, at most *limit*, whose payload
        contains *payload* (jsonb ``@>``, a subset match; None: any; not JSON: ``InvalidJob``), of *tenant*
        when given (SPEC T1)."""
        check_tenant(tenant)
        plan = list_plan(
            self._q, None if topic is None else checked_topic(topic), state, limit, payload, tenant
        )
        return self.session.drive("listing jobs", plan)

    def topic_active(self, topic: str) -> bool:
        """Whether *topic* has a job waiting (pending, scheduled, failed) or processing."""
        params = {"topic": checked_topic(topic)}
        return bool(self.session.run("looking for a topic's jobs", self._q["topic_active"], params)[0][0])

    def pending_topics_besides(self, topics: Sequence[str]) -> list[str]:
        """The topics with pending jobs other than *topics* (at most 100), by name."""
        params = {"topics": list(topics)}
        rows = self.session.run("reading the pending topics", self._q["topic_pending_others"], params)
        return [str(r[0]) for r in rows]

    def topic_overview(self) -> list[TopicOverview]:
        """Every topic with jobs or settings: jobs per state, oldest ready age, paused, limit (one
        grouped scan of the whole table: an operator's command, not a scrape)."""
        rows = self.session.run("reading topics", self._q["topic_overview"], {})
        return [topic_overview_of(r) for r in rows]


def topic_overview_of(r: tuple[Any, ...]) -> TopicOverview:
    """A row of ``topic_overview`` as a TopicOverview."""
    return TopicOverview(
        topic=r[0],
        counts={str(k): int(v) for k, v in (r[1] or {}).items()},
        oldest_ready_seconds=max(0.0, float(r[2] or 0.0)),
        paused=bool(r[3]),
        limit=r[4],
        rate=rate_text(r[5], r[6], r[7]),
        tokens=None if r[8] is None else float(r[8]),
        max_depth=r[9],
        tenants_waiting=r[10],
    )


def refusal_text(job_id: str, rows: list[tuple[Any, ...]]) -> str | None:
    """Why a retry changes nothing, from the row of ``job_retry_refusal``; None when it would retry."""
    if not rows:
        return f"no job {job_id}"
    state, holder, unique_key, parent, unapplied = rows[0]
    if state not in ("dead", "canceled"):
        return f"job {job_id} is {state}: only dead or canceled jobs can be retried"
    if holder is not None:
        return f"job {holder} is active with the same unique key {unique_key!r}: retry refused"
    if parent is not None:  # a deleted parent cannot be retried
        retry = "" if parent.endswith(" no longer exists") else " (retry the parent first)"
        return f"its parent {parent}: a job runs only after its parents are done{retry}"
    if unapplied is not None:
        return (
            f"its end is not yet applied to its child {unapplied} (whose row another transaction "
            "held): the engines' next sweep applies it; retry then"
        )
    return None
