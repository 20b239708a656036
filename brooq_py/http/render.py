"""What the dashboard's pages show: the Jinja2 environment with its filters, and the job page's facts."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import jinja2

from brooq_py.http.actions import Operator
from brooq_py.postgres.operator.overview import FINISHED, Overview
from brooq_py.queue import JobRow, State

BAR_WIDTH = 2
CHART_HEIGHT = 28
MAX_PAYLOAD_SHOWN = 256 * 1024  # characters of a job's pretty-printed payload (or result) on its page
GRAPH_SIDE = 8  # parents, and children, drawn as boxes on the job page; the others are counted

# What the Result card says when there is no result, per state: a row holds a result only once done.
NO_RESULT = {
    State.PENDING: "Pending: no result yet, waiting for a worker.",
    State.SCHEDULED: "Scheduled: no result yet, not due before its available time.",
    State.PROCESSING: "Running: no result yet.",
    State.FAILED: "Failed an attempt: no result yet, a retry is due at its available time.",
    State.BLOCKED: "Blocked: no result yet, waiting for its parents to be done or its turn in its sequence.",
    State.PARKED: "Parked: no result yet, waiting for room under its topic's depth cap.",
    State.DONE: "Done: the handler returned nothing (None).",
    State.DEAD: "Ended dead: no result.",
    State.CANCELED: "Canceled: no result.",
}
# What the job page says of a sleep or a wait it recorded; a step is just "step recorded".
WHAT_STEP = {"sleep": "slept until {} UTC", "wait": "waited for the signal, at most until {} UTC"}


def _no_result(row: JobRow) -> str:
    """What the Result card says of a row without a result: why, by its state (a wait for a signal
    is a scheduled row whose available time is the wait's timeout)."""
    if row.state is State.SCHEDULED and row.waiting_for:
        return f"Waiting for the signal {row.waiting_for!r}: no result yet (its wait times out at its available time)."
    return NO_RESULT.get(row.state, f"{row.state}: no result.")


def age(seconds: float | None) -> str:
    """Return *seconds* as a short age: ``0s``, ``42s``, ``3m 12s``, ``5h 03m``, ``2d 4h``."""
    if not seconds or seconds < 0:
        return "0s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def when(moment: datetime | None) -> str:
    """Return *moment* in UTC to the second (``2026-11-30 16:40:05``), or an em dash."""
    if moment is None:
        return "—"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def ago(moment: datetime | None) -> str:
    if moment is None:
        return ""
    delta = (datetime.now(UTC) - moment).total_seconds()
    return f"{age(delta)} ago" if delta >= 0 else f"in {age(-delta)}"


def bars(values: list[int]) -> list[tuple[int, int, int]]:
    """Return (x, y, height) of one bar per value, scaled to the chart's height (an inline SVG)."""
    top = max(values, default=0) or 1
    out = []
    for i, v in enumerate(values):
        h = 0 if v == 0 else max(1, round(v / top * CHART_HEIGHT))
        out.append((i * BAR_WIDTH, CHART_HEIGHT - h, h))
    return out


def count(value: int | None, cap: int) -> str:
    if value is None:
        return "—"
    text = f"{value:,}"
    return text + "+" if value >= cap else text


def tenants_path(topic: str) -> str:
    """The tenants page of *topic* inside the dashboard (every character of the name quoted, a
    ``/`` too, so that no browser reads a name's ``..`` or ``?`` as part of the address)."""
    return "/topics/" + quote(topic, safe="") + "/tenants"


def jinja_env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("brooq_py.http", "templates"),
        autoescape=True,  # every value is escaped: payloads and errors are shown as text
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(age=age, when=when, ago=ago, bars=bars, count=count, ids_field=lambda v: ("id", v))
    env.globals.update(BAR_WIDTH=BAR_WIDTH, CHART_HEIGHT=CHART_HEIGHT, tenants_path=tenants_path)
    return env


def job_view(op: Operator, overview: Overview, raw_id: str) -> dict[str, Any]:
    """The job page's facts about job *raw_id*; ActionError (404, 503) as ``Operator.get`` raises."""
    row = op.get(raw_id)
    relatives = op.guarded("reading a job's parents and children", overview.relatives, row.id)
    return {
        "job": row,
        "finished": row.state in FINISHED,
        "canceled_by": canceled_by(row),
        "payload": shown(row.payload),
        "result": shown(row.result) if row.result is not None else None,
        "errors": list(reversed(row.errors)),  # each failed attempt, the latest first
        "no_result": _no_result(row),
        "parents": [r for r in relatives if r.side == "parent"],
        "children": [r for r in relatives if r.side == "child"],
        "graph_side": GRAPH_SIDE,
        "steps": timeline(row.steps),
        "waiting_for": row.waiting_for,
        "title": f"Job {row.id}",
    }


def timeline(steps: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Each recorded step, sleep and wait, in the handler's order, with what the page says (SPEC DS5)."""
    out = []
    for st in steps:
        kind = getattr(st, "kind", "step")
        what = WHAT_STEP.get(kind, "step recorded").format(when(getattr(st, "until", None)))
        out.append({"kind": kind, "name": st.name, "at": st.at, "what": what})
    return out


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
