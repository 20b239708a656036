"""A step's record survives an immediate stop of the server that the worker lives through (SPEC DS1).

The worker's claim is committed synchronously, so after crash recovery the attempt still holds the
job and its handler goes on: the next step is recorded at the next position. If the earlier step's
record was lost in the crash (a commit acknowledged before its WAL was written), the job's record has
a hole: the next run calls the earlier step again and gets a new value, while the later step, computed
from the lost value, replays. The handler then sees two runs' values at once. The server is a
throwaway one this test starts, stopped with SIGQUIT (``pg_ctl stop -m immediate``). Never the
machine's shared server.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from brooq_py import Config, Engine, devdb
from brooq_py.postgres import Store
from brooq_py.queue import Job, StoreUnavailable
from tests.chaos.conftest import make_chaos_schema
from tests.chaos.test_immediate_stop import stop_immediately, synchronous
from tests.chaos.test_restart import throwaway  # noqa: F401 - the fixture


def test_ds1_a_step_record_survives_a_server_crash_the_worker_lives_through(
    throwaway: devdb.DevDatabase,  # noqa: F811
) -> None:
    dsn = throwaway.dsn
    synchronous(throwaway)
    schema = make_chaos_schema(dsn)
    runs: list[dict[str, Any]] = []

    def crash_then_charge(order_id: str) -> dict[str, str]:
        if len(runs) == 1:  # the first run: the server stops between the two records
            stop_immediately(throwaway)
            throwaway.restart()  # crash recovery on the same port and data directory
        return {"charged_for": order_id}

    def handler(ctx: Any, claim: Any) -> Any:
        runs.append({})
        order_id = ctx.step("order_id", lambda: str(uuid.uuid4()))
        charged = ctx.step("charge", crash_then_charge, order_id)
        ctx.sleep(0.2)  # ends the first run; the next run replays both steps
        return {"order_id": order_id, "charged_for": charged["charged_for"]}

    pool: ConnectionPool[Any] = ConnectionPool(
        dsn, min_size=1, max_size=2, open=True, check=ConnectionPool.check_connection
    )
    store = Store(pool, schema=schema)
    engine = Engine(store, Config(workers=1))
    try:
        engine.register_kind("order", handler)
        jid = store.enqueue(Job("order")).id
        deadline = time.monotonic() + 120
        row = store.get(jid)
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.Error, StoreUnavailable):
                engine.run_once()  # a connection broken by the stop: the next round opens another
            row = store.get(jid)
            if row is not None and row.state == "done":
                break
            time.sleep(0.3)
        assert row is not None and row.state == "done", row
        assert len(runs) >= 2, runs
        assert row.result["order_id"] == row.result["charged_for"], (
            f"a later run got a new order_id but the charge recorded for the lost one: {row.result}"
        )
    finally:
        engine.close()
        store.close()
        pool.close()
