"""AsyncStore's operator controls (SPEC Q1-Q3, API "Operator controls (Store, AsyncStore, ...)"):
the Store's methods, awaited, with the same behaviour and errors, on real PostgreSQL; none blocks
the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from brooq_py import Engine
from brooq_py.postgres import AsyncStore, Store, WrapTx
from brooq_py.queue import InvalidJob, Job, State

# Every operator method of the Store, read or action; the worker's (claim, settle, ...) are not.
OPERATOR_METHODS = [
    "retry",
    "retry_refusal",
    "resume_sequence",
    "list_jobs",
    "topic_active",
    "topic_overview",
    "topic_settings",
    "pause",
    "resume",
    "paused",
    "forget_topic",
    "set_limit",
    "set_rate_limit",
    "set_max_depth",
    "set_tenant_limit",
    "set_tenant_rate_limit",
    "set_tenant_weight",
]


def with_astore(dsn: str, schema: str, main: Callable[[AsyncStore], Awaitable[Any]]) -> Any:
    """Run ``main(astore)`` on a fresh event loop, on an AsyncStore over a pool of its own."""

    async def run() -> Any:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False)
        await pool.open()
        try:
            return await main(AsyncStore(pool, schema=schema))
        finally:
            await pool.close()

    return asyncio.run(run())


@pytest.mark.parametrize("name", OPERATOR_METHODS)
def test_async_store_has_the_operator_methods_of_store(name: str) -> None:
    assert hasattr(Store, name)
    assert inspect.iscoroutinefunction(getattr(AsyncStore, name, None)), f"AsyncStore.{name} is missing"
    assert inspect.signature(getattr(AsyncStore, name)) == inspect.signature(getattr(Store, name))


def test_pause_resume_paused_and_topic_settings(dsn: str, schema: str, store: Store) -> None:
    async def main(astore: AsyncStore) -> None:
        assert await astore.paused() == set()
        await astore.pause("a")
        await astore.pause("a")  # twice is fine
        await astore.pause("b")
        assert await astore.paused() == {"a", "b"} == store.paused()
        await astore.resume("a")
        await astore.resume("never-paused")
        assert await astore.paused() == {"b"} == store.paused()
        assert await astore.topic_settings() == store.topic_settings()
        settings = {s.topic: (s.paused, s.limit) for s in await astore.topic_settings()}
        assert settings["b"] == (True, None) and settings.get("a", (False, None)) == (False, None)

    with_astore(dsn, schema, main)


def test_a_topic_paused_by_the_async_store_is_not_claimed_until_resumed(
    dsn: str, schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    ran: list[Any] = []
    engine = engines()
    engine.register_kind("held", lambda ctx, claim: ran.append(claim.payload))
    engine.start()

    async def pause(astore: AsyncStore) -> str:
        await astore.pause("held")
        return (await astore.enqueue(Job("held", 1))).id

    job_id = with_astore(dsn, schema, pause)
    time.sleep(1.0)
    row = store.get(job_id)
    assert row is not None and row.state is State.PENDING and ran == []

    async def resume(astore: AsyncStore) -> None:
        await astore.resume("held")

    with_astore(dsn, schema, resume)
    deadline = time.monotonic() + 20
    while not ran and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ran == [1]


def test_set_limit_sets_and_clears_the_global_limit(dsn: str, schema: str, store: Store) -> None:
    async def main(astore: AsyncStore) -> None:
        await astore.set_limit("api", 4)
        await astore.pause("api")
        (setting,) = store.topic_settings()
        assert (setting.topic, setting.paused, setting.limit) == ("api", True, 4)
        await astore.set_limit("api", 2)  # not a first limit: no wait
        assert store.topic_settings()[0].limit == 2
        await astore.set_limit("api", None)
        (setting,) = await astore.topic_settings()
        assert (setting.paused, setting.limit) == (True, None)

    with_astore(dsn, schema, main)


def test_a_first_limit_waits_for_earlier_writers_without_blocking_the_loop(
    dsn: str, schema: str, store: Store
) -> None:
    # A transaction that wrote to the job table before the first limit: set_limit waits for its
    # end (as Store.set_limit does), sleeping on the event loop, which keeps running meanwhile.
    writer = psycopg.connect(dsn)
    store.enqueue_tx(WrapTx(writer), Job("other", 1))
    threading.Timer(1.0, writer.commit).start()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    async def main(astore: AsyncStore) -> float:
        ticker = asyncio.create_task(tick())
        started = time.monotonic()
        await astore.set_limit("api", 3)
        took = time.monotonic() - started
        ticker.cancel()
        return took

    try:
        took = with_astore(dsn, schema, main)
    finally:
        writer.close()
    assert took >= 0.8, took  # it waited for the writer
    assert ticks >= 20, ticks  # and the loop ran all along
    assert store.topic_settings()[0].limit == 3


@pytest.mark.parametrize("limit", [-1, 2**31, 1.5, "4", True])
def test_set_limit_refuses_bad_limits_before_writing(
    dsn: str, schema: str, store: Store, limit: object
) -> None:
    async def main(astore: AsyncStore) -> None:
        with pytest.raises(ValueError, match="limit must be"):
            await astore.set_limit("api", limit)  # type: ignore[arg-type]

    with_astore(dsn, schema, main)
    assert store.topic_settings() == []


@pytest.mark.parametrize("topic", ["", "a\x00b", None, "\udcff", "t" * 256])
def test_operator_controls_refuse_bad_topics(dsn: str, schema: str, store: Store, topic: object) -> None:
    async def main(astore: AsyncStore) -> None:
        with pytest.raises(InvalidJob):
            await astore.set_limit(topic, 3)  # type: ignore[arg-type]
        for call in (astore.pause, astore.resume, astore.forget_topic, astore.topic_active):
            with pytest.raises(InvalidJob):
                await call(topic)  # type: ignore[arg-type]

    with_astore(dsn, schema, main)
    assert store.topic_settings() == []


def test_a_topic_of_255_bytes_can_be_paused(dsn: str, schema: str, store: Store) -> None:
    topic = "t" * 255

    async def main(astore: AsyncStore) -> None:
        await astore.pause(topic)
        assert await astore.paused() == {topic}

    with_astore(dsn, schema, main)


def test_forget_topic_removes_the_settings(dsn: str, schema: str, store: Store) -> None:
    async def main(astore: AsyncStore) -> None:
        await astore.pause("a")
        await astore.set_limit("a", 2)
        assert await astore.forget_topic("a") is True
        assert await astore.forget_topic("a") is False  # nothing left
        assert await astore.topic_settings() == [] == store.topic_settings()

    with_astore(dsn, schema, main)


def test_topic_active(dsn: str, schema: str, store: Store) -> None:
    store.enqueue(Job("busy", 1))

    async def main(astore: AsyncStore) -> None:
        assert await astore.topic_active("busy") is True
        assert await astore.topic_active("idle") is False

    with_astore(dsn, schema, main)


def test_topic_overview_is_the_stores(dsn: str, schema: str, store: Store) -> None:
    store.enqueue(Job("a", 1))
    store.enqueue(Job("a", 2))
    store.enqueue(Job("b", 1))
    store.set_limit("b", 5)
    store.pause("c")

    async def main(astore: AsyncStore) -> Any:
        return await astore.topic_overview()

    overview = with_astore(dsn, schema, main)
    by_topic = {t.topic: t for t in overview}
    assert by_topic["a"].counts.get("pending") == 2
    assert (by_topic["b"].limit, by_topic["c"].paused) == (5, True)
    # The same rows as the Store's (the ages aside: read a moment apart).
    strip = [(t.topic, t.counts, t.paused, t.limit, t.rate, t.max_depth) for t in overview]
    assert strip == [
        (t.topic, t.counts, t.paused, t.limit, t.rate, t.max_depth) for t in store.topic_overview()
    ]


def test_retry_refusal_is_the_stores(dsn: str, schema: str, store: Store) -> None:
    pending = store.enqueue(Job("t", 1)).id
    dead = store.enqueue(Job("t", 2)).id
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET state = 'dead' WHERE id = %s").format(sql.Identifier(schema, "job")),
            (dead,),
        )
    unknown = "00000000-0000-0000-0000-000000000000"

    async def main(astore: AsyncStore) -> list[str | None]:
        return [await astore.retry_refusal(i) for i in (pending, dead, unknown, "nope")]

    reasons = with_astore(dsn, schema, main)
    assert reasons == [store.retry_refusal(i) for i in (pending, dead, unknown, "nope")]
    assert reasons[1] is None  # a dead job would be retried
    assert "only dead or canceled" in str(reasons[0])
    assert reasons[2] == f"no job {unknown}" and reasons[3] == "'nope' is not a job id"
