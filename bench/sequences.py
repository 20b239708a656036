"""SQ: what sequences and parking cost (SPEC Q5, F3).

- The drain of 1,000 sequences x 20 jobs beside the same 20,000 jobs without a sequence
  (four workers, one engine, enqueued before the engine starts, in alternating rounds):
  the ratio of the rates (target >= 0.8 x).
- W1 and W3 for jobs without a sequence on a schema at head and at head without the
  sequences' triggers (NO_SEQUENCES), rounds alternating (target >= 0.97 x).
- A parked enqueue (a parking topic at its cap) beside an enqueue of an uncapped topic,
  and the stager's release of 1,000 parked jobs, and its tick with nothing owed.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg
from util import NO_SEQUENCES, fresh_schema, job_table, store_on, wait_all_done
from workloads import drain

from brooq_py.engine import Config, Engine
from brooq_py.queue import Job

TOPIC = "bench"


def _sequenced_drain(dsn: str, sequences: int, per: int, sequenced: bool, workers: int = 4) -> float:
    """Jobs per second of one engine draining *sequences* x *per* jobs (with or without a sequence)."""
    n = sequences * per
    with fresh_schema(dsn, "sq") as schema, store_on(dsn, schema, max_size=8) as store:
        jobs = [Job(TOPIC, {"n": i}, sequence=f"s{i % sequences}" if sequenced else None) for i in range(n)]
        for start in range(0, n, 1000):
            store.enqueue_many(jobs[start : start + 1000])
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"VACUUM ANALYZE {job_table(schema).as_string(conn)}")
            engine = Engine(store, Config(workers=workers))
            engine.register_kind(TOPIC, lambda ctx, claim: None)
            t0 = time.perf_counter()
            engine.start()
            t_end = wait_all_done(conn, schema, deadline_s=max(300.0, n / 20))
            engine.stop()
            engine.close()
    if t_end is None:
        raise RuntimeError("not drained in time")
    return n / (t_end - t0)


def sequenced_drain(dsn: str, sequences: int = 1000, per: int = 20, rounds: int = 2) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"sequenced": [], "plain": []}
    for i in range(rounds):
        for kind in ("sequenced", "plain") if i % 2 == 0 else ("plain", "sequenced"):
            rates[kind].append(_sequenced_drain(dsn, sequences, per, kind == "sequenced"))
    ratio = statistics.median(s / p for s, p in zip(rates["sequenced"], rates["plain"], strict=True))
    return {
        "sequences": sequences,
        "per": per,
        "per_s": {k: [round(v) for v in vs] for k, vs in rates.items()},
        "ratio": round(ratio, 3),
    }


def w1_beside(dsn: str, n: int, rounds: int = 10) -> dict[str, Any]:
    """Store.enqueue of plain jobs, one a call, on head and on NO_SEQUENCES, batch by batch in turn."""
    per_round = max(1, n // rounds)
    spent = {"head": 0.0, NO_SEQUENCES: 0.0}
    with (
        fresh_schema(dsn, "sqw1a") as head,
        fresh_schema(dsn, "sqw1b", NO_SEQUENCES) as bare,
        store_on(dsn, head, max_size=2) as s_head,
        store_on(dsn, bare, max_size=2) as s_bare,
    ):
        stores = {"head": s_head, NO_SEQUENCES: s_bare}
        for store in stores.values():
            for _ in range(5):
                store.enqueue(Job(TOPIC, {"n": 0}))
        for i in range(rounds):
            order = list(stores.items()) if i % 2 == 0 else list(stores.items())[::-1]
            for name, store in order:
                t0 = time.perf_counter()
                for _ in range(per_round):
                    store.enqueue(Job(TOPIC, {"n": 1}))
                spent[name] += time.perf_counter() - t0
    return {"n": per_round * rounds, "seconds": spent, "ratio": round(spent[NO_SEQUENCES] / spent["head"], 3)}


def w3_beside(dsn: str, n: int, rounds: int = 2) -> dict[str, Any]:
    per_s: dict[str, list[float]] = {"head": [], NO_SEQUENCES: []}
    for i in range(rounds):
        order = ("head", NO_SEQUENCES) if i % 2 == 0 else (NO_SEQUENCES, "head")
        for revision in order:
            res = drain(dsn, n, 4, "sqw3", revision=revision)
            if "per_s" not in res:
                return {"n": n, "error": f"{revision}: {res.get('error')}"}
            per_s[revision].append(res["per_s"])
    ratio = statistics.median(h / o for h, o in zip(per_s["head"], per_s[NO_SEQUENCES], strict=True))
    return {"n": n, "per_s": {k: [round(v) for v in vs] for k, vs in per_s.items()}, "ratio": round(ratio, 3)}


def parking_cost(dsn: str, n: int = 2000, released: int = 1000) -> dict[str, Any]:
    """Per-enqueue time of a parked job beside a plain one (interleaved), the stager's release of
    *released* parked jobs, and a stager tick with nothing owed."""
    with fresh_schema(dsn, "sqpark") as schema, store_on(dsn, schema, max_size=2) as store:
        store.set_max_depth("parked", 100, park=True)
        store.enqueue_many([Job("parked", {"n": i}) for i in range(100)])
        parked = plain = 0.0
        for _ in range(n // 100):
            t0 = time.perf_counter()
            for _ in range(100):
                store.enqueue(Job("parked", {"n": 1}))
            t1 = time.perf_counter()
            for _ in range(100):
                store.enqueue(Job("plain", {"n": 1}))
            parked += t1 - t0
            plain += time.perf_counter() - t1
        idle = []
        for _ in range(20):
            t0 = time.perf_counter()
            store.stage(["nothing"], 1000)
            idle.append(time.perf_counter() - t0)
        # room for *released* jobs: raise the cap, then one stager tick releases them
        store.set_max_depth("parked", 100 + released, park=True)
        t0 = time.perf_counter()
        staged = store.stage(["parked"], 1000)
        release_s = time.perf_counter() - t0
    return {
        "n": n,
        "parked_ms": round(parked / n * 1000, 3),
        "plain_ms": round(plain / n * 1000, 3),
        "release_ms": round(release_s * 1000, 1),
        "released": staged.promoted.get("parked", 0),
        "idle_tick_ms": round(statistics.median(idle) * 1000, 2),
    }


def sq(dsn: str, w1: int, w3: int) -> dict[str, Any]:
    return {
        "drain": sequenced_drain(dsn),
        "w1": w1_beside(dsn, w1),
        "w3": w3_beside(dsn, w3),
        "parking": parking_cost(dsn),
    }


def sq_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    d = r.get("drain", {})
    if "ratio" in d:
        rows.append(
            {
                "workload": f"SQ drain {d['sequences']:,} sequences x {d['per']} vs the same jobs unsequenced",
                "measured": f"{statistics.median(d['per_s']['sequenced']):,.0f} vs "
                f"{statistics.median(d['per_s']['plain']):,.0f} jobs/s",
                "target": ">= 0.8 x",
                "ratio": d["ratio"],
                "verdict": "PASS" if d["ratio"] >= 0.8 else "MISS",
            }
        )
    for key, what in (("w1", "W1 plain enqueue"), ("w3", "W3 plain drain")):
        w = r.get(key, {})
        if "ratio" in w:
            rows.append(
                {
                    "workload": f"SQ {what}, with vs without the sequences' triggers",
                    "measured": f"n={w['n']:,}",
                    "target": ">= 0.97 x",
                    "ratio": w["ratio"],
                    "verdict": "PASS" if w["ratio"] >= 0.97 else "MISS",
                }
            )
    p = r.get("parking", {})
    if "parked_ms" in p:
        rows.append(
            {
                "workload": "SQ a parked enqueue vs a plain one; release of parked jobs; idle stager tick",
                "measured": f"{p['parked_ms']} vs {p['plain_ms']} ms; {p['released']} in {p['release_ms']} ms;"
                f" {p['idle_tick_ms']} ms",
                "target": "-",
                "ratio": None,
                "verdict": "INFO",
            }
        )
    return rows
