"""One W7 worker process: an Engine on the bench schema, started on "go", stopped on "stop".

Usage: w7_worker.py DSN SCHEMA WORKERS. Prints "ready" once the engine is built, starts it
when a line "go" arrives on stdin, stops it on "stop" (or end of input), then writes every
(job id, attempt) its handler ran into SCHEMA.ran with one COPY and prints "ran N".
"""

from __future__ import annotations

import sys
import threading
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store


def main() -> int:
    dsn, schema, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ran: list[tuple[str, int]] = []
    lock = threading.Lock()

    def handler(ctx: Any, claim: Any) -> None:
        with lock:
            ran.append((claim.id, claim.attempt))

    pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=2, max_size=8, open=True)
    store = Store(pool, schema=schema)
    engine = Engine(store, Config(workers=workers, lease=timedelta(seconds=120)))
    engine.register_kind("bench", handler)
    print("ready", flush=True)
    line = sys.stdin.readline().strip()
    if line != "go":
        return 1
    engine.start()
    sys.stdin.readline()  # "stop" or EOF
    engine.close()
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        copy = sql.SQL("COPY {} (job_id, attempt) FROM STDIN").format(sql.Identifier(schema, "ran"))
        with cur.copy(copy) as cp:
            for row in ran:
                cp.write_row(row)
    pool.close()
    print(f"ran {len(ran)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
