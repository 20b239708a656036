"""A second process that cancels running jobs and retries them at once, as the dashboard's two buttons do.

Run as ``python tests/chaos/storm_proc.py '<json settings>'`` (dsn, schema,
seconds, seed, pause, storms, cap). Once connected it prints ``ready`` and waits
for a line on stdin (the test's go, once handlers run). Then, for at least
*seconds* and until it has made *storms* cancel-and-retry pairs (at most *cap*
seconds in all), it picks running jobs of the schema at random and, for each,
calls ``Store.cancel`` and, when that cancelled it, ``Store.retry`` right after.
It prints ``storms N`` (the cancel-and-retry pairs that both succeeded) and exits.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool


def main() -> None:
    settings: dict[str, Any] = json.loads(sys.argv[1])
    from brooq_py.postgres import Store

    dsn, schema = settings["dsn"], settings["schema"]
    rng = random.Random(settings.get("seed", 0))
    pause = float(settings.get("pause", 0.2))
    wanted = int(settings.get("storms", 0))
    storms = 0
    running = sql.SQL("SELECT id::text FROM {}.job WHERE state = 'processing'").format(sql.Identifier(schema))
    with (
        ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        store = Store(pool, schema=schema)
        print("ready", flush=True)
        sys.stdin.readline()
        began = time.monotonic()
        least = began + float(settings["seconds"])
        cap = began + float(settings.get("cap", settings["seconds"]))
        while time.monotonic() < least or (storms < wanted and time.monotonic() < cap):
            ids = [r[0] for r in conn.execute(running).fetchall()]
            for job_id in rng.sample(ids, min(2, len(ids))):
                if store.cancel(job_id) and store.retry(job_id):
                    storms += 1
            time.sleep(pause)
        store.close()
    print(f"storms {storms}", flush=True)


if __name__ == "__main__":
    main()
