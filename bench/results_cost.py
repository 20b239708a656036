"""RES: what results, attempt history and wait cost (SPEC V1-V4).

- W1 on/off: a task's ``enqueue`` (arguments bound to the signature, stored by name) beside
  ``Store.enqueue(Job(...))`` of the same payload, interleaved round by round in one schema.
- W3 on/off: a drain whose handlers return a small dict (written with the done, the batch
  notifying the results channel) beside one whose handlers return None and whose batches
  send no notification (QuietStore: what a store without V1-V2 writes), the two of each pair
  at the same time in two schemas (the machine's load weighs on both alike); median of the
  per-pair ratios. No job fails in either, so history costs nothing here: it is written only
  by failures, in the statement that records them.
- W8 on/off: the async W8 drain (sleeping handlers) returning a dict vs None (and no
  notification), alternated.
- wait latency: from the commit of a job's done (the outcome batch returned) to ``Store.wait``
  returning in another thread, p50/p99 over many jobs, on an otherwise idle store.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from util import fresh_schema, job_table, pct, side_by_side, store_on, wait_all_done
from workloads import PAYLOAD, TOPIC, seed

from brooq_py import Tasks
from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.postgres.worker.repo import WorkerRepo
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome

LEASE = timedelta(seconds=120)


class QuietRepo(WorkerRepo):
    @staticmethod
    def _settle_params(outcomes: Any) -> dict[str, Any]:
        params = WorkerRepo._settle_params(outcomes)
        params["notify"] = False
        return params


class QuietStore(Store):
    """The "off" side: outcome batches send no NOTIFY on the results channel (nobody waits)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.worker = QuietRepo(self.session, self.producer, self.flow)


RESULT = {"ok": True, "n": 1, "note": "a small result, as most are"}


def w1_on_off(dsn: str, n: int, rounds: int = 20) -> dict[str, Any]:
    per_round = max(1, n // rounds)
    plain_s = task_s = 0.0
    with fresh_schema(dsn, "resw1") as schema, store_on(dsn, schema, max_size=2) as store:
        tasks = Tasks(store)

        @tasks.task(TOPIC)
        def bench(n: int, what: str) -> None: ...

        for _ in range(5):
            store.enqueue(Job(TOPIC, PAYLOAD))
            bench.enqueue(**PAYLOAD)
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(per_round):
                store.enqueue(Job(TOPIC, PAYLOAD))
            t1 = time.perf_counter()
            for _ in range(per_round):
                bench.enqueue(**PAYLOAD)
            t2 = time.perf_counter()
            plain_s += t1 - t0
            task_s += t2 - t1
    total = per_round * rounds
    return {
        "n": total,
        "plain_per_s": total / plain_s,
        "task_per_s": total / task_s,
        "ratio": plain_s / task_s,
    }


def _drain(dsn: str, n: int, with_result: bool, asynchronous: bool, start: Any = None) -> float:
    """One drain of *n* jobs whose handlers return RESULT (*with_result*) or None: W3's no-op
    handlers on 4 workers, or W8's 100 ms async sleeps on 500 (*asynchronous*)."""

    def handler(ctx: Any, claim: Any) -> Any:
        return RESULT if with_result else None

    async def sleeper(ctx: Any, claim: Any) -> Any:
        await asyncio.sleep(0.1)
        return RESULT if with_result else None

    factory = Store if with_result else QuietStore
    with fresh_schema(dsn, "resdrain") as schema, store_on(dsn, schema, max_size=8, factory=factory) as store:
        seed(store, n)
        engine = Engine(store, Config(workers=500 if asynchronous else 4, lease=LEASE))
        engine.register_kind(TOPIC, sleeper if asynchronous else handler)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))
            if start is not None:
                start.wait()
            t0 = time.perf_counter()
            engine.start()
            t_end = wait_all_done(conn, schema, deadline_s=max(120.0, n / 50), every=0.02)
            engine.stop()
            engine.close()
    if t_end is None:
        raise RuntimeError("not drained in time")
    return n / (t_end - t0)


def _summary(n: int, pairs: list[tuple[float, float]]) -> dict[str, Any]:
    ratios = [on / off for off, on in pairs]
    return {
        "n": n,
        "off_per_s": [round(a) for a, _ in pairs],
        "on_per_s": [round(b) for _, b in pairs],
        "ratio": statistics.median(ratios),
        "ratios": [round(r, 3) for r in ratios],
    }


def w3_on_off(dsn: str, n: int, rounds: int = 3) -> dict[str, Any]:
    """Side by side: the machine's load weighs on both drains of a pair alike."""
    return _summary(n, side_by_side(lambda flag, start: _drain(dsn, n, flag, False, start), rounds))


def w8_on_off(dsn: str, n: int, rounds: int = 4) -> dict[str, Any]:
    """Alternated (500 workers each: side by side they would crowd each other out)."""
    pairs = []
    for i in range(rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {flag: _drain(dsn, n, flag, True) for flag in order}
        pairs.append((got[False], got[True]))
    return _summary(n, pairs)


def wait_latency(dsn: str, n: int = 200) -> dict[str, Any]:
    """Seconds from an outcome batch's commit to Store.wait returning in another thread."""
    lat: list[float] = []
    with fresh_schema(dsn, "reswait") as schema, store_on(dsn, schema, max_size=4) as store:
        store.wait_poll_interval = 10.0  # a notification, not the fallback, must wake it
        for _ in range(n):
            jid = store.enqueue(Job(TOPIC, PAYLOAD)).id
            (row,) = store.worker.claim([TOPIC], 1, "bench", LEASE)
            woke: list[float] = []

            def waiter(j: str = jid, woke: list[float] = woke) -> None:
                store.wait(j, timeout=30)
                woke.append(time.perf_counter())

            t = threading.Thread(target=waiter)
            t.start()
            while jid not in store.waits._waiting:
                time.sleep(0.001)
            time.sleep(0.005)  # the waiter reads its row and sleeps
            store.worker.settle_many([Outcome(jid, row.claim_token, State.DONE, result="1")])
            committed = time.perf_counter()
            t.join(30)
            lat.append(woke[0] - committed)
    return {
        "n": n,
        "p50_ms": round(pct(lat, 50) * 1000, 2),
        "p99_ms": round(pct(lat, 99) * 1000, 2),
        "max_ms": round(max(lat) * 1000, 2),
    }


def res(dsn: str, sizes: dict[str, Any]) -> dict[str, Any]:
    return {
        "w1": w1_on_off(dsn, sizes["w1"]),
        "w3": w3_on_off(dsn, sizes["w3"] // 2),
        "w8": w8_on_off(dsn, sizes["w8"] // 3),
        "wait": wait_latency(dsn),
    }


def rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The RES lines of the results table."""
    out = []
    for key, label, need in (
        ("w1", "RES W1 task.enqueue vs Store.enqueue(Job)", 0.97),
        ("w3", "RES W3 results + NOTIFY vs None, no NOTIFY", 0.95),
        ("w8", "RES W8 results + NOTIFY vs None, no NOTIFY", 0.95),
    ):
        w = r[key]
        on = w.get("task_per_s") or statistics.median(w["on_per_s"])
        off = w.get("plain_per_s") or statistics.median(w["off_per_s"])
        out.append(
            {
                "workload": label,
                "measured": f"{on:,.0f}/s vs {off:,.0f}/s",
                "target": f">= {need} x",
                "ratio": round(w["ratio"], 3),
                "verdict": "PASS" if w["ratio"] >= need else "MISS",
            }
        )
    w = r["wait"]
    out.append(
        {
            "workload": f"RES wait latency after commit ({w['n']} jobs)",
            "measured": f"p50 {w['p50_ms']} ms, p99 {w['p99_ms']} ms",
            "target": "p50 <= 20 ms",
            "ratio": None,
            "verdict": "PASS" if w["p50_ms"] <= 20 else "MISS",
        }
    )
    return out
