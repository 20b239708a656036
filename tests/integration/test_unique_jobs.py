"""SPEC U1-U3 on real PostgreSQL: one active job per (topic, unique_key), keep/merge/replace."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store, WrapTx
from brooq_py.queue import Job, State
from tests.integration.conftest import q
from tests.polling import wait_for

LEASE = timedelta(seconds=30)


def _unique_rows(pool: ConnectionPool[Any], schema: str, key: str) -> list[tuple[Any, ...]]:
    return q(pool, schema, "SELECT id::text, state FROM {job} WHERE unique_key = %s", key)


# Racers at once (their own connections, within a test's share of the suite's connection budget,
# docs/development.md), in several rounds of a fresh key each.
RACERS, ROUNDS = 6, 8


@pytest.mark.parametrize("key", [f"k{r}" for r in range(ROUNDS)])
def test_u1_concurrent_enqueues_from_separate_connections_create_one_job(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, key: str
) -> None:
    n = RACERS
    conns = [psycopg.connect(dsn) for _ in range(n)]
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def one(i: int) -> None:
        conn = conns[i]
        barrier.wait()
        results[i] = store.enqueue_tx(WrapTx(conn), Job("u", {"i": i}, unique_key=key, on_duplicate="merge"))
        conn.commit()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    rows = _unique_rows(pool, schema, key)
    assert len(rows) == 1
    assert sum(r.created for r in results) == 1
    assert {r.id for r in results} == {rows[0][0]}


@pytest.mark.parametrize("key", [f"ak{r}" for r in range(ROUNDS)])
def test_u1_concurrent_async_enqueues_create_one_job(
    pool: ConnectionPool[Any], schema: str, dsn: str, key: str
) -> None:
    astore = AsyncStore(None, schema=schema)

    async def main() -> list[Any]:
        conns = [await psycopg.AsyncConnection.connect(dsn) for _ in range(RACERS)]

        async def one(i: int, conn: psycopg.AsyncConnection[Any]) -> Any:
            r = await astore.enqueue_tx(conn, Job("u", {"i": i}, unique_key=key))
            await conn.commit()
            return r

        try:
            return await asyncio.gather(*(one(i, c) for i, c in enumerate(conns)))
        finally:
            for c in conns:
                await c.close()

    results = asyncio.run(main())
    rows = _unique_rows(pool, schema, key)
    assert len(rows) == 1 and sum(r.created for r in results) == 1
    assert {r.id for r in results} == {rows[0][0]}


def test_u2_keep_returns_the_holder_and_changes_nothing(store: Store) -> None:
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k", priority=1))
    b = store.enqueue(Job("u", {"v": 2}, unique_key="k", priority=9))
    assert a.created and b == (a.id, False)
    row = store.get(a.id)
    assert row is not None and row.payload == {"v": 1} and row.priority == 1


def test_u2_keep_answers_duplicates_and_new_keys_in_any_order(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """Store.enqueue tries a new unique job's plain insert first, and after a duplicate the statement
    that answers one: either way each call answers as U2 says, whatever the order."""
    a = store.enqueue(Job("u", {"v": 1}, unique_key="a"))
    assert store.enqueue(Job("u", {"v": 2}, unique_key="a")) == (a.id, False)
    assert store.enqueue(Job("u", {"v": 3}, unique_key="a")) == (a.id, False)
    b = store.enqueue(Job("u", {"v": 4}, unique_key="b"))
    c = store.enqueue(Job("u", {"v": 5}, unique_key="c"))
    assert b.created and c.created and len({a.id, b.id, c.id}) == 3
    assert store.enqueue(Job("u", {"v": 6}, unique_key="b")) == (b.id, False)
    assert store.cancel(a.id)
    a2 = store.enqueue(Job("u", {"v": 7}, unique_key="a"))
    assert a2.created and a2.id != a.id
    assert store.enqueue(Job("u", {"v": 8}, unique_key="a")) == (a2.id, False)
    rows = q(
        pool, schema, "SELECT unique_key, payload FROM {job} WHERE state = 'pending' ORDER BY unique_key"
    )
    assert rows == [("a", {"v": 7}), ("b", {"v": 4}), ("c", {"v": 5})]


def test_u2_merge_takes_the_higher_priority_and_the_earlier_time(store: Store) -> None:
    later = datetime.now(UTC) + timedelta(hours=2)
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k", priority=5, available_at=later))
    earlier = datetime.now(UTC) + timedelta(hours=1)
    b = store.enqueue(
        Job("u", {"v": 2}, unique_key="k", priority=1, available_at=earlier, on_duplicate="merge")
    )
    assert b == (a.id, False)
    row = store.get(a.id)
    assert row is not None
    assert row.payload == {"v": 1} and row.priority == 5 and row.state == State.SCHEDULED
    assert abs((row.available_at - earlier).total_seconds()) < 0.01
    c = store.enqueue(Job("u", {"v": 3}, unique_key="k", priority=7, on_duplicate="merge"))  # due now
    row = store.get(a.id)
    assert c == (a.id, False) and row is not None
    assert row.priority == 7 and row.state == State.PENDING and row.payload == {"v": 1}


def test_u2_replace_takes_the_new_payload_meta_priority_and_time(store: Store) -> None:
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k", priority=5, meta={"a": "1"}))
    later = datetime.now(UTC) + timedelta(hours=1)
    b = store.enqueue(
        Job(
            "u",
            {"v": 2},
            unique_key="k",
            priority=1,
            meta={"b": "2"},
            available_at=later,
            on_duplicate="replace",
        )
    )
    assert b == (a.id, False)
    row = store.get(a.id)
    assert row is not None
    assert row.payload == {"v": 2} and row.priority == 1 and row.state == State.SCHEDULED  # debounced
    assert abs((row.available_at - later).total_seconds()) < 0.01
    meta = q(store.session.pool, store.schema, "SELECT meta FROM {job} WHERE id = %s", a.id)[0][0]  # type: ignore[arg-type]
    assert meta == {"b": "2"}
    store.enqueue(Job("u", {"v": 3}, unique_key="k", on_duplicate="replace"))
    row = store.get(a.id)
    assert row is not None and row.payload == {"v": 3} and row.state == State.PENDING


@pytest.mark.parametrize("mode", ["merge", "replace"])
def test_u2_a_processing_holder_is_answered_as_with_keep(store: Store, mode: Any) -> None:
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k", priority=1))
    (claimed,) = store.worker.claim(["u"], 1, "w", LEASE)
    b = store.enqueue(Job("u", {"v": 2}, unique_key="k", priority=9, on_duplicate=mode))
    assert b == (a.id, False) and claimed.id == a.id
    row = store.get(a.id)
    assert row is not None and row.state == State.PROCESSING and row.payload == {"v": 1} and row.priority == 1
    # the same through the statement a job with both keys takes
    c = store.enqueue(Job("u", {"v": 3}, unique_key="k", idempotency_key="i", priority=9, on_duplicate=mode))
    row = store.get(a.id)
    assert c == (a.id, False) and row is not None and row.payload == {"v": 1}


def test_u2_a_scheduled_holder_pulled_forward_wakes_the_stager(
    store: Store, engines: Callable[..., Engine]
) -> None:
    ran = threading.Event()
    # A long poll interval: without the stager's wake-up the job would wait for its old time (1 h)
    # or the stager's next look (60 s).
    engine = engines(poll_interval=60)
    engine.register_kind("u", lambda ctx, claim: ran.set())
    engine.start()
    a = store.enqueue(Job("u", {}, unique_key="k", available_at=datetime.now(UTC) + timedelta(hours=1)))
    soon = datetime.now(UTC) + timedelta(seconds=1)
    b = store.enqueue(Job("u", {}, unique_key="k", available_at=soon, on_duplicate="merge"))
    assert b == (a.id, False)
    wait_for(ran.is_set, "the pulled-forward job to run", timeout=20)


def test_u2_a_duplicate_in_the_callers_transaction_then_its_own_write_and_commit(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k"))
    with psycopg.connect(dsn) as conn:
        tx = WrapTx(conn)
        for mode in ("keep", "merge", "replace"):
            r = store.enqueue_tx(tx, Job("u", {"v": mode}, unique_key="k", on_duplicate=mode))  # type: ignore[arg-type]
            assert r == (a.id, False)
        conn.execute(f'CREATE TABLE "{schema}".mine (x int)')
        conn.execute(f'INSERT INTO "{schema}".mine VALUES (1)')
        conn.commit()
    assert q(pool, schema, 'SELECT x FROM "' + schema + '".mine') == [(1,)]
    row = store.get(a.id)
    assert row is not None and row.payload == {"v": "replace"}


def test_u1_both_keys_at_once(store: Store) -> None:
    a = store.enqueue(Job("u", {"v": 1}, idempotency_key="i1", unique_key="k1"))
    # the idempotency key taken: that row, unchanged, even with another unique key
    b = store.enqueue(Job("u", {"v": 2}, idempotency_key="i1", unique_key="k2", on_duplicate="replace"))
    assert b == (a.id, False)
    # the unique key held: its holder, replaced
    c = store.enqueue(Job("u", {"v": 3}, idempotency_key="i2", unique_key="k1", on_duplicate="replace"))
    assert c == (a.id, False)
    row = store.get(a.id)
    assert row is not None and row.payload == {"v": 3}
    # once the holder ends, the unique key is free, the idempotency key is not
    store.cancel(a.id)
    d = store.enqueue(Job("u", {"v": 4}, idempotency_key="i3", unique_key="k1"))
    e = store.enqueue(Job("u", {"v": 5}, idempotency_key="i1", unique_key="k9"))
    assert d.created and d.id != a.id and e == (a.id, False)


def test_u1_enqueue_many_answers_repeated_keys_in_input_order(store: Store) -> None:
    held = store.enqueue(Job("u", {"v": 0}, unique_key="old", priority=1))
    jobs = [
        Job("u", {"v": 1}, unique_key="a"),
        Job("u", {"v": 2}, unique_key="a", on_duplicate="replace"),
        Job("u", {"v": 3}, idempotency_key="i", unique_key="b"),
        Job("u", {"v": 4}, idempotency_key="i"),
        Job("u", {"v": 5}, unique_key="b"),
        Job("u", {"v": 6}, unique_key="old", priority=8, on_duplicate="merge"),
        Job("u", {"v": 7}),
    ]
    r = store.enqueue_many(jobs)
    assert [x.created for x in r] == [True, False, True, False, False, False, True]
    assert r[1].id == r[0].id and r[3].id == r[2].id and r[4].id == r[2].id and r[5].id == held.id
    row = store.get(held.id)
    assert row is not None and row.priority == 8
    first = store.get(r[0].id)  # the repeat's replace applies, as it would in a second enqueue (U2)
    assert first is not None and first.payload == {"v": 2}
    # again: every one a duplicate now
    again = store.enqueue_many(jobs)
    assert [x.created for x in again] == [False, False, False, False, False, False, True]
    assert [x.id for x in again[:6]] == [x.id for x in r[:6]]


def test_u3_retry_refuses_while_an_active_job_holds_the_key(store: Store) -> None:
    a = store.enqueue(Job("u", {}, unique_key="k"))
    assert store.cancel(a.id)
    b = store.enqueue(Job("u", {}, unique_key="k"))
    assert b.created
    assert store.retry(a.id) is False
    reason = store.retry_refusal(a.id)
    assert reason is not None and b.id in reason and "unique key" in reason
    assert store.cancel(b.id)
    assert store.retry_refusal(a.id) is None
    assert store.retry(a.id) is True
    row = store.get(a.id)
    assert row is not None and row.state == State.PENDING


def test_u3_internal_moves_never_conflict(store: Store) -> None:
    from brooq_py.queue.port import Outcome

    a = store.enqueue(Job("u", {}, unique_key="k"))
    (c,) = store.worker.claim(["u"], 1, "w", LEASE)
    # processing -> failed -> pending -> processing -> done: the same row, never a conflict
    assert store.worker.settle_many([Outcome(c.id, c.claim_token, State.FAILED, last_error="boom")]) == {a.id}
    store.worker.stage(["u"], 10)
    row = store.get(a.id)
    assert row is not None and row.state == State.PENDING
    (c,) = store.worker.claim(["u"], 1, "w", LEASE)
    assert store.worker.settle_many([Outcome(c.id, c.claim_token, State.DONE)]) == {a.id}
    assert store.enqueue(Job("u", {}, unique_key="k")).created
