"""Workflows on the producer side (SPEC D1, D6): the parameters of ``job_enqueue_after``, which
writes a batch holding jobs that name parents (``after``), and the checks of those parents.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from typing import Any

from brooq_py.postgres.session.statements import bool_array, int_array, own_uuid_array
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
    """A group's ``then`` or ``finally_``: a Job whose ``after`` ends with its group's ids, ``group``
    (in group order, one per job given: two jobs that found one row by their key give its id
    twice), the names the group gave them beside them (``group_names``, None for a sequence), and
    whether its parents' ends release it whatever their state (``any_end``: ``finally_``, SPEC BD2)."""

    group: tuple[str, ...] = ()
    group_names: tuple[str, ...] | None = None
    any_end: bool = False


def _canonical(job_id: str) -> str:
    return str(uuid.UUID(str(job_id)))


def parents_column(parents: list[str], job: Job) -> tuple[list[str], list[str | None] | None]:
    """What the row keeps of *job*'s *parents* (its distinct parents, the ones it waits for): its
    ``parents`` array, and its ``parent_names`` beside it (None: no names). A fan-in's array is its
    own ``after`` then its group, one entry per job of the group (SPEC BD3): a row two of its jobs
    share is there once for each, under each one's name, so ``parent_results(by="name")`` finds
    every name and ``by="order"`` gives one result per job of the group."""
    if not isinstance(job, FanIn) or not job.group:
        return parents, None
    own = list(dict.fromkeys(_canonical(p) for p in job.after[: len(job.after) - len(job.group)]))
    column = own + [_canonical(p) for p in job.group]
    if job.group_names is None:
        return column, None
    return column, [None] * len(own) + list(job.group_names)


def after_params(batch_parents: Sequence[list[str]], batch: Sequence[Job]) -> dict[str, Any]:
    """The parent columns of ``job_enqueue_after`` for a batch (each job's parents in input order)."""
    ords: list[int] = []
    edges: list[str] = []
    columns: list[list[str]] = []
    names: list[list[str | None] | None] = []
    for position, (parents, job) in enumerate(zip(batch_parents, batch, strict=True), start=1):
        ords.extend([position] * len(parents))
        edges.extend(parents)
        column, named = parents_column(parents, job)
        columns.append(column)
        names.append(named)
    return {
        "parents": own_uuid_array(list(dict.fromkeys(edges))),
        "edge_ords": int_array(ords),
        "edge_parents": own_uuid_array(edges),
        "after": json.dumps(columns, separators=(",", ":")),
        "names": json.dumps(names, separators=(",", ":")),
        "any_end": bool_array(isinstance(j, FanIn) and j.any_end for j in batch),
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
    if names is not None and len(names) != len(ids):
        raise ValueError("with_parents: one name per id")
    return FanIn(
        **fields, group=tuple(ids), group_names=tuple(names) if names is not None else None, any_end=any_end
    )
