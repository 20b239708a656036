"""Mistakes of the calling code are told as such against a real PostgreSQL: a pool never opened is
InvalidUsage naming the fix, not an outage; the demo's psql statements can be pasted as printed."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from brooq_py.postgres import AsyncStore, Store
from brooq_py.postgres.operator import stats as ops
from brooq_py.queue import InvalidUsage, Job, State, StoreUnavailable


def test_a_store_on_a_pool_never_opened_says_open_it_first(dsn: str, schema: str) -> None:
    pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=1, open=False)
    store = Store(pool, schema=schema)
    for call in (lambda: store.enqueue(Job("t", {})), lambda: store.get(str(uuid.uuid4()))):
        with pytest.raises(
            InvalidUsage, match=r"open the pool first \(pool\.open\(\), or `with pool:`"
        ) as err:
            call()
        assert not isinstance(err.value, StoreUnavailable) and isinstance(err.value, ValueError)
    with pool:  # opened, the same Store works
        assert store.enqueue(Job("t", {})).created


def test_an_async_store_on_a_pool_never_opened_says_open_it_first(dsn: str, schema: str) -> None:
    async def main() -> None:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False)
        store = AsyncStore(pool, schema=schema)
        with pytest.raises(InvalidUsage, match="open the pool first"):
            await store.enqueue(Job("t", {}))
        async with pool:
            assert (await store.enqueue(Job("t", {}))).created

    asyncio.run(main())


def test_the_demos_psql_statements_paste_as_printed(store: Store, dsn: str, schema: str) -> None:
    job_id = store.enqueue(Job("slow", {})).id
    cancel = ops.pasteable("cancel", {"id": job_id})
    fate = ops.pasteable("fate", {"id": job_id})
    assert "%(" not in cancel + fate and f"'{job_id}'" in cancel
    with psycopg.connect(
        dsn, autocommit=True
    ) as conn:  # as psql would: no parameters, the schema on the path
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
        conn.execute(cancel.encode())  # bytes: run as text, never as a parameterised query
        row = conn.execute(fate.encode()).fetchone()
    assert row is not None and row[2] == "canceled"
    assert store.get(job_id).state is State.CANCELED  # type: ignore[union-attr]
