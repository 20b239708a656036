"""Batch delivery (SPEC BD1) where it meets operators, chained work, cancels and settles."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from tests.polling import wait_for


def all_in(store: Store, ids: Sequence[str], state: State) -> Callable[[], bool]:
    return lambda: all((r := store.get(i)) is not None and r.state is state for i in ids)


def count_writes(store: Store) -> dict[str, list[int]]:
    """Wrap the engine-side write paths: settle_many (one statement each) and the closing
    transactions (lock_own_tx opens each one)."""
    seen: dict[str, list[int]] = {"settle_many": [], "closing": []}
    real_many = store.worker.settle_many
    real_lock = store.worker.lock_own_tx

    def many(outcomes: Any) -> Any:
        seen["settle_many"].append(len(outcomes))
        return real_many(outcomes)

    def lock(tx: Any, outcome: Any) -> Any:
        seen["closing"].append(1)
        return real_lock(tx, outcome)

    store.worker.settle_many = many  # type: ignore[method-assign]
    store.worker.lock_own_tx = lock  # type: ignore[method-assign]
    return seen


def test_bd1_a_batch_settles_in_one_statement_but_its_jobs_with_closing_work_each_in_their_own(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """BD1 and C9 (docs/batches.md): the plain outcomes of one call are one settle statement; a job
    that chained a follow-up commits its done with it, in a transaction of its own."""
    seen = count_writes(store)
    go = threading.Event()

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        assert go.wait(30)
        for c in claims:
            if c.payload % 2:
                c.chain(Job("at.after", c.payload))
        return [c.payload for c in claims]

    e = engines(workers=10, poll_interval=0.05)
    e.register_batch("at.chain", handler, KindOptions(batch_size=10))
    ids = [r.id for r in store.enqueue_many([Job("at.chain", i) for i in range(10)])]
    e.start()
    wait_for(all_in(store, ids, State.PROCESSING), "the batch claimed")
    go.set()
    wait_for(all_in(store, ids, State.DONE), "the batch done")
    assert sorted(r.payload for r in store.list_jobs("at.after", limit=100)) == [1, 3, 5, 7, 9]
    assert seen == {"settle_many": [5], "closing": [1] * 5}


def test_bd1_a_member_locked_by_an_operator_at_settle_time_delays_only_itself(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    seen = count_writes(store)
    go = threading.Event()
    runs: list[str] = []
    lock = threading.Lock()

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        with lock:
            runs.extend(c.id for c in claims)
        assert go.wait(30)
        return [c.payload for c in claims]

    e = engines(workers=6, poll_interval=0.05)
    e.register_batch("at.lock", handler, KindOptions(batch_size=6))
    ids = [r.id for r in store.enqueue_many([Job("at.lock", i) for i in range(6)])]
    e.start()
    wait_for(all_in(store, ids, State.PROCESSING), "the batch claimed")
    with pool.connection() as conn, conn.transaction():
        conn.execute(f'SELECT 1 FROM "{schema}".job WHERE id = %s FOR UPDATE', (ids[3],))
        go.set()
        others = [i for i in ids if i != ids[3]]
        wait_for(all_in(store, others, State.DONE), "the others settled beside the lock")
        assert store.get(ids[3]).state is State.PROCESSING  # type: ignore[union-attr]
    wait_for(all_in(store, ids, State.DONE), "the locked one after the lock")
    assert sorted(runs) == sorted(ids)  # each ran once
    for i, job_id in enumerate(ids):
        row = store.get(job_id)
        assert row is not None and row.result == i and row.attempts == 1
    assert seen["settle_many"][0] == 6, seen


def test_bd1_a_claim_canceled_mid_batch_is_no_hung_handler_while_its_call_runs(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """docs/batches.md: the call's context is not canceled by the cancel of one of its jobs, so a
    call that runs on past watchdog_grace after an operator canceled one claim is no hung handler
    (C5: no ERROR, no brooq_hung_workers_total, nothing against /healthz's budget). It was: the
    job's own context started the grace the call could never see."""
    release = threading.Event()
    told: list[bool] = []

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        release.wait(6)  # past the grace (the lease, 3 s) after the cancel
        told.append(ctx.done())
        return [c.payload for c in claims]

    e = engines(workers=4, poll_interval=0.05)  # watchdog_grace: the lease, 3 s
    e.register_batch("at.hung", handler, KindOptions(batch_size=4))
    ids = [r.id for r in store.enqueue_many([Job("at.hung", i) for i in range(3)])]
    e.start()
    wait_for(all_in(store, ids, State.PROCESSING), "the batch claimed")
    assert store.cancel(ids[0])
    wait_for(all_in(store, ids[1:], State.DONE), "the rest", timeout=60)
    assert store.get(ids[0]).state is State.CANCELED  # type: ignore[union-attr]
    assert told == [False]
    hung = e.metrics.child(e.metrics.hung, "at.hung")
    value = hung._value.get() if hasattr(hung, "_value") else hung
    assert not value, f"hung handlers counted for a call that never saw a cancel: {value}"


def test_bd1_a_call_whose_every_job_is_canceled_is_told_and_if_it_runs_on_is_hung(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """Once every job of a call is canceled the call's context is (it was never canceled at all):
    a call that looks stops; one that runs on past watchdog_grace is a hung handler, its claims let go."""
    looked = threading.Event()
    release = threading.Event()

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        if claims[0].payload == "looks":
            deadline = time.monotonic() + 60
            while not ctx.done() and time.monotonic() < deadline:
                time.sleep(0.02)
            looked.set()
            ctx.raise_if_done()
        else:
            release.wait(60)
        return [c.payload for c in claims]

    e = engines(workers=4, poll_interval=0.05, watchdog_grace=1)
    e.register_batch("at.told", handler, KindOptions(batch_size=2))
    looks = [r.id for r in store.enqueue_many([Job("at.told", "looks"), Job("at.told", "looks")])]
    e.start()
    wait_for(all_in(store, looks, State.PROCESSING), "the first call running")
    assert store.cancel(looks[0])
    time.sleep(0.3)
    assert not looked.is_set()  # one job of two: the call is not told
    assert store.cancel(looks[1])
    wait_for(looked.is_set, "the call told once both are canceled")
    hung = e.metrics.child(e.metrics.hung, "at.told")
    runs_on = [r.id for r in store.enqueue_many([Job("at.told", "runs on"), Job("at.told", "runs on")])]
    wait_for(all_in(store, runs_on, State.PROCESSING), "the second call running")
    for job_id in runs_on:
        assert store.cancel(job_id)
    wait_for(lambda: (hung._value.get() if hasattr(hung, "_value") else hung) == 2, "both claims hung")
    release.set()
