"""A real engine process for the tests of stalled engines (not a test module: run as a script).

``python tests/integration/engine_proc.py '<json settings>'``; settings: dsn, schema, mode, dir,
lease, retention_ttl, retention_period. Modes:

- ``tick_stall``: schedules ``tick`` every second; the first tick this process advances stops the
  process itself (SIGSTOP) inside enqueue_tick's transaction, right after schedule_tick_advance
  (a stall of the whole process at that moment: GC, swap, a debugger, a frozen VM).
- ``tick``: schedules ``tick`` on ``cron`` (does not run the topic).
- ``late``: runs topic ``late``; the handler touches ``<dir>/started.<job>`` and then sleeps
  ``hold`` seconds ignoring its ctx, returns "late" and touches ``<dir>/returned.<job>``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import Any


def main() -> None:
    settings = json.loads(sys.argv[1])
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(threadName)s %(levelname)s %(message)s"
    )
    from psycopg_pool import ConnectionPool

    import brooq_py.postgres.enqueue.producer as producer
    from brooq_py import Config, Engine
    from brooq_py.postgres import Store

    mode = settings["mode"]
    directory = settings.get("dir", "/tmp")

    def touch(name: str) -> None:
        with open(os.path.join(directory, name), "w"):
            pass

    if mode == "tick_stall":
        orig = producer.enqueueing.enqueue_one
        once: list[int] = []

        def enqueue_one(*a: Any, **k: Any) -> Any:
            plan = orig(*a, **k)
            if once:
                return plan
            once.append(1)

            def stalled() -> Any:
                touch("tick_stalling")
                os.kill(os.getpid(), signal.SIGSTOP)  # inside the tick's transaction
                return (yield from plan)

            return stalled()

        producer.enqueueing.enqueue_one = enqueue_one  # type: ignore[assignment]

    pool: ConnectionPool[Any] = ConnectionPool(settings["dsn"], min_size=1, max_size=6, open=True, timeout=5)
    store = Store(pool, schema=settings["schema"])
    lease = float(settings.get("lease", 2.0))
    engine = Engine(
        store,
        Config(
            workers=2,
            lease=lease,
            reaper_period=0.3,
            poll_interval=0.2,
            watchdog_grace=lease,
            retention_ttl=float(settings.get("retention_ttl", 0)),
            retention_period=float(settings.get("retention_period", 0.2)),
        ),
    )
    if mode == "tick_stall":
        engine.schedule("tick", "* * * * * *", {"by": "stalled"})
    if mode == "tick":
        engine.schedule("tick", settings["cron"], {"by": "proc"})
    if mode == "late":
        hold = float(settings.get("hold", 8.0))

        def late(ctx: Any, claim: Any) -> str:
            touch(f"started.{claim.id}")
            time.sleep(hold)  # ignores ctx: a handler that does not look
            touch(f"returned.{claim.id}")
            return "late"

        engine.register_kind("late", late)
    stop: list[int] = []  # the handler only appends: an Event's lock, held by this thread, would hang it
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.append(signum))
    engine.start()
    print(f"ready {engine.worker_id}", flush=True)
    while not stop:
        time.sleep(0.2)
    engine.close()
    pool.close()
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
