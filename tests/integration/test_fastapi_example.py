"""The FastAPI example (examples/fastapi_orders.py) through httpx's ASGI transport against real
PostgreSQL: the order and its job commit together or not at all (SPEC E3, A1)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import psycopg
from psycopg import sql

from brooq_py.postgres import Store

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_orders.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fastapi_orders_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def count_orders(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "orders"))
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_e3_fastapi_order_and_job_in_one_transaction(dsn: str, schema: str, store: Store) -> None:
    app = load_example().create_app(dsn, schema)

    async def main() -> tuple[Any, Any, Any, Any]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://example") as client:
                made = await client.post("/orders", json={"item": "book", "qty": 2})
                refused = await client.post("/orders", json={"item": "piano", "qty": 99})
                state = await client.get(f"/jobs/{made.json()['job_id']}")
                missing = await client.get("/jobs/not-a-job")
                return made, refused, state, missing

    made, refused, state, missing = asyncio.run(main())
    assert made.status_code == 201, made.text
    order_id, job_id = made.json()["order_id"], made.json()["job_id"]
    row = store.get(job_id)
    assert row is not None and row.topic == "order.confirm" and row.payload == {"order_id": order_id}
    assert state.json()["state"] == "pending" and missing.status_code == 404
    # The refused order rolled back with its job: one order and one job in all.
    assert refused.status_code == 409
    assert count_orders(dsn, schema) == 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "job"))
        ).fetchone()
    assert jobs == (1,)
