"""SPEC U1-U3 under races, from the outside: a holder that moves while an enqueue or a retry waits on it.

Each race is made deterministic: another connection moves the holder in a
transaction it has not committed yet, the enqueue (or retry) is started in a
thread and seen waiting on that transaction's lock, then the mover commits.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store, WrapTx
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome
from tests.budget import APP, MINE
from tests.integration.conftest import q
from tests.polling import wait_for

LEASE = timedelta(seconds=30)
CLAIM = (
    "UPDATE {job} SET state = 'processing', locked_by = 'x', locked_until = now() + interval '1 min', "
    "attempts = attempts + 1, claim_token = gen_random_uuid() WHERE id = %s"
)


def _in(conn: psycopg.Connection[Any], schema: str, query: str, *params: Any) -> None:
    """Run a test-side statement on *conn* (its transaction stays open)."""
    conn.execute(query.replace("{job}", f'"{schema}".job'), params or None)  # type: ignore[arg-type]


def _waiting_on_a_lock(pool: ConnectionPool[Any], n: int = 1) -> bool:
    rows = q(
        pool, "x", f"SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND {MINE}", APP
    )
    return bool(rows[0][0] >= n)


def _while_held(
    pool: ConnectionPool[Any], dsn: str, schema: str, move: str, job_id: str, act: Callable[[], Any]
) -> Any:
    """Run *act* in a thread while another transaction has moved *job_id* by *move*, uncommitted;
    commit the move once *act* waits on it; return what *act* returned (or raise what it raised)."""
    out: dict[str, Any] = {}
    with psycopg.connect(dsn) as mover:
        _in(mover, schema, move, job_id)

        def run() -> None:
            try:
                out["value"] = act()
            except BaseException as exc:  # handed to the test thread
                out["error"] = exc

        t = threading.Thread(target=run)
        t.start()
        wait_for(
            lambda: _waiting_on_a_lock(pool) or not t.is_alive(), "the act to wait on the mover", timeout=20
        )
        mover.commit()
        t.join(timeout=20)
    if "error" in out:
        raise out["error"]
    return out["value"]


def _row(store: Store, job_id: str) -> Any:
    row = store.get(job_id)
    assert row is not None
    return row


# --- a merge or replace racing a claim ------------------------------------------------------


@pytest.mark.parametrize("mode", ["merge", "replace"])
@pytest.mark.parametrize("both_keys", [False, True])
def test_u2_a_holder_claimed_while_a_merge_waits_is_left_as_it_was(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, mode: Any, both_keys: bool
) -> None:
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k", priority=1))
    job = Job(
        "u",
        {"v": 2},
        unique_key="k",
        priority=9,
        on_duplicate=mode,
        idempotency_key="i" if both_keys else None,
        available_at=datetime.now(UTC) + timedelta(hours=1),
    )
    r = _while_held(pool, dsn, schema, CLAIM, a.id, lambda: store.enqueue(job))
    assert r == (a.id, False)
    row = _row(store, a.id)
    assert row.state == State.PROCESSING and row.payload == {"v": 1} and row.priority == 1


@pytest.mark.parametrize("mode", ["merge", "replace"])
def test_u2_enqueue_many_with_a_holder_claimed_meanwhile_leaves_it(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, mode: Any
) -> None:
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k", priority=1))
    jobs = [Job("u", {"v": 2}, unique_key="k", priority=9, on_duplicate=mode), Job("u", {"v": 3})]
    r = _while_held(pool, dsn, schema, CLAIM, a.id, lambda: store.enqueue_many(jobs))
    assert r[0] == (a.id, False) and r[1].created
    row = _row(store, a.id)
    assert row.state == State.PROCESSING and row.payload == {"v": 1} and row.priority == 1


@pytest.mark.parametrize("mode", ["keep", "merge", "replace"])
def test_u1_a_holder_ending_while_an_enqueue_waits_frees_the_key(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, mode: Any
) -> None:
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k"))
    done = "UPDATE {job} SET state = 'canceled' WHERE id = %s"
    r = _while_held(
        pool,
        dsn,
        schema,
        done,
        a.id,
        lambda: store.enqueue(Job("u", {"v": 2}, unique_key="k", on_duplicate=mode)),
    )
    assert r.created and r.id != a.id
    assert q(pool, schema, "SELECT count(*) FROM {job} WHERE unique_key = 'k' AND state = 'pending'") == [
        (1,)
    ]


def _blocked_by(pool: ConnectionPool[Any], pid: int) -> bool:
    rows = q(pool, "x", "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))", pid)
    return bool(rows[0][0])


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_u1_store_enqueue_of_a_key_an_uncommitted_insert_holds_waits_for_it(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, end: str
) -> None:
    """Store.enqueue's first statement for a new unique job (its only arbiter the unique index) waits
    for a holder not yet committed: committed, it answers that holder; rolled back, it inserts."""
    with psycopg.connect(dsn) as other:
        held = store.enqueue_tx(WrapTx(other), Job("u", {"v": 1}, unique_key="k"))
        out: dict[str, Any] = {}
        t = threading.Thread(
            target=lambda: out.setdefault("r", store.enqueue(Job("u", {"v": 2}, unique_key="k")))
        )
        t.start()
        wait_for(
            lambda: _blocked_by(pool, other.info.backend_pid) or not t.is_alive(), "the enqueue to wait", 20
        )
        getattr(other, end)()
        t.join(timeout=20)
    r = out["r"]
    rows = q(pool, schema, "SELECT id::text, payload FROM {job} WHERE unique_key = 'k'")
    if end == "commit":
        assert r == (held.id, False) and rows == [(held.id, {"v": 1})]
    else:
        assert r.created and r.id != held.id and rows == [(r.id, {"v": 2})]


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_u1_async_store_enqueue_of_a_key_an_uncommitted_insert_holds_waits_for_it(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, end: str
) -> None:
    async def main() -> Any:
        apool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await apool.open()
        try:
            astore = AsyncStore(apool, schema=schema)
            async with await psycopg.AsyncConnection.connect(dsn) as other:
                held = await astore.enqueue_tx(other, Job("u", {"v": 1}, unique_key="k"))
                enqueue = asyncio.create_task(astore.enqueue(Job("u", {"v": 2}, unique_key="k")))
                pid = other.info.backend_pid
                await asyncio.to_thread(wait_for, lambda: _blocked_by(pool, pid), "the enqueue to wait", 20)
                await getattr(other, end)()
                return held, await enqueue
        finally:
            await apool.close()

    held, r = asyncio.run(main())
    rows = q(pool, schema, "SELECT id::text FROM {job} WHERE unique_key = 'k'")
    if end == "commit":
        assert r == (held.id, False) and rows == [(held.id,)]
    else:
        assert r.created and r.id != held.id and rows == [(r.id,)]


def test_u2_store_enqueue_of_a_new_unique_job_keeps_its_meta_time_and_priority(store: Store) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k", meta={"m": "1"}, priority=3, available_at=later))
    b = store.enqueue(Job("u", {"v": 2}, unique_key="k2"))
    row, row2 = _row(store, a.id), _row(store, b.id)
    assert a.created and row.state == State.SCHEDULED and row.meta == {"m": "1"} and row.priority == 3
    assert row.available_at == later
    assert b.created and row2.state == State.PENDING and row2.meta == {}
    assert store.enqueue(Job("u", {"v": 3}, unique_key="k")) == (a.id, False)


# --- a replace racing the stager ------------------------------------------------------------


def test_u2_a_replace_waiting_on_the_stager_pushes_the_promoted_holder_back(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    a = store.enqueue(
        Job("u", {"v": 1}, unique_key="k", available_at=datetime.now(UTC) + timedelta(seconds=1))
    )
    q(pool, schema, "UPDATE {job} SET available_at = now() - interval '1 s' WHERE id = %s", a.id)
    later = datetime.now(UTC) + timedelta(hours=1)
    promote = "UPDATE {job} SET state = 'pending' WHERE id = %s AND state = 'scheduled'"
    job = Job("u", {"v": 2}, unique_key="k", available_at=later, on_duplicate="replace")
    r = _while_held(pool, dsn, schema, promote, a.id, lambda: store.enqueue(job))
    assert r == (a.id, False)
    row = _row(store, a.id)
    assert row.state == State.SCHEDULED and row.payload == {"v": 2}
    assert abs((row.available_at - later).total_seconds()) < 0.01
    assert store.worker.claim(["u"], 10, "w", LEASE) == []


def test_u2_the_stager_skips_a_holder_a_replace_has_pushed_back(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    a = store.enqueue(
        Job("u", {"v": 1}, unique_key="k", available_at=datetime.now(UTC) + timedelta(seconds=1))
    )
    q(pool, schema, "UPDATE {job} SET available_at = now() - interval '1 s' WHERE id = %s", a.id)
    later = datetime.now(UTC) + timedelta(hours=1)
    with psycopg.connect(dsn) as conn:
        r = store.enqueue_tx(
            WrapTx(conn), Job("u", {"v": 2}, unique_key="k", available_at=later, on_duplicate="replace")
        )
        assert r == (a.id, False)
        store.worker.stage(["u"], 10)  # the row is locked: skipped, not promoted
        conn.commit()
    store.worker.stage(["u"], 10)
    row = _row(store, a.id)
    assert row.state == State.SCHEDULED and row.payload == {"v": 2}


# --- a unique job retried by an operator ----------------------------------------------------


def test_u3_retry_while_a_new_holder_is_not_yet_committed_answers_false(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    a = store.enqueue(Job("u", {}, unique_key="k"))
    assert store.cancel(a.id)
    with psycopg.connect(dsn) as conn:
        b = store.enqueue_tx(WrapTx(conn), Job("u", {}, unique_key="k"))
        assert b.created
        out: dict[str, Any] = {}
        t = threading.Thread(target=lambda: out.setdefault("r", store.retry(a.id)))
        t.start()
        wait_for(lambda: _waiting_on_a_lock(pool) or not t.is_alive(), "the retry to wait", timeout=20)
        conn.commit()
        t.join(timeout=20)
    assert out["r"] is False
    assert _row(store, a.id).state == State.CANCELED
    reason = store.retry_refusal(a.id)
    assert reason is not None and b.id in reason


def test_u3_async_retry_while_a_new_holder_is_not_yet_committed_answers_false(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    a = store.enqueue(Job("u", {}, unique_key="k"))
    assert store.cancel(a.id)

    async def main() -> bool:
        apool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await apool.open()
        try:
            astore = AsyncStore(apool, schema=schema)
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                b = await astore.enqueue_tx(conn, Job("u", {}, unique_key="k"))
                assert b.created
                retry = asyncio.create_task(astore.retry(a.id))
                await asyncio.to_thread(wait_for, lambda: _waiting_on_a_lock(pool), "the retry to wait", 20)
                await conn.commit()
                return await retry
        finally:
            await apool.close()

    assert asyncio.run(main()) is False
    assert _row(store, a.id).state == State.CANCELED


def test_u3_a_psql_insert_without_a_unique_key_beside_unique_jobs(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k"))
    q(pool, schema, "INSERT INTO {job} (topic, payload) VALUES ('u', '2')")
    q(pool, schema, "INSERT INTO {job} (topic, payload) VALUES ('u', '3')")
    assert len(store.worker.claim(["u"], 10, "w", LEASE)) == 3
    assert store.enqueue(Job("u", {"v": 4}, unique_key="k")) == (a.id, False)


# --- the engine's own moves -----------------------------------------------------------------


def test_u2_a_handler_chaining_its_successor_with_its_own_unique_key_creates_it(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """A self-rescheduling job: the chained successor is enqueued with the done, when the key is
    free again; answering it with the job that is ending would lose it."""
    seen: list[int] = []

    def handler(ctx: Any, claim: Any) -> None:
        n = claim.payload["n"]
        seen.append(n)
        if n < 3:
            claim.chain(Job("u", {"n": n + 1}, unique_key="sync"))

    engine = engines()
    engine.register_kind("u", handler)
    engine.start()
    store.enqueue(Job("u", {"n": 1}, unique_key="sync"))
    wait_for(lambda: len(seen) >= 3, "three generations of the job", timeout=20)
    assert seen == [1, 2, 3]


def test_u3_the_reaper_returns_a_unique_holder_without_conflict(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    a = store.enqueue(Job("u", {}, unique_key="k"))
    (c,) = store.worker.claim(["u"], 1, "w", timedelta(milliseconds=1))
    wait_for(lambda: store.worker.reap(), "the lease to be reaped", timeout=10)
    assert _row(store, a.id).state == State.PENDING
    assert store.enqueue(Job("u", {}, unique_key="k")) == (a.id, False)
    del c


@pytest.mark.parametrize("mode", ["merge", "replace"])
def test_u2_a_repeatable_read_caller_is_never_answered_by_a_running_holder_that_ended_since(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, mode: Any
) -> None:
    """The caller's REPEATABLE READ snapshot saw the holder running; it ended since. The enqueue
    creates the job or raises the documented serialization failure: never created=False with no
    active holder at the commit (the snapshot alone answered it: the job lost)."""
    holder = store.enqueue(Job("rr", {"v": 1}, unique_key="k")).id
    (c,) = store.worker.claim(["rr"], 1, "w", LEASE)
    with psycopg.connect(dsn) as caller:
        caller.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        caller.execute("SELECT 1")  # the snapshot: the holder processing
        store.worker.settle_many([Outcome(c.id, c.claim_token, State.DONE)])
        try:
            r = store.enqueue_tx(WrapTx(caller), Job("rr", {"v": 2}, unique_key="k", on_duplicate=mode))
        except psycopg.errors.SerializationFailure:
            return
        caller.commit()
    active = q(pool, schema, "SELECT id::text FROM {job} WHERE state NOT IN ('done', 'dead', 'canceled')")
    assert r.created and active == [(r.id,)], (r, holder, active)
