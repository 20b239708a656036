"""SIGKILL of worker processes while a tenant limit holds (SPEC T2 through engine deaths)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py import Job
from brooq_py.postgres import Store
from tests.chaos.conftest import Worker, kill_mid_job, settled
from tests.polling import wait_for


class TenantSampler(threading.Thread):
    """The busiest tenant's processing rows, sampled from the database (one statement a sample)."""

    def __init__(self, dsn: str, schema: str) -> None:
        super().__init__(daemon=True)
        self.query = sql.SQL(
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM {}.job "
            "WHERE topic = 'chaos' AND state = 'processing' GROUP BY tenant) AS t"
        ).format(sql.Identifier(schema))
        self.dsn = dsn
        self.samples: list[int] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.halt.is_set():
                row = conn.execute(self.query).fetchone()
                assert row is not None
                self.samples.append(int(row[0]))
                time.sleep(0.005)


def test_t2_a_tenant_limit_holds_while_workers_are_sigkilled(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker]
) -> None:
    """Three worker processes of 3 slots on 4 tenants limited to 2 each; one process SIGKILLed mid-job,
    twice (and replaced): the reaped claims come back, every job ends done, and no sample
    ever sees a tenant with more than 2 processing rows (a dead engine's rows count until reaped)."""
    rng = random.Random(3)
    payloads: list[dict[str, Any]] = [{"n": i, "sleep": round(rng.uniform(0.05, 0.4), 3)} for i in range(80)]
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = Store(pool, schema=chaos_schema)
        store.set_tenant_limit("chaos", 2)
        store.close()
    settings = {"workers": 3, "lease": 2.0, "reaper_period": 0.5}
    sampler = TenantSampler(dsn, chaos_schema)
    sampler.start()
    live = []
    try:
        for _ in range(3):
            w = spawn(dsn, chaos_schema, **settings)
            live.append((w, f"chaos-{w.label}:{w.proc.pid}"))
        # Enqueued once the workers run: on a busy machine the first drained the queue while the
        # others started, and no kill found a job to interrupt.
        with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
            store = Store(pool, schema=chaos_schema)
            jobs = [Job("chaos", p, tenant=f"t{p['n'] % 4}") for p in payloads]
            ids = {r.id for r in store.enqueue_many(jobs)}
            store.close()
        mid_job = kill_mid_job(
            dsn, chaos_schema, spawn, live, settings, rng, kills=2, pause=(0.3, 0.8), hits=1, most=5
        )
        wait_for(lambda: settled(dsn, chaos_schema, ids), "every job to settle after the kills", timeout=120)
        for w, _ in live:
            assert w.stop() == 0, w.log_tail()
    finally:
        sampler.halt.set()
        sampler.join(10)
    assert mid_job >= 1, "no kill hit a worker holding a job"
    assert sampler.samples and max(sampler.samples) <= 2, max(sampler.samples)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FROM {}.job WHERE topic = 'chaos'"
            ).format(sql.Identifier(chaos_schema))
        ).fetchone()
    assert row == (80, 80), states(dsn, chaos_schema)


def states(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT state, last_error, count(*) FROM {}.job GROUP BY 1, 2").format(
            sql.Identifier(schema)
        )
        return conn.execute(query).fetchall()
