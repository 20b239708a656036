"""Parking past a depth cap, and an enqueue that waits for room (SPEC F3)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store
from brooq_py.queue import Claim, Context, InvalidJob, Job, QueueFull, State
from tests.integration.conftest import q
from tests.polling import wait_for

STATES = "SELECT state, count(*) FROM {job} WHERE topic = %s GROUP BY 1"
# Parked jobs are always the newest of the topic's jobs not yet released: oldest released first.
OUT_OF_ORDER = (
    "SELECT count(*) FROM {job} p WHERE p.topic = %s AND p.state = 'parked'"
    " AND EXISTS (SELECT FROM {job} r WHERE r.topic = p.topic AND r.state <> 'parked' AND r.id > p.id)"
)


def counts(pool: ConnectionPool[Any], schema: str, topic: str) -> dict[str, int]:
    return dict(q(pool, schema, STATES, topic))


def test_f3_past_a_parking_cap_jobs_are_parked_never_refused(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    store.set_max_depth("park.a", 5, park=True)
    ids = [store.enqueue(Job("park.a", n)).id for n in range(8)]
    ids += [r.id for r in store.enqueue_many([Job("park.a", n) for n in range(8, 12)])]
    with store.begin() as tx:
        ids.append(store.enqueue_tx(tx, Job("park.a", 12)).id)
    assert counts(pool, schema, "park.a") == {"pending": 5, "parked": 8}
    assert [store.get(i).state for i in ids[:5]] == [State.PENDING] * 5  # type: ignore[union-attr]
    assert store.list_jobs("park.a", state="parked", limit=100)
    # without park the same cap refuses
    store.set_max_depth("park.b", 1)
    store.enqueue(Job("park.b"))
    with pytest.raises(QueueFull):
        store.enqueue(Job("park.b"))


def test_f3_parked_jobs_are_released_oldest_first_across_two_engines_and_none_lost(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    store.set_max_depth("park.drain", 4, park=True)
    lock = threading.Lock()
    ran: list[int] = []

    def handler(ctx: Context, claim: Claim) -> None:
        time.sleep(0.02)  # a drain of some length: the loop below samples it several times
        with lock:
            ran.append(claim.payload)

    ids = [r.id for r in store.enqueue_many([Job("park.drain", n) for n in range(3)])]
    ids += [store.enqueue(Job("park.drain", n)).id for n in range(3, 60)]
    assert counts(pool, schema, "park.drain")["parked"] == 56
    seen_out_of_order = []
    for _ in range(2):
        e = engines(workers=2, poll_interval=0.05)
        e.register_kind("park.drain", handler)
        e.start()
    deadline = time.monotonic() + 60
    while True:  # at least one sample, however late this thread is scheduled
        seen_out_of_order.append(q(pool, schema, OUT_OF_ORDER, "park.drain")[0][0])
        waiting = counts(pool, schema, "park.drain")
        if waiting.get("done", 0) == 60:
            break
        assert waiting.get("pending", 0) <= 4 + 2  # the runnable backlog stays bounded
        assert time.monotonic() < deadline, f"not drained: {waiting}"
        time.sleep(0.01)
    assert set(seen_out_of_order) == {0}
    assert sorted(ran) == list(range(60)) and len(ran) == 60  # nothing lost, none twice


def test_f3_removing_the_cap_releases_the_parked_jobs(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    store.set_max_depth("park.off", 1, park=True)
    for n in range(4):
        store.enqueue(Job("park.off", n))
    assert counts(pool, schema, "park.off") == {"pending": 1, "parked": 3}
    store.stage(["park.off"], 100)
    assert counts(pool, schema, "park.off") == {"pending": 1, "parked": 3}  # no room
    store.set_max_depth("park.off", None)
    store.stage(["park.off"], 100)
    assert counts(pool, schema, "park.off") == {"pending": 4}


def test_f3_a_parked_job_can_be_canceled(store: Store, pool: ConnectionPool[Any], schema: str) -> None:
    store.set_max_depth("park.cancel", 1, park=True)
    store.enqueue(Job("park.cancel"))
    parked = store.enqueue(Job("park.cancel")).id
    assert store.get(parked).state is State.PARKED  # type: ignore[union-attr]
    assert store.cancel(parked)
    assert store.get(parked).state is State.CANCELED  # type: ignore[union-attr]


def test_f3_wait_times_out_to_queue_full(store: Store) -> None:
    store.set_max_depth("wait.full", 1)
    store.enqueue(Job("wait.full"))
    started = time.monotonic()
    with pytest.raises(QueueFull):
        store.enqueue(Job("wait.full"), wait=0.3)
    assert time.monotonic() - started >= 0.3


def test_f3_wait_succeeds_when_room_appears(store: Store) -> None:
    store.set_max_depth("wait.room", 1)
    first = store.enqueue(Job("wait.room")).id
    got: list[Any] = []
    t = threading.Thread(
        target=lambda: got.append(store.enqueue(Job("wait.room"), wait=timedelta(seconds=30)))
    )
    t.start()
    wait_for(lambda: store.queue_full_refusals().get("wait.room", 0) >= 1, "the waiter refused once")
    assert t.is_alive()
    assert store.cancel(first)
    t.join(30)
    assert got and got[0].created
    assert store.get(got[0].id).state is State.PENDING  # type: ignore[union-attr]


def test_f3_wait_inside_a_transaction_is_refused_and_the_transaction_usable(store: Store) -> None:
    with store.begin() as tx:
        with pytest.raises(InvalidJob):
            store.enqueue_tx(tx, Job("wait.tx"), wait=1)
        assert store.enqueue_tx(tx, Job("wait.tx")).created
    for bad in (-1, float("nan"), "1", True):
        with pytest.raises(InvalidJob):
            store.enqueue(Job("wait.bad"), wait=bad)  # type: ignore[arg-type]


def test_f3_sequence_members_on_a_parking_topic_keep_their_order(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    store.set_max_depth("park.seq", 2, park=True)
    lock = threading.Lock()
    ran: list[int] = []

    def handler(ctx: Context, claim: Claim) -> None:
        with lock:
            ran.append(claim.payload)

    ids = [store.enqueue(Job("park.seq", n, sequence="ps")).id for n in range(10)]
    assert counts(pool, schema, "park.seq") == {"blocked": 2, "parked": 8}
    e = engines(workers=4, poll_interval=0.05)
    e.register_kind("park.seq", handler)
    e.start()
    wait_for(lambda: counts(pool, schema, "park.seq") == {"done": 10}, "every member done")
    assert ran == list(range(10))
    assert len(ids) == 10


def test_f3_q5_async_store_parks_waits_and_resumes(dsn: str, schema: str, store: Store) -> None:
    async def main() -> None:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False)
        await pool.open()
        try:
            astore = AsyncStore(pool, schema=schema)
            await astore.set_max_depth("apark", 1, park=True)
            await astore.enqueue(Job("apark"))
            parked = await astore.enqueue(Job("apark"))
            assert (await astore.get(parked.id)).state is State.PARKED  # type: ignore[union-attr]
            await astore.set_max_depth("afull", 1)
            first = await astore.enqueue(Job("afull"))
            with pytest.raises(QueueFull):
                await astore.enqueue(Job("afull"), wait=0.1)
            waiter = asyncio.ensure_future(astore.enqueue(Job("afull"), wait=30))
            while astore.queue_full_refusals().get("afull", 0) < 2:
                await asyncio.sleep(0.01)
            assert store.cancel(first.id)
            assert (await waiter).created
            async with pool.connection() as conn:
                with pytest.raises(InvalidJob):
                    await astore.enqueue_tx(conn, Job("afull"), wait=1)
            assert await astore.resume_sequence("apark", "none") is False
        finally:
            await pool.close()

    asyncio.run(main())


def test_f3_q5_a_unique_job_in_a_sequence_and_on_a_parking_topic(store: Store) -> None:
    one = store.enqueue(Job("uq.seq", sequence="u", unique_key="k"))
    assert store.enqueue(Job("uq.seq", sequence="u", unique_key="k")) == (one.id, False)
    store.set_max_depth("uq.park", 1, park=True)
    store.enqueue(Job("uq.park"))
    parked = store.enqueue(Job("uq.park", unique_key="k"))
    assert parked.created and store.get(parked.id).state is State.PARKED  # type: ignore[union-attr]
