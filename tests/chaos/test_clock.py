"""Clock skew between hosts does not break leases: lease times come from the database clock.

By construction (NOTES, Reliability): every SQL file that writes locked_until or available_at
computes it from now() (plus an interval parameter), never from a timestamp sent from Python.
And a run where the worker processes' Python clocks are an hour off, with handlers that run
longer than the lease while heartbeating: no lease is lost, nothing is reaped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import brooq_py.postgres
from tests.chaos import invariants
from tests.chaos.conftest import Worker, enqueue_parents, settled
from tests.polling import wait_for

SQL_DIR = Path(brooq_py.postgres.__file__).with_name("sql")
# What an assignment may be: NULL, now() [+ interval parameter], the column itself, or a CASE of those.
_ALLOWED_PIECE = re.compile(
    r"^(NULL|now\(\)( \+ %\(\w+\)[sbt]::interval| \+ \w+\.\w+| \+ make_interval\(secs => \w+\.\w+\))?"
    r"|(\w+\.)?(locked_until|available_at)"
    r"|greatest\((\w+\.)?available_at, (now|clock_timestamp)\(\)\))$"
)

# A merge or replace of a unique job (SPEC U2) moves its holder to the time the enqueuer asked for
# (Job.available_at, or the statement's time), as the INSERT it stands for would: never a lease.
_ENQUEUER_TIME = {"job_enqueue_unique_update.sql", "job_unique_update.sql"}
_ENQUEUER_PIECE = re.compile(
    r"^(excluded\.available_at|n\.at|least\(j\.available_at, (excluded\.available_at|n\.at)\))$"
)


def _strip_comments(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur]


def _expanded(path: Path) -> str:
    """*path*'s text with the fragments it names (``{claim_set}``: sql/claim_set.sql) put in place."""
    return re.sub(
        r"\{(\w+)\}",
        lambda m: (
            _strip_comments(SQL_DIR.joinpath(f"{m.group(1)}.sql").read_text())
            if SQL_DIR.joinpath(f"{m.group(1)}.sql").exists()
            else m.group(0)
        ),
        path.read_text(),
    )


def _sql_update_assignments() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted(SQL_DIR.glob("*.sql")):
        body = " ".join(_strip_comments(_expanded(path)).split())
        for m in re.finditer(r"\bSET\b(.+?)(?=\bFROM\b|\bWHERE\b|\bRETURNING\b|$)", body, re.IGNORECASE):
            for item in _split_top(m.group(1)):
                col, _, expr = item.partition("=")
                if col.strip() in ("locked_until", "available_at"):
                    found.append((path.name, col.strip(), expr.strip()))
    return found


def test_lease_and_availability_writes_use_database_clock_by_construction() -> None:
    """Every UPDATE that sets locked_until/available_at uses now(), an interval parameter, NULL or
    the column's own value; no SQL file takes a timestamptz parameter for them."""
    assignments = _sql_update_assignments()
    columns = {(name, col) for name, col, _ in assignments}
    # the statements that must be there: claim, reap, settle
    for expected in ("job_claim.sql", "lease_reap.sql", "job_settle_many.sql"):
        assert any(name == expected for name, _ in columns), f"{expected}: no lease/availability write found"
    # the engine's proof of life is the database's time of its heartbeat (SPEC P1'', F0)
    beat = " ".join(_strip_comments(SQL_DIR.joinpath("engine_beat.sql").read_text()).split())
    assert "SET seen_at = now()" in beat and "timestamptz" not in beat
    for name, col, expr in assignments:
        pieces = [expr]
        case = re.fullmatch(r"CASE WHEN .+? THEN (.+?) ELSE (.+?) END", expr)
        if case:
            pieces = [case.group(1).strip(), case.group(2).strip()]
        for piece in pieces:
            if name in _ENQUEUER_TIME and col == "available_at" and _ENQUEUER_PIECE.match(piece):
                continue
            assert _ALLOWED_PIECE.match(piece), f"{name}: {col} = {expr!r} is not computed from now()"
            if "+ u." in piece:  # a per-row value from an unnest: it must be an interval array
                text = SQL_DIR.joinpath(name).read_text()
                var = piece.split("+ u.")[1]
                assert re.search(rf"%\(\w+\)[sbt]::interval\[\].*AS u\([^)]*\b{var}\b", text, re.S), (
                    name,
                    piece,
                )
    for path in SQL_DIR.glob("*.sql"):
        body = _strip_comments(path.read_text())
        if re.search(r"\b(UPDATE|INSERT)\b", body, re.IGNORECASE):
            for m in re.finditer(r"%\((\w+)\)[sbt]::timestamptz", body):
                if (path.name, m.group(1)) in (("job_claim.sql", "after"), ("history_lock.sql", "since")):
                    continue  # a claim head, the mover's mark: a database time read back from rows, bounding a read
                # only an enqueue may take the caller's own available_at (a job's schedule)
                enqueue = path.name.startswith("job_enqueue") or path.name in _ENQUEUER_TIME
                assert enqueue and m.group(1) == "available_at", (path.name, m)


def lease_spans(dsn: str, schema: str) -> tuple[timedelta, timedelta]:
    """min and max of (locked_until set - time of the write), database clock, over every write."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT min(new_locked_until - at), max(new_locked_until - at) FROM {}.chaos_audit"
                " WHERE new_state = 'processing' AND new_locked_until IS DISTINCT FROM old_locked_until"
            ).format(sql.Identifier(schema))
        ).fetchone()
    assert row is not None and row[0] is not None
    return row[0], row[1]


@pytest.mark.parametrize("skew", [3600, -3600])
def test_skewed_python_clock_leases_hold_P1(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker], skew: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Worker processes whose time.time()/datetime.now() are an hour off run handlers for 2.5 leases
    while heartbeating: every lease is renewed from the database clock, none is lost or reaped."""
    payloads = [{"n": i, "sleep": 5.0 if i < 4 else 0.1} for i in range(12)]
    ids = enqueue_parents(dsn, chaos_schema, payloads)
    workers = [spawn(dsn, chaos_schema, skew=skew, lease=2.0, reaper_period=0.5, workers=4) for _ in range(2)]
    wait_for(lambda: settled(dsn, chaos_schema, ids), "every job to settle", timeout=90)
    for w in workers:
        assert w.stop() == 0, w.log_tail()
    report = invariants.check(dsn, chaos_schema, ids)
    report.assert_ok()
    assert report.states == {"done": 12}
    assert report.reaps == 0, "a lease of a live, heartbeating worker was reaped"
    assert report.claims == 12, "a job was claimed twice"
    low, high = lease_spans(dsn, chaos_schema)
    # locked_until = now() + 2 s on the server: never an hour away, whatever the worker's clock says
    assert timedelta(seconds=-1) < low and high <= timedelta(seconds=2), (low, high)
