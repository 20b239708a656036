"""CXL: what the cancel trigger costs the hot path, and how fast a cancel reaches a running handler.

``trigger_cost``: W1 (one autocommit enqueue a job) and W3 (4 workers draining no-op
jobs) each in a schema with the cancel trigger of migration 0011 and in one
without it (dropped), in alternating order, several rounds; the figures are the
medians of the per-round ratios (with / without). The trigger fires only on a
move from processing to canceled: an enqueue does not touch it, an outcome
write evaluates its WHEN clause per row.

``cancel_latency``: an engine with lease 120 s (a heartbeat every 40 s) runs
handlers that wait on their ctx; each is canceled through ``Store.cancel`` and
the time from the cancel call to the handler's ctx being cancelled is measured
(the cancel's commit, the NOTIFY, the engine's listener, the ctx).
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import psycopg
from psycopg import sql
from util import fresh_schema, job_table, pct, store_on, wait_all_done
from workloads import LEASE, TOPIC, seed

from brooq_py.engine import Config, Engine
from brooq_py.queue import Job, JobCanceledByOperator


def _drop_trigger(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TRIGGER job_cancel_notify ON {}").format(job_table(schema)))


def _w1(dsn: str, n: int, trigger: bool) -> float:
    with fresh_schema(dsn, "cxl1") as schema:
        if not trigger:  # before the Store's connections open: both sides start alike
            _drop_trigger(dsn, schema)
        with store_on(dsn, schema, max_size=2) as store:
            return _timed_enqueues(store, n)


def _timed_enqueues(store: Any, n: int) -> float:
    store.enqueue(Job(TOPIC, 0))  # warm the pool's connection
    t0 = time.perf_counter()
    for i in range(n):
        store.enqueue(Job(TOPIC, i))
    return n / (time.perf_counter() - t0)


def _w3(dsn: str, n: int, trigger: bool) -> float:
    with fresh_schema(dsn, "cxl3") as schema:
        if not trigger:  # before the Store's connections open: both sides start alike
            _drop_trigger(dsn, schema)
        return _timed_drain(dsn, schema, n)


def _timed_drain(dsn: str, schema: str, n: int) -> float:
    with store_on(dsn, schema, max_size=8) as store:
        seed(store, n)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))
            engine = Engine(store, Config(workers=4, lease=LEASE))
            engine.register_kind(TOPIC, lambda ctx, claim: None)
            t0 = time.perf_counter()
            engine.start()
            t_end = wait_all_done(conn, schema, deadline_s=max(120.0, n / 100))
            engine.stop()
            engine.close()
    if t_end is None:
        raise RuntimeError("W3 not drained in time")
    return n / (t_end - t0)


def trigger_cost(dsn: str, n_w1: int, n_w3: int, rounds: int = 3) -> dict[str, Any]:
    """W1 and W3 with and without the cancel trigger, alternating; medians of the per-round ratios."""
    out: dict[str, Any] = {"rounds": rounds, "w1_n": n_w1, "w3_n": n_w3}
    for name, run, n in (("w1", _w1, n_w1), ("w3", _w3, n_w3)):
        pairs: list[tuple[float, float]] = []
        for r in range(rounds):
            if r % 2:
                with_t, without = run(dsn, n, True), run(dsn, n, False)
            else:
                without, with_t = run(dsn, n, False), run(dsn, n, True)
            pairs.append((without, with_t))
        out[name] = {
            "without_per_s": [round(a) for a, _ in pairs],
            "with_per_s": [round(b) for _, b in pairs],
            "ratios": [round(b / a, 3) for a, b in pairs],
            "ratio": statistics.median(b / a for a, b in pairs),
        }
    return out


def cancel_latency(dsn: str, n: int = 100, at_once: int = 4) -> dict[str, Any]:
    """Cancel *n* running jobs (*at_once* running together) through Store.cancel; ms from the call
    to the handler's ctx being cancelled, with the lease at 120 s (no heartbeat within the run)."""
    with fresh_schema(dsn, "cxlat") as schema, store_on(dsn, schema, max_size=4) as store:
        started: dict[str, float] = {}
        told: dict[str, float] = {}
        causes: list[str] = []
        lock = threading.Condition()

        def handler(ctx: Any, claim: Any) -> None:
            with lock:
                started[claim.id] = time.perf_counter()
                lock.notify_all()
            ctx.wait(60)
            with lock:
                told[claim.id] = time.perf_counter()
                causes.append(type(ctx.cause).__name__)
                lock.notify_all()

        engine = Engine(store, Config(workers=at_once, lease=LEASE))
        engine.register_kind(TOPIC, handler)
        engine.start()
        latencies: list[float] = []
        try:
            done = 0
            while done < n:
                k = min(at_once, n - done)
                ids = [store.enqueue(Job(TOPIC, done + i)).id for i in range(k)]
                with lock:
                    if not lock.wait_for(lambda ids=ids: all(i in started for i in ids), 30):
                        raise RuntimeError("handlers did not start")
                called: dict[str, float] = {}
                for i in ids:
                    called[i] = time.perf_counter()
                    store.cancel(i)
                with lock:
                    if not lock.wait_for(lambda ids=ids: all(i in told for i in ids), 30):
                        raise RuntimeError("a cancel did not reach its handler within 30 s")
                latencies.extend(1000 * (told[i] - called[i]) for i in ids)
                done += k
        finally:
            engine.stop(timeout=5)
            engine.close()
    return {
        "n": n,
        "at_once": at_once,
        "lease_s": LEASE.total_seconds(),
        "p50_ms": pct(latencies, 50),
        "p99_ms": pct(latencies, 99),
        "max_ms": max(latencies),
        "all_by_operator": all(c == JobCanceledByOperator.__name__ for c in causes),
    }
