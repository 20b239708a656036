"""The Store's operator actions and reads: retry, pause and resume, set_limit, list, overview (SPEC Q1-Q3)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

from brooq_py.postgres.enqueue.plans import by_id
from brooq_py.postgres.enqueue.plans import list_jobs as list_plan
from brooq_py.postgres.flow.limits import (
    LIMIT_WAIT,
    checked_limit,
    checked_topic,
    rate_text,
    refusal_text,
    setting_of,
    until,
)
from brooq_py.postgres.session.connections import PoolSide
from brooq_py.postgres.session.statements import Queries, parse_id
from brooq_py.postgres.session.tx import on_connection
from brooq_py.postgres.worker.repo import claimed_jobs
from brooq_py.queue import JobRow
from brooq_py.queue.port import LimitedClaim, TopicSetting

__all__ = ["OperatorSide", "TopicOverview", "TopicSetting"]


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

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "counts": self.counts,
            "oldest_ready_seconds": self.oldest_ready_seconds,
            "paused": self.paused,
            "limit": self.limit,
            "rate": self.rate,
            "tokens": self.tokens,
            "max_depth": self.max_depth,
        }


class OperatorSide(PoolSide):
    """Mixin of Store: the operator's controls, one named SQL file each."""

    _q: Queries

    def retry(self, job_id: str) -> bool:
        """Put a dead or canceled job back to pending: attempts 0, due now, last_error kept (SPEC Q1).

        Wake the engines of its topic. Return False for any other state and for
        unknown or malformed ids.
        """
        try:
            done: bool = self._drive("retrying a job", by_id(self._q["job_retry"], job_id))
        except psycopg.errors.UniqueViolation:
            return False  # an active holder of its unique key committed meanwhile (SPEC U3)
        return done

    def retry_refusal(self, job_id: str) -> str | None:
        """Say why ``retry(job_id)`` changes nothing now, or None when it would retry the job."""
        parsed = parse_id(job_id)
        if parsed is None:
            return f"{job_id!r} is not a job id"
        rows = self._run("reading a job", self._q["job_retry_refusal"], {"id": parsed})
        return refusal_text(job_id, rows)

    def list_jobs(
        self, topic: str | None = None, state: str | None = None, limit: int = 50, *, payload: Any = None
    ) -> list[JobRow]:
        """The newest jobs first (by id: UUIDv7), of *topic* and in *state* when given; at most *limit*.

        *payload* (None: any) keeps the jobs whose payload contains it (jsonb ``@>``, a subset
        match); a value that is not JSON raises ``InvalidJob``.
        """
        plan = list_plan(self._q, None if topic is None else checked_topic(topic), state, limit, payload)
        rows: list[JobRow] = self._drive("listing jobs", plan)
        return rows

    def pause(self, topic: str) -> None:
        """Pause *topic*: no engine claims it from its next claim on; running jobs finish (SPEC Q2)."""
        self._run("pausing a topic", self._q["topic_pause"], {"topic": checked_topic(topic)})

    def resume(self, topic: str) -> None:
        """Resume *topic* and wake the engines that run it (SPEC Q2)."""
        self._run("resuming a topic", self._q["topic_resume"], {"topic": checked_topic(topic)})

    def forget_topic(self, topic: str) -> bool:
        """Remove *topic*'s settings (pause, limit): it runs as if never touched. True if it had some."""
        rows = self._run(
            "forgetting a topic's settings", self._q["topic_forget"], {"topic": checked_topic(topic)}
        )
        return bool(rows)

    def topic_active(self, topic: str) -> bool:
        """Whether *topic* has a job waiting (pending, scheduled, failed) or processing."""
        rows = self._run(
            "looking for a topic's jobs", self._q["topic_active"], {"topic": checked_topic(topic)}
        )
        return bool(rows[0][0])

    def pending_topics_besides(self, topics: Sequence[str]) -> list[str]:
        """The topics with pending jobs other than *topics* (at most 100), by name."""
        rows = self._run(
            "reading the pending topics", self._q["topic_pending_others"], {"topics": list(topics)}
        )
        return [str(r[0]) for r in rows]

    def paused(self) -> set[str]:
        """Return the paused topics."""
        return {s.topic for s in self.topic_settings() if s.paused}

    def set_limit(self, topic: str, limit: int | None) -> None:
        """Cap *topic* at *limit* jobs processing at once across every engine; None removes the cap (SPEC Q3).

        Raise ValueError for a limit that is not None or an integer from 0 to 2**31-1.
        """
        params = {"topic": checked_topic(topic), "limit": checked_limit(limit)}
        if params["limit"] is None:
            self._run("setting a topic's limit", self._q["topic_set_limit"], params)
            return
        # A claim that ran while the topic was unlimited may still commit rows of it: a limited
        # claim that counted before they did would add on top. So a topic limited for the first
        # time is held at limit 0 until the job table's writers begun before that have ended
        # (bounded), then given its limit. Plain transactions only: safe behind a pooling proxy.
        with self._autocommit("setting a topic's limit") as conn:
            run = on_connection(conn)
            if run(self._q["topic_limit_hold"], params):
                writers = run(self._q["topic_limit_writers"], {"schema": self._q.schema})
                if writers:
                    left = {"pids": [w[0] for w in writers], "starts": [w[1] for w in writers]}
                    until(lambda: run(self._q["topic_limit_writers_left"], left)[0][0] == 0, LIMIT_WAIT)
            run(self._q["topic_set_limit"], params)

    def topic_settings(self) -> list[TopicSetting]:
        """Return every topic an operator has paused or limited, by name."""
        rows = self._run("reading topic settings", self._q["topic_settings"], {})
        return [setting_of(r) for r in rows]

    def topic_overview(self) -> list[TopicOverview]:
        """Every topic with jobs or settings: jobs per state, oldest ready age, paused, limit.

        Reads the whole job table (one grouped scan): an operator's command, not a scrape.
        """
        rows = self._run("reading topics", self._q["topic_overview"], {})
        return [
            TopicOverview(
                topic=r[0],
                counts={str(k): int(v) for k, v in (r[1] or {}).items()},
                oldest_ready_seconds=max(0.0, float(r[2] or 0.0)),
                paused=bool(r[3]),
                limit=r[4],
                rate=rate_text(r[5], r[6], r[7]),
                tokens=None if r[8] is None else float(r[8]),
                max_depth=r[9],
            )
            for r in rows
        ]

    def claim_limited(self, topic: str, limit: int, worker: str, lease: timedelta) -> LimitedClaim:
        """Claim up to *limit* jobs of a globally limited or rate-limited *topic*, never beyond its
        limit nor its tokens (SPEC Q3, F1); ``next_token_in`` says when its next token is due once
        they ran out.

        One READ COMMITTED transaction: the topic's transaction-scoped advisory
        lock first, then the claim, whose snapshot (taken once the lock is held)
        counts every committed processing row of the topic. The lock is tried,
        never waited for: when another transaction holds it, nothing is claimed
        this time. A topic that is paused or no longer limited yields nothing.
        """
        if limit < 1:
            return LimitedClaim()
        params = {"topic": topic, "limit": limit, "worker": worker, "lease": lease}
        with self._autocommit("claiming a limited topic") as conn, _read_committed(conn):
            run = on_connection(conn)
            with conn.transaction():
                if not run(self._q["topic_claim_lock"], {"topic": topic})[0][0]:
                    busy = LimitedClaim()  # another claim of the topic holds the lock: nothing this time
                    busy.busy = True
                    return busy
                rows = run(self._q["job_claim_limited"], params)
        got = LimitedClaim(claimed_jobs([r for r in rows if r[0] is not None]))
        got.next_token_in = rows[0][10] if rows else None
        return got


@contextmanager
def _read_committed(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Run the transactions inside at READ COMMITTED, whatever the pool's own setting."""
    saved = conn.isolation_level
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    try:
        yield
    finally:
        if not conn.closed:
            with suppress(psycopg.Error):  # a broken connection: the pool discards it
                conn.isolation_level = saved
