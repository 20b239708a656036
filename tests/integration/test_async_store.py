"""AsyncStore and AsyncWrapTx: every producer rule on psycopg's async connections (SPEC A1: E1-E6, X1, Q1).

Each test runs its coroutine with ``asyncio.run`` against the real PostgreSQL
schema of the ``schema`` fixture.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from brooq_py.postgres import AsyncStore, AsyncWrapTx, Store, WrapTx
from brooq_py.queue import BrooqError, InvalidJob, Job, State

T = TypeVar("T")


def run(make: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(make())  # type: ignore[arg-type]


async def open_pool(dsn: str, max_size: int = 8) -> AsyncConnectionPool[Any]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=max_size, open=False)
    await pool.open()
    return pool


def test_a1_e1_enqueue_then_same_id_and_get(dsn: str, schema: str, store: Store) -> None:
    async def main() -> None:
        pool = await open_pool(dsn)
        try:
            astore = AsyncStore(pool, schema=schema)
            first = await astore.enqueue(Job("email", {"to": "a"}, idempotency_key="k1"))
            assert first.created
            again = await astore.enqueue(Job("email", {"to": "CHANGED"}, idempotency_key="k1"))
            assert again == (first.id, False)
            other_topic = await astore.enqueue(Job("sms", 1, idempotency_key="k1"))
            assert other_topic.created and other_topic.id != first.id
            no_keys = {(await astore.enqueue(Job("t", 1, idempotency_key=k))).id for k in ("", None, "")}
            assert len(no_keys) == 3
            row = await astore.get(first.id)
            assert row is not None and row.payload == {"to": "a"} and row.state == State.PENDING
            assert row == store.get(first.id)  # the same row the sync Store reads
            assert await astore.get("not-a-uuid") is None
            assert await astore.get(str(uuid.uuid4())) is None
        finally:
            await pool.close()

    run(main)


def test_a1_e1_concurrent_enqueues_of_one_key_make_one_row(dsn: str, schema: str) -> None:
    async def main() -> set[tuple[str, bool]]:
        pool = await open_pool(dsn)
        try:
            astore = AsyncStore(pool, schema=schema)
            results = await asyncio.gather(
                *(astore.enqueue(Job("t", i, idempotency_key="same")) for i in range(20))
            )
            return {(r.id, r.created) for r in results}
        finally:
            await pool.close()

    results = run(main)
    ids = {i for i, _ in results}
    assert len(ids) == 1
    assert sum(created for _, created in results) == 1


def test_a1_e3_async_connection_commit_and_rollback(dsn: str, schema: str, store: Store) -> None:
    async def main() -> tuple[str, str]:
        astore = AsyncStore(None, schema=schema)  # producer-only: no pool needed
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            gone = await astore.enqueue_tx(conn, Job("t", 1))
            uuid.UUID(gone.id)  # known before commit
            assert store.get(gone.id) is None
            await conn.rollback()
            kept = await astore.enqueue_tx(AsyncWrapTx(conn), Job("t", 2))
            assert store.get(kept.id) is None  # invisible to others before commit
            await conn.commit()
        return gone.id, kept.id

    gone, kept = run(main)
    assert store.get(gone) is None
    row = store.get(kept)
    assert row is not None and row.payload == 2


def test_a1_e2_duplicate_inside_the_callers_async_transaction_does_not_abort_it(
    dsn: str, schema: str, store: Store
) -> None:
    first = store.enqueue(Job("t", 1, idempotency_key="k"))

    async def main() -> str:
        astore = AsyncStore(None, schema=schema)
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            again = await astore.enqueue_tx(conn, Job("t", 2, idempotency_key="k"))
            assert again == (first.id, False)
            batch = await astore.enqueue_many(
                [Job("t", 3, idempotency_key="k"), Job("t", 4, idempotency_key="k2")], tx=conn
            )
            assert batch[0] == (first.id, False) and batch[1].created
            await conn.execute("SELECT 1")  # the transaction still works
            await conn.commit()
            return batch[1].id

    other = run(main)
    assert store.get(other) is not None
    row = store.get(first.id)
    assert row is not None and row.payload == 1  # the duplicate changed nothing


def test_a1_e2_concurrent_uncommitted_duplicate_resolves_after_commit(
    dsn: str, schema: str, store: Store
) -> None:
    """A second async transaction waits for the first's insert and gets its id once it commits."""

    async def main() -> tuple[Any, Any]:
        astore = AsyncStore(None, schema=schema)
        async with (
            await psycopg.AsyncConnection.connect(dsn) as c1,
            await psycopg.AsyncConnection.connect(dsn) as c2,
        ):
            r1 = await astore.enqueue_tx(c1, Job("t", 1, idempotency_key="k"))
            waiting = asyncio.ensure_future(astore.enqueue_tx(c2, Job("t", 2, idempotency_key="k")))
            await asyncio.sleep(0.2)
            assert not waiting.done()  # blocked on c1's row, without blocking this loop
            await c1.commit()
            r2 = await asyncio.wait_for(waiting, 30)
            await c2.execute("SELECT 1")
            await c2.commit()
            return r1, r2

    r1, r2 = run(main)
    assert r2 == (r1.id, False)


def test_a1_e3_pool_begin_commit_rollback_and_duplicate(dsn: str, schema: str, store: Store) -> None:
    async def main() -> None:
        pool = await open_pool(dsn)
        try:
            astore = AsyncStore(pool, schema=schema)
            with pytest.raises(RuntimeError):
                async with astore.begin() as tx:
                    assert isinstance(tx, AsyncWrapTx)
                    gone = await astore.enqueue_tx(tx, Job("t", 1, idempotency_key="p"))
                    raise RuntimeError("boom")
            assert await astore.get(gone.id) is None
            async with astore.begin() as tx:
                kept = await astore.enqueue_tx(tx, Job("t", 1, idempotency_key="p"))
                dup = await astore.enqueue_tx(tx, Job("t", 2, idempotency_key="p"))
                assert dup == (kept.id, False)
                assert store.get(kept.id) is None
            assert store.get(kept.id) is not None
            # The caller's own pool connection and transaction, as a web handler holds it.
            async with pool.connection() as conn:
                mine = await astore.enqueue_tx(conn, Job("t", 3))
                await conn.rollback()
            assert store.get(mine.id) is None
            async with pool.connection() as conn:
                mine = await astore.enqueue_tx(conn, Job("t", 3))
            assert store.get(mine.id) is not None  # the pool's context commits on a clean exit
        finally:
            await pool.close()

    run(main)


def test_a1_pool_connection_autocommit_flag_is_restored(dsn: str, schema: str) -> None:
    async def main() -> bool:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False)
        await pool.open()
        try:
            astore = AsyncStore(pool, schema=schema)
            await astore.enqueue(Job("t", 1))
            await astore.cancel(str(uuid.uuid4()))
            async with pool.connection() as conn:
                return conn.autocommit
        finally:
            await pool.close()

    assert run(main) is False


def test_a1_e4_bad_input_refused_before_anything_is_written(dsn: str, schema: str, store: Store) -> None:
    async def main() -> None:
        pool = await open_pool(dsn)
        try:
            astore = AsyncStore(pool, schema=schema)
            for make in (
                lambda: Job("t", float("nan")),
                lambda: Job("t", "a\x00b"),
                lambda: Job("", 1),
            ):
                with pytest.raises(InvalidJob):
                    await astore.enqueue(make())
            with pytest.raises(InvalidJob):
                await astore.enqueue_many([Job("t", 1), "not a job"])  # type: ignore[list-item]
            async with astore.begin() as tx:
                with pytest.raises(InvalidJob):
                    await astore.enqueue_tx(tx, Job("t", {"x": float("inf")}))
        finally:
            await pool.close()

    run(main)
    with store.begin() as tx:
        row = tx.execute(f'SELECT count(*) FROM "{schema}".job').fetchone()
    assert row == (0,)


def test_a1_e5_enqueue_many_in_order_with_repeats_and_existing(dsn: str, schema: str) -> None:
    async def main() -> None:
        pool = await open_pool(dsn)
        try:
            astore = AsyncStore(pool, schema=schema)
            existing = await astore.enqueue(Job("t", 0, idempotency_key="old"))
            out = await astore.enqueue_many(
                [
                    Job("t", 1, idempotency_key="a"),
                    Job("t", 2),
                    Job("t", 3, idempotency_key="a"),
                    Job("t", 4, idempotency_key="old"),
                ]
            )
            assert [r.created for r in out] == [True, True, False, False]
            assert out[2].id == out[0].id and out[3].id == existing.id
            assert await astore.enqueue_many([]) == []
            async with astore.begin() as tx:
                inside = await astore.enqueue_many([Job("t", 5), Job("t", 6)], tx=tx)
            assert all([await astore.get(r.id) for r in inside])
        finally:
            await pool.close()

    run(main)


def test_a1_x1_cancel_and_q1_retry(dsn: str, schema: str) -> None:
    async def main() -> None:
        pool = await open_pool(dsn)
        try:
            astore = AsyncStore(pool, schema=schema)
            job = await astore.enqueue(Job("t", 1))
            assert await astore.retry(job.id) is False  # pending: left alone
            assert await astore.cancel(job.id) is True
            assert await astore.cancel(job.id) is False  # terminal: untouched
            assert await astore.cancel("nope") is False and await astore.retry("nope") is False
            row = await astore.get(job.id)
            assert row is not None and row.state == State.CANCELED
            assert await astore.retry(job.id) is True
            row = await astore.get(job.id)
            assert row is not None and row.state == State.PENDING and row.attempts == 0
        finally:
            await pool.close()

    run(main)


def test_a1_e6_async_enqueue_wakes_a_listener(dsn: str, schema: str, store: Store) -> None:
    listener = store.worker.listen()
    try:

        async def main() -> None:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                await AsyncStore(None, schema=schema).enqueue_tx(conn, Job("t", 1))

        run(main)
        assert listener.wait(30)
    finally:
        listener.close()


def test_a1_producer_only_stores_refuse_what_needs_a_pool(dsn: str, schema: str) -> None:
    sync = Store(None, schema=schema)
    for call in (
        lambda: sync.enqueue(Job("t", 1)),
        lambda: sync.enqueue_many([Job("t", 1)]),
        lambda: sync.cancel(str(uuid.uuid4())),
        lambda: sync.get(str(uuid.uuid4())),
        lambda: sync.retry(str(uuid.uuid4())),
    ):
        with pytest.raises(BrooqError, match=r"without a pool.*enqueue_tx"):
            call()
    with pytest.raises(BrooqError, match="without a pool"), sync.begin():
        pass
    assert sync.get("malformed") is None  # nothing to run: no pool needed
    with psycopg.connect(dsn) as conn:
        made = sync.enqueue_tx(conn, Job("t", 1))
        conn.commit()

    async def main() -> None:
        astore = AsyncStore(None, schema=schema)
        for call in (
            lambda: astore.enqueue(Job("t", 1)),
            lambda: astore.enqueue_many([Job("t", 1)]),
            lambda: astore.cancel(made.id),
            lambda: astore.get(made.id),
            lambda: astore.retry(made.id),
        ):
            with pytest.raises(BrooqError, match="AsyncStore was built without a pool"):
                await call()
        with pytest.raises(BrooqError, match="without a pool"):
            async with astore.begin():
                pass

    run(main)


def test_a1_sync_and_async_sides_refuse_each_other_naming_the_right_class(dsn: str, schema: str) -> None:
    sync = Store(None, schema=schema)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # an un-awaited coroutine would warn
                for tx in (aconn, AsyncWrapTx(aconn)):
                    with pytest.raises(TypeError, match="AsyncStore"):
                        sync.enqueue_tx(tx, Job("t", 1))  # type: ignore[arg-type]
                    with pytest.raises(TypeError, match="AsyncStore"):
                        sync.enqueue_many([Job("t", 1)], tx=tx)  # type: ignore[arg-type]
                gc.collect()
            with pytest.raises(TypeError, match="AsyncWrapTx"):
                WrapTx(aconn)  # type: ignore[arg-type]
            with psycopg.connect(dsn) as conn:
                astore = AsyncStore(None, schema=schema)
                for tx in (conn, WrapTx(conn)):
                    with pytest.raises(TypeError, match=r"goes to Store"):
                        await astore.enqueue_tx(tx, Job("t", 1))  # type: ignore[arg-type]
                with pytest.raises(TypeError, match="WrapTx"):
                    AsyncWrapTx(conn)  # type: ignore[arg-type]
            assert (await aconn.execute("SELECT 1")).rowcount == 1  # nothing was left pending on it

    run(main)
    sync_pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=0, max_size=1, open=False)
    async_pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=0, max_size=1, open=False)
    with pytest.raises(TypeError, match="AsyncStore"):
        Store(async_pool, schema=schema)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="goes to Store"):
        AsyncStore(sync_pool, schema=schema)  # type: ignore[arg-type]


def test_a1_sqlalchemy_async_session_and_connection_join_their_transaction(
    dsn: str, schema: str, store: Store
) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.pool import NullPool

    async def main() -> None:
        engine = create_async_engine(
            "postgresql+psycopg://",
            async_creator=lambda: psycopg.AsyncConnection.connect(dsn),
            poolclass=NullPool,
        )
        astore = AsyncStore(None, schema=schema)
        try:
            async with AsyncSession(engine) as session:
                tx = await AsyncWrapTx.from_sqlalchemy(session)
                assert (
                    tx.psycopg is (await (await session.connection()).get_raw_connection()).driver_connection
                )
                gone = await astore.enqueue_tx(tx, Job("t", 1))
                await session.rollback()
            assert store.get(gone.id) is None
            async with AsyncSession(engine) as session:
                await session.execute(text("SELECT 1"))  # the session's own work, same transaction
                kept = await astore.enqueue_tx(await AsyncWrapTx.from_sqlalchemy(session), Job("t", 2))
                assert store.get(kept.id) is None
                await session.commit()
            assert store.get(kept.id) is not None
            async with engine.connect() as conn:
                r = await astore.enqueue_tx(await AsyncWrapTx.from_sqlalchemy(conn), Job("t", 3))
                await conn.commit()
            assert store.get(r.id) is not None
            async with AsyncSession(engine) as session:
                with pytest.raises(TypeError, match="AsyncStore"):
                    Store(None, schema=schema).enqueue_tx(session, Job("t", 4))  # type: ignore[arg-type]
            for bad in (object(), None, "x"):
                with pytest.raises(TypeError):
                    await AsyncWrapTx.from_sqlalchemy(bad)
        finally:
            await engine.dispose()

    run(main)


def test_a1_enqueues_never_block_the_event_loop(dsn: str, schema: str, store: Store) -> None:
    """A1: enqueues waiting on a slow database (a row lock held by another transaction for
    HOLD seconds) leave the loop free: a heartbeat task's worst lag stays far below HOLD."""
    hold = 3.0
    release = threading.Event()
    locked = threading.Event()

    def blocker() -> None:
        with psycopg.connect(dsn) as conn:
            store.enqueue_tx(conn, Job("t", 0, idempotency_key="slow"))
            locked.set()
            release.wait(60)
            conn.commit()

    t = threading.Thread(target=blocker)
    t.start()
    assert locked.wait(30)

    async def main() -> tuple[float, float]:
        pool = await open_pool(dsn, max_size=4)
        astore = AsyncStore(pool, schema=schema)
        worst = 0.0
        stop = asyncio.Event()

        async def heartbeat() -> None:
            nonlocal worst
            while not stop.is_set():
                t0 = time.monotonic()
                await asyncio.sleep(0.01)
                worst = max(worst, time.monotonic() - t0 - 0.01)

        beat = asyncio.ensure_future(heartbeat())
        try:
            loop = asyncio.get_running_loop()
            loop.call_later(hold, release.set)
            t0 = time.monotonic()
            # One waits on the held key; the others are plain enqueues through the same pool.
            results = await asyncio.gather(
                astore.enqueue(Job("t", 1, idempotency_key="slow")),
                *(astore.enqueue(Job("t", i)) for i in range(20)),
            )
            waited = time.monotonic() - t0
            assert results[0].created is False
            return waited, worst
        finally:
            stop.set()
            await beat
            await pool.close()

    try:
        waited, worst = run(main)
    finally:
        release.set()
        t.join(30)
    assert waited >= hold * 0.9  # the database really was slow
    assert worst < hold / 2, f"the event loop stalled for {worst:.2f}s"


def test_e3_payload_decoded_whatever_loader_the_callers_connection_registered(
    dsn: str, schema: str, store: Store
) -> None:
    """A connection that loads jsonb as text (as Django's does) still reads decoded payloads."""
    from psycopg.types.string import TextLoader

    made = store.enqueue(Job("t", {"a": [1, 2]}))
    with psycopg.connect(dsn) as conn:
        conn.adapters.register_loader("jsonb", TextLoader)
        row = store.get_tx(conn, made.id)
        assert row is not None and row.payload == {"a": [1, 2]}
        assert conn.execute("SELECT '{}'::jsonb").fetchone() == ("{}",)  # the caller's setting is kept

    async def main() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            aconn.adapters.register_loader("jsonb", TextLoader)
            return await AsyncStore(None, schema=schema).enqueue_tx(aconn, Job("t", 1, idempotency_key="j"))

    assert run(main).created


def test_a1_a_cancelled_enqueue_waiting_on_a_lock_leaves_the_connection_usable(dsn: str, schema: str) -> None:
    """An enqueue waiting on a key another transaction holds can be given up on (asyncio timeout):
    the statement is cancelled on the server and the caller's connection works after its rollback."""

    async def main() -> tuple[Any, Any]:
        astore = AsyncStore(None, schema=schema)
        async with (
            await psycopg.AsyncConnection.connect(dsn) as holder,
            await psycopg.AsyncConnection.connect(dsn) as waiter,
        ):
            await astore.enqueue_tx(holder, Job("t", 1, idempotency_key="held"))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(astore.enqueue_tx(waiter, Job("t", 2, idempotency_key="held")), 0.5)
            await waiter.rollback()
            again = await astore.enqueue_tx(waiter, Job("t", 3, idempotency_key="other"))
            await waiter.commit()
            await holder.rollback()
            return again, await (await waiter.execute("SELECT 1")).fetchone()

    again, one = run(main)
    assert again.created and one == (1,)


def test_a1_a_dropped_connection_is_store_unavailable(dsn: str, schema: str) -> None:
    from brooq_py.queue import StoreUnavailable

    async def main() -> None:
        astore = AsyncStore(None, schema=schema)
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            pid = conn.info.backend_pid
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            with pytest.raises(StoreUnavailable, match="database unavailable while enqueueing"):
                await astore.enqueue_tx(conn, Job("t", 1))

    run(main)
