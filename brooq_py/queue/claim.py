"""Claim: a claimed job as its handler sees it (SPEC D4)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from brooq_py.queue.errors import BrooqError
from brooq_py.queue.job import Job, Lease
from brooq_py.queue.tx import Tx


class Claim:
    """A claimed job: its identity, decoded payload, attempt and lease.

    ``chain`` and ``on_succeeded`` collect work for the transaction that records
    this job as done; nothing of it runs unless the job ends done.
    """

    __slots__ = (
        "_callbacks",
        "_chained",
        "_parents",
        "attempt",
        "claim_token",
        "id",
        "lease",
        "max_attempts",
        "meta",
        "payload",
        "priority",
        "topic",
    )

    def __init__(
        self,
        *,
        id: str,
        topic: str,
        payload: Any,
        attempt: int,
        max_attempts: int,
        lease: Lease,
        claim_token: str = "",
        priority: int = 0,
        parents: Callable[[str], dict[str, Any]] | None = None,
        meta: Mapping[str, str] | None = None,
    ) -> None:
        self.id = id
        self.topic = topic
        self.payload = payload
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.lease = lease
        self.claim_token = claim_token
        self.priority = priority
        self._chained: list[Job] = []
        self._callbacks: list[Callable[[Tx], None]] = []
        self._parents = parents
        self.meta: Mapping[str, str] = meta or {}
        """``Job.meta`` as enqueued (tracing's ``traceparent`` among it); empty when none."""

    def parent_results(self) -> dict[str, Any]:
        """Each parent's result (``Job.after``) by parent id, in one statement; empty without parents.

        Raise BrooqError for a Claim made without a store to read from.
        """
        if self._parents is None:
            raise BrooqError("this Claim has no store to read its parents' results from")
        return self._parents(self.id)

    def chain(self, job: Job) -> None:
        """Enqueue *job* in the transaction that records this job as done; bad input raises at once
        (``InvalidJob``, ``TypeError`` for a non-Job)."""
        if not isinstance(job, Job):
            raise TypeError(f"chain() takes a Job, got {type(job).__name__}")
        job.payload_json()  # refuse bad payloads now, in the handler, not at closing
        self._chained.append(job)

    def on_succeeded(self, fn: Callable[[Tx], None]) -> None:
        """Run ``fn(tx)`` inside the transaction that records this job as done; if *fn* raises, it
        rolls back and the attempt is recorded as failed."""
        if not callable(fn):
            raise TypeError("on_succeeded() takes a callable fn(tx)")
        self._callbacks.append(fn)

    @property
    def chained(self) -> tuple[Job, ...]:
        return tuple(self._chained)

    @property
    def callbacks(self) -> tuple[Callable[[Tx], None], ...]:
        return tuple(self._callbacks)

    @property
    def has_closing_work(self) -> bool:
        """True when success must close in its own transaction (chain/on_succeeded)."""
        return bool(self._chained or self._callbacks)

    def __repr__(self) -> str:
        return f"Claim(id={self.id!r}, topic={self.topic!r}, attempt={self.attempt}/{self.max_attempts})"
