"""WF: what workflows cost the jobs that use none of it, and how fast a fan-in starts (SPEC D5).

- W3 (four workers draining no-op jobs without parents) on a schema at head without
  the workflows' release trigger (BEFORE: what the outcome write pays without it; today's
  code needs head's schema, so an older revision cannot stand in) and at head, in rounds
  whose order alternates; the ratio is the median over the rounds.
- The fan-in: one ``then`` after 10,000 parents enqueued as a group, drained by one
  engine; the release latency is from the return of the outcome batch that wrote the
  last parent's done to the start of the ``then``'s handler.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from util import NO_RELEASE, fresh_schema, store_on
from workloads import drain

from brooq_py.engine import Config, Engine
from brooq_py.queue import Job

BEFORE = NO_RELEASE  # head without the release trigger
REVISIONS = (BEFORE, "head")


def w3_beside_revisions(dsn: str, n: int, rounds: int = 3) -> dict[str, Any]:
    """W3 per schema revision; the ratio of head to BEFORE (median of the rounds)."""
    per_s: dict[str, list[float]] = {r: [] for r in REVISIONS}
    for i in range(rounds):
        order = REVISIONS[i % len(REVISIONS) :] + REVISIONS[: i % len(REVISIONS)]
        for revision in order:
            res = drain(dsn, n, 4, "wfhead" if revision == "head" else "wfbefore", revision=revision)
            if "per_s" not in res:
                return {"n": n, "error": f"{revision}: {res.get('error')}"}
            per_s[revision].append(res["per_s"])
    ratio = statistics.median(h / o for h, o in zip(per_s["head"], per_s[BEFORE], strict=True))
    return {
        "n": n,
        "rounds": rounds,
        "per_s": {r: [round(x) for x in xs] for r, xs in per_s.items()},
        "head_vs_before": round(ratio, 3),
    }


def statement_cost(dsn: str, n: int, batch: int = 500, rounds: int = 3) -> dict[str, Any]:
    """The claim and outcome statements alone (no engine), on a schema at BEFORE and at head.

    Each round seeds *n* jobs per schema, then claims and settles them done in batches of
    *batch*, the schemas taking turns batch by batch so that both see the same machine; the
    ratio is of the median batch times (claim + settle) over every round.
    """
    from datetime import timedelta

    from workloads import seed

    from brooq_py.queue.job import State
    from brooq_py.queue.port import Outcome

    times: dict[str, list[float]] = {r: [] for r in REVISIONS}
    for _ in range(rounds):
        with (
            fresh_schema(dsn, "wfst0", BEFORE) as old,
            fresh_schema(dsn, "wfst1") as new,
            store_on(dsn, old) as s_old,
            store_on(dsn, new) as s_new,
        ):
            stores = {BEFORE: s_old, "head": s_new}
            for store in stores.values():
                seed(store, n)
            for _ in range(n // batch):
                for revision, store in stores.items():
                    t0 = time.perf_counter()
                    rows = store.worker.claim(["bench"], batch, "bench", timedelta(seconds=60))
                    store.worker.settle_many([Outcome(r.id, r.claim_token, State.DONE) for r in rows])
                    times[revision].append(time.perf_counter() - t0)
    medians = {r: statistics.median(ts) for r, ts in times.items()}
    return {
        "n": n,
        "batch": batch,
        "median_ms": {r: round(m * 1000, 2) for r, m in medians.items()},
        "head_vs_before": round(medians[BEFORE] / medians["head"], 3),
    }


def fan_in_latency(dsn: str, parents: int = 10_000, workers: int = 4) -> dict[str, Any]:
    """Enqueue a group of *parents* and one ``then``; time the drain and the release of the ``then``."""
    with fresh_schema(dsn, "wffan") as schema, store_on(dsn, schema, max_size=8) as store:
        t0 = time.perf_counter()
        group = store.enqueue_group([Job("wf.parent", i) for i in range(parents)], then=Job("wf.join"))
        enqueue_s = time.perf_counter() - t0
        settled_at: list[float] = []
        settle_many = store.worker.settle_many

        def timed_settle(outcomes: Any) -> set[str]:
            written = settle_many(outcomes)
            settled_at.append(time.perf_counter())
            return written

        store.worker.settle_many = timed_settle  # type: ignore[method-assign]
        started = threading.Event()
        join_at: list[float] = []

        def join(ctx: Any, claim: Any) -> None:
            join_at.append(time.perf_counter())
            started.set()

        engine = Engine(store, Config(workers=workers))
        engine.register_kind("wf.parent", lambda ctx, claim: None)
        engine.register_kind("wf.join", join)
        t1 = time.perf_counter()
        engine.start()
        ok = started.wait(max(120.0, parents / 50))
        drain_s = time.perf_counter() - t1
        engine.stop()
        engine.close()
        row = store.get(str(group.then_id))
    if not ok or not join_at:
        return {"parents": parents, "error": "the join never started"}
    last_done = max(t for t in settled_at if t <= join_at[0]) if settled_at else join_at[0]
    return {
        "parents": parents,
        "enqueue_group_s": round(enqueue_s, 3),
        "drain_s": round(drain_s, 3),
        "release_latency_ms": round(max(0.0, join_at[0] - last_done) * 1000, 1),
        "join_state": str(row.state) if row is not None else None,
    }


def wf(dsn: str, n: int, parents: int = 10_000) -> dict[str, Any]:
    return {
        "w3": w3_beside_revisions(dsn, n),
        "statements": statement_cost(dsn, n),
        "fan_in": fan_in_latency(dsn, parents),
    }


def wf_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The table rows of WF: W3 at head beside BEFORE (>= 0.97 x) and the fan-in release (<= 1 s)."""
    rows: list[dict[str, Any]] = []
    w3 = r.get("w3", {})
    for old in (BEFORE,):
        ratio = w3.get("head_vs_before")
        measured = (
            f"{statistics.median(w3['per_s']['head']):,.0f} vs {statistics.median(w3['per_s'][old]):,.0f} jobs/s"
            if ratio is not None
            else w3.get("error", "?")
        )
        rows.append(
            {
                "workload": "WF W3 plain jobs, with vs without the release trigger",
                "measured": measured,
                "target": ">= 0.97 x",
                "ratio": ratio,
                "verdict": "PASS" if ratio is not None and ratio >= 0.97 else "MISS",
            }
        )
    st = r.get("statements", {})
    if "head_vs_before" in st:
        ms = st["median_ms"]
        rows.append(
            {
                "workload": f"WF claim+settle of {st['batch']} plain jobs, with vs without the trigger",
                "measured": f"{ms['head']} vs {ms[BEFORE]} ms a batch",
                "target": ">= 0.97 x",
                "ratio": st["head_vs_before"],
                "verdict": "PASS" if st["head_vs_before"] >= 0.97 else "MISS",
            }
        )
    fan = r.get("fan_in", {})
    latency = fan.get("release_latency_ms")
    rows.append(
        {
            "workload": f"WF fan-in: then after {fan.get('parents', 0):,} parents",
            "measured": f"release {latency} ms (drain {fan.get('drain_s')} s, enqueue {fan.get('enqueue_group_s')} s)"
            if latency is not None
            else fan.get("error", "?"),
            "target": "<= 1000 ms",
            "ratio": None,
            "verdict": "PASS" if latency is not None and latency <= 1000 else "MISS",
        }
    )
    return rows
