"""Engines SIGSTOPped holding jobs of a limited tenant (SPEC T2, Q3, F0, P1''): real worker
processes (worker_proc.py) on the chaos server, a tight database sampler of each tenant's processing
rows and of the topic's."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py import Job
from brooq_py.postgres import Store
from tests.chaos import invariants
from tests.chaos.conftest import Worker, held_by, settled
from tests.polling import wait_for
from tests.sampling import Sampler


def peak_sampler(dsn: str, schema: str) -> Sampler:
    query = sql.SQL(
        "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM {} WHERE topic = 'chaos' "
        "AND state = 'processing' GROUP BY tenant) AS t"
    ).format(sql.Identifier(schema, "job"))
    return Sampler(dsn, query, ())


def overlap(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    """Handler executions (chaos_exec, database clock) of one tenant overlapping more than 2 at once."""
    s = sql.Identifier(schema)
    query = sql.SQL(
        """
        WITH e AS (
            SELECT x.claim_token, x.started_at, coalesce(x.ended_at, 'infinity') AS ended_at, j.tenant
            FROM {}.chaos_exec x JOIN {}.job j ON j.id = x.job_id
        )
        SELECT a.tenant, a.started_at, count(*) AS running
        FROM e a JOIN e b ON b.tenant = a.tenant AND b.started_at <= a.started_at AND b.ended_at > a.started_at
        GROUP BY a.claim_token, a.tenant, a.started_at
        HAVING count(*) > 2
        ORDER BY running DESC LIMIT 5
        """
    ).format(s, s)
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query).fetchall()


def test_t2_a_tenant_limit_holds_while_engines_are_sigstopped_fenced_and_reaped(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker]
) -> None:
    """Three worker processes of 3 slots, lease 2 s; 4 tenants of a topic limited to 2 each. Twice, a
    worker holding jobs is SIGSTOPped, its jobs reaped and run by the others, then SIGCONTed (it fences
    itself and gives its claims back). No database sample ever has a tenant with more than 2 processing,
    every job ends done, and P1-P3 hold (tests/chaos/invariants.py)."""
    schema = chaos_schema
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = Store(pool, schema=schema)
        store.set_tenant_limit("chaos", 2)
        store.close()
    settings = {"workers": 3, "lease": 2.0, "reaper_period": 0.3, "poll_interval": 0.1}
    live = [spawn(dsn, schema, label=f"lmw{i}", **settings) for i in range(3)]
    wids = [f"chaos-{w.label}:{w.proc.pid}" for w in live]
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = Store(pool, schema=schema)
        jobs = [Job("chaos", {"n": i, "sleep": 0.4 + (i % 5) * 0.15}, tenant=f"t{i % 4}") for i in range(90)]
        ids = {r.id for r in store.enqueue_many(jobs)}
        store.close()
    stopped = 0
    with peak_sampler(dsn, schema) as s:
        for victim_i in (0, 1):
            victim, wid = live[victim_i], wids[victim_i]
            wait_for(lambda wid=wid: held_by(dsn, schema, wid) > 0, f"{wid} to hold a job", timeout=60)
            os.killpg(victim.proc.pid, signal.SIGSTOP)
            stopped += 1
            # its jobs reaped (lease + margin on the database clock) and taken by the others
            wait_for(lambda wid=wid: held_by(dsn, schema, wid) == 0, f"{wid}'s jobs reaped", timeout=60)
            time.sleep(1.0)  # the others run the reaped jobs meanwhile (not a pass/fail timing)
            os.killpg(victim.proc.pid, signal.SIGCONT)
        wait_for(lambda: settled(dsn, schema, ids), "every job settled", timeout=180)
    for w in live:
        assert w.stop() == 0, w.log_tail()
    assert stopped == 2
    assert s.samples and max(s.samples) <= 2, max(s.samples)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FROM {}.job WHERE topic = 'chaos'"
            ).format(sql.Identifier(schema))
        ).fetchone()
    assert row == (90, 90), row
    report = invariants.check(dsn, schema, ids)
    report.assert_ok()
    print("reaps:", report.reaps)
    print("handler-side overlaps > 2 (stalled handlers resumed after SIGCONT):", overlap(dsn, schema))
