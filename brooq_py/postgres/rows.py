"""Rows of the job table as the vocabulary's records (``sql/job_get.sql``'s columns, in order)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from brooq_py.queue import AttemptError, JobRow, State

_EPOCH = datetime.fromtimestamp(0, UTC)


# job_get's columns, which every statement read into a JobRow selects (job_list too).
JOB_ROW_COLUMNS = 21


def job_row(r: Any) -> JobRow:
    """Return the JobRow of a row of ``job_get``'s columns (result, history and progress included).

    Raise ValueError for a row of any other width: a statement that selects fewer columns
    would leave fields silently empty (SPEC R0).
    """
    if len(r) != JOB_ROW_COLUMNS:
        raise ValueError(f"a job row has {JOB_ROW_COLUMNS} columns (job_get's), got {len(r)}")
    parents = r[14]
    result, errors, progress, note, meta, crashes = r[15:21]
    return JobRow(
        id=str(r[0]),
        topic=r[1],
        payload=r[2],
        state=State(r[3]),
        attempts=r[4],
        priority=r[5],
        available_at=r[6],
        locked_by=r[7],
        locked_until=r[8],
        last_error=r[9],
        idempotency_key=r[10],
        created_at=r[11],
        updated_at=r[12],
        result=result,
        errors=attempt_errors(errors),
        progress=None if progress is None else float(progress),
        progress_note=note,
        meta=meta or {},
        parents=tuple(str(p) for p in parents or ()),
        crashes=crashes or 0,
    )


def attempt_errors(value: Any) -> tuple[AttemptError, ...]:
    """The row's ``errors`` (a jsonb array, NULL for none) as AttemptError records, oldest first.

    An entry written by hand (psql) that lacks a field is read with what it has.
    """
    if not isinstance(value, list):
        return ()
    out = []
    for e in value:
        if not isinstance(e, dict):
            continue
        at = e.get("at")
        try:
            when = datetime.fromisoformat(at) if isinstance(at, str) else _EPOCH
        except ValueError:
            when = _EPOCH
        attempt = e.get("attempt")
        tb = e.get("traceback")
        out.append(
            AttemptError(
                attempt=attempt if isinstance(attempt, int) else 0,
                at=when,
                error=str(e.get("error") or ""),
                traceback=tb if isinstance(tb, str) else None,
            )
        )
    return tuple(out)
