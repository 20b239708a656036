"""AsyncStore under cancellation, and its waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store
from brooq_py.queue import Job


def _rows(dsn: str, schema: str) -> list[object]:
    with psycopg.connect(dsn) as c:
        return [
            r[0]
            for r in c.execute(
                sql.SQL("SELECT payload FROM {} ORDER BY payload::text").format(sql.Identifier(schema, "job"))
            )
        ]


def test_group_cancelled_between_its_statements_writes_nothing(dsn: str, schema: str, store: Store) -> None:
    """enqueue_group on the AsyncStore's own transaction: its group is written, then its fan-in waits
    on a key another transaction holds; the task is cancelled there."""

    async def main() -> tuple[bool, list[object]]:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as pool:
            astore = AsyncStore(pool, schema=schema)
            async with await psycopg.AsyncConnection.connect(dsn) as holder:
                await astore.enqueue_tx(holder, Job("t", "holder", idempotency_key="fan"))
                group = astore.enqueue_group(
                    [Job("t", "g1"), Job("t", "g2")], then=Job("t", "then", idempotency_key="fan")
                )
                try:
                    await asyncio.wait_for(group, 1.0)
                    waited = False
                except TimeoutError:
                    waited = True
                # the pool's only connection comes back usable and clean
                after = await asyncio.wait_for(astore.enqueue(Job("t", "after")), 30)
                assert after.created
                await holder.rollback()
            async with pool.connection() as c:
                assert c.info.transaction_status == TransactionStatus.IDLE
            return waited, []

    waited, _ = asyncio.run(main())
    assert waited
    assert _rows(dsn, schema) == ["after"]


def test_enqueue_tx_cancelled_in_the_callers_transaction_leaves_it_usable(
    dsn: str, schema: str, store: Store
) -> None:
    async def main() -> None:
        astore = AsyncStore(None, schema=schema)
        async with (
            await psycopg.AsyncConnection.connect(dsn) as holder,
            await psycopg.AsyncConnection.connect(dsn) as conn,
        ):
            await astore.enqueue_tx(holder, Job("t", "holder", idempotency_key="k"))
            await astore.enqueue_tx(conn, Job("t", "before"))
            try:
                await asyncio.wait_for(astore.enqueue_tx(conn, Job("t", "waits", idempotency_key="k")), 1.0)
                raise AssertionError("did not wait")
            except TimeoutError:
                pass
            # the caller decides: roll back, then the connection is used again
            await conn.rollback()
            assert conn.info.transaction_status == TransactionStatus.IDLE
            await astore.enqueue_tx(conn, Job("t", "again"))
            await conn.commit()
            await holder.rollback()

    asyncio.run(main())
    assert _rows(dsn, schema) == ["again"]


def test_async_result_across_two_event_loops(
    dsn: str, schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    """asyncio.run twice on one AsyncStore (a script, a test suite): the second wait is still woken."""
    e = engines()
    e.register_kind("r", lambda ctx, claim: claim.payload)
    e.start()

    pool = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)

    async def first() -> object:
        await pool.open()
        astore.pool_ref = pool  # type: ignore[attr-defined]
        jid = (await astore.enqueue(Job("r", {"n": 1}))).id
        res = await astore.result(jid, timeout=30)
        await pool.close()
        return res

    astore = AsyncStore(pool, schema=schema)
    # the pool must be bound to each loop; a new pool object per loop keeps psycopg_pool happy
    assert asyncio.run(first()) == {"n": 1}

    async def second() -> tuple[object, float]:
        pool2 = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await pool2.open()
        astore.session.pool = pool2
        jid = (await astore.enqueue(Job("r", {"n": 2}, available_at=None))).id
        t0 = time.monotonic()
        res = await astore.result(jid, timeout=30)
        await astore.close()
        await pool2.close()
        return res, time.monotonic() - t0

    res, took = asyncio.run(second())
    assert res == {"n": 2}
    assert took < 25, took  # the result as soon as it is there, not at the 30 s timeout
