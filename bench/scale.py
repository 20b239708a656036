"""Scale workloads: W5b (claims beside a million waiting rows), W9 (scheduled lateness), RET (retention pace)."""

from __future__ import annotations

import random
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from util import fresh_schema, job_table, pct, store_on
from workloads import LEASE, PAYLOAD, seed

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.postgres.worker.repo import WorkerRepo
from brooq_py.queue import Job


def _fill(dsn: str, schema: str, n: int, state: str, at: str, updated: str = "now()") -> None:
    """Insert *n* rows of *state* in one generate_series statement (topic w5 unless terminal)."""
    if n <= 0:
        return
    query = sql.SQL(
        "INSERT INTO {} (topic, payload, state, available_at, updated_at) "
        "SELECT 'w5', '{{}}', {}, " + at + ", " + updated + " FROM generate_series(1, %s) AS i"
    ).format(job_table(schema), sql.Literal(state))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(query, (n,))


def _vacuum(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))


# --- W5b: claims in a topic that also holds 1,000,000 scheduled and 100,000 failed rows -------------


def _timed_ms(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t0)


def w5b_claim_beside_waiting(dsn: str, scheduled: int, failed: int, n: int = 200) -> dict[str, Any]:
    """Claim cost in a topic that also holds *scheduled* + *failed* waiting rows vs an empty table.

    Both tables are measured in one interleaved loop (claim here, claim there), so
    a load that comes and goes on the machine weighs on both alike.
    """
    out: dict[str, Any] = {"scheduled": scheduled, "failed": failed, "claims": n}
    worker = "bench:w5b"
    with (
        fresh_schema(dsn, "w5b") as empty_schema,
        fresh_schema(dsn, "w5b") as waiting_schema,
        store_on(dsn, empty_schema, max_size=2) as empty,
        store_on(dsn, waiting_schema, max_size=2) as waiting,
    ):
        t0 = time.perf_counter()
        _fill(
            dsn,
            waiting_schema,
            scheduled,
            "scheduled",
            "now() + interval '1 hour' + i * interval '1 millisecond'",
        )
        _fill(
            dsn, waiting_schema, failed, "failed", "now() + interval '1 hour' + i * interval '10 millisecond'"
        )
        out["fill_s"] = round(time.perf_counter() - t0, 1)
        stores = {"empty": empty, "waiting": waiting}
        for label, schema in (("empty", empty_schema), ("waiting", waiting_schema)):
            seed(stores[label], n, topic="w5")
            _vacuum(dsn, schema)
            for _ in range(3):
                stores[label].claim(["w5-none"], 1, worker, LEASE)
        times: dict[str, dict[str, list[float]]] = {
            k: {"found": [], "empty": [], "stage": []} for k in stores
        }
        for what in ("found", "empty", "stage"):
            for i in range(n):
                order = ("empty", "waiting") if i % 2 == 0 else ("waiting", "empty")
                for label in order:
                    store = stores[label]
                    if what == "stage":
                        times[label][what].append(_timed_ms(lambda s=store: s.worker.stage(["w5"], 1000)))
                    else:
                        times[label][what].append(
                            _timed_ms(lambda s=store: s.worker.claim(["w5"], 1, worker, LEASE))
                        )
    for label in stores:
        out[label] = {
            "found_p50_ms": pct(times[label]["found"], 50),
            "found_p99_ms": pct(times[label]["found"], 99),
            "empty_p50_ms": pct(times[label]["empty"], 50),
            "stage_p50_ms": pct(times[label]["stage"], 50),
        }
    out["ratio_found_p50"] = out["waiting"]["found_p50_ms"] / out["empty"]["found_p50_ms"]
    out["ratio_empty_p50"] = out["waiting"]["empty_p50_ms"] / out["empty"]["empty_p50_ms"]
    out["ratio_stage_p50"] = out["waiting"]["stage_p50_ms"] / out["empty"]["stage_p50_ms"]
    return out


# --- W9: lateness of scheduled jobs on an idle engine --------------------------------------------------


def w9_scheduled_lateness(dsn: str, n: int, low: float = 5.0, high: float = 15.0) -> dict[str, Any]:
    """*n* jobs due *low*..*high* s ahead, enqueued at once on an idle engine; handler start - available_at."""
    started: dict[str, float] = {}
    lock = threading.Lock()

    def handler(ctx: Any, claim: Any) -> None:
        t = time.time()
        with lock:
            started[claim.id] = t

    rng = random.Random(9)
    with fresh_schema(dsn, "w9") as schema, store_on(dsn, schema, max_size=8) as store:
        engine = Engine(store, Config(workers=4, lease=LEASE))
        engine.register_kind("w9", handler)
        engine.start()
        try:
            time.sleep(0.5)
            now = datetime.now(UTC)
            jobs = [
                Job("w9", PAYLOAD, available_at=now + timedelta(seconds=rng.uniform(low, high)))
                for _ in range(n)
            ]
            due = {}
            for start in range(0, n, 500):
                batch = jobs[start : start + 500]
                for job, r in zip(batch, store.enqueue_many(batch), strict=True):
                    assert job.available_at is not None
                    due[r.id] = job.available_at.timestamp()
            end = time.monotonic() + high + 30
            while time.monotonic() < end and len(started) < n:
                time.sleep(0.05)
        finally:
            engine.close()
    late = [1000 * (started[j] - due[j]) for j in due if j in started]
    return {
        "n": n,
        "ahead_s": [low, high],
        "started": len(late),
        "early": sum(1 for x in late if x < 0),
        "p50_ms": pct(late, 50),
        "p99_ms": pct(late, 99),
        "max_ms": max(late) if late else float("nan"),
    }


# --- RET: retention deleting a backlog while W3 drains --------------------------------------------------


RET_PAIRS = 3


class _CountingRepo(WorkerRepo):
    deleted = 0
    busy = 0.0

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        t0 = time.perf_counter()
        rows = super().delete_terminal(ttl, batch)
        self.busy += time.perf_counter() - t0
        self.deleted += len(rows)
        return rows


class _Counting(Store):
    """A Store whose worker part counts and times its retention batches."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.worker = _CountingRepo(self.session, self.producer, self.flow)


def _drain(store: Store, n: int, retention: bool) -> float:
    """Seed *n* no-op jobs; an engine (retention on or off) runs them; jobs per second."""
    seed(store, n, topic="ret")
    done = [0]
    lock = threading.Lock()

    def handler(ctx: Any, claim: Any) -> None:
        with lock:
            done[0] += 1

    cfg = Config(workers=4, lease=LEASE, retention_ttl=30 * 86400 if retention else 0)
    engine = Engine(store, cfg)
    engine.register_kind("ret", handler)
    t0 = time.perf_counter()
    engine.start()
    try:
        while done[0] < n and time.perf_counter() - t0 < max(120.0, n / 50):
            time.sleep(0.01)
        seconds = time.perf_counter() - t0
    finally:
        engine.close()
    return n / seconds


def retention_pace(dsn: str, expired: int, w3: int) -> dict[str, Any]:
    with fresh_schema(dsn, "ret") as schema, store_on(dsn, schema, max_size=8, factory=_Counting) as store:
        assert isinstance(store, _Counting)
        _fill(dsn, schema, expired, "done", "now() - interval '40 days'", "now() - interval '40 days'")
        _vacuum(dsn, schema)
        # Pairs of drains, without then with retention, so the machine's drift weighs on both
        # alike; the ratio is the median of the pairs' ratios.
        pairs: list[tuple[float, float]] = []
        during_s = 0.0
        deleted_during = 0
        for _ in range(RET_PAIRS):
            without = _drain(store, w3, retention=False)
            before = store.worker.deleted
            t0 = time.perf_counter()
            with_ret = _drain(store, w3, retention=True)
            during_s += time.perf_counter() - t0
            deleted_during += store.worker.deleted - before
            pairs.append((without, with_ret))
        without = statistics.median(wo for wo, _ in pairs)
        with_ret = statistics.median(w for _, w in pairs)
        t0 = time.perf_counter()
        # then let retention finish the backlog on its own (bounded), for the sustained rate
        engine = Engine(store, Config(workers=1, lease=LEASE))
        engine.register_kind("none", lambda ctx, claim: None)
        engine.start()
        try:
            end = time.perf_counter() + max(60.0, expired / 2000)
            while store.worker.deleted < expired and time.perf_counter() < end:
                time.sleep(0.1)
        finally:
            engine.close()
        total_s = time.perf_counter() - t0
    return {
        "expired": expired,
        "w3_jobs": w3,
        "w3_without_per_s": without,
        "w3_with_per_s": with_ret,
        "w3_pairs": [(round(wo), round(w)) for wo, w in pairs],
        "w3_ratio": statistics.median(w / wo for wo, w in pairs),
        "deleted_during_w3": deleted_during,
        "rows_per_min_during_w3": 60 * deleted_during / during_s,
        "deleted": store.worker.deleted,
        "rows_per_min": 60 * store.worker.deleted / (during_s + total_s),
        "delete_busy_s": round(store.worker.busy, 1),
    }
