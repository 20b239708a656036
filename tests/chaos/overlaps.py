"""Strict checks of the chaos side tables for runs where no worker dies (SPEC P1').

``invariants.check`` allows two executions of one job to overlap once the
first one's lease was taken away (a dead or partitioned worker). When every
worker stays alive and connected, nothing outside the engine may take a lease
from a running handler: these checks allow no such overlap.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql


def _rows(dsn: str, query: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql.SQL(query).format(s=sql.Identifier(schema))).fetchall()


def overlapping_runs(dsn: str, schema: str, tolerance: timedelta = timedelta(0)) -> list[str]:
    """Pairs of executions of one job that ran at once (the second started before the first ended).

    An execution that never recorded its end counts as running until now. *tolerance*: overlaps
    at most this long are not counted.
    """
    execs = _rows(
        dsn,
        "SELECT job_id, worker, attempt, claim_token, started_at, coalesce(ended_at, clock_timestamp()), how"
        " FROM {s}.chaos_exec ORDER BY job_id, started_at",
        schema,
    )
    return overlapping(execs, tolerance)


def overlapping(execs: list[tuple[Any, ...]], tolerance: timedelta = timedelta(0)) -> list[str]:
    """``overlapping_runs`` over rows (job_id, worker, attempt, claim_token, started_at, ended_at, how)
    ordered by job and start."""
    by_job: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for e in execs:
        by_job[str(e[0])].append(e)
    found: list[str] = []
    for job, es in by_job.items():
        for i, first in enumerate(es):
            for second in es[i + 1 :]:
                # from the second's start to whichever ended first (the second may end before the first)
                overlap = min(first[5], second[5]) - second[4]
                if overlap > tolerance:
                    found.append(
                        f"job {job}: {first[1]} attempt {first[2]} [{first[4]} .. {first[5]}, {first[6]}] and "
                        f"{second[1]} attempt {second[2]} [{second[4]} .. {second[5]}, {second[6]}] overlap by "
                        f"{overlap.total_seconds():.3f}s"
                    )
    return found


def reaped(dsn: str, schema: str) -> list[str]:
    """Every claim the reaper returned to pending (none may be, while every worker lives)."""
    rows = _rows(
        dsn,
        "SELECT job_id, at, old_locked_until FROM {s}.chaos_audit"
        " WHERE old_state = 'processing' AND new_state = 'pending' AND new_attempts = old_attempts",
        schema,
    )
    return [f"job {r[0]} reaped at {r[1]} (its lease ran to {r[2]})" for r in rows]


def reaped_while_running(dsn: str, schema: str) -> list[str]:
    """Claims returned to pending by the reaper while their handler was still running (P1')."""
    rows = _rows(
        dsn,
        "SELECT a.job_id, a.at, e.worker, e.started_at, e.ended_at FROM {s}.chaos_audit a"
        " JOIN {s}.chaos_exec e ON e.claim_token = a.old_token"
        " WHERE a.old_state = 'processing' AND a.new_state = 'pending' AND a.new_attempts = a.old_attempts"
        " AND (e.ended_at IS NULL OR e.ended_at > a.at)",
        schema,
    )
    return [f"job {r[0]} reaped at {r[1]} while {r[2]} ran it (from {r[3]} to {r[4]})" for r in rows]


def succeeded_but_dead(dsn: str, schema: str) -> list[str]:
    """Jobs that ended dead although one of their handlers returned successfully."""
    rows = _rows(
        dsn,
        "SELECT j.id, e.worker, e.attempt FROM {s}.job j JOIN {s}.chaos_exec e ON e.job_id = j.id"
        " WHERE j.state = 'dead' AND e.how = 'ok'",
        schema,
    )
    return [f"job {r[0]} dead although {r[1]} attempt {r[2]} succeeded" for r in rows]
