"""The checker itself can fail: a terminal row overwritten and an unsettled job are reported (SPEC P3)."""

from __future__ import annotations

import psycopg
from psycopg import sql

from tests.chaos import invariants
from tests.chaos.conftest import enqueue_parents


def test_checker_reports_overwritten_terminal_and_lost_jobs(dsn: str, chaos_schema: str) -> None:
    ids = enqueue_parents(dsn, chaos_schema, [{"n": 0}, {"n": 1}])
    a, b = sorted(ids)
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = sql.Identifier(chaos_schema, "job")
        conn.execute(sql.SQL("UPDATE {} SET state = 'done' WHERE id = %s").format(job), [a])
        conn.execute(sql.SQL("UPDATE {} SET state = 'failed' WHERE id = %s").format(job), [a])  # P3 broken
        conn.execute(
            sql.SQL("UPDATE {} SET attempts = 3 WHERE id = %s").format(job), [b]
        )  # no claim behind it
    report = invariants.check(dsn, chaos_schema, ids)
    text = "\n".join(report.problems)
    assert f"P3: terminal row {a} changed by UPDATE: done -> failed" in text
    assert f"job {b} ended in state pending" in text
    assert f"C1: job {b} attempts=3, but claims-given back-reaped=0" in text
