"""Plans, the producer's and the operator's statements written once for both Stores.

A plan is a generator that yields ``(query, params)`` for every statement it needs and
receives that statement's rows back. It does no I/O itself: ``drive`` runs it on a
blocking runner (``Store``), ``drive_async`` on an awaitable one (``AsyncStore``). The
enqueue plans are in enqueueing.py and single.py; here the drivers and the plans that read one job
or a list of them.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from brooq_py.postgres.queries import Queries, Query
from brooq_py.postgres.rows import job_row
from brooq_py.postgres.runner import Rows
from brooq_py.queue import JobRow, State
from brooq_py.queue.job import encode_payload

Statement = tuple[Query, dict[str, Any]]
T = TypeVar("T")
Plan = Generator[Statement, Rows, T]


def first_statement(plan: Plan[T]) -> tuple[Statement | None, T | None]:
    """Start *plan*: return its first statement, or (None, result) when it needs none.

    A Store takes a connection only for a plan that has a statement to run (a
    malformed id needs none).
    """
    try:
        return next(plan), None
    except StopIteration as done:
        return None, done.value


def drive(plan: Plan[T], run: Callable[[Query, dict[str, Any]], Rows], first: Statement | None = None) -> T:
    """Run *plan* to its end on a blocking runner and return its result.

    *first* is the plan's first statement when ``first_statement`` already started it.
    """
    try:
        statement = next(plan) if first is None else first
        while True:
            statement = plan.send(run(*statement))
    except StopIteration as done:
        result: T = done.value
        return result


async def drive_async(
    plan: Plan[T], run: Callable[[Query, dict[str, Any]], Awaitable[Rows]], first: Statement | None = None
) -> T:
    """Run *plan* to its end on an awaitable runner and return its result (*first*: as ``drive``)."""
    try:
        statement = next(plan) if first is None else first
        while True:
            statement = plan.send(await run(*statement))
    except StopIteration as done:
        result: T = done.value
        return result


def parse_id(job_id: Any) -> uuid.UUID | None:
    """Return *job_id* as a UUID, or None when it is not a well-formed one."""
    if isinstance(job_id, uuid.UUID):
        return job_id
    if not isinstance(job_id, str):
        return None
    try:
        return uuid.UUID(job_id)
    except ValueError:
        return None


def by_id(query: Query, job_id: Any) -> Plan[bool]:
    """Run *query* (cancel, retry) for a well-formed *job_id*; True if it changed a row.

    A malformed id changes nothing and runs no statement (False, never an error).
    """
    parsed = parse_id(job_id)
    if parsed is None:
        return False
    rows = yield query, {"id": parsed}
    return bool(rows)


def get(q: Queries, job_id: Any) -> Plan[JobRow | None]:
    """Read the job's row; None for an unknown or malformed id (no statement for a malformed one)."""
    parsed = parse_id(job_id)
    if parsed is None:
        return None
    rows = yield q.get, {"id": parsed}
    return job_row(rows[0]) if rows else None


def row_of(r: tuple[Any, ...]) -> JobRow:
    """A row of job_get's columns (job_list selects the same) as a JobRow (see rows.job_row)."""
    return job_row(r)


def list_jobs(
    q: Queries, topic: str | None, state: str | None, limit: int, payload: Any = None
) -> Plan[list[JobRow]]:
    """Read the newest jobs first, of one topic and/or state (all when None), at most *limit*.

    *payload* (None: any) keeps the jobs whose payload contains it (jsonb ``@>``); a value
    that is not JSON raises ``InvalidJob`` before any statement.
    """
    if state is not None:
        state = str(State(state))  # an unknown state is a ValueError here, not an empty answer
    params: dict[str, Any] = {"topic": topic, "state": state, "limit": max(0, int(limit))}
    if payload is None:
        rows = yield q["job_list"], params
    else:
        params["payload"] = encode_payload(payload, "payload filter")
        rows = yield q["job_list_payload"], params
    return [row_of(r) for r in rows]
