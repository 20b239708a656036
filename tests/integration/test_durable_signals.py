"""Signals and waits against PostgreSQL (SPEC DS4, DS5): stored first-wins, waking a waiting job."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import psycopg_pool
import pytest

from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store
from brooq_py.postgres.worker.repo import WorkerRepo
from brooq_py.queue import (
    Claim,
    Context,
    InvalidJob,
    Job,
    KindOptions,
    SignalTimeout,
    State,
)
from brooq_py.queue.port import StepLog, StepWrite
from tests.integration.conftest import wait_listening
from tests.integration.test_durable_steps import OPTS, ended, in_state, step_rows
from tests.polling import wait_for


def waiting(store: Store, job_id: str, name: str) -> None:
    def check() -> bool:
        row = store.get(job_id)
        return row is not None and row.state is State.SCHEDULED and row.waiting_for == name

    wait_for(check, f"job {job_id} to wait for {name!r}")


def approval(ctx: Context, claim: Claim) -> Any:
    ctx.step("before", lambda: "ok")
    try:
        decision = ctx.wait_for("approval", claim.payload.get("timeout", 60))
    except SignalTimeout as exc:
        return {"timed_out": str(exc)}
    return {"decision": decision}


def test_ds4_a_waiting_job_is_scheduled_spends_no_attempt_and_the_signal_wakes_it(
    store: Store, engines: Callable[..., Engine]
) -> None:
    e = engines(workers=1)
    e.register_kind("approve", approval, OPTS)
    jid = e.enqueue(Job("approve", {})).id
    e.start()
    wait_listening(store.session.pool, store.schema)  # type: ignore[arg-type]
    waiting(store, jid, "approval")
    row = store.get(jid)
    assert row is not None and row.attempts == 0 and row.locked_by is None
    assert [(s.name, s.kind) for s in row.steps] == [("before", "step"), ("approval", "wait")]
    assert row.steps[1].until is not None and row.steps[1].until - row.steps[1].at >= timedelta(seconds=59)
    # not claimable while it waits: a free engine leaves it alone
    store.worker.read_whole()
    assert store.worker.claim(["approve"], 10, "probe", timedelta(seconds=5)) == []
    assert store.signal(jid, "approval", {"by": "ann"}) is True
    assert store.signal(jid, "approval", {"by": "bob"}) is False  # the first of a name wins
    done = ended(store, jid)
    assert done.state is State.DONE and done.result == {"decision": {"by": "ann"}}
    assert done.attempts == 1 and done.waiting_for is None
    assert store.signal(jid, "other", 1) is False  # an ended job takes no signal


def test_ds4_the_timeout_raises_signal_timeout_in_the_next_run(
    store: Store, engines: Callable[..., Engine]
) -> None:
    e = engines()
    e.register_kind("approve", approval, OPTS)
    jid = e.enqueue(Job("approve", {"timeout": 0.5})).id
    e.start()
    row = ended(store, jid)
    assert row.state is State.DONE
    assert "no signal 'approval'" in row.result["timed_out"]
    # a signal sent after the timeout changes nothing: the replay says the same
    assert row.attempts == 1


def test_ds4_bad_signals_are_refused_before_any_statement(store: Store) -> None:
    jid = store.enqueue(Job("x")).id
    with store.session.begin() as tx:
        with pytest.raises(ValueError):
            store.signal(jid, "", None, tx=tx)
        with pytest.raises(InvalidJob):
            store.signal(jid, "n", float("nan"), tx=tx)
        assert store.signal(jid, "n", [1], tx=tx) is True  # the transaction is still usable
    assert store.signal("not-an-id", "n") is False
    assert store.signal("00000000-0000-0000-0000-000000000000", "n") is False


def test_ds4_a_signal_in_a_rolled_back_transaction_never_happened(
    store: Store, engines: Callable[..., Engine]
) -> None:
    e = engines()
    e.register_kind("approve", approval, OPTS)
    jid = e.enqueue(Job("approve", {})).id
    e.start()
    waiting(store, jid, "approval")

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), store.session.begin() as tx:
        assert store.signal(jid, "approval", "rolled back", tx=tx) is True
        raise Rollback
    with store.session.pool.connection() as conn:  # type: ignore[union-attr]
        assert conn.execute(f'SELECT count(*) FROM "{store.schema}".job_signal').fetchone() == (0,)
    row = store.get(jid)
    assert row is not None and row.state is State.SCHEDULED and row.waiting_for == "approval"
    assert store.signal(jid, "approval", "committed") is True  # the first that happened
    assert ended(store, jid).result == {"decision": "committed"}


def test_ds4_a_signal_never_waits_on_the_jobs_row_lock(store: Store, engines: Callable[..., Engine]) -> None:
    """An operator holds the waiting job's row FOR UPDATE: the signal commits at once, and the job
    wakes once the lock is gone."""
    e = engines()
    e.register_kind("approve", approval, OPTS)
    jid = e.enqueue(Job("approve", {})).id
    e.start()
    waiting(store, jid, "approval")
    with psycopg.connect(store.session.conninfo or _dsn(store)) as operator:
        operator.execute(f'SELECT * FROM "{store.schema}".job WHERE id = %s FOR UPDATE', (jid,))
        with psycopg.connect(_dsn(store), autocommit=True) as caller:
            caller.execute("SET lock_timeout = '2s'")
            with caller.transaction():
                assert store.signal(jid, "approval", "through the lock", tx=caller) is True
        row = store.get(jid)
        assert row is not None and row.state is State.SCHEDULED  # still held: not woken yet
        operator.rollback()
    assert ended(store, jid).result == {"decision": "through the lock"}


def _dsn(store: Store) -> str:
    pool = store.session.pool
    assert pool is not None
    return str(pool.conninfo)


def test_ds4_a_signal_sent_while_the_job_runs_is_found_by_wait_for(
    store: Store, engines: Callable[..., Engine]
) -> None:
    started, go = threading.Event(), threading.Event()

    def handler(ctx: Context, claim: Claim) -> Any:
        started.set()
        go.wait(30)
        return ctx.wait_for("go", 60)

    e = engines()
    e.register_kind("running", handler, OPTS)
    jid = e.enqueue(Job("running")).id
    e.start()
    assert started.wait(30)
    assert store.signal(jid, "go", "early") is True
    go.set()
    row = ended(store, jid)
    assert row.result == "early" and row.attempts == 1
    assert step_rows(store, jid) == []  # no wait was needed


class SlowWaitRecord(WorkerRepo):
    """Holds the record of a wait until released: a signal sent then commits after the handler
    looked for it and before the attempt's waiting outcome is written."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.recorded, self.release = threading.Event(), threading.Event()

    def step_record(self, *args: Any, **kwargs: Any) -> StepWrite:
        write = super().step_record(*args, **kwargs)
        if args[4] == "wait":
            self.recorded.set()
            self.release.wait(30)
        return write


def test_ds4_a_signal_between_the_handlers_look_and_its_waiting_outcome_still_wakes_it(
    store: Store, engines: Callable[..., Engine]
) -> None:
    repo = SlowWaitRecord(store.session, store.producer, store.flow)
    e = engines(repo)
    e.register_kind("approve", approval, OPTS)
    jid = store.enqueue(Job("approve", {})).id
    e.start()
    assert repo.recorded.wait(30)
    assert store.signal(jid, "approval", "in between") is True
    repo.release.set()
    assert ended(store, jid).result == {"decision": "in between"}


def test_ds4_cancel_during_a_wait(store: Store, engines: Callable[..., Engine]) -> None:
    e = engines()
    e.register_kind("approve", approval, OPTS)
    jid = e.enqueue(Job("approve", {})).id
    e.start()
    waiting(store, jid, "approval")
    assert store.cancel(jid) is True
    row = store.get(jid)
    assert row is not None and row.state is State.CANCELED and row.waiting_for is None
    assert store.signal(jid, "approval", "too late") is False


def test_ds4_two_waits_of_one_name_and_signals_of_others(
    store: Store, engines: Callable[..., Engine]
) -> None:
    runs = Counter[str]()

    def handler(ctx: Context, claim: Claim) -> Any:
        runs["run"] += 1
        first = ctx.wait_for("a", 60)
        second = ctx.wait_for("b", 60)
        return [first, second]

    e = engines()
    e.register_kind("two", handler, OPTS)
    jid = e.enqueue(Job("two")).id
    e.start()
    waiting(store, jid, "a")
    assert store.signal(jid, "b", "bee") is True  # not the one it waits for: it keeps waiting
    assert store.signal(jid, "a", "ay") is True
    row = ended(store, jid)
    assert row.result == ["ay", "bee"]
    assert [s.name for s in row.steps] == ["a"]


def test_ds4_async_handlers_wait_sleep_and_step_without_blocking_the_loop(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """The step record's first read blocks until another async handler, on the same loop, runs: it
    could never run if the read blocked the loop."""
    other_ran = threading.Event()

    class GatedLoad(WorkerRepo):
        def steps_load(self, job_id: str) -> StepLog:
            assert other_ran.wait(30), "the event loop was blocked"
            return super().steps_load(job_id)

    async def durable(ctx: Context, claim: Claim) -> Any:
        async def fetch() -> int:
            await asyncio.sleep(0)
            return 41

        n = await ctx.astep("fetch", fetch)
        m = await ctx.astep("add", lambda: n + 1)
        await ctx.sleep(0.3)
        got = await ctx.wait_for("go", 60)
        return [n, m, got]

    async def other(ctx: Context, claim: Claim) -> None:
        other_ran.set()

    repo = GatedLoad(store.session, store.producer, store.flow)
    e = engines(repo)
    e.register_kind("durable", durable, OPTS)
    e.register_kind("other", other, OPTS)
    jid = store.enqueue(Job("durable")).id
    e.start()
    wait_for(lambda: e.health() is not None and _running(store, jid), "the durable handler to start")
    store.enqueue(Job("other"))
    waiting(store, jid, "go")
    row = store.get(jid)
    assert row is not None and [(s.name, s.kind) for s in row.steps] == [
        ("fetch", "step"),
        ("add", "step"),
        ("sleep", "sleep"),
        ("go", "wait"),
    ]
    assert store.signal(jid, "go", "now") is True
    assert ended(store, jid).result == [41, 42, "now"]


def _running(store: Store, jid: str) -> bool:
    row = store.get(jid)
    return row is not None and row.state is not State.PENDING


def test_ds4_async_store_signal(store: Store, dsn: str) -> None:
    jid = store.enqueue(Job("x")).id

    async def main() -> list[bool]:
        async with psycopg_pool.AsyncConnectionPool(dsn, min_size=1, max_size=2) as pool:
            astore = AsyncStore(pool, schema=store.schema)
            return [await astore.signal(jid, "n", {"a": 1}), await astore.signal(jid, "n", 2)]

    assert asyncio.run(main()) == [True, False]


def test_ds5_the_row_tells_the_story(store: Store, engines: Callable[..., Engine]) -> None:
    e = engines()
    e.register_kind("approve", approval, KindOptions())
    jid = e.enqueue(Job("approve", {})).id
    e.start()
    waiting(store, jid, "approval")
    (listed,) = [r for r in store.list_jobs("approve") if r.id == jid]
    assert listed.waiting_for == "approval" and [s.name for s in listed.steps] == ["before", "approval"]
    doc = listed.to_json()
    assert doc["waiting_for"] == "approval"
    assert [s["kind"] for s in doc["steps"]] == ["step", "wait"] and doc["steps"][1]["until"]
    e.stop()
    assert store.signal(jid, "approval", True)
    store.worker.stage(["approve"], 10)  # a stopped engine's stager does not run: this one does
    row = in_state(store, jid, State.PENDING)
    assert row.waiting_for is None
