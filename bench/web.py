"""DASH: dashboard page latency over real HTTP (uvicorn) with a large job table.

The table is filled with one INSERT ... SELECT generate_series: 60 % done over
the last two hours, 15 % pending, 5 % failed, 5 % dead, 15 % canceled, across
eight topics; then ANALYZE. Each page is fetched `samples` times with the
bearer token; the topic overview's database read is timed alone (the cache
dropped before each read), the topics page over HTTP as viewers get it (the
default cache), list pages on their first and on a deep page, and the payload search (a window of
SEARCH_SCAN jobs of a listing, each payload probed by primary key).
"""

from __future__ import annotations

import http.client
import re
import time
from typing import Any

from psycopg import sql
from util import fresh_schema, job_table, pct, store_on

from brooq_py.http.server import ThreadedUvicorn
from brooq_py.postgres.operator.overview import SEARCH_SCAN, Overview
from brooq_py.web import dashboard

TOKEN = "bench-dashboard-token"
TOPICS = [f"dash.topic{i}" for i in range(8)]
SEARCH = "%7B%22email%22%3A%22user42%40example.com%22%7D"  # {"email":"user42@example.com"}


def fill(dsn: str, schema: str, n: int) -> float:
    import psycopg

    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (topic, payload, state, attempts, priority, available_at, updated_at, last_error) "
                "SELECT (%s::text[])[1 + n %% 8], jsonb_build_object('n', n, 'email', 'user' || n || '@example.com'), "
                "s.state, 1, n %% 3, now() - interval '3 hours' + (n %% 3600) * interval '1 second', "
                "now() - (n %% 7200) * interval '1 second', "
                "CASE WHEN s.state IN ('dead', 'failed') THEN 'RuntimeError: boom' END "
                "FROM generate_series(1, %s) AS n, LATERAL (SELECT CASE "
                "WHEN n %% 20 < 12 THEN 'done' WHEN n %% 20 < 15 THEN 'pending' WHEN n %% 20 = 15 THEN 'failed' "
                "WHEN n %% 20 = 16 THEN 'dead' ELSE 'canceled' END AS state) AS s"
            ).format(job_table(schema)),
            (TOPICS, n),
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))
    return time.perf_counter() - t0


def fetch(port: int, path: str) -> tuple[float, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        t0 = time.perf_counter()
        conn.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
        resp = conn.getresponse()
        body = resp.read().decode()
        elapsed = (time.perf_counter() - t0) * 1000
        if resp.status != 200:
            raise RuntimeError(f"GET {path} -> {resp.status}")
        return elapsed, body
    finally:
        conn.close()


def measure(port: int, path: str, samples: int) -> dict[str, float]:
    fetch(port, path)  # warm: plans cached, pages in shared buffers
    times = [fetch(port, path)[0] for _ in range(samples)]
    return {
        "p50_ms": round(pct(times, 50), 2),
        "p99_ms": round(pct(times, 99), 2),
        "max_ms": round(max(times), 2),
    }


def deep(port: int, path: str, pages: int) -> str:
    """Follow the "Next page" links *pages* times; return that page's path."""
    for _ in range(pages):
        _, body = fetch(port, path)
        found = re.search(r'id="next" href="([^"]+)"', body)
        if found is None:
            break
        path = found.group(1).replace("&amp;", "&")
    return path


def overview_read(store: Any, samples: int) -> dict[str, float]:
    """The topic overview read from the database, the cache dropped before each read."""
    view = Overview(store)
    view.topics()
    times = []
    for _ in range(samples):
        view.forget(activity=True)
        t0 = time.perf_counter()
        view.topics()
        times.append((time.perf_counter() - t0) * 1000)
    return {
        "p50_ms": round(pct(times, 50), 2),
        "p99_ms": round(pct(times, 99), 2),
        "max_ms": round(max(times), 2),
    }


def dashboard_latency(dsn: str, n: int, samples: int = 30) -> dict[str, Any]:
    out: dict[str, Any] = {"n": n, "samples": samples}
    with fresh_schema(dsn, "dash") as schema, store_on(dsn, schema, max_size=4) as store:
        out["fill_seconds"] = round(fill(dsn, schema, n), 1)
        dead_id = Overview(store).jobs(None, "dead", limit=1).jobs[0].id
        cold = ThreadedUvicorn(dashboard(store, token=TOKEN, cache_seconds=0), "127.0.0.1", 0)
        warm = ThreadedUvicorn(dashboard(store, token=TOKEN), "127.0.0.1", 0)
        try:
            cp, wp = cold.address[1], warm.address[1]
            out["overview_read"] = overview_read(store, max(5, samples // 3))
            pending = f"/jobs?topic={TOPICS[0]}&state=pending"
            done = f"/jobs?topic={TOPICS[1]}&state=done"
            pages = {
                "topics (cached)": (wp, "/"),
                "pending, first page": (cp, pending),
                "pending, page 20": (cp, deep(cp, pending, 19)),
                "done, first page": (cp, done),
                "done, page 20": (cp, deep(cp, done, 19)),
                "dead, all topics": (cp, "/dead"),
                "one job": (cp, f"/jobs/{dead_id}"),
                # The payload search reads a window of SEARCH_SCAN jobs of the listing and probes
                # their payloads by primary key (web_jobs_payload.sql): no GIN index.
                f"pending, payload search ({SEARCH_SCAN:,} read)": (cp, f"{pending}&payload={SEARCH}"),
                f"dead, payload search ({SEARCH_SCAN:,} read)": (cp, f"/dead?payload={SEARCH}"),
            }
            out["pages"] = {name: measure(port, path, samples) for name, (port, path) in pages.items()}
        finally:
            cold.close()
            warm.close()
    return out
