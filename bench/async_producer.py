"""W1a and W2a: the producer workloads W1 and W2 through AsyncStore, beside the sync Store.

W1a interleaves rounds of ``await AsyncStore.enqueue`` (one job, one autocommit
transaction) with rounds of the sync ``Store.enqueue`` on the same server, so
the ratio compares like with like; W2a is W2 (enqueue_many in batches, with
keys) on an AsyncConnectionPool.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from psycopg_pool import AsyncConnectionPool
from util import fresh_schema, store_on
from workloads import PAYLOAD, TOPIC

from brooq_py.postgres import AsyncStore
from brooq_py.queue import Job


async def _open(dsn: str) -> AsyncConnectionPool[Any]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
    await pool.open()
    return pool


def w1a_enqueue_one(dsn: str, n: int, rounds: int = 10) -> dict[str, Any]:
    per_round = max(1, n // rounds)

    async def main(store_sync: Any, schema: str) -> tuple[float, float]:
        pool = await _open(dsn)
        try:
            store = AsyncStore(pool, schema=schema)
            for _ in range(5):  # warm up both paths
                await store.enqueue(Job(TOPIC, PAYLOAD))
                store_sync.enqueue(Job(TOPIC, PAYLOAD))
            async_s = sync_s = 0.0
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(per_round):
                    store_sync.enqueue(Job(TOPIC, PAYLOAD))
                t1 = time.perf_counter()
                for _ in range(per_round):
                    await store.enqueue(Job(TOPIC, PAYLOAD))
                t2 = time.perf_counter()
                sync_s += t1 - t0
                async_s += t2 - t1
            return async_s, sync_s
        finally:
            await pool.close()

    with fresh_schema(dsn, "w1a") as schema, store_on(dsn, schema, max_size=2) as store_sync:
        async_s, sync_s = asyncio.run(main(store_sync, schema))
    total = per_round * rounds
    return {
        "n": total,
        "rounds": rounds,
        "seconds": async_s,
        "per_s": total / async_s,
        "sync_seconds": sync_s,
        "sync_per_s": total / sync_s,
        "ratio": sync_s / async_s,
    }


def w2a_enqueue_many(dsn: str, n: int, batch: int = 1000) -> dict[str, Any]:
    async def main(schema: str) -> float:
        pool = await _open(dsn)
        try:
            store = AsyncStore(pool, schema=schema)
            await store.enqueue_many([Job(TOPIC, PAYLOAD, idempotency_key="warm")])
            t0 = time.perf_counter()
            for start in range(0, n, batch):
                await store.enqueue_many(
                    [
                        Job(TOPIC, PAYLOAD, idempotency_key=f"k{start + i}")
                        for i in range(min(batch, n - start))
                    ]
                )
            return time.perf_counter() - t0
        finally:
            await pool.close()

    with fresh_schema(dsn, "w2a") as schema:
        dt = asyncio.run(main(schema))
    return {"n": n, "batch": batch, "seconds": dt, "per_s": n / dt}
