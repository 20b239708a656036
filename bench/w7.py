"""W7: 1, 2 and 4 worker processes on one database; throughput and no job run twice."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from util import fresh_schema, job_table, store_on, wait_all_done
from workloads import seed

HERE = Path(__file__).resolve().parent


def run_processes(dsn: str, n: int, processes: int, workers: int) -> dict[str, Any]:
    with fresh_schema(dsn, f"w7p{processes}") as schema:
        with store_on(dsn, schema, max_size=2) as store:
            seed(store, n)
        ran = sql.Identifier(schema, "ran")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE TABLE {} (job_id uuid NOT NULL, attempt int NOT NULL)").format(ran))
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))
            procs = [
                subprocess.Popen(
                    [sys.executable, str(HERE / "w7_worker.py"), dsn, schema, str(workers)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(processes)
            ]
            try:
                for p in procs:
                    assert p.stdout is not None
                    if p.stdout.readline().strip() != "ready":
                        raise RuntimeError("a worker process did not start")
                t0 = time.perf_counter()
                for p in procs:
                    assert p.stdin is not None
                    p.stdin.write("go\n")
                    p.stdin.flush()
                t_end = wait_all_done(conn, schema, deadline_s=max(120.0, n / 100))
                outputs = []
                for p in procs:
                    assert p.stdin is not None
                    p.stdin.write("stop\n")
                    p.stdin.flush()
                for p in procs:
                    out, _ = p.communicate(timeout=60)
                    outputs.append(out.strip())
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
            row = conn.execute(
                sql.SQL(
                    "SELECT count(*), count(DISTINCT job_id),"
                    " (SELECT count(*) FROM (SELECT job_id FROM {} GROUP BY job_id HAVING count(*) > 1) d)"
                    " FROM {}"
                ).format(ran, ran)
            ).fetchone()
            assert row is not None
            runs, distinct, twice = (int(x) for x in row)
    result: dict[str, Any] = {
        "processes": processes,
        "workers_each": workers,
        "n": n,
        "runs": runs,
        "distinct_jobs": distinct,
        "jobs_run_twice": twice,
        "per_process": outputs,
    }
    if t_end is None:
        result["error"] = "not drained in time"
    else:
        result["seconds"] = t_end - t0
        result["per_s"] = n / (t_end - t0)
    return result


def w7(dsn: str, n: int, counts: tuple[int, ...] = (1, 2, 4), workers: int = 4) -> dict[str, Any]:
    return {"runs": [run_processes(dsn, n, k, workers) for k in counts]}
