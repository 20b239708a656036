"""Results, attempt history and progress in the job's row (SPEC V1, V3, V4), tasks end to end."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from brooq_py import Tasks
from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.postgres.worker.repo import WorkerRepo
from brooq_py.queue import Claim, Context, InvalidJob, Job, JobRow, KindOptions, State, StoreUnavailable
from tests.integration.conftest import q
from tests.polling import wait_for


def ended(store: Store, job_id: str) -> JobRow:
    def check() -> JobRow | None:
        row = store.get(job_id)
        return row if row is not None and row.state.terminal else None

    row: JobRow = wait_for(check, f"job {job_id} to end")
    return row


def test_v1_register_kind_handler_return_value_is_the_result(
    store: Store, engines: Callable[..., Engine]
) -> None:
    e = engines()
    e.register_kind("calc", lambda ctx, claim: {"sum": sum(claim.payload), "ok": True})
    jid = e.enqueue(Job("calc", [1, 2, 3])).id
    e.start()
    row = ended(store, jid)
    assert row.state is State.DONE
    assert row.result == {"sum": 6, "ok": True}
    assert row.errors == ()


def test_v1_async_handler_result_and_none_stays_null(store: Store, engines: Callable[..., Engine]) -> None:
    async def answer(ctx: Context, claim: Claim) -> int:
        await asyncio.sleep(0)
        return 42

    e = engines()
    e.register_kind("answer", answer)
    e.register_kind("nothing", lambda ctx, claim: None)
    a = e.enqueue(Job("answer")).id
    b = e.enqueue(Job("nothing")).id
    e.start()
    assert ended(store, a).result == 42
    assert ended(store, b).result is None
    assert q(store.session.pool, store.schema, "SELECT result IS NULL FROM {job} WHERE id = %s", b) == [
        (True,)
    ]  # type: ignore[arg-type]


def test_v1_result_written_with_a_chained_done(store: Store, engines: Callable[..., Engine]) -> None:
    def parent(ctx: Context, claim: Claim) -> str:
        claim.chain(Job("child", {"n": 1}))
        return "parent-result"

    e = engines()
    e.register_kind("parent", parent)
    e.register_kind("child", lambda ctx, claim: claim.payload["n"] + 1)
    pid = e.enqueue(Job("parent")).id
    e.start()
    row = ended(store, pid)
    assert (row.state, row.result) == (State.DONE, "parent-result")
    cid = wait_for(
        lambda: q(store.session.pool, store.schema, "SELECT id::text FROM {job} WHERE topic = 'child'"),  # type: ignore[arg-type]
        "the chained job",
    )[0][0]
    assert ended(store, cid).result == 2


def test_v1_result_written_with_on_succeeded(store: Store, engines: Callable[..., Engine]) -> None:
    def handler(ctx: Context, claim: Claim) -> list[int]:
        claim.on_succeeded(lambda tx: None)
        return [1, 2]

    e = engines()
    e.register_kind("cb", handler)
    jid = e.enqueue(Job("cb")).id
    e.start()
    assert ended(store, jid).result == [1, 2]


def test_v1_a_result_that_cannot_be_encoded_fails_the_attempt(
    store: Store, engines: Callable[..., Engine]
) -> None:
    e = engines(result_max_bytes=100)
    e.register_kind("set", lambda ctx, claim: {1, 2}, KindOptions(max_attempts=2, backoff_base=0.01))
    e.register_kind("big", lambda ctx, claim: "x" * 200, KindOptions(max_attempts=1))
    e.register_kind("nan", lambda ctx, claim: float("nan"), KindOptions(max_attempts=1))
    s = e.enqueue(Job("set")).id
    b = e.enqueue(Job("big")).id
    n = e.enqueue(Job("nan")).id
    e.start()
    row = ended(store, s)
    assert row.state is State.DEAD and row.attempts == 2  # a failure, retried per the usual rules
    assert row.result is None
    assert row.last_error is not None
    assert row.last_error.startswith("ResultRejected: the handler's return value is not JSON-serialisable")
    assert [x.attempt for x in row.errors] == [1, 2]
    big = ended(store, b)
    assert big.state is State.DEAD
    assert "more than result_max_bytes (100)" in (big.last_error or "")
    assert ended(store, n).state is State.DEAD


def test_v3_three_failed_attempts_three_tracebacks_and_success_keeps_them(
    store: Store, engines: Callable[..., Engine]
) -> None:
    def flaky(ctx: Context, claim: Claim) -> str:
        if claim.attempt <= 3:
            raise RuntimeError(f"boom {claim.attempt}")
        return "fine"

    e = engines()
    e.register_kind("flaky", flaky, KindOptions(max_attempts=5, backoff_base=0.01, backoff_max=0.02))
    jid = e.enqueue(Job("flaky")).id
    e.start()
    row = ended(store, jid)
    assert (row.state, row.result) == (State.DONE, "fine")
    assert [x.attempt for x in row.errors] == [1, 2, 3]
    assert [x.error for x in row.errors] == [f"RuntimeError: boom {i}" for i in (1, 2, 3)]
    for i, x in enumerate(row.errors, 1):
        assert x.traceback is not None
        assert "Traceback (most recent call last)" in x.traceback
        assert "in flaky" in x.traceback and f"RuntimeError: boom {i}" in x.traceback
    assert row.errors[0].at <= row.errors[1].at <= row.errors[2].at
    assert row.last_error == "RuntimeError: boom 3"


def test_v3_dead_appends_and_only_the_last_20_are_kept(store: Store, engines: Callable[..., Engine]) -> None:
    def fail(ctx: Context, claim: Claim) -> None:
        raise ValueError("x" * 40_000)  # the traceback holds the message: cut to 16 KiB

    e = engines()
    e.register_kind("fail", fail, KindOptions(max_attempts=23, backoff_base=0.001, backoff_max=0.001))
    jid = e.enqueue(Job("fail")).id
    e.start()
    row = ended(store, jid)
    assert row.state is State.DEAD and row.attempts == 23
    assert [x.attempt for x in row.errors] == list(range(4, 24))
    tb = row.errors[-1].traceback
    assert tb is not None and len(tb.encode()) <= 16 * 1024
    assert "bytes cut]" in tb and tb.startswith("Traceback") and tb.rstrip().endswith("x")


def test_v4_progress_is_visible_while_the_handler_runs(store: Store, engines: Callable[..., Engine]) -> None:
    release = threading.Event()

    def slow(ctx: Context, claim: Claim) -> None:
        ctx.progress(0.25)
        ctx.progress(0.5, "half way")  # coalesced: the latest wins
        release.wait(30)
        ctx.progress(note="finishing")

    e = engines(lease=0.6)  # renewals every 0.2 s
    e.register_kind("slow", slow)
    jid = e.enqueue(Job("slow")).id
    e.start()

    def seen() -> JobRow | None:
        row = store.get(jid)
        return row if row is not None and row.progress is not None else None

    row = wait_for(seen, "progress written by a renewal")
    assert row.state is State.PROCESSING
    assert (row.progress, row.progress_note) == (0.5, "half way")
    release.set()
    done = ended(store, jid)
    assert done.progress == 0.5  # the last note came after the last renewal; the value stays


def test_tasks_end_to_end_payload_by_name_ctx_and_async(store: Store, engines: Callable[..., Engine]) -> None:
    tasks = Tasks(store)

    @tasks.task("math.add", max_attempts=3)
    def add(a: int, b: int = 10) -> int:
        return a + b

    @tasks.task()
    async def who(ctx: Context, name: str) -> dict[str, Any]:
        return {"hello": name, "job": ctx.claim.id, "attempt": ctx.claim.attempt}

    assert add(1, 2) == 3  # a plain call runs it here
    first = add.enqueue(5)
    second = add.using(priority=3).enqueue(a=1, b=1)
    with store.begin() as tx:
        third = who.enqueue_tx(tx, "ann")
    with pytest.raises(InvalidJob):  # refused by the store before anything is written
        add.enqueue(float("nan"))
    with pytest.raises(InvalidJob):
        add.job(1, c=2)  # type: ignore[call-arg]
    payload = q(store.session.pool, store.schema, "SELECT payload FROM {job} WHERE id = %s", first.id)[0][0]  # type: ignore[arg-type]
    assert payload == {"a": 5}
    assert q(store.session.pool, store.schema, "SELECT count(*) FROM {job}") == [(3,)]  # type: ignore[arg-type]
    e = engines()
    e.register_tasks(tasks)
    assert set(e.topics) == {"math.add", who.topic}
    e.start()
    assert store.result(first.id, timeout=30) == 15
    assert store.result(second.id, timeout=30) == 2
    assert ended(store, second.id).priority == 3
    assert store.result(third.id, timeout=30) == {"hello": "ann", "job": third.id, "attempt": 1}


def test_tasks_bound_to_an_async_store(
    dsn: str, schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    from psycopg_pool import AsyncConnectionPool

    from brooq_py.postgres import AsyncStore

    async def main() -> Any:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await pool.open()
        astore = AsyncStore(pool, schema=schema)
        tasks = Tasks(astore)

        @tasks.task("double")
        def double(n: int) -> int:
            return 2 * n

        e = engines()
        e.register_tasks(tasks)
        e.start()
        try:
            one = await double.aenqueue(4)
            async with astore.begin() as tx:
                two = await double.aenqueue_tx(tx, 5)
            return [await astore.result(one.id, 30), await astore.result(two.id, 30)]
        finally:
            await astore.close()
            await pool.close()

    assert asyncio.run(main()) == [8, 10]


def test_v4_a_progress_too_small_for_the_column_never_stops_renewals(
    store: Store, engines: Callable[..., Engine]
) -> None:
    # 1e-300 is a valid progress (between 0 and 1) that PostgreSQL's real cannot hold: it must
    # not make every renewal of the engine fail (and so lose every lease it holds).
    release = threading.Event()

    def tiny(ctx: Context, claim: Claim) -> None:
        ctx.progress(1e-300)
        release.wait(30)
        assert not ctx.done(), ctx.cause

    def other(ctx: Context, claim: Claim) -> None:
        ctx.progress(0.5, "other")
        release.wait(30)
        assert not ctx.done(), ctx.cause

    e = engines(lease=0.6)  # renewals every 0.2 s
    e.register_kind("tiny", tiny)
    e.register_kind("other", other)
    t = e.enqueue(Job("tiny")).id
    o = e.enqueue(Job("other")).id
    e.start()
    try:
        row = wait_for(
            lambda: (r := store.get(o)) is not None and r.progress is not None and r,
            "the other job's progress written by a renewal",
            timeout=5,
        )
        assert (row.progress, row.progress_note) == (0.5, "other")
        assert (
            wait_for(lambda: (r := store.get(t)) is not None and r.progress is not None and r).progress == 0.0
        )
    finally:
        release.set()
    for jid in (t, o):
        done = ended(store, jid)
        assert (done.state, done.attempts) == (State.DONE, 1)


def test_v1_o4_a_done_whose_write_failed_for_several_leases_is_written_late_with_its_result(
    pool: Any, schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    # The handler returned on its last attempt while every write and heartbeat failed for several
    # leases; nobody took the row meanwhile, so the queued done is written once the store answers,
    # under its own claim, with its result (O4, V1): not run again, never dead.
    class Flaky(WorkerRepo):
        down = False

        def settle_many(self, outcomes: Any) -> Any:
            if self.down:
                raise StoreUnavailable("the store is down (test)")
            return super().settle_many(outcomes)

        def beat(self, proof: Any, leases: Any, orphans: bool = False, running: Any = None) -> Any:
            if self.down:
                raise StoreUnavailable("the store is down (test)")
            return super().beat(proof, leases, orphans, running)

    flaky = Flaky(store.session, store.producer, store.flow)
    release = threading.Event()
    calls: list[int] = []

    def answer(ctx: Context, claim: Claim) -> dict[str, int]:
        calls.append(claim.attempt)
        release.wait(30)
        return {"answer": 42}

    e = engines(repo=flaky, lease=0.6, reaper_period=60)
    e.register_kind("answer", answer, KindOptions(max_attempts=1))
    jid = e.enqueue(Job("answer")).id
    e.start()
    try:
        wait_for(lambda: calls, "the handler to run")
        flaky.down = True
        release.set()
        time.sleep(2.0)  # more than three leases
        assert store.get(jid).state is State.PROCESSING  # type: ignore[union-attr]
        flaky.down = False
        row = ended(store, jid)
    finally:
        flaky.close()
    assert calls == [1]  # not run again
    assert (row.state, row.result) == (State.DONE, {"answer": 42})
