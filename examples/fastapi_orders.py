"""FastAPI: an order and the job that confirms it, written in one transaction.

Run it (after ``python -m brooq_py migrate up`` on the same database and schema)::

    pip install brooq-py fastapi uvicorn
    DATABASE_URL=postgresql://localhost/app uvicorn examples.fastapi_orders:app

``POST /orders {"item": "book", "qty": 1}`` inserts the order and enqueues
``order.confirm`` in the same transaction: both commit together, or neither
does (a quantity above the stock rolls both back with a 409). Nothing here
blocks the event loop: the pool, the store and the enqueue are asyncio's.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from psycopg import sql
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from brooq_py.postgres import AsyncStore
from brooq_py.queue import Job

STOCK = 10


class OrderIn(BaseModel):
    item: str
    qty: int


def create_app(dsn: str, schema: str = "public") -> FastAPI:
    pool = AsyncConnectionPool(dsn, min_size=1, max_size=10, open=False)
    store = AsyncStore(pool, schema=schema)
    orders = sql.Identifier(schema, "orders")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.open()
        async with pool.connection() as conn:  # the application's own table, beside brooq's job table
            await conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, item text, qty int)"
                ).format(orders)
            )
        yield
        await pool.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/orders", status_code=201)
    async def create_order(order: OrderIn) -> dict[str, Any]:
        async with store.begin() as tx:  # commit on a clean exit, rollback on an exception
            cur = await tx.psycopg.execute(
                sql.SQL("INSERT INTO {} (item, qty) VALUES (%s, %s) RETURNING id").format(orders),
                (order.item, order.qty),
            )
            row = await cur.fetchone()
            assert row is not None
            order_id = row[0]
            job = await store.enqueue_tx(
                tx, Job("order.confirm", {"order_id": order_id}, idempotency_key=f"order-{order_id}")
            )
            if order.qty > STOCK:  # any exception inside the block undoes the order and the job
                raise HTTPException(status_code=409, detail="not enough stock")
        return {"order_id": order_id, "job_id": job.id}

    @app.get("/jobs/{job_id}")
    async def job_state(job_id: str) -> dict[str, Any]:
        row = await store.get(job_id)
        if row is None:
            raise HTTPException(status_code=404, detail="no such job")
        return {"id": row.id, "topic": row.topic, "state": row.state, "payload": row.payload}

    return app


if "DATABASE_URL" in os.environ:
    app = create_app(os.environ["DATABASE_URL"], os.environ.get("BROOQ_SCHEMA", "public"))
