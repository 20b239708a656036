"""A limited topic's claim under a held transaction horizon (SPEC B1; what the claim heads leave out).

    .venv/bin/python bench/horizon_limited.py [--steps 20000,60000] [--batch 500]

On a throwaway server of its own (never the shared one): one session holds an xid, and jobs of one
topic are cycled through the real statements (enqueue_many, claim, an outcome batch: done) until
each step's count is reached, for three kinds of topic: plain (``job_claim``, its claim heads), with
a concurrency limit and with a rate limit (``job_claim_limited``, limits high enough never to bind).
At each step, with 100 jobs ready and 5 running, it times ten claims of 10 jobs (p50) and runs
``EXPLAIN (ANALYZE, BUFFERS)`` of the parts of the limited claim: its scan of the claim index from
the topic's start and past a head (the plain claim's way), its count of the topic's running jobs,
and its reads of the settings table. Prints one row per part and step.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from brooq_py import devdb
from brooq_py.postgres import Store, migrations
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome

PARTS = {
    "scan from the start": "SELECT id FROM job WHERE topic = 't' AND state = 'pending' AND available_at <= now()"
    " ORDER BY priority DESC, available_at, id LIMIT 10 FOR NO KEY UPDATE SKIP LOCKED",
    "scan past a head": "SELECT id FROM job WHERE topic = 't' AND state = 'pending' AND priority = 0"
    " AND available_at > now() - interval '2 s' AND available_at <= now()"
    " ORDER BY available_at, id LIMIT 10 FOR NO KEY UPDATE SKIP LOCKED",
    "running count": "SELECT count(*) FROM job p WHERE p.state = 'processing' AND p.topic = 't'",
    "setting row": "SELECT * FROM topic_setting WHERE topic = 't'",
}


def explain(conn: psycopg.Connection[Any], query: str) -> tuple[float, int]:
    """(milliseconds, shared buffers hit+read) of one run of *query*, rolled back."""
    with conn.transaction(force_rollback=True):
        (plan,) = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query).fetchone()  # type: ignore[misc]
    top = plan[0]
    return float(top["Execution Time"]), int(
        top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0)
    )


def run(kind: str, steps: list[int], batch: int) -> None:
    db = devdb.start_throwaway()
    try:
        migrations.upgrade(db.dsn, schema="public")
        hold = psycopg.connect(db.dsn)
        hold.execute("SELECT txid_current()")
        with ConnectionPool(db.dsn, min_size=2, max_size=4, open=True) as pool:
            store = Store(pool)
            if kind == "limit":
                store.set_limit("t", 1_000_000)
            elif kind == "rate":
                store.set_rate_limit("t", 1_000_000, per=1, burst=1_000_000)

            def claim(n: int) -> list[Any]:
                if kind == "plain":
                    return list(store.claim(["t"], n, "bench", timedelta(seconds=600)))
                store.worker.topic_settings()
                return list(store.worker.claim_limited("t", n, "bench", timedelta(seconds=600)))

            cycled = 0
            for step in steps:
                while cycled < step:
                    store.enqueue_many([Job("t", {"i": i}) for i in range(batch)])
                    rows = claim(batch)
                    store.settle_many([Outcome(r.id, r.claim_token, State.DONE) for r in rows])
                    cycled += len(rows)
                store.enqueue_many([Job("t", {"i": i}) for i in range(105)])
                claim(5)  # five running: the count has live rows to find
                times = []
                for _ in range(10):
                    t0 = time.perf_counter()
                    rows = claim(10)
                    times.append((time.perf_counter() - t0) * 1000)
                    store.settle_many([Outcome(r.id, r.claim_token, State.DONE) for r in rows])
                print(
                    f"{kind:>6} {step:>8} {'claim of 10, p50':<22} {statistics.median(times):>8.2f} ms",
                    flush=True,
                )
                if kind != "plain":
                    with pool.connection() as conn:
                        for name, query in PARTS.items():
                            explain(conn, query)  # warm
                            ms, buffers = explain(conn, query)
                            print(
                                f"{kind:>6} {step:>8} {name:<22} {ms:>8.2f} ms {buffers:>7} buffers",
                                flush=True,
                            )
            store.close()
        hold.close()
    finally:
        db.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", default="20000,60000")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--kinds", default="plain,limit,rate")
    args = parser.parse_args(argv)
    steps = [int(s) for s in re.split(r"[, ]+", args.steps) if s]
    print(f"{'topic':>6} {'cycled':>8} {'what':<22} {'time':>11}")
    for kind in args.kinds.split(","):
        run(kind.strip(), steps, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
