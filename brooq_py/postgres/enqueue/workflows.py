"""Workflows on the producer side (SPEC D1, D6): the parameters of ``job_enqueue_after``, which
writes a batch holding jobs that name parents (``after``), and the checks of those parents.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from typing import Any

from brooq_py.postgres.session.statements import int_array, own_uuid_array
from brooq_py.queue import InvalidJob, Job

# How many parents one job may name: the enqueue's statement carries them as arrays.
MAX_PARENTS = 100_000


def has_parents(jobs: Sequence[Any]) -> bool:
    """Whether any Job of *jobs* names parents (anything else is refused elsewhere)."""
    return any(isinstance(job, Job) and job.after for job in jobs)


def parents_of(jobs: Sequence[Job]) -> list[list[str]]:
    """Each job's parents as canonical UUID text, repeats dropped; InvalidJob for a malformed id."""
    out = []
    for i, job in enumerate(jobs):
        if job.after and job.unique_key is not None:
            # The unique-key statement (keep/merge/replace of an active holder) links no parents.
            raise InvalidJob(f"item {i}: a job with after cannot carry a unique_key (use an idempotency_key)")
        if len(job.after) > MAX_PARENTS:
            raise InvalidJob(f"item {i}: after names {len(job.after)} jobs; at most {MAX_PARENTS}")
        parents: dict[str, None] = {}
        for parent in job.after:
            try:
                parents[str(uuid.UUID(parent))] = None
            except (ValueError, TypeError, AttributeError):
                raise InvalidJob(f"after: {parent!r} is not a job id") from None
        out.append(list(parents))
    keyed = next((i for i, job in enumerate(jobs) if job.unique_key is not None), None)
    if keyed is not None and any(out):
        # One statement writes the batch, and the unique-key statement links no parents.
        raise InvalidJob(
            f"item {keyed}: a job with a unique_key cannot be enqueued in one call with jobs naming "
            "parents (after); enqueue it in a call of its own"
        )
    return out


@dataclasses.dataclass(frozen=True)
class FanIn(Job):
    """A group's ``then`` or ``finally_``: a Job with the names its parents were given (parent id,
    name) and whether its parents' ends release it whatever their state (``finally_``, SPEC BD2)."""

    parent_names: tuple[tuple[str, str], ...] = ()
    any_end: bool = False


def after_params(batch_parents: Sequence[list[str]], batch: Sequence[Job]) -> dict[str, Any]:
    """The parent columns of ``job_enqueue_after`` for a batch (each job's parents in input order)."""
    ords: list[int] = []
    edges: list[str] = []
    names: list[list[str | None] | None] = []
    for position, (parents, job) in enumerate(zip(batch_parents, batch, strict=True), start=1):
        ords.extend([position] * len(parents))
        edges.extend(parents)
        named = dict(job.parent_names) if isinstance(job, FanIn) else {}
        names.append([named.get(p) for p in parents] if named else None)
    return {
        "parents": own_uuid_array(list(dict.fromkeys(edges))),
        "edge_ords": int_array(ords),
        "edge_parents": own_uuid_array(edges),
        "after": json.dumps(batch_parents, separators=(",", ":")),
        "names": json.dumps(names, separators=(",", ":")),
        "any_end": "{" + ",".join("t" if isinstance(j, FanIn) and j.any_end else "f" for j in batch) + "}",
    }


def unknown_parent(parent_id: Any) -> InvalidJob:
    return InvalidJob(
        f"after: job {parent_id} does not exist (or is not visible to this transaction); nothing was enqueued"
    )


def with_parents(
    then: Job, ids: Sequence[str], names: Sequence[str] | None = None, *, any_end: bool = False
) -> Job:
    """*then* waiting for *ids* as well as the parents it names itself; *names*, beside *ids*, the
    names the group gave them; *any_end*: any end of theirs releases it (a ``finally_``)."""
    fields = {f.name: getattr(then, f.name) for f in dataclasses.fields(Job)}
    fields["after"] = [*then.after, *ids]
    named = tuple(zip(ids, names, strict=True)) if names is not None else ()
    return FanIn(**fields, parent_names=named, any_end=any_end)
