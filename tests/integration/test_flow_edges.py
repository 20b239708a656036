"""SPEC F1, F2 and U2 at their edges: full topics and duplicates, the caller's transaction, bad inputs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from brooq_py.postgres import AsyncStore, AsyncWrapTx, Store, WrapTx
from brooq_py.queue import Job, QueueFull
from tests.integration.conftest import q
from tests.polling import wait_for


def _count(pool: ConnectionPool[Any], schema: str, topic: str) -> int:
    return int(q(pool, schema, "SELECT count(*) FROM {job} WHERE topic = %s", topic)[0][0])


@pytest.mark.parametrize(
    "make",
    [
        lambda i: Job("d", {"i": i}, idempotency_key=f"k{i}"),
        lambda i: Job("d", {"i": i}, unique_key=f"u{i}"),
        lambda i: Job("d", {"i": i}, unique_key=f"u{i}", on_duplicate="merge", priority=5),
        lambda i: Job("d", {"i": i}, idempotency_key=f"k{i}", unique_key=f"u{i}"),
    ],
    ids=["idempotency", "unique", "unique-merge", "both"],
)
def test_f2_a_batch_of_duplicates_of_a_full_topic_answers_its_holders(
    store: Store, pool: ConnectionPool[Any], schema: str, make: Callable[[int], Job]
) -> None:
    """Sent again (a retry after a lost answer), a batch that writes nothing is not refused:
    each job is answered by its holder, as a single enqueue of it is."""
    store.set_max_depth("d", 2)
    first = store.enqueue_many([make(0), make(1)])
    assert [r.created for r in first] == [True, True]
    assert store.enqueue(make(0)) == (first[0].id, False)  # single: the duplicate, not QueueFull
    again = store.enqueue_many([make(0), make(1)])
    assert again == [(first[0].id, False), (first[1].id, False)]
    with pytest.raises(QueueFull):  # a new job among them is still refused, and nothing written
        store.enqueue_many([make(0), make(2)])
    assert _count(pool, schema, "d") == 2


def test_f2_a_batch_counts_only_the_jobs_it_would_write(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    store.set_max_depth("d", 3)
    a = store.enqueue(Job("d", {}, unique_key="a"))
    b = store.enqueue(Job("d", {}, idempotency_key="b"))
    r = store.enqueue_many([Job("d", {}, unique_key="a"), Job("d", {}, idempotency_key="b"), Job("d", {})])
    assert r[0] == (a.id, False) and r[1] == (b.id, False) and r[2].created
    assert _count(pool, schema, "d") == 3


def test_f2_queue_full_and_duplicates_in_a_sqlalchemy_session_keep_it_usable(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session
    from sqlalchemy.pool import NullPool

    store.set_max_depth("d", 1)
    held = store.enqueue(Job("d", {"v": 1}, unique_key="k"))
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), poolclass=NullPool)
    try:
        with Session(engine) as session:
            session.execute(text(f'CREATE TABLE "{schema}".mine (x int)'))
            tx = WrapTx.from_sqlalchemy(session)
            with pytest.raises(QueueFull):
                store.enqueue_tx(tx, Job("d", {}))
            with pytest.raises(QueueFull):
                store.enqueue_many([Job("d", {}), Job("d", {}, unique_key="k")], tx=tx)
            for mode in ("keep", "merge", "replace"):
                r = store.enqueue_tx(tx, Job("d", {"v": mode}, unique_key="k", on_duplicate=mode))  # type: ignore[arg-type]
                assert r == (held.id, False)
            session.execute(text(f'INSERT INTO "{schema}".mine VALUES (1)'))
            session.commit()
    finally:
        engine.dispose()
    assert q(pool, schema, f'SELECT x FROM "{schema}".mine') == [(1,)]
    row = store.get(held.id)
    assert row is not None and row.payload == {"v": "replace"} and _count(pool, schema, "d") == 1


def test_f2_queue_full_and_duplicates_in_an_async_transaction_keep_it_usable(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.pool import NullPool

    async def main() -> None:
        apool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await apool.open()
        engine = create_async_engine(
            "postgresql+psycopg://",
            async_creator=lambda: psycopg.AsyncConnection.connect(dsn),
            poolclass=NullPool,
        )
        try:
            astore = AsyncStore(apool, schema=schema)
            await astore.set_max_depth("d", 1)
            held = await astore.enqueue(Job("d", {"v": 1}, unique_key="k"))
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                with pytest.raises(QueueFull):
                    await astore.enqueue_many([Job("d", {})], tx=conn)
                r = await astore.enqueue_tx(conn, Job("d", {"v": 2}, unique_key="k", on_duplicate="replace"))
                assert r == (held.id, False)
                await conn.execute(f'CREATE TABLE "{schema}".mine (x int)')
                await conn.commit()
            async with AsyncSession(engine) as session:
                tx = await AsyncWrapTx.from_sqlalchemy(session)
                with pytest.raises(QueueFull):
                    await astore.enqueue_tx(tx, Job("d", {}))
                r = await astore.enqueue_tx(tx, Job("d", {"v": 3}, unique_key="k", on_duplicate="replace"))
                assert r == (held.id, False)
                await session.execute(text(f'INSERT INTO "{schema}".mine VALUES (2)'))
                await session.commit()
        finally:
            await engine.dispose()
            await apool.close()

    asyncio.run(main())
    assert q(pool, schema, f'SELECT x FROM "{schema}".mine') == [(2,)]
    assert _count(pool, schema, "d") == 1


@pytest.mark.parametrize("key", ["", None])
def test_u1_an_empty_unique_key_is_no_key_as_an_empty_idempotency_key_is(
    store: Store, key: str | None
) -> None:
    a = store.enqueue(Job("u", {}, unique_key=key))
    b = store.enqueue(Job("u", {}, unique_key=key))
    assert a.created and b.created and a.id != b.id
    r = store.enqueue_many([Job("u", {}, unique_key=key), Job("u", {}, unique_key=key)])
    assert [x.created for x in r] == [True, True]


def test_f1_a_rate_change_waits_for_a_claim_of_its_topic(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """A claim holds its topic's lock while it spends tokens; a change made meanwhile waits for it,
    so the claim never spends a bucket being changed."""
    store.set_rate_limit("r", 5, 1)
    lock = store.session.q["topic_claim_lock"]  # the very statement a limited claim takes first
    changed = threading.Event()
    with psycopg.connect(dsn) as claimer:
        bounds = {"topic": "r", "lock_timeout": "250ms", "statement_timeout": "10s"}
        assert claimer.execute(lock.text, bounds).fetchone()[0]  # type: ignore[index, union-attr]
        t = threading.Thread(target=lambda: (store.set_rate_limit("r", 1, 60), changed.set()))
        t.start()
        blocked = "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))"
        wait_for(
            lambda: q(pool, schema, blocked, claimer.info.backend_pid)[0][0],
            "the change to wait",
            timeout=20,
        )
        assert not changed.is_set()
        claimer.commit()
        t.join(timeout=20)
    assert changed.is_set()
    (s,) = [s for s in store.topic_settings() if s.topic == "r"]
    assert s.rate_limit == 1 and s.rate_per == 60 and s.tokens is not None and s.tokens <= 1


def test_f1_a_raised_rate_is_used_without_waiting_for_the_old_rates_next_token(
    store: Store, engines: Callable[..., Any]
) -> None:
    """An engine that ran out of tokens at 1 per hour waits up to an hour for the next one; the
    operator raising the rate to 50/s must not leave it waiting for that old time."""
    store.set_rate_limit("r", 1, 3600)
    store.enqueue_many([Job("r", {"i": i}) for i in range(5)])
    ran: list[int] = []
    engine = engines(poll_interval=0.2)
    engine.register_kind("r", lambda ctx, claim: ran.append(claim.payload["i"]))
    engine.start()
    wait_for(lambda: len(ran) == 1, "the one token of the hour to be spent", timeout=20)
    store.set_rate_limit("r", 50, 1)
    wait_for(lambda: len(ran) == 5, "the other jobs at the new rate", timeout=20)


def test_f1_three_engines_and_a_lowered_rate_never_exceed_the_bucket(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Any]
) -> None:
    """Three engines of 8 slots on a 40/s topic with burst 2, lowered to 8/s while they run: the
    claims' times (as the bucket counted them) never hold more than burst + rate * T in a window."""
    from tests.integration.test_flow_control import _window_excess

    burst, first, second = 2, 40, 8
    store.set_rate_limit("r", first, 1, burst=burst)
    store.enqueue_many([Job("r", {"i": i}) for i in range(300)])
    times: list[float] = []
    lock = threading.Lock()

    def handler(ctx: Any, claim: Any) -> None:
        row = store.get(claim.id)  # processing: updated_at is the claim's time, as the bucket counted it
        assert row is not None
        with lock:
            times.append(row.updated_at.timestamp())

    made = [engines(workers=8, poll_interval=0.1) for _ in range(3)]
    for e in made:
        e.register_kind("r", handler)
        e.start()

    def claimed() -> list[float]:
        with lock:
            return list(times)

    wait_for(lambda: len(claimed()) >= 40, "claims at the first rate", timeout=30)
    store.set_rate_limit("r", second, 1, burst=burst)
    changed_at = q(pool, schema, "SELECT extract(epoch FROM clock_timestamp())::float8")[0][0]
    wait_for(
        lambda: len([t for t in claimed() if t > changed_at]) >= 16, "claims at the second rate", timeout=30
    )
    for e in made:
        e.stop(timeout=5)
    seen = claimed()

    def bound(start: float, end: float, span: float) -> float:
        # a window that starts after the change holds the second rate; any other, the first
        return burst + (second if start > changed_at else first) * span

    assert _window_excess(seen, bound) == []


def test_f2_a_batch_with_repeated_keys_counts_each_new_job_once(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    jobs = [
        Job("d", {"v": 1}, idempotency_key="k", unique_key="u1"),
        Job("d", {"v": 2}, idempotency_key="k"),  # a repeat of the first (its idempotency key)
        Job("d", {"v": 3}, unique_key="u2", on_duplicate="replace"),
        Job("d", {"v": 4}, unique_key="u2"),  # a repeat of the third
        Job("d", {"v": 5}, idempotency_key="k2", unique_key="u1"),  # a repeat of the first (its unique key)
    ]
    store.set_max_depth("d", 1)
    with pytest.raises(QueueFull):  # two new jobs, room for one: nothing written
        store.enqueue_many(jobs)
    assert _count(pool, schema, "d") == 0
    store.set_max_depth("d", 2)
    r = store.enqueue_many(jobs)
    assert [x.created for x in r] == [True, False, True, False, False]
    assert r[1].id == r[0].id == r[4].id and r[3].id == r[2].id
    assert _count(pool, schema, "d") == 2
    assert [x.created for x in store.enqueue_many(jobs)] == [False] * 5  # full, and all duplicates
