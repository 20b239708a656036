"""QueueFull of an enqueue without *wait* is raised as the statement raised it (SPEC F2): raised while
the caller handles an exception of its own, its traceback still shows that exception, as any error
raised there does. Only the end of a *wait* raises it afresh."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from brooq_py.postgres import AsyncStore, Store
from brooq_py.queue import Job, QueueFull


def test_f2_queue_full_keeps_the_callers_exception_as_its_context(store: Store) -> None:
    store.set_max_depth("d", 0)
    with pytest.raises(QueueFull) as err:
        try:
            raise KeyError("the caller's own")
        except KeyError:
            store.enqueue(Job("d", {}))
    assert isinstance(err.value.__context__, KeyError)
    assert not err.value.__suppress_context__  # "During handling of the above exception" is shown


def test_f2_async_queue_full_keeps_the_callers_exception_as_its_context(
    dsn: str, schema: str, store: Store
) -> None:
    store.set_max_depth("d", 0)

    async def main() -> BaseException:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await pool.open()
        try:
            astore = AsyncStore(pool, schema=schema)
            try:
                try:
                    raise KeyError("the caller's own")
                except KeyError:
                    await astore.enqueue(Job("d", {}))
            except QueueFull as exc:
                return exc
            raise AssertionError("the enqueue was not refused")
        finally:
            await pool.close()

    refused = asyncio.run(main())
    assert isinstance(refused.__context__, KeyError)
    assert not refused.__suppress_context__
