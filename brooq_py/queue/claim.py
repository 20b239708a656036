"""Claim: a claimed job as its handler sees it (SPEC D4, BD2, BD3)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple

from brooq_py.queue.errors import BrooqError
from brooq_py.queue.job import Job, Lease, State
from brooq_py.queue.tx import Tx


class Parent(NamedTuple):
    """One parent of a job as read for its handler: id, the name its group gave it (None for
    none), its state and its result."""

    id: str
    name: str | None
    state: State
    result: Any


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
        parents: Callable[[str], list[Parent]] | None = None,
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

    def parent_results(self, by: Literal["id", "name", "order"] = "id") -> dict[str, Any] | list[Any]:
        """Each parent's result (``Job.after`` and its group), in one statement; empty without parents.

        ``by="id"``: a dict by parent id; ``by="name"``: a dict by the names ``enqueue_group`` was
        given (a parent without a name, such as one of the job's own ``after``, under its id);
        ``by="order"``: a list in the order the job names its parents (its own ``after``, then
        its group in group order). Raise ValueError for another *by*, BrooqError for a Claim made
        without a store to read from.
        """
        if by not in ("id", "name", "order"):
            raise ValueError(f"parent_results: by must be 'id', 'name' or 'order', got {by!r}")
        parents = self._read_parents()
        if by == "order":
            return [p.result for p in parents]
        if by == "name":
            return {p.id if p.name is None else p.name: p.result for p in parents}
        return {p.id: p.result for p in parents}

    def parent_states(self) -> dict[str, State]:
        """Each parent's state by parent id, in one statement: for a group's ``finally_``, how each
        job of the group ended (done, dead or canceled)."""
        return {p.id: p.state for p in self._read_parents()}

    def _read_parents(self) -> list[Parent]:
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
