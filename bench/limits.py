"""Q3: what a globally limited topic costs the others, and its own rate at limit 4.

``w3_with_limited``: the W3 drain (4 workers, no-op handlers) without and
with a second, globally limited topic registered in the same engine (limit 0
over 1,000 ready jobs: the limited path is tried every poll interval and never
takes anything, its worst case for the others). The two drains of a pair run
at the same time in two schemas, so the machine's load weighs on both alike;
the figure is the median of the pairs' ratios. ``limited_rate``: two engines of 8 workers on a topic limited
to 4, no-op and 10 ms handlers, with the topic's processing rows sampled from
the database throughout (the peak must never exceed 4).
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import psycopg
from psycopg import sql
from util import fresh_schema, job_table, store_on
from workloads import LEASE, TOPIC, seed

from brooq_py.engine import Config, Engine

LIMITED = "limited"


def _left(conn: psycopg.Connection[Any], schema: str, topic: str) -> int:
    q = sql.SQL("SELECT count(*) FROM {} WHERE topic = %s AND state <> 'done'").format(job_table(schema))
    row = conn.execute(q, (topic,)).fetchone()
    assert row is not None
    return int(row[0])


def _wait_topic_done(
    conn: psycopg.Connection[Any], schema: str, topic: str, deadline_s: float
) -> float | None:
    end = time.perf_counter() + deadline_s
    while time.perf_counter() < end:
        if _left(conn, schema, topic) == 0:
            return time.perf_counter()
        time.sleep(0.02)
    return None


def _drain_once(dsn: str, n: int, with_limited: bool) -> float:
    """One W3 drain (4 workers, no-op handlers); with a limited topic (limit 0 over 1,000 ready jobs)."""
    with fresh_schema(dsn, "q3w3") as schema, store_on(dsn, schema, max_size=8) as store:
        seed(store, n)
        engine = Engine(store, Config(workers=4, lease=LEASE))
        engine.register_kind(TOPIC, lambda ctx, claim: None)
        if with_limited:
            seed(store, 1000, topic=LIMITED)
            store.set_limit(LIMITED, 0)
            engine.register_kind(LIMITED, lambda ctx, claim: None)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))
            ready.wait()  # both drains of a pair start together
            t0 = time.perf_counter()
            engine.start()
            t_end = _wait_topic_done(conn, schema, TOPIC, max(120.0, n / 100))
            engine.stop()
            engine.close()
    if t_end is None:
        raise RuntimeError("not drained in time")
    return n / (t_end - t0)


ready = threading.Barrier(1)


def _pair(dsn: str, n: int) -> tuple[float, float]:
    """The drains without and with a limited topic run at the same time, in two schemas, so that
    the machine's load (other processes) weighs on both alike; return their rates."""
    global ready
    ready = threading.Barrier(2)
    out: dict[bool, float] = {}

    def run(flag: bool) -> None:
        out[flag] = _drain_once(dsn, n, flag)

    threads = [threading.Thread(target=run, args=(flag,)) for flag in (False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out[False], out[True]


def w3_with_limited(dsn: str, n: int, rounds: int = 5) -> dict[str, Any]:
    """W3 without and with a limited topic in the engine, side by side; per-pair ratios and their median."""
    pairs = [_pair(dsn, n) for _ in range(rounds)]
    ratios = [b / a for a, b in pairs]
    return {
        "n": n,
        "rounds": rounds,
        "plain_per_s": [round(a) for a, _ in pairs],
        "with_limited_per_s": [round(b) for _, b in pairs],
        "plain_median": statistics.median(a for a, _ in pairs),
        "with_limited_median": statistics.median(b for _, b in pairs),
        "ratio": statistics.median(ratios),
        "ratios": [round(r, 3) for r in ratios],
    }


def _limited_run(dsn: str, n: int, limit: int, sleep_s: float) -> dict[str, Any]:
    with fresh_schema(dsn, "q3rate") as schema, store_on(dsn, schema, max_size=8) as store:
        seed(store, n, topic=LIMITED)
        store.set_limit(LIMITED, limit)

        def handler(ctx: Any, claim: Any) -> None:
            if sleep_s:
                time.sleep(sleep_s)

        engines = [Engine(store, Config(workers=8, lease=LEASE)) for _ in range(2)]
        for e in engines:
            e.register_kind(LIMITED, handler)
        peak = 0
        stop = threading.Event()

        def sampler() -> None:
            nonlocal peak
            q = sql.SQL("SELECT count(*) FROM {} WHERE topic = %s AND state = 'processing'").format(
                job_table(schema)
            )
            with psycopg.connect(dsn, autocommit=True) as sconn:
                while not stop.is_set():
                    row = sconn.execute(q, (LIMITED,)).fetchone()
                    assert row is not None
                    peak = max(peak, int(row[0]))

        with psycopg.connect(dsn, autocommit=True) as conn:
            t0 = time.perf_counter()
            for e in engines:
                e.start()
            thread = threading.Thread(target=sampler, daemon=True)
            thread.start()
            t_end = _wait_topic_done(conn, schema, LIMITED, max(120.0, n / 20))
            stop.set()
            thread.join()
            for e in engines:
                e.stop()
                e.close()
    if t_end is None:
        return {"n": n, "limit": limit, "handler_ms": sleep_s * 1000, "error": "not drained in time"}
    per_s = n / (t_end - t0)
    out: dict[str, Any] = {"n": n, "limit": limit, "handler_ms": sleep_s * 1000, "per_s": per_s, "peak": peak}
    if sleep_s:
        out["ideal_per_s"] = limit / sleep_s
    return out


def limited_rate(dsn: str, n: int, limit: int = 4) -> dict[str, Any]:
    """The limited topic's own rate at *limit* on two engines of 8 workers: no-op and 10 ms handlers."""
    return {
        "noop": _limited_run(dsn, n, limit, 0.0),
        "sleep_10ms": _limited_run(dsn, max(200, n // 10), limit, 0.010),
    }
