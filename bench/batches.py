"""BATCH: batch delivery against W3 (SPEC BD1).

W3 is four workers draining no-op jobs one handler call each; the batch run drains the
same number of no-op jobs of a batch kind, ``batch_size`` 100. Each claim of a batch
takes a slot (``workers``), so the batch engine has 100 slots; the batch is run by
one thread, and the handler is called once per batch. Both in fresh schemas, in rounds
whose order alternates; the ratio is the median over the rounds. The Probe counts the
settle statements: one per batch is the rule.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg
from psycopg import sql
from util import fresh_schema, job_table, store_on, wait_all_done
from workloads import LEASE, TOPIC, Probe, drain, seed

from brooq_py.engine import Config, Engine
from brooq_py.queue import KindOptions


def _noop_batch(ctx: Any, claims: list[Any]) -> list[None]:
    return [None] * len(claims)


def batch_drain(dsn: str, n: int, batch_size: int = 100) -> dict[str, Any]:
    """Enqueue *n* no-op jobs, then time one Engine draining them with a batch handler."""
    with fresh_schema(dsn, "batch") as schema, store_on(dsn, schema, max_size=8) as store:
        seed(store, n)
        probe = Probe(store)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))
            engine = Engine(store, Config(workers=batch_size, claim_batch=batch_size, lease=LEASE))
            engine.register_batch(TOPIC, _noop_batch, KindOptions(batch_size=batch_size))
            t0 = time.perf_counter()
            engine.start()
            t_end = wait_all_done(conn, schema, deadline_s=max(120.0, n / 100))
            engine.stop()
            engine.close()
    if t_end is None:
        return {"n": n, "error": "not drained in time"}
    dt = t_end - t0
    return {"n": n, "batch_size": batch_size, "seconds": dt, "per_s": n / dt, "store": probe.summary()}


def batch(dsn: str, n: int, rounds: int = 3) -> dict[str, Any]:
    per_s: dict[str, list[float]] = {"w3": [], "batch": []}
    settles: list[dict[str, Any]] = []
    for i in range(rounds):
        order = ("w3", "batch") if i % 2 == 0 else ("batch", "w3")
        for which in order:
            if which == "w3":
                r = drain(dsn, n, 4, "w3")
            else:
                r = batch_drain(dsn, n)
                settles.append(r.get("store", {}).get("settle_many", {}))
            if "error" in r:
                return {"error": f"{which}: {r['error']}"}
            per_s[which].append(r["per_s"])
    ratio = statistics.median(per_s["batch"]) / statistics.median(per_s["w3"])
    return {"n": n, "per_s": per_s, "batch_vs_w3": round(ratio, 2), "settles": settles}


def batch_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The table row of BATCH: batch_size 100 against W3 (>= 3 x)."""
    ratio = r.get("batch_vs_w3")
    measured = (
        f"{statistics.median(r['per_s']['batch']):,.0f} vs {statistics.median(r['per_s']['w3']):,.0f} jobs/s"
        if ratio is not None
        else r.get("error", "?")
    )
    return [
        {
            "workload": "BATCH no-op, batch_size 100, vs W3",
            "measured": measured,
            "target": ">= 3 x",
            "ratio": ratio,
            "verdict": "PASS" if ratio is not None and ratio >= 3 else "MISS",
        }
    ]
