"""A worker process SIGKILLed in the middle of a batch call (SPEC BD1, P1''): every claim of the
batch is taken back and run again elsewhere; none is lost, none is done twice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py import Job
from brooq_py.postgres import Store
from tests.chaos import invariants
from tests.chaos.conftest import Worker, settled
from tests.polling import wait_for


def _rows(dsn: str, query: str, schema: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), args).fetchall()


def test_bd1_a_worker_killed_mid_batch_loses_no_claim(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker]
) -> None:
    schema = chaos_schema
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = Store(pool, schema=schema)
        ids = {r.id for r in store.enqueue_many([Job("chaos.batch", {"sleep": 30}) for _ in range(8)])}
        store.close()
    settings = {"workers": 8, "lease": 2.0, "reaper_period": 0.3, "batch": 8}
    victim = spawn(dsn, schema, label="victim", **settings)
    wait_for(
        lambda: _rows(dsn, "SELECT count(*) FROM {s}.chaos_exec WHERE how IS NULL", schema)[0][0] >= 2,
        "the victim running a batch of several claims",
    )
    in_call = {str(r[0]) for r in _rows(dsn, "SELECT job_id FROM {s}.chaos_exec WHERE how IS NULL", schema)}
    victim.kill()
    # The survivor runs the same jobs again, quickly this time.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("UPDATE {}.job SET payload = '{{\"sleep\": 0}}'").format(sql.Identifier(schema)))
    survivor = spawn(dsn, schema, label="survivor", **settings)
    wait_for(lambda: settled(dsn, schema, ids), "every job of the batch settled", timeout=60)
    done = _rows(dsn, "SELECT id::text, state, crashes FROM {s}.job", schema)
    assert {r[0] for r in done} == ids
    assert all(r[1] == "done" for r in done)
    # Each job the victim held ran again, and each was done by exactly one execution.
    runs = _rows(dsn, "SELECT job_id::text, worker, how FROM {s}.chaos_exec", schema)
    for job_id in ids:
        ok = [r for r in runs if r[0] == job_id and r[2] is not None and r[2].startswith("ok")]
        assert len(ok) == 1, (job_id, runs)
    assert in_call <= {r[0] for r in runs if r[2] is not None}
    invariants.check(dsn, schema, ids, parent_topic="chaos.batch").assert_ok()
    survivor.stop()
