"""SCRAPE: what 100 concurrent /metrics requests cost the database (SPEC Z2).

An engine with a backlog in several topics serves /metrics over real HTTP;
100 requests are sent at the same moment and every statement the engine runs
meanwhile is counted (``engine.statements``). For comparison, the same burst reading the gauges per
request (what a scrape did before the refresher) is timed on the same Store.
"""

from __future__ import annotations

import http.client
import threading
import time
from typing import Any

from psycopg import sql
from util import fresh_schema, pct, store_on

from brooq_py.engine import Config, Engine
from brooq_py.queue import Job
from brooq_py.service import serve

TOPICS = [f"scrape.{i}" for i in range(10)]
HOUR = 3600


def burst(n: int, action: Any) -> tuple[float, list[float]]:
    """Run *action* in *n* threads released at once; return the wall time and each call's latency."""
    barrier = threading.Barrier(n + 1)
    lat: list[float] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        barrier.wait()
        t0 = time.perf_counter()
        action(i)
        with lock:
            lat.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, lat


def scrape_cost(dsn: str, backlog: int = 20_000, n: int = 100) -> dict[str, Any]:
    with fresh_schema(dsn, "scrape") as schema, store_on(dsn, schema, max_size=8) as store:
        per_topic = backlog // len(TOPICS)
        for topic in TOPICS:
            store.enqueue_many([Job(topic, {"i": i}) for i in range(per_topic)])
        with store.session.pool.connection() as conn:
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "job")))
        # Every period an hour: the only statements are the first ones at start.
        cfg = Config(workers=1, poll_interval=HOUR, reaper_period=HOUR, retention_ttl=0, gauges_period=HOUR)
        engine = Engine(store, cfg)
        for topic in TOPICS:
            engine.register_kind(topic, lambda ctx, claim: None)
        refresh_t0 = time.perf_counter()
        engine.refresher.run_once()
        refresh_ms = (time.perf_counter() - refresh_t0) * 1000
        try:
            with serve(engine, port=0, concurrency=128) as srv:
                # Connected one by one (the listen backlog is short), then all sent at once.
                conns = []
                for _ in range(n):
                    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
                    c.connect()
                    conns.append(c)
                    time.sleep(0.005)
                statuses: list[int] = []

                def get(i: int) -> None:
                    conns[i].request("GET", "/metrics")
                    resp = conns[i].getresponse()
                    resp.read()
                    statuses.append(resp.status)
                    conns[i].close()

                # engine.statements counts every statement the engine runs through its Store.
                before = engine.statements.calls
                wall, lat = burst(n, get)
                from_memory = engine.statements.calls - before
            # The same burst, each request reading the gauges itself (the former scrape).
            repo = engine.repo
            before = engine.statements.calls
            wall_direct, lat_direct = burst(n, lambda i: (repo.gauges(TOPICS), repo.database_gauges()))
            direct = engine.statements.calls - before
        finally:
            engine.close()
    return {
        "requests": n,
        "ok": statuses.count(200),
        "backlog": backlog,
        "topics": len(TOPICS),
        "statements_during_burst": from_memory,
        "refresh_statements": 2,
        "refresh_ms": round(refresh_ms, 2),
        "wall_ms": round(wall * 1000, 1),
        "p50_ms": round(pct(lat, 50) * 1000, 2),
        "p99_ms": round(pct(lat, 99) * 1000, 2),
        "per_request_reads": {
            "statements": direct,
            "wall_ms": round(wall_direct * 1000, 1),
            "p50_ms": round(pct(lat_direct, 50) * 1000, 2),
            "p99_ms": round(pct(lat_direct, 99) * 1000, 2),
        },
    }
