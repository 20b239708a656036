"""The workloads W1-W6 and the memory drain, each in its own fresh schema."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from util import (
    count_not_done,
    fresh_schema,
    job_counters,
    job_table,
    pct,
    raw_insert,
    rss_mb,
    settled_counters,
    store_on,
    versions_per_job,
    wait_all_done,
)

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job
from brooq_py.queue.port import EngineProof, HeldLease

TOPIC = "bench"
PAYLOAD = {"n": 1, "what": "bench"}
LEASE = timedelta(seconds=120)

log = logging.getLogger("bench")


def seed(store: Store, n: int, topic: str = TOPIC, batch: int = 1000, keys: bool = False) -> None:
    for start in range(0, n, batch):
        jobs = [
            Job(topic, PAYLOAD, idempotency_key=f"k{start + i}" if keys else None)
            for i in range(min(batch, n - start))
        ]
        store.enqueue_many(jobs)


# --- W1, W2: producer side ---------------------------------------------------------------------


def w1_enqueue_one(dsn: str, n: int, rounds: int = 10) -> dict[str, Any]:
    """Store.enqueue, one job per transaction, interleaved round by round with the raw baseline:
    one autocommit INSERT per job (one round trip) of the same row into a table LIKE the job
    table (defaults, constraints and indexes included, no trigger), so both see the same load."""
    per_round = max(1, n // rounds)
    raw_s = store_s = 0.0
    with fresh_schema(dsn, "w1") as schema, psycopg.connect(dsn, autocommit=True) as stats:
        before = job_counters(stats, schema)
        with store_on(dsn, schema, max_size=2) as store, psycopg.connect(dsn, autocommit=True) as conn:
            insert = raw_insert(conn, schema)
            payload = json.dumps(PAYLOAD)
            for _ in range(5):  # warm up both paths: connections, prepared statements
                store.enqueue(Job(TOPIC, PAYLOAD))
                conn.execute(insert, (uuid.uuid4(), TOPIC, payload))
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(per_round):
                    conn.execute(insert, (uuid.uuid4(), TOPIC, payload))
                t1 = time.perf_counter()
                for _ in range(per_round):
                    store.enqueue(Job(TOPIC, PAYLOAD))
                t2 = time.perf_counter()
                raw_s += t1 - t0
                store_s += t2 - t1
        # the pool's connections are closed: their backends flushed their counters on exit
        versions = versions_per_job(before, settled_counters(stats, schema), 5 + per_round * rounds)
    total = per_round * rounds
    return {
        "n": total,
        "rounds": rounds,
        "seconds": store_s,
        "per_s": total / store_s,
        "raw_seconds": raw_s,
        "raw_per_s": total / raw_s,
        "ratio": raw_s / store_s,
        "row_versions": versions,
    }


def w2_enqueue_many(dsn: str, n: int, batch: int = 1000) -> dict[str, Any]:
    """Store.enqueue_many, *batch* jobs with keys a call, interleaved batch by batch with the raw
    baseline: COPY of the same rows (topic, payload, key) into a table LIKE the job table
    (defaults, constraints and indexes included), one transaction a batch."""
    store_s = copy_s = 0.0
    with (
        fresh_schema(dsn, "w2") as schema,
        store_on(dsn, schema, max_size=2) as store,
        psycopg.connect(dsn) as conn,
    ):
        like = sql.Identifier(schema, "copy_job")
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(like, job_table(schema)))
        conn.commit()
        copy = sql.SQL("COPY {} (topic, payload, idempotency_key) FROM STDIN").format(like)
        store.enqueue_many([Job(TOPIC, PAYLOAD, idempotency_key="warm")])
        payload = json.dumps(PAYLOAD)
        for start in range(0, n, batch):
            size = min(batch, n - start)
            t0 = time.perf_counter()
            with conn.cursor() as cur, cur.copy(copy) as cp:
                for i in range(size):
                    cp.write_row((TOPIC, payload, f"k{start + i}"))
            conn.commit()
            t1 = time.perf_counter()
            store.enqueue_many([Job(TOPIC, PAYLOAD, idempotency_key=f"k{start + i}") for i in range(size)])
            t2 = time.perf_counter()
            copy_s += t1 - t0
            store_s += t2 - t1
    return {
        "n": n,
        "batch": batch,
        "seconds": store_s,
        "per_s": n / store_s,
        "copy_seconds": copy_s,
        "copy_per_s": n / copy_s,
        "ratio": copy_s / store_s,
    }


# --- W3, W3b, memory: drains ---------------------------------------------------------------------


def _noop(ctx: Any, claim: Any) -> None:
    return None


class Probe:
    """Counts and times the Store calls an Engine makes (wraps the instance's methods)."""

    def __init__(self, store: Store) -> None:
        self.calls: dict[str, list[float]] = {"claim": [], "settle_many": []}
        self.rows: dict[str, int] = {"claim": 0, "settle_many": 0}
        for name in self.calls:
            setattr(store.worker, name, self._wrap(name, getattr(store.worker, name)))

    def _wrap(self, name: str, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.calls[name].append(time.perf_counter() - t0)
            self.rows[name] += len(out)
            return out

        return wrapped

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, times in self.calls.items():
            if times:
                out[name] = {
                    "calls": len(times),
                    "rows_per_call": round(self.rows[name] / len(times), 2),
                    "p50_ms": round(pct(times, 50) * 1000, 3),
                    "busy_s": round(sum(times), 3),
                }
        return out


def drain(
    dsn: str,
    n: int,
    workers: int,
    label: str,
    sample_rss: bool = False,
    store_factory: Any = None,
    revision: str = "head",
    versions: bool = False,
    handler: Any = None,
) -> dict[str, Any]:
    """Enqueue *n* no-op jobs, then time one Engine draining them (start -> every row done in the DB).

    *handler*: what runs each job (default a no-op).

    *revision*: the migration the schema is at (an older schema under today's code).
    *versions*: also count the row versions written to the job table per job (SPEC W0), from
    pg_stat_user_tables before the enqueue and after the drain, the engine and pool closed.
    """
    with fresh_schema(dsn, label, revision) as schema, psycopg.connect(dsn, autocommit=True) as stats:
        before = job_counters(stats, schema) if versions else {}
        with store_on(dsn, schema, max_size=8, factory=store_factory) as store:
            seed(store, n)
            probe = Probe(store)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))
                engine = Engine(store, Config(workers=workers, lease=LEASE))
                engine.register_kind(TOPIC, handler or _noop)
                samples: list[tuple[float, int, float]] = []
                stop_sampling = threading.Event()

                def sampler() -> None:
                    with psycopg.connect(dsn, autocommit=True) as sconn:
                        while not stop_sampling.wait(0.5):
                            left = count_not_done(sconn, schema)
                            samples.append((time.perf_counter() - t0, n - left, rss_mb()))

                t0 = time.perf_counter()
                sampler_thread = threading.Thread(target=sampler, daemon=True) if sample_rss else None
                engine.start()
                if sampler_thread is not None:
                    sampler_thread.start()
                t_end = wait_all_done(conn, schema, deadline_s=max(120.0, n / 100))
                engine.stop()
                stop_sampling.set()
                if sampler_thread is not None:
                    sampler_thread.join()
                engine.close()
                left = count_not_done(conn, schema)
        # after the pool closed: its backends flushed their counters on exit
        row_versions = versions_per_job(before, settled_counters(stats, schema), n) if versions else None
    if t_end is None:
        return {"n": n, "workers": workers, "error": f"not drained in time ({left} left)"}
    dt = t_end - t0
    out: dict[str, Any] = {
        "n": n,
        "workers": workers,
        "seconds": dt,
        "per_s": n / dt,
        "store": probe.summary(),
    }
    if row_versions is not None:
        out["row_versions"] = row_versions
    if sample_rss:
        out["rss_samples"] = [(round(t, 2), done, round(mb, 1)) for t, done, mb in samples]
    return out


def memory_drain(dsn: str, n: int) -> dict[str, Any]:
    """RSS across a long drain: flat means within +-10 % of the level after warm-up (10 % of the jobs)."""
    res = drain(dsn, n, 4, "mem", sample_rss=True)
    samples = res.get("rss_samples", [])
    warm = [mb for _, done, mb in samples if done >= n * 0.10]
    if not warm:
        res["flat"] = None
        return res
    base = warm[0]
    res["rss_warm_mb"] = base
    res["rss_max_mb"] = max(warm)
    res["rss_end_mb"] = warm[-1]
    res["rss_drift_pct"] = 100 * (max(abs(max(warm) - base), abs(min(warm) - base)) / base)
    return res


# --- W4: latency of an idle engine ------------------------------------------------------------------


def w4_latency(dsn: str, n: int, gap: float = 0.020, workers: int = 4) -> dict[str, Any]:
    """Idle engine; *n* jobs enqueued *gap* apart; enqueue commit -> handler start (time.time())."""
    started: dict[str, float] = {}
    lock = threading.Lock()

    def handler(ctx: Any, claim: Any) -> None:
        t = time.time()
        with lock:
            started[claim.id] = t

    with fresh_schema(dsn, "w4") as schema, store_on(dsn, schema, max_size=8) as store:
        engine = Engine(store, Config(workers=workers, lease=LEASE))
        engine.register_kind(TOPIC, handler)
        engine.start()
        try:
            # warm up the claim path and the LISTEN connection, outside the measurement
            warm = store.enqueue(Job(TOPIC, PAYLOAD)).id
            _wait_for(lambda: warm in started, 10)
            time.sleep(0.3)
            before: dict[str, float] = {}
            after: dict[str, float] = {}
            for _ in range(n):
                t_call = time.time()
                job_id = store.enqueue(Job(TOPIC, PAYLOAD)).id
                after[job_id] = time.time()
                before[job_id] = t_call
                time.sleep(gap)
            _wait_for(lambda: all(j in started for j in after), 30)
        finally:
            engine.close()
    lat_commit = [1000 * (started[j] - after[j]) for j in after if j in started]
    lat_call = [1000 * (started[j] - before[j]) for j in before if j in started]
    return {
        "n": n,
        "gap_ms": gap * 1000,
        "started": len(lat_commit),
        "p50_ms": pct(lat_commit, 50),
        "p99_ms": pct(lat_commit, 99),
        "max_ms": max(lat_commit) if lat_commit else float("nan"),
        "from_call_p50_ms": pct(lat_call, 50),
        "from_call_p99_ms": pct(lat_call, 99),
    }


def _wait_for(cond: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return False


# --- W5: claim cost against a backlog of other topics ---------------------------------------------


def _claim_times(store: Store, n: int, topic: str) -> tuple[list[float], list[float]]:
    """Claim one job of *topic* *n* times (each finds one), then *n* empty claims; milliseconds each."""
    worker = "bench:w5"
    for _ in range(3):  # warm up: connection, prepared statement
        store.worker.claim([topic + "-none"], 1, worker, LEASE)
    found: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        rows = store.worker.claim([topic], 1, worker, LEASE)
        found.append(1000 * (time.perf_counter() - t0))
        assert len(rows) == 1, rows
    empty: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        rows = store.worker.claim([topic], 1, worker, LEASE)
        empty.append(1000 * (time.perf_counter() - t0))
        assert not rows
    return found, empty


def w5_claim_backlog(dsn: str, others: int, n: int = 200) -> dict[str, Any]:
    out: dict[str, Any] = {"others": others, "claims": n}
    for label, backlog in (("empty", 0), ("backlog", others)):
        with fresh_schema(dsn, "w5") as schema, store_on(dsn, schema, max_size=2) as store:
            for t in range(10):  # ten other topics
                seed(store, backlog // 10, topic=f"other-{t}", batch=5000)
            seed(store, n, topic="w5")
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))
            found, empty = _claim_times(store, n, "w5")
        out[label] = {
            "found_p50_ms": pct(found, 50),
            "found_p99_ms": pct(found, 99),
            "empty_p50_ms": pct(empty, 50),
            "empty_p99_ms": pct(empty, 99),
        }
    out["ratio_found_p50"] = out["backlog"]["found_p50_ms"] / out["empty"]["found_p50_ms"]
    out["ratio_empty_p50"] = out["backlog"]["empty_p50_ms"] / out["empty"]["empty_p50_ms"]
    return out


# --- W6: the heartbeat with 1,000 leases ---------------------------------------------------------------


def w6_heartbeat(dsn: str, in_flight: int = 1000, ticks: int = 30) -> dict[str, Any]:
    executes = 0
    real_execute = psycopg.Cursor.execute

    def counting_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal executes
        executes += 1
        return real_execute(self, *args, **kwargs)

    with fresh_schema(dsn, "w6") as schema, store_on(dsn, schema, max_size=2) as store:
        seed(store, in_flight)
        claimed = store.worker.claim([TOPIC], in_flight, "bench:w6", LEASE)
        leases = [HeldLease(c.id, c.claim_token) for c in claimed]
        proof = EngineProof("bench:w6", "bench", os.getpid(), LEASE, LEASE / 3)
        store.worker.beat(proof, leases)  # open the heartbeat connection outside the clock
        times: list[float] = []
        renewed: list[int] = []
        psycopg.Cursor.execute = counting_execute  # type: ignore[method-assign]
        try:
            for _ in range(ticks):
                t0 = time.perf_counter()
                alive = store.worker.beat(proof, leases)
                times.append(1000 * (time.perf_counter() - t0))
                renewed.append(len(alive.held))
        finally:
            psycopg.Cursor.execute = real_execute  # type: ignore[method-assign]
    return {
        "in_flight": len(leases),
        "ticks": ticks,
        "statements_per_tick": executes / ticks,
        "renewed_min": min(renewed),
        "p50_ms": pct(times, 50),
        "p99_ms": pct(times, 99),
    }


def new_id() -> str:
    return uuid.uuid4().hex


# --- W0: heartbeat writes to the job row of a long job with nothing to report ------------------------


def heartbeat_writes(dsn: str, lease_s: float = 3.0, periods: float = 3.0) -> dict[str, Any]:
    """One job whose handler sleeps *periods* x the lease (lease *lease_s*), reporting nothing.

    Counts the writes to its row while the handler runs: the row's xmin sampled every 20 ms from
    another connection (each change is one new row version), and, over the job's whole life, the
    job table's pg_stat_user_tables counters (enqueue, claim, heartbeats, done).
    """
    started = threading.Event()
    ended = threading.Event()
    run_s = lease_s * periods

    def handler(ctx: Any, claim: Any) -> None:
        started.set()
        time.sleep(run_s)
        ended.set()

    xmins: list[tuple[float, str]] = []
    with fresh_schema(dsn, "hb") as schema, psycopg.connect(dsn, autocommit=True) as stats:
        before = job_counters(stats, schema)
        row = sql.SQL("SELECT xmin::text, state::text FROM {} WHERE id = %s").format(job_table(schema))
        with store_on(dsn, schema, max_size=4) as store:
            job_id = store.enqueue(Job(TOPIC, PAYLOAD)).id
            engine = Engine(store, Config(workers=1, lease=lease_s))
            engine.register_kind(TOPIC, handler)
            engine.start()
            try:
                if not started.wait(30):
                    return {"error": "the job did not start within 30 s"}
                t0 = time.monotonic()
                while not ended.is_set():
                    got = stats.execute(row, (job_id,)).fetchone()
                    assert got is not None
                    if not xmins or xmins[-1][1] != got[0]:
                        xmins.append((round(time.monotonic() - t0, 3), str(got[0])))
                    time.sleep(0.02)
                state = None
                end = time.monotonic() + 30
                while state != "done" and time.monotonic() < end:
                    got = stats.execute(row, (job_id,)).fetchone()
                    state = got[1] if got else None
                    time.sleep(0.02)
            finally:
                engine.close()
        total = versions_per_job(before, settled_counters(stats, schema), 1)
    return {
        "lease_s": lease_s,
        "handler_s": run_s,
        "state": state,
        # the first sample is the claim's version; every change after it is a write during the run
        "writes_while_running": len(xmins) - 1,
        "xmin_changes_at_s": [t for t, _ in xmins[1:]],
        "row_versions": total,
        "updates_in_life": total["upd"],
    }
