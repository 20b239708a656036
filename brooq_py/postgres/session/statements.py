"""Named SQL statements: loaded once from ``sql/*.sql``, rendered per schema; their parameters and rows.

Each file holds one statement with ``%(name)s`` parameters and placeholders for the schema's tables,
channels and fragments, rendered once per schema: no connection's ``search_path`` is set. Batch
parameters are array literals built in one string, as a Python list costs psycopg a type scan and a
dump per element (most of the adapter's CPU at tens of thousands of outcomes a second).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from psycopg import sql

from brooq_py.queue import AttemptError, JobRow, State, StepRecord
from brooq_py.queue.job import read_payload

_BINARY_PLACEHOLDER = re.compile(r"%\((\w+)\)b")


@functools.cache
def load(name: str) -> str:
    """Return the text of ``sql/<name>.sql`` (read once per process)."""
    path = resources.files("brooq_py.postgres") / "sql" / f"{name}.sql"
    text: str = path.read_text(encoding="utf-8")
    return text


def compact(text: str, name: bool = True) -> str:
    """*text* without blank lines, indentation and comment lines but its first, ``-- name: ...``
    (kept for pg_stat_activity, unless not *name*): psycopg caches the parsing of a statement only
    up to 4 KB long."""
    lines = [line.strip() for line in text.splitlines()]
    kept = [line for line in lines if line and not line.startswith("--")]
    return "\n".join(lines[:1] + kept if name and lines[0].startswith("--") else kept)


@dataclass(frozen=True)
class Query:
    """One statement rendered for a schema: bytes for psycopg, text for a foreign Tx; ``rows`` False:
    no RETURNING, a runner reads back its row count only (session/tx.py)."""

    name: str
    composed: bytes
    text: str
    rows: bool = True


def _fragment(name: str, schema: str, halts: bool = True) -> sql.Composed:
    """``sql/<name>.sql`` rendered for *schema*, without its comment lines, to stand inside a statement
    (*halts*: see ``Queries.halts``)."""
    source = name if halts or name != "depth_waiting" else "depth_waiting_0017"
    text = compact(load(source), name=False)
    inner = {f: _fragment(f, schema, halts) for f in _FRAGMENTS if f != name and "{" + f + "}" in text}
    return sql.SQL(text).format(
        job=sql.Identifier(schema, "job"),
        live=_live(schema),
        job_edge=sql.Identifier(schema, "job_edge"),
        job_step=sql.Identifier(schema, "job_step"),
        job_sequence_halt=sql.Identifier(schema, "job_sequence_halt"),
        depth_seq=_depth_seq(schema),
        **inner,
    )


# Files that are parts of statements, not statements: ``{name}`` in a statement (or in another
# fragment) stands for one.
_FRAGMENTS = (
    "depth_room",
    "depth_waiting",
    "job_row_columns",
    "claim_room",
    "claim_set",
    "topic_tokens",
    "terminal_kept",
)


def _live(schema: str) -> sql.Composable:
    """``{live}``: the job table without its history (SPEC B2: the tables of terminal history inherit
    from it; a statement of the hot path reads and writes the table itself, never opening them)."""
    return sql.SQL("ONLY {}").format(sql.Identifier(schema, "job"))


def _depth_seq(schema: str) -> sql.Composable:
    return sql.Literal(sql.Identifier(schema, "job_depth_seq").as_string(None))


# The tables a statement names by their name: ``{job}`` stands for "<schema>"."job".
_TABLES = (
    "job",
    "engine",
    "job_in_flight",
    "job_edge",
    "job_wait",
    "job_step",
    "job_signal",
    "topic_setting",
    "tenant_setting",
    "tenant_topic",  # migration 0022
    "schedule_tick",
    # migration 0018: sequences' tables and functions (its job_parked_release() is not called:
    # topic_parked_release counts as depth_waiting does)
    "job_sequence_due",
    "job_sequence_halt",
    # migration 0021: canceled members whose handlers may still run
    "job_sequence_hold",
    "job_sequence_release",
    "job_sequence_resume",
)


# An enqueue statement named with this suffix writes the job's tenant (SPEC T1): its {tenant_*}
# fragments are filled. Without it they are empty, so a job that names no tenant is written by the
# statement of a schema before migration 0019 (a producer of this release on a schema not yet migrated).
TENANT = "+tenant"
_TENANT_FRAGMENTS = {"tenant_col": ", tenant", "tenant_param": ", %(tenant)s", "tenant_input": ", tenant"}


def tenanted(name: str, tenant: bool) -> str:
    """*name*, or its variant that writes the tenant when *tenant*."""
    return name + TENANT if tenant else name


# A statement named ``<name>@<day>`` names one table of terminal history as ``{history}``
# (``job_history_<day>``, the day as YYYYMMDD: SPEC B2, postgres/worker/history.py).
HISTORY = "@"


def history_table(day: str) -> str:
    """The name of the table of terminal history for *day* (YYYYMMDD)."""
    if len(day) != 8 or not day.isdigit():
        raise ValueError(f"not a day (YYYYMMDD): {day!r}")
    return "job_history_" + day


def render(name: str, schema: str, *, rows: bool = True, halts: bool = True) -> Query:
    """Render ``sql/<name>.sql`` for *schema* (*rows*: see ``Query``; *halts*: see ``Queries.halts``);
    ``<name>+tenant``: see TENANT; ``<name>@<day>``: see HISTORY."""
    name, _, day = name.partition(HISTORY)
    base, suffix, _ = name.partition(TENANT)
    template = sql.SQL(compact(load(base)))
    args: dict[str, sql.Composable] = {
        f: _fragment(f, schema, halts) if "{" + f + "}" in template.as_string(None) else sql.SQL("")
        for f in _FRAGMENTS
    }
    args.update({t: sql.Identifier(schema, t) for t in _TABLES})
    args.update(
        live=_live(schema),
        job_literal=sql.Literal(sql.Identifier(schema, "job").as_string(None)),
        history=sql.Identifier(schema, history_table(day) if day else "job_history"),
        history_index=sql.Identifier((history_table(day) if day else "job_history") + "_ended"),
        history_literal=sql.Literal(
            sql.Identifier(schema, history_table(day) if day else "job_history").as_string(None)
        ),
    )
    args.update({k: sql.SQL(v if suffix else "") for k, v in _TENANT_FRAGMENTS.items()})
    args.update(
        depth_seq=_depth_seq(schema),
        version_table=sql.Identifier(schema, "brooq_alembic_version"),
        halt_table=sql.Literal(sql.Identifier(schema, "job_sequence_halt").as_string(None)),
    )
    for key, channel in (
        ("channel", channel_for),
        ("stage_channel", stage_channel_for),
        ("cancel_channel", cancel_channel_for),
        ("settled_channel", settled_channel_for),
    ):
        args[key], args[f"{key}_literal"] = sql.Identifier(channel(schema)), sql.Literal(channel(schema))
    composed = template.format(**args)
    # A foreign Tx gets the text with plain %(name)s placeholders: binary ones are psycopg's own.
    text = _BINARY_PLACEHOLDER.sub(r"%(\1)s", composed.as_string(None))
    return Query(base, composed.as_bytes(None), text, rows)


# Statements without RETURNING: their row count is their answer (session/tx.py).
_COUNTED = frozenset(
    {
        "job_enqueue_plain",
        "job_enqueue_unique_new",
        "job_enqueue_capped",
        "signal_savepoint",
        "signal_savepoint_release",
        "signal_savepoint_rollback",
        "history_create",
        "history_index",
        "history_lock_table",
        "history_lock_wait",
        "history_drop",
        "history_empty",
        "history_own",
    }
)


class Queries:
    """Every statement a store runs, by name, rendered for one schema once, on first use.

    ``halts``: whether the schema has ``job_sequence_halt`` (migration 0018), as the last read of the
    depth caps said (``topic_caps``). The depth count leaves out the members held behind a halted
    sequence (``depth_waiting``); on an older schema, where a producer of this release still writes
    capped jobs, it counts as before (``depth_waiting_0017``)."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.halts = True
        self._rendered: dict[tuple[str, bool], Query] = {}

    def __getitem__(self, name: str) -> Query:
        """Return ``sql/<name>.sql`` rendered for this schema."""
        key = (name, self.halts)
        query = self._rendered.get(key)
        if query is None:
            counted = name.partition(HISTORY)[0].partition(TENANT)[0] in _COUNTED
            query = self._rendered[key] = render(name, self.schema, rows=not counted, halts=self.halts)
        return query


# --- the NOTIFY channels of a schema --------------------------------------------------------------


_MAX_IDENTIFIER_BYTES = 63


def _named(prefix: str, schema: str) -> str:
    channel = prefix + schema
    if len(channel.encode("utf-8")) <= _MAX_IDENTIFIER_BYTES:
        return channel
    return prefix + hashlib.md5(schema.encode("utf-8"), usedforsecurity=False).hexdigest()


def channel_for(schema: str) -> str:
    """``brooq.<schema>`` (``brooq.<md5(schema)>`` past 63 bytes, as every channel here): a topic has
    ready jobs; the payload is the topic (empty: every topic)."""
    return _named("brooq.", schema)


def stage_channel_for(schema: str) -> str:
    """``brooq_stage.<schema>``: a job of the topic in the payload was scheduled."""
    return _named("brooq_stage.", schema)


def cancel_channel_for(schema: str) -> str:
    """``brooq_cancel.<schema>``: a processing job was canceled; the payload is ``"<id> <claim_token>"``."""
    return _named("brooq_cancel.", schema)


def settled_channel_for(schema: str) -> str:
    """``brooq_settled.<schema>``: one per outcome batch (or closing transaction, or cancel) that
    ended a job, empty payload; waiters check their ids again (SPEC V2)."""
    return _named("brooq_settled.", schema)


# --- parameters: array literals for the batch statements of the hot path --------------------------


_PLAIN = re.compile(r"[0-9a-fA-F-]{32,36}")


def uuid_array(values: Iterable[str]) -> str:
    """Return ``{u1,u2,...}`` for UUID strings; raise ValueError for anything else (no injection)."""
    return "{" + ",".join([v if _PLAIN.fullmatch(v) else str(uuid.UUID(v)) for v in values]) + "}"


def text_array(values: Sequence[str | None]) -> str:
    """An array literal for text values (NULL for None); without a None, in three passes over one string
    joined on NUL (a value holding NUL goes element-wise and is refused by the server)."""
    n = len(values)
    if n and None not in values:
        joined = "\x00".join(values)  # type: ignore[arg-type]  # no None: checked above
        if joined.count("\x00") == n - 1:
            return '{"' + joined.replace("\\", "\\\\").replace('"', '\\"').replace("\x00", '","') + '"}'
    parts = ["NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values]
    return "{" + ",".join(parts) + "}"


def int_array(values: Iterable[int]) -> str:
    """Return ``{1,-2}`` for ints (an int subclass, an IntEnum say, as its plain value)."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


def own_uuid_array(values: Sequence[str]) -> str:
    """Return ``{u1,u2,...}`` for UUID strings this process made itself (no check: see uuid_array)."""
    return "{" + ",".join(values) + "}"


def timestamptz_array(values: Sequence[datetime | None]) -> str:
    """Return an array literal for aware datetimes (NULL for None), in ISO 8601."""
    if all(v is None for v in values):
        return "{" + ",".join(["NULL"] * len(values)) + "}"
    return "{" + ",".join(["NULL" if v is None else '"' + v.isoformat() + '"' for v in values]) + "}"


def float_array(values: Iterable[float]) -> str:
    """Return ``{1.5,0}`` for finite floats."""
    parts = []
    for v in values:
        if not math.isfinite(v):
            raise ValueError(f"not a finite number: {v!r}")
        parts.append(repr(float(v)))
    return "{" + ",".join(parts) + "}"


def bool_array(values: Iterable[bool]) -> str:
    return "{" + ",".join("t" if v else "f" for v in values) + "}"


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


# --- rows of the job table as the vocabulary's records --------------------------------------------


_EPOCH = datetime.fromtimestamp(0, UTC)


# job_get's columns, which every statement read into a JobRow selects (job_list too).
JOB_ROW_COLUMNS = 25


def job_row(r: Any) -> JobRow:
    """Return the JobRow of a row of ``job_get``'s columns; ValueError for a row of any other width,
    whose missing fields would be silently empty (SPEC R0)."""
    if len(r) != JOB_ROW_COLUMNS:
        raise ValueError(f"a job row has {JOB_ROW_COLUMNS} columns (job_get's), got {len(r)}")
    result, errors, progress, note, meta, crashes = r[15:21]
    state = State(r[3])
    return JobRow(
        id=str(r[0]),
        topic=r[1],
        payload=read_payload(r[2]),
        state=state,
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
        meta=read_payload(meta) or {},
        parents=tuple(dict.fromkeys(str(p) for p in r[14] or ())),  # a group's job given twice: once
        crashes=crashes or 0,
        steps=step_records(r[22]),
        waiting_for=r[21] if state is State.SCHEDULED else None,
        sequence=r[23],
        tenant=r[24],
    )


def step_records(value: Any) -> tuple[StepRecord, ...]:
    """The row's recorded steps ([name, at, kind, until] each, in order) as StepRecord records."""
    if not isinstance(value, list):
        return ()
    return tuple(
        StepRecord(
            name,
            datetime.fromisoformat(at),
            kind,
            datetime.fromisoformat(until) if isinstance(until, str) else None,
        )
        for name, at, kind, until in value
    )


def attempt_errors(value: Any) -> tuple[AttemptError, ...]:
    """The row's ``errors`` (a jsonb array, NULL for none) as AttemptError records, oldest first; an
    entry written by hand (psql) that lacks a field is read with what it has."""
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
        attempt, tb = e.get("attempt"), e.get("traceback")
        attempt = attempt if isinstance(attempt, int) else 0
        out.append(
            AttemptError(attempt, when, str(e.get("error") or ""), tb if isinstance(tb, str) else None)
        )
    return tuple(out)
