"""What a reader's whole scan of ``job`` costs with the ended jobs in ``job`` and in the history (SPEC B1, B3).

    .venv/bin/python bench/history_scan.py [--jobs 1000000] [--runs 5]

The pressure bench's REPEATABLE READ sessions count ``job`` every second, and ``job`` answers for
every job, active or ended (B3), so what they read grows with every job kept. On a throwaway server
of its own (never the shared one): *--jobs* ended jobs are written into ``job``, vacuumed, and
``SELECT count(*) FROM job`` is timed (median of *--runs*, with the server's default parallel plan
and without one); then the mover puts them into their day's table of history, as retention does
once they are ``history_after`` old, and the same count is timed again. Prints the plan of each.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta
from typing import Any

import psycopg
from big_table import _fill
from util import fresh_schema, store_on

from brooq_py import devdb


def timed_count(conn: psycopg.Connection[Any], runs: int, label: str) -> None:
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        conn.execute("SELECT count(*) FROM job").fetchone()
        took.append(time.perf_counter() - t0)
    (size,) = conn.execute("SELECT pg_total_relation_size('job')").fetchone()  # type: ignore[misc]
    plan = [str(r[0]).strip() for r in conn.execute("EXPLAIN SELECT count(*) FROM job").fetchall()]
    scans = [p for p in plan if "Scan" in p]
    print(f"{label}: count(*) {statistics.median(took) * 1000:.1f} ms (median of {runs});")
    print(f"    job itself {size / 1e6:.0f} MB; " + "; ".join(scans))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    db = devdb.start_throwaway()
    try:
        with fresh_schema(db.dsn, "hscan") as schema, psycopg.connect(db.dsn, autocommit=True) as conn:
            _fill(db.dsn, schema, args.jobs, 0)  # ended a day ago, vacuumed
            conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
            timed_count(conn, args.runs, f"{args.jobs:,} ended jobs in job")
            conn.execute("SET max_parallel_workers_per_gather = 0")
            timed_count(conn, args.runs, "    the same, no parallel plan")
            conn.execute("RESET max_parallel_workers_per_gather")
            with store_on(db.dsn, schema, max_size=2) as store:
                moved, t0 = 0, time.perf_counter()
                while got := store.worker.move_terminal(timedelta(seconds=1), timedelta(days=30), 10_000):
                    moved += len(got)
                print(f"moved {moved:,} to the history in {time.perf_counter() - t0:.1f} s")
            conn.execute("VACUUM ANALYZE")
            timed_count(conn, args.runs, f"{moved:,} ended jobs in a day's table of history")
            conn.execute("SET max_parallel_workers_per_gather = 0")
            timed_count(conn, args.runs, "    the same, no parallel plan")
    finally:
        db.stop()


if __name__ == "__main__":
    main()
