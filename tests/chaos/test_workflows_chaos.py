"""A workflow under SIGKILLs and backend kills (SPEC D1-D3, P1-P3).

A 3-level fan-out/fan-in of 2,002 jobs (a root, 20 branches after it, 98 leaves after each
branch, a join after each branch's leaves, a final join after the 20 joins), enqueued in one
transaction, is drained by three worker processes while one of them is SIGKILLed or every
engine connection is terminated again and again. Every job ends done exactly once, no
child is ever claimed or started before each of its parents was recorded done, and nothing
stays blocked.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py import Job
from brooq_py.postgres import Store
from tests.chaos import invariants
from tests.chaos.conftest import Worker, settled
from tests.chaos.test_connections import terminate_engine_connections
from tests.polling import wait_for

BRANCHES = 20
LEAVES = 98


def enqueue_graph(dsn: str, schema: str, rng: random.Random) -> set[str]:
    def job(after: list[str] | None = None) -> Job:
        return Job("wf", {"sleep": round(rng.uniform(0.01, 0.08), 3)}, after=after or [])

    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = Store(pool, schema=schema)
        ids: list[str] = []
        with store.begin() as tx:
            root = store.enqueue_tx(tx, job()).id
            branches = [r.id for r in store.enqueue_many([job([root]) for _ in range(BRANCHES)], tx=tx)]
            joins = []
            for branch in branches:
                group = store.enqueue_group([job([branch]) for _ in range(LEAVES)], then=job(), tx=tx)
                assert group.then_id is not None
                ids += group.ids
                joins.append(group.then_id)
            final = store.enqueue_tx(tx, job(joins)).id
        store.close()
    return {root, *branches, *ids, *joins, final}


def query(dsn: str, schema: str, text: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql.SQL(text).format(s=sql.Identifier(schema))).fetchall()  # type: ignore[arg-type]


def test_a_fan_out_fan_in_survives_kills_and_dropped_connections(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker], capsys: pytest.CaptureFixture[str]
) -> None:
    schema = chaos_schema
    rng = random.Random(23)
    ids = enqueue_graph(dsn, schema, rng)
    assert len(ids) == 2 + BRANCHES * (LEAVES + 2)
    settings = {"workers": 4, "lease": 2.0, "reaper_period": 0.5, "poll_interval": 0.2, "workflow": True}
    live = [spawn(dsn, schema, **settings) for _ in range(3)]
    kills = drops = 0
    faults_until = time.monotonic() + 25
    while time.monotonic() < faults_until and not settled(dsn, schema, ids):
        time.sleep(rng.uniform(0.4, 1.2))
        if rng.random() < 0.5:
            victim = rng.choice(live)
            victim.kill()
            live.remove(victim)
            live.append(spawn(dsn, schema, **settings))
            kills += 1
        else:
            drops += terminate_engine_connections(dsn)
    wait_for(lambda: settled(dsn, schema, ids), "every job of the workflow to end", timeout=90)
    for w in live:
        assert w.stop() == 0, w.log_tail()

    report = invariants.check(dsn, schema, ids, parent_topic="wf", child_topic="none")
    report.assert_ok()
    assert report.states == {"done": len(ids)}
    # Done exactly once: one change into done per job.
    dones = query(
        dsn,
        schema,
        "SELECT job_id, count(*) FROM {s}.chaos_audit WHERE new_state = 'done' AND old_state <> 'done'"
        " GROUP BY job_id",
    )
    assert {str(j) for j, _ in dones} == ids and all(n == 1 for _, n in dones)
    # No child claimed or started before each parent's done was recorded (database clock: the
    # done is written before its commit, which releases the child, which is claimed after).
    early = query(
        dsn,
        schema,
        """
        WITH done AS (SELECT job_id, min(at) AS at FROM {s}.chaos_audit
                      WHERE new_state = 'done' AND old_state <> 'done' GROUP BY job_id),
             began AS (SELECT job_id, at FROM {s}.chaos_audit
                       WHERE new_state = 'processing' AND old_state <> 'processing'
                       UNION ALL
                       SELECT job_id, started_at FROM {s}.chaos_exec)
        SELECT b.job_id, p.id, b.at, d.at
        FROM began b
        JOIN {s}.job c ON c.id = b.job_id
        CROSS JOIN LATERAL unnest(c.parents) AS p(id)
        LEFT JOIN done d ON d.job_id = p.id
        WHERE d.at IS NULL OR b.at <= d.at
        """,
    )
    assert early == []
    # Each execution that ended read every parent's result (retention kept them all).
    short = query(
        dsn,
        schema,
        "SELECT x.job_id FROM {s}.chaos_exec x JOIN {s}.job j ON j.id = x.job_id"
        " WHERE x.how LIKE 'ok:%%' AND x.how <> 'ok:' || coalesce(cardinality(j.parents), 0)",
    )
    assert short == []
    assert query(dsn, schema, "SELECT count(*) FROM {s}.job WHERE state = 'blocked'") == [(0,)]
    with capsys.disabled():
        print(
            f"\n[chaos] workflow: jobs={len(ids)} kills={kills} connections dropped={drops}"
            f" claims={report.claims} reaped={report.reaps} executions={report.executions}"
        )
