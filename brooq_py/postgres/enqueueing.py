"""Enqueue on any runner: one job (E1-E3) or a batch in one statement (E5).

Ids are generated here (UUIDv7, time-ordered: SPEC Z4), so a job's id is known before commit.
Idempotency relies on ``INSERT ... ON CONFLICT DO NOTHING``: a duplicate never
raises into the caller's transaction at READ COMMITTED (SPEC E2). Under
REPEATABLE READ or SERIALIZABLE a duplicate committed concurrently raises a
serialization failure, as any conflicting write does there.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from brooq_py.postgres.queries import Queries
from brooq_py.postgres.runner import Runner
from brooq_py.queue import BrooqError, EnqueueResult, InvalidJob, Job
from brooq_py.queue.ids import uuid7

# A row found by key can vanish (retention) before we read it: insert again, a few times.
_ATTEMPTS = 5


def job_params(job: Job, payload: str, job_id: uuid.UUID) -> dict[str, Any]:
    return {
        "id": job_id,
        "topic": job.topic,
        "payload": payload,
        "key": job.key,
        "available_at": job.available_at,
        "priority": job.priority,
    }


def validated(jobs: Sequence[Job]) -> list[str]:
    """Return every job's payload text; raise InvalidJob for the first bad one (nothing written)."""
    texts = []
    for i, job in enumerate(jobs):
        if not isinstance(job, Job):
            raise InvalidJob(f"item {i} is not a Job: {type(job).__name__}")
        texts.append(job.payload_json())
    return texts


def enqueue_one(run: Runner, q: Queries, job: Job, payload: str) -> EnqueueResult:
    """Insert *job* unless (topic, key) exists; return its id and whether this call created it."""
    params = job_params(job, payload, uuid7())
    for _ in range(_ATTEMPTS):
        rows = run(q.enqueue, params)
        if rows:
            return EnqueueResult(str(rows[0][0]), True)
        if job.key is None:
            break
        # A new statement: its snapshot sees a duplicate committed while we waited on it.
        rows = run(q.get_by_key, {"topic": job.topic, "key": job.key})
        if rows:
            return EnqueueResult(str(rows[0][0]), False)
    raise BrooqError(f"enqueue of topic {job.topic!r} did not settle after {_ATTEMPTS} attempts")


def enqueue_batch(
    run: Runner, q: Queries, jobs: Sequence[Job], payloads: Sequence[str]
) -> list[EnqueueResult]:
    """Enqueue *jobs* in one statement (more only for keys a concurrent writer held); input order."""
    results: list[EnqueueResult | None] = [None] * len(jobs)
    first_of: dict[tuple[str, str], int] = {}
    repeats: list[tuple[int, int]] = []
    todo: list[int] = []
    for i, job in enumerate(jobs):
        key = job.key
        if key is not None:
            first = first_of.setdefault((job.topic, key), i)
            if first != i:
                repeats.append((i, first))
                continue
        todo.append(i)
    ids = {i: uuid7() for i in todo}

    for _ in range(_ATTEMPTS):
        if not todo:
            break
        rows = run(
            q.enqueue_many,
            {
                "ids": [ids[i] for i in todo],
                "topics": [jobs[i].topic for i in todo],
                "payloads": [payloads[i] for i in todo],
                "keys": [jobs[i].key for i in todo],
                "available_at": [jobs[i].available_at for i in todo],
                "priorities": [jobs[i].priority for i in todo],
            },
        )
        unresolved = []
        for i, (job_id, created) in zip(todo, rows, strict=True):
            if job_id is None:
                unresolved.append(i)
            else:
                results[i] = EnqueueResult(str(job_id), bool(created))
        todo = []
        if unresolved:
            found = {
                (topic, key): str(job_id)
                for topic, key, job_id in run(
                    q.get_by_keys,
                    {
                        "topics": [jobs[i].topic for i in unresolved],
                        "keys": [jobs[i].key for i in unresolved],
                    },
                )
            }
            for i in unresolved:
                existing = found.get((jobs[i].topic, str(jobs[i].key)))
                if existing is None:
                    todo.append(i)
                else:
                    results[i] = EnqueueResult(existing, False)
    if todo:
        raise BrooqError(f"enqueue_many did not settle after {_ATTEMPTS} attempts")
    for i, first in repeats:
        first_result = results[first]
        assert first_result is not None
        results[i] = EnqueueResult(first_result.id, False)
    return [r for r in results if r is not None]
