"""DS: what durable steps, sleeps and signals cost (SPEC DS1-DS4).

- Three steps: W3's drain (four workers) of jobs whose handler records three steps, beside the
  same drain of no-op jobs, in rounds whose order alternates; the ratio is the median.
- Statements: the durable statements (``steps_load``, ``step_record``, ``signal_read``) an
  engine runs per job, counted for a drain of jobs that sleep once, and for one of jobs that
  use nothing durable (which must run none).
- Signal to resume: jobs wait for a signal; each is signalled in turn and the time from
  ``store.signal``'s return to the handler's ``wait_for`` returning is taken (p50, p95).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from typing import Any

import psycopg
from util import fresh_schema, pct, store_on, wait_all_done
from workloads import TOPIC, drain, seed

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job

DURABLE = ("steps_load", "step_record", "signal_read")


def _three_steps(ctx: Any, claim: Any) -> None:
    for name in ("a", "b", "c"):
        ctx.step(name, _nothing)


def _nothing() -> int:
    return 1


def three_steps(dsn: str, n: int, rounds: int = 3) -> dict[str, Any]:
    """The drain of 3-step jobs against the drain of plain ones (median ratio of the rounds)."""
    per_s: dict[str, list[float]] = {"plain": [], "steps": []}
    for i in range(rounds):
        order = ("plain", "steps") if i % 2 == 0 else ("steps", "plain")
        for kind in order:
            res = drain(dsn, n, 4, f"ds{kind}", handler=_three_steps if kind == "steps" else None)
            if "per_s" not in res:
                return {"n": n, "error": f"{kind}: {res.get('error')}"}
            per_s[kind].append(res["per_s"])
    ratio = statistics.median(s / p for s, p in zip(per_s["steps"], per_s["plain"], strict=True))
    return {"n": n, "per_s": {k: [round(x) for x in v] for k, v in per_s.items()}, "ratio": round(ratio, 3)}


class Counting:
    """Counts the durable statements the engine runs through *store*'s worker part."""

    def __init__(self, store: Store) -> None:
        self.calls: Counter[str] = Counter()
        for name in DURABLE:
            setattr(store.worker, name, self._wrap(name, getattr(store.worker, name)))

    def _wrap(self, name: str, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return fn(*args, **kwargs)

        return wrapped


def statements(dsn: str, n: int) -> dict[str, Any]:
    """Durable statements per job: jobs that sleep once (0.2 s), and jobs that use nothing durable."""
    out: dict[str, Any] = {"n": n}
    for label, handler in (("plain", None), ("sleep", _sleep_once)):
        with fresh_schema(dsn, f"dsst{label}") as schema, store_on(dsn, schema, max_size=8) as store:
            seed(store, n)
            counting = Counting(store)
            engine = Engine(store, Config(workers=4, poll_interval=0.2))
            engine.register_kind(TOPIC, handler or (lambda ctx, claim: None))
            with psycopg.connect(dsn, autocommit=True) as conn:
                engine.start()
                done = wait_all_done(conn, schema, deadline_s=max(120.0, n / 50))
                engine.stop()
                engine.close()
            if done is None:
                return {"n": n, "error": f"{label}: not drained in time"}
            out[label] = {k: round(counting.calls[k] / n, 3) for k in DURABLE}
            out[label]["total"] = round(sum(counting.calls.values()) / n, 3)
    return out


def _sleep_once(ctx: Any, claim: Any) -> None:
    ctx.sleep(0.2)


def signal_latency(dsn: str, n: int) -> dict[str, Any]:
    """From ``store.signal``'s return to the waiting handler's ``wait_for`` returning, one at a time."""
    resumed: dict[str, float] = {}
    lock = threading.Lock()

    def waiter(ctx: Any, claim: Any) -> None:
        ctx.wait_for("go", 600)
        with lock:
            resumed[claim.id] = time.perf_counter()

    with fresh_schema(dsn, "dssig") as schema, store_on(dsn, schema, max_size=8) as store:
        ids = [r.id for r in store.enqueue_many([Job("sig", {}) for _ in range(n)])]
        engine = Engine(store, Config(workers=4, poll_interval=0.5))
        engine.register_kind("sig", waiter)
        engine.start()
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                deadline = time.monotonic() + 120
                while True:
                    waiting = conn.execute(
                        f'SELECT count(*) FROM "{schema}".job WHERE waiting_for = %s', ("go",)
                    ).fetchone()
                    if waiting is not None and waiting[0] == n:
                        break
                    if time.monotonic() > deadline:
                        return {"n": n, "error": "jobs did not all wait in time"}
                    time.sleep(0.05)
            times: list[float] = []
            for jid in ids:
                store.signal(jid, "go", None)
                t0 = time.perf_counter()
                end = time.monotonic() + 30
                while jid not in resumed and time.monotonic() < end:
                    time.sleep(0.001)
                if jid not in resumed:
                    return {"n": n, "error": f"job {jid} not resumed within 30 s"}
                times.append(resumed[jid] - t0)
        finally:
            engine.stop()
            engine.close()
    return {
        "n": n,
        "p50_ms": round(pct(times, 50) * 1000, 1),
        "p95_ms": round(pct(times, 95) * 1000, 1),
        "max_ms": round(max(times) * 1000, 1),
    }


def ds(dsn: str, sz: dict[str, Any]) -> dict[str, Any]:
    return {
        "steps": three_steps(dsn, sz["w3"]),
        "statements": statements(dsn, max(200, sz["w3"] // 10)),
        "signal": signal_latency(dsn, sz["ds_signals"]),
    }


def ds_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The table rows of DS: 3-step drain >= 0.6 x plain, statements per job, signal to resume."""
    rows: list[dict[str, Any]] = []
    st = r.get("steps", {})
    ratio = st.get("ratio")
    rows.append(
        {
            "workload": "DS drain of 3-step jobs vs plain jobs, workers=4",
            "measured": (
                f"{statistics.median(st['per_s']['steps']):,.0f} vs "
                f"{statistics.median(st['per_s']['plain']):,.0f} jobs/s"
                if ratio is not None
                else st.get("error", "?")
            ),
            "target": ">= 0.6 x",
            "ratio": ratio,
            "verdict": "PASS" if ratio is not None and ratio >= 0.6 else "MISS",
        }
    )
    sm = r.get("statements", {})
    if "sleep" in sm:
        plain, sleep = sm["plain"]["total"], sm["sleep"]
        rows.append(
            {
                "workload": "DS durable statements per job: none used / one sleep",
                "measured": (
                    f"{plain} / {sleep['total']} (record {sleep['step_record']}, "
                    f"read {sleep['steps_load']} a run, 2 runs)"
                ),
                "target": "0 / a sleep's record is 1",
                "ratio": None,
                "verdict": "PASS" if plain == 0 and sleep["step_record"] <= 1 else "MISS",
            }
        )
    sg = r.get("signal", {})
    rows.append(
        {
            "workload": "DS signal -> wait_for resumed",
            "measured": (
                f"p50 {sg['p50_ms']} ms, p95 {sg['p95_ms']} ms (n={sg['n']})"
                if "p50_ms" in sg
                else sg.get("error", "?")
            ),
            "target": "p50 <= 50 ms",
            "ratio": None,
            "verdict": "PASS" if sg.get("p50_ms") is not None and sg["p50_ms"] <= 50 else "MISS",
        }
    )
    return rows
