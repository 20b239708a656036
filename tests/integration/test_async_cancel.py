"""AsyncStore given up on mid-statement on its own pool connection (SPEC A1, E3)."""

from __future__ import annotations

import asyncio

import psycopg
import psycopg.sql
from psycopg_pool import AsyncConnectionPool

from brooq_py.postgres import AsyncStore, Store
from brooq_py.queue import Job


def test_a1_an_enqueue_cancelled_on_a_pool_connection_writes_nothing_and_frees_it(
    dsn: str, schema: str, store: Store
) -> None:
    """Through enqueue() and inside begin(): the statement is cancelled on the server (nothing commits
    once the blocking transaction ends), and the pool's only connection comes back clean."""

    async def main() -> list[bool]:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as pool:
            astore = AsyncStore(pool, schema=schema)
            async with await psycopg.AsyncConnection.connect(dsn) as holder:
                await astore.enqueue_tx(holder, Job("t", 1, idempotency_key="held"))

                async def in_begin() -> None:
                    async with astore.begin() as tx:
                        await astore.enqueue_tx(tx, Job("t", 3, idempotency_key="held"))

                created = []
                for attempt in (astore.enqueue(Job("t", 2, idempotency_key="held")), in_begin()):
                    try:
                        await asyncio.wait_for(attempt, 0.5)
                    except TimeoutError:
                        pass
                    else:
                        raise AssertionError("the enqueue did not wait on the held key")
                    created.append((await asyncio.wait_for(astore.enqueue(Job("t", 4)), 30)).created)
                await holder.rollback()
            return created

    assert asyncio.run(main()) == [True, True]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            psycopg.sql.SQL("SELECT payload FROM {}.job ORDER BY created_at").format(
                psycopg.sql.Identifier(schema)
            )
        ).fetchall()
    assert [r[0] for r in rows] == [4, 4]  # neither given-up enqueue went through after the holder ended
