"""Enqueue plans of jobs with a unique key (SPEC U1, U2), I/O-free as the others in ``jobs``.

The partial unique index over the active states does the work, with no read-then-insert race; each
statement's file says why. The idempotency key wins when both are taken: that row is the answer.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from brooq_py.postgres.flow.caps import NO_ANCHOR, TopicCaps
from brooq_py.postgres.session.statements import Queries, tenanted
from brooq_py.postgres.session.tx import Rows
from brooq_py.queue import BrooqError, EnqueueResult, Job
from brooq_py.queue.ids import uuid7

# A holder found can end (or commit) between our statements: insert again, a few times.
_ATTEMPTS = 5


def meta_json(job: Job) -> str | None:
    return None if job.meta is None else json.dumps(dict(job.meta), ensure_ascii=False)


def unique_params(job: Job, payload: str, cap: int | None) -> dict[str, Any]:
    return {
        "id": uuid7(),
        "topic": job.topic,
        "payload": payload,
        "key": job.key,
        "unique_key": job.unique_key,
        "meta": meta_json(job),
        "available_at": job.available_at,
        "priority": job.priority,
        "tenant": job.tenant,
        "cap": cap,
        **NO_ANCHOR,
        "mode": job.on_duplicate,
    }


def answers(rows: Rows) -> dict[str, tuple[Any, Any]]:
    """The rows of a unique statement by kind: kind -> (id, state); the first of a kind wins."""
    found: dict[str, tuple[Any, Any]] = {}
    for r in rows:
        found.setdefault(r[0], (r[1], r[2]))
    return found


def enqueue_unique(q: Queries, job: Job, payload: str, cap: int | None, caps: TopicCaps) -> Any:
    """Plan: insert *job* unless an active job holds its unique key (answered: its id, created=False,
    merged or replaced); QueueFull when the topic is at its cap and no holder answers."""
    params = unique_params(job, payload, cap)
    sent = caps.depth_params(job.topic, cap)
    params.update(sent[0])
    changes = job.on_duplicate != "keep"
    name = "job_enqueue_unique_update" if changes and job.key is None else "job_enqueue_unique"
    query = q[tenanted(name, job.tenant is not None)]
    for _ in range(_ATTEMPTS):
        rows = yield query, params
        if rows and cap is not None:
            caps.answered(job.topic, cap, sent, rows[0], any(r[0] == "created" for r in rows))
        found = answers(rows)
        if "created" in found:
            return EnqueueResult(str(params["id"]), True)
        for kind in ("updated", "key"):
            if kind in found:
                return EnqueueResult(str(found[kind][0]), False)
        if "unique" in found:
            holder, state = found["unique"]
            if not changes or state == "processing":
                return EnqueueResult(str(holder), False)
            changed = answers((yield q["job_unique_update"], params))
            for kind in ("updated", "unique"):
                if kind in changed:
                    return EnqueueResult(str(changed[kind][0]), False)
            continue  # the holder ended meanwhile: the key is free, insert again
        if "full" in found:
            assert cap is not None
            raise caps.refused(job.topic, cap)
        # No row: a holder committed while we waited on it (not in our snapshot), or ended: again.
    raise BrooqError(f"enqueue of topic {job.topic!r} did not settle after {_ATTEMPTS} attempts")


class FirstTries:
    """Per store, the topics whose new unique jobs try ``job_enqueue_unique_new`` first: a duplicate
    costs it a second statement, so a key found held takes its topic out until a job is created."""

    def __init__(self) -> None:
        self._out: set[str] = set()
        self._lock = threading.Lock()

    def tries(self, topic: str) -> bool:
        return topic not in self._out

    def saw(self, job: Job, result: EnqueueResult) -> None:
        """Note the outcome of an enqueue of *job* that ``plans.unique_new`` took."""
        with self._lock:
            if result.created:
                self._out.discard(job.topic)
            else:
                self._out.add(job.topic)
