"""The dashboard's job page: the row, its payload and result as shown, its failed attempts,
its parents and children (Job.after)."""

from __future__ import annotations

import json
from typing import Any

from brooq_py.http.actions import Operator
from brooq_py.postgres.overview import FINISHED, Overview
from brooq_py.queue import JobRow, State

MAX_PAYLOAD_SHOWN = 256 * 1024  # characters of a job's pretty-printed payload (or result) on its page


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
        "parents": [r for r in relatives if r.side == "parent"],
        "children": [r for r in relatives if r.side == "child"],
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
