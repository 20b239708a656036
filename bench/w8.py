"""W8: many ``async def`` jobs awaiting I/O (a 100 ms sleep) on one engine, workers=500.

The ideal rate is workers / sleep = 5,000 jobs/s; the process's OS threads (from
/proc/self/status) and its RSS are sampled every 100 ms across the drain.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
from util import count_not_done, fresh_schema, job_table, rss_mb, store_on, wait_all_done
from workloads import LEASE, seed

from brooq_py.engine import Config, Engine

TOPIC = "bench.async"


def os_threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def w8_async_io(dsn: str, n: int, workers: int = 500, sleep: float = 0.1) -> dict[str, Any]:
    async def handler(ctx: Any, claim: Any) -> None:
        await asyncio.sleep(sleep)

    with fresh_schema(dsn, "w8") as schema, store_on(dsn, schema, max_size=8) as store:
        seed(store, n, topic=TOPIC)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))
            engine = Engine(store, Config(workers=workers, lease=LEASE))
            engine.register_kind(TOPIC, handler)
            samples: list[tuple[float, int, float]] = []
            stop = threading.Event()

            def sampler() -> None:
                while not stop.wait(0.1):
                    samples.append((time.perf_counter() - t0, os_threads(), rss_mb()))

            t0 = time.perf_counter()
            engine.start()
            th = threading.Thread(target=sampler, daemon=True)
            th.start()
            t_end = wait_all_done(conn, schema, deadline_s=max(120.0, n / 50))
            stop.set()
            th.join()
            engine.stop()
            engine.close()
            left = count_not_done(conn, schema)
    if t_end is None:
        return {"n": n, "workers": workers, "error": f"not drained in time ({left} left)"}
    dt = t_end - t0
    warm = [mb for t, _, mb in samples if t >= dt * 0.2 and t <= dt]
    return {
        "n": n,
        "workers": workers,
        "sleep_s": sleep,
        "seconds": dt,
        "per_s": n / dt,
        "ideal_per_s": workers / sleep,
        "ratio": n / dt / (workers / sleep),
        "threads_max": max((t for _, t, _ in samples), default=0),
        "rss_warm_mb": warm[0] if warm else None,
        "rss_max_mb": max(warm) if warm else None,
        "rss_drift_pct": (100 * (max(warm) - warm[0]) / warm[0]) if warm else None,
    }
