"""A claim between its answer and its handler's start (SPEC P1, P1'', F0): taken in late by an engine
whose chain of proofs never broke (the heartbeat's orphan look gave it to the reaper meanwhile), run
by run_once after its lease ran out, and the fence's check at the start for every kind of handler."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from tests.integration.conftest import q
from tests.polling import wait_for

LEASE = 3.0


def _other_runs_until(
    released: threading.Event, started: threading.Event, running: threading.Event | None = None
) -> Callable[..., str]:
    def handler(ctx: Context, claim: Claim) -> str:
        if running is not None:
            running.set()
        started.set()
        released.wait(30)  # the other engine's run lasts until the test lets it end
        if running is not None:
            running.clear()
        return "fresh"

    return handler


def test_p1_a_claim_the_orphan_look_dropped_while_the_dispatcher_held_it_never_runs(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """The dispatcher thread is held back between the claim's answer and taking it in (as in
    test_f0_p1_a_claim_taken_in_after_the_proof_came_back_is_not_covered_by_it), but the heartbeat
    keeps beating: no stall of the engine, its chain of proofs never breaks. The orphan look drops
    the claim, the reaper takes it back, another engine runs it; then the claim is taken in."""
    own = Store(pool, schema=schema)
    runs: list[str] = []
    go = threading.Event()
    stalled = threading.Event()
    other_started = threading.Event()
    other_release = threading.Event()
    other_running = threading.Event()
    taken_in = threading.Event()

    def handler(ctx: Context, claim: Claim) -> str:
        runs.append("while the other engine ran it" if other_running.is_set() else "after the other run")
        return "stale"

    e = engines(repo=own, lease=LEASE, workers=1)
    e.register_kind("ti.orphan", handler)
    real = e.intake.launch_all

    def held_back(rows: Any) -> None:
        stalled.set()
        go.wait(60)
        real(rows)
        taken_in.set()

    e.intake.launch_all = held_back  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job("ti.orphan", {"n": 0})).id
    wait_for(stalled.is_set, "the claim's answer", timeout=30)
    # the heartbeat goes on: the orphan look drops the claim, the reaper takes it back (a crash)
    wait_for(
        lambda: q(pool, schema, "SELECT crashes FROM {job} WHERE id = %s", job)[0][0] >= 1,
        "the claim dropped as an orphan and reaped",
        timeout=60,
    )
    other = engines(lease=LEASE)
    other.register_kind("ti.orphan", _other_runs_until(other_release, other_started, other_running))
    other.start()
    assert other_started.wait(30), "the other engine runs the job"
    assert e._may_claim(), "the held-back engine is proven all along (its chain never broke)"
    go.set()  # the dispatcher takes the claim in now
    assert taken_in.wait(30)
    wait_for(lambda: e.inflight.held() == [] and e.inflight.running() == [], "the stale attempt ended", 30)
    other_release.set()
    wait_for(lambda: (r := store.get(job)) is not None and r.state is State.DONE, "run elsewhere", 60)
    e.stop()
    assert store.get(job).result == "fresh"  # type: ignore[union-attr]
    assert runs == [], f"P1: the job ran on two engines at once: {runs}"


def test_p1_a_claim_answered_before_slow_claims_of_other_topics_is_not_run_beside_its_reaped_run(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """No thread held back: one claim of Capacity.claim is several statements (one per capped topic,
    then the common one). The first capped topic's row is committed and answered; each of the next
    statements is slow, answered within its own statement budget (lease/3 + 1 s: a sleep before it
    stands for a slow server or a late answer). The heartbeat beats all along; by the time the
    dispatcher takes the first row in, it is older than a lease: the orphan look has dropped it, the
    reaper has handed it to another engine, which is running it."""
    own = Store(pool, schema=schema)
    topics = [f"ti.capped{i}" for i in range(6)]
    runs: list[str] = []
    other_started = threading.Event()
    other_release = threading.Event()
    other_running = threading.Event()
    taken_in = threading.Event()
    first_rows: list[str] = []
    slow_left = [len(topics) - 1]
    budget = max(LEASE / 3, 1.0) + 1.0  # statement_budget(lease)

    def handler(ctx: Context, claim: Claim) -> str:
        if claim.id in first_rows:
            runs.append("while the other engine ran it" if other_running.is_set() else "after the other run")
        return "stale"

    e = engines(repo=own, lease=LEASE, workers=8)
    for t in topics:
        e.register_kind(t, handler, KindOptions(concurrency=1))  # capped: one statement per topic
    claim = own.worker.claim

    def slow_claim(names: Sequence[str], *rest: Any) -> Any:
        if first_rows and not taken_in.is_set() and slow_left[0] > 0:
            slow_left[0] -= 1
            time.sleep(budget - 0.2)  # a statement of the same claim, answered just in time
        rows = claim(names, *rest)
        if rows and not first_rows:
            first_rows.extend(r.id for r in rows)
        return rows

    own.worker.claim = slow_claim  # type: ignore[method-assign]
    real = e.intake.launch_all

    def launch(rows: Any) -> None:
        real(rows)
        if any(r.id in first_rows for r in rows):
            taken_in.set()

    e.intake.launch_all = launch  # type: ignore[method-assign]
    e.start()
    wait_for(e._may_claim, "the engine proven", 30)
    job = store.enqueue(Job(topics[0], {"n": 0})).id
    wait_for(lambda: first_rows, "the first capped topic's row", 30)
    assert first_rows == [job]
    other = engines(lease=LEASE)
    other.register_kind(topics[0], _other_runs_until(other_release, other_started, other_running))
    other.start()
    assert taken_in.wait(60), "the claim's rows taken in"
    wait_for(lambda: all(a.id != job for a in e.inflight.running()), "the first row's handler ended", 60)
    other_release.set()
    wait_for(lambda: (r := store.get(job)) is not None and r.state is State.DONE, "the job done", 60)
    e.stop()
    assert runs == [], f"P1: the job ran here too: {runs}"


def test_p1_run_once_never_starts_a_handler_whose_claim_expired_before_its_start(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    other_running = threading.Event()
    release = threading.Event()
    order: list[str] = []
    second: list[str] = []

    def script(ctx: Context, claim: Claim) -> str:
        order.append(claim.id)
        if len(order) == 1:  # the first job is slow: the second claim expires, is reaped, runs elsewhere
            wait_for(other_running.is_set, "the other engine runs the second job", timeout=60)
        else:
            second.append("ran here while the other engine ran it" if not release.is_set() else "ran later")
        return "script"

    def other(ctx: Context, claim: Claim) -> str:
        other_running.set()
        release.wait(30)
        return "fresh"

    once = engines(repo=Store(pool, schema=schema), lease=2, workers=2, claim_batch=2)
    once.register_kind("ti.once", script)
    a = store.enqueue(Job("ti.once", {"n": 0})).id
    b = store.enqueue(Job("ti.once", {"n": 1})).id
    runner = engines(lease=2)
    runner.register_kind("ti.once", other)
    started: list[int] = []
    t = threading.Thread(target=lambda: started.append(once.run_once()), daemon=True)
    t.start()
    wait_for(lambda: len(order) == 1, "run_once's first handler", 30)
    runner.start()  # its reaper takes back the expired claim, its dispatcher runs it
    t.join(90)
    release.set()
    wait_for(
        lambda: all((r := store.get(j)) is not None and r.state is State.DONE for j in (a, b)), "done", 60
    )
    assert second == [], f"P1: {second}"


@pytest.mark.parametrize("shape", ["async", "batch", "batch-async", "batch-wait"])
def test_p1_a_claim_taken_in_after_a_broken_chain_never_runs_whatever_the_kind(
    shape: str, dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    own = Store(pool, schema=schema)
    runs: list[str] = []
    go = threading.Event()
    stalled = threading.Event()
    taken_in = threading.Event()
    topic = f"ti.kinds.{shape}"

    async def one_async(ctx: Context, claim: Claim) -> str:
        runs.append(claim.id)
        return "stale"

    def many(ctx: Context, claims: list[Claim]) -> list[str]:
        runs.extend(c.id for c in claims)
        return ["stale"] * len(claims)

    async def many_async(ctx: Context, claims: list[Claim]) -> list[str]:
        runs.extend(c.id for c in claims)
        return ["stale"] * len(claims)

    e = engines(repo=own, lease=LEASE, workers=2)
    if shape == "async":
        e.register_kind(topic, one_async)
    elif shape == "batch":
        e.register_batch(topic, many, KindOptions(batch_size=1))
    elif shape == "batch-async":
        e.register_batch(topic, many_async, KindOptions(batch_size=1))
    else:  # waits in the batcher for a fuller batch after it was taken in
        e.register_batch(topic, many, KindOptions(batch_size=2, batch_wait=0.5))
    real = e.intake.launch_all

    def held_back(rows: Any) -> None:
        stalled.set()
        go.wait(60)
        real(rows)
        taken_in.set()

    e.intake.launch_all = held_back  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    wait_for(stalled.is_set, "the claim's answer", timeout=30)
    with psycopg.connect(dsn) as operator:  # no beat proves the engine: its claim is reaped
        operator.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(schema, "engine")),
            (e.worker_id,),
        )
        other = engines(lease=LEASE)
        if shape == "async":
            other.register_kind(topic, lambda ctx, claim: "fresh")
        else:
            other.register_batch(topic, lambda ctx, claims: ["fresh"] * len(claims))
        other.start()
        wait_for(lambda: (r := store.get(job)) is not None and r.state is State.DONE, "run elsewhere", 60)
        operator.rollback()
    wait_for(e._may_claim, "a beat to prove the engine again", timeout=30)
    go.set()
    assert taken_in.wait(30)
    wait_for(lambda: e.inflight.held() == [] and e.inflight.running() == [], "the stale attempt ended", 30)
    e.stop()
    assert runs == [], runs
    assert store.get(job).result == "fresh"  # type: ignore[union-attr]
