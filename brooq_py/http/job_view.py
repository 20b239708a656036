"""The dashboard's job page: the row, its payload and result as shown, its failed attempts,
its parents and children (Job.after)."""

from __future__ import annotations

import json
from typing import Any

from brooq_py.http.actions import Operator
from brooq_py.postgres.operator.overview import FINISHED, Overview
from brooq_py.queue import JobRow, State

MAX_PAYLOAD_SHOWN = 256 * 1024  # characters of a job's pretty-printed payload (or result) on its page
GRAPH_SIDE = 8  # parents, and children, drawn as boxes on the job page; the others are counted

# What the Result card says when there is no result, per state: a row holds a result only once done.
NO_RESULT = {
    State.PENDING: "Pending: no result yet, waiting for a worker.",
    State.SCHEDULED: "Scheduled: no result yet, not due before its available time.",
    State.PROCESSING: "Running: no result yet.",
    State.FAILED: "Failed an attempt: no result yet, a retry is due at its available time.",
    State.BLOCKED: "Blocked: no result yet, waiting for its parents to be done.",
    State.DONE: "Done: the handler returned nothing (None).",
    State.DEAD: "Ended dead: no result.",
    State.CANCELED: "Canceled: no result.",
}


def job_view(op: Operator, overview: Overview, raw_id: str) -> dict[str, Any]:
    """The page's facts about job *raw_id*; ActionError (404, 503) as ``Operator.get`` raises."""
    row = op.get(raw_id)
    relatives = op.guarded("reading a job's parents and children", overview.relatives, row.id)
    return {
        "job": row,
        "finished": row.state in FINISHED,
        "canceled_by": canceled_by(row),
        "payload": shown(row.payload),
        "result": shown(row.result) if row.result is not None else None,
        "errors": list(reversed(row.errors)),  # each failed attempt, the latest first (V3)
        "no_result": NO_RESULT.get(row.state, f"{row.state}: no result."),
        "parents": [r for r in relatives if r.side == "parent"],
        "children": [r for r in relatives if r.side == "child"],
        "graph_side": GRAPH_SIDE,
        # Durable steps and signal waits (SPEC DS1-DS5) arrive with JobRow.steps and .waiting_for:
        # read through getattr so that this page works before and after that change.
        "steps": tuple(getattr(row, "steps", None) or ()),
        "waiting_for": getattr(row, "waiting_for", None),
        "title": f"Job {row.id}",
    }


def shown(value: Any) -> str:
    """*value* pretty-printed, cut so that a browser can open the page whatever was stored."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    if len(text) > MAX_PAYLOAD_SHOWN:
        hidden = len(text) - MAX_PAYLOAD_SHOWN
        text = f"{text[:MAX_PAYLOAD_SHOWN]}\n… {hidden:,} more characters not shown"
    return text


def canceled_by(row: JobRow) -> str | None:
    """Who canceled a canceled job, as far as its row tells: its handler or its parent leaves it in last_error."""
    if row.state != State.CANCELED:
        return None
    if row.last_error and row.last_error.startswith("MustCancelTask"):
        return "by its handler"
    if row.last_error and row.last_error.startswith("canceled: parent "):
        return "because a job it waited for ended without success"
    return "by a cancel (dashboard, CLI, HTTP or code; the row does not record who)"
