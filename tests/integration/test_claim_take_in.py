"""A claim between its answer and its handler's start (SPEC P1, P1'', F0): taken in late by an engine
whose chain of proofs never broke (a heartbeat's look for lost answers must not give it away), run by
run_once after its lease ran out, and the fence's check at the start for every kind of handler."""

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
from tests.integration.conftest import q, wait_listening
from tests.integration.take_in import enqueue_known, hear_cancels, register
from tests.polling import wait_for

LEASE = 3.0


def _runs_elsewhere(runs: list[str]) -> Callable[..., str]:
    def handler(ctx: Context, claim: Claim) -> str:
        runs.append(claim.id)
        return "elsewhere"

    return handler


def test_p1_a_claim_held_between_its_answer_and_its_start_is_never_given_to_the_reaper(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """The dispatcher thread is held back between the claim's answer and taking it in for over two
    leases, while the heartbeat keeps beating (no stall of the engine, its chain of proofs never
    breaks). A beat's look for claims whose answer was lost must not name this one (it did: the
    reaper took it back and another engine ran it beside this one): it stays this engine's, is never
    reaped nor run elsewhere, and runs here once it is taken in."""
    own = Store(pool, schema=schema)
    runs: list[str] = []
    elsewhere: list[str] = []
    go = threading.Event()
    stalled = threading.Event()
    beats = [0]

    def handler(ctx: Context, claim: Claim) -> str:
        runs.append(claim.id)
        return "here"

    e = engines(repo=own, lease=LEASE, workers=1)
    e.register_kind("ti.held", handler)
    real = e.intake.launch_all

    def held_back(rows: Any) -> None:
        stalled.set()
        go.wait(60)
        real(rows)

    e.intake.launch_all = held_back  # type: ignore[method-assign]
    beat = own.worker.beat

    def counted(*args: Any) -> Any:
        beats[0] += 1
        return beat(*args)

    own.worker.beat = counted  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job("ti.held", {"n": 0})).id
    wait_for(stalled.is_set, "the claim's answer", timeout=30)
    other = engines(lease=LEASE)
    other.register_kind("ti.held", _runs_elsewhere(elsewhere))
    other.start()  # its reaper and its claims would take the job at once if it were let go
    first = beats[0]
    wait_for(lambda: beats[0] >= first + 10, "ten beats (over two leases, two looks for lost answers)", 60)
    assert q(pool, schema, "SELECT state, crashes FROM {job} WHERE id = %s", job)[0] == ("processing", 0)
    assert e._may_claim(), "the held-back engine is proven all along (its chain never broke)"
    go.set()  # the dispatcher takes the claim in now
    wait_for(lambda: (r := store.get(job)) is not None and r.state is State.DONE, "the job done", 60)
    e.stop()
    assert store.get(job).result == "here"  # type: ignore[union-attr]
    assert (runs, elsewhere) == ([job], [])


def test_p1_a_claim_answered_before_slow_claims_of_other_topics_runs_here_once(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """No thread held back: one claim of Capacity.claim is several statements (one per capped topic,
    then the common one). The first capped topic's row is committed and answered; each of the next
    statements is slow, answered within its own statement budget (lease/3 + 1 s: a sleep before it
    stands for a slow server). By the time the first row is taken in it is older than a lease: it
    was named never received by a beat, reaped and run by another engine beside this one. It must
    stay this engine's and run here, once."""
    own = Store(pool, schema=schema)
    topics = [f"ti.capped{i}" for i in range(6)]
    runs: list[str] = []
    elsewhere: list[str] = []
    taken_in = threading.Event()
    first_rows: list[str] = []
    slow_left = [len(topics) - 1]
    budget = max(LEASE / 3, 1.0) + 1.0  # statement_budget(lease)

    def handler(ctx: Context, claim: Claim) -> str:
        runs.append(claim.id)
        return "here"

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
    other.register_kind(topics[0], _runs_elsewhere(elsewhere))
    other.start()  # its reaper and its claims would take the job at once if it were let go
    assert taken_in.wait(60), "the claim's rows taken in"
    wait_for(lambda: (r := store.get(job)) is not None and r.state is State.DONE, "the job done", 60)
    e.stop()
    assert (runs, elsewhere) == ([job], [])
    assert q(pool, schema, "SELECT crashes FROM {job} WHERE id = %s", job)[0][0] == 0


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


@pytest.mark.parametrize(
    "shape",
    [
        "async",
        "batch",
        "batch-async",
        "batch-wait",
    ],
)
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


@pytest.mark.parametrize("shape", ["sync", "async", "batch"])
def test_p1_a_claim_answered_over_a_lease_late_is_never_run_here(
    shape: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """The claim commits, its answer comes over a lease later (a network stall, a commit waiting for a
    synchronous standby). Meanwhile a beat's look for lost answers named it never received, the
    reaper took it back, another engine ran it, and a beat forgot the dropped claim. The engine's
    chain of proofs never broke: only the answer's own lateness tells that it must not run."""
    own = Store(pool, schema=schema)
    runs: list[Any] = []
    topic = f"ti.late.{shape}"
    answered = threading.Event()
    go = threading.Event()
    claims = [0]
    e = engines(repo=own, lease=LEASE, workers=1)
    register(e, topic, shape, runs, result="stale")
    real_claim = own.worker.claim

    def late(names: Sequence[str], *rest: Any) -> Any:
        claims[0] += 1
        rows = real_claim(names, *rest)
        if rows and not answered.is_set():
            answered.set()
            go.wait(90)  # the answer is on its way: committed, not back yet
        return rows

    own.worker.claim = late  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    wait_for(answered.is_set, "the claim committed", 30)
    other = engines(lease=LEASE)
    if shape == "batch":
        other.register_batch(topic, lambda ctx, claims: ["fresh"] * len(claims), KindOptions(batch_size=1))
    else:
        other.register_kind(topic, lambda ctx, claim: "fresh")
    other.start()
    try:
        wait_for(
            lambda: (r := store.get(job)) is not None and r.state is State.DONE,
            "the claim named never received, reaped, run by the other engine",
            60,
        )
        wait_for(lambda: not e.inflight.dropped(), "the dropped claim forgotten by a beat", 30)
        assert e._may_claim(), "the engine's chain of proofs never broke"
    finally:
        go.set()  # the answer comes now
    first = claims[0]
    wait_for(lambda: claims[0] > first, "the dispatcher past the late answer (its next claim)", 30)
    wait_for(lambda: e.inflight.held() == [] and e.inflight.running() == [], "the stale attempt ended", 30)
    e.stop()
    other.stop()
    assert store.get(job).result == "fresh"  # type: ignore[union-attr]
    row = q(pool, schema, "SELECT state, attempts FROM {job} WHERE id = %s", job)[0]
    assert runs == [], f"P1: the handler ran here for a claim reaped and run elsewhere (row {row})"


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("shape", ["sync", "async", "batch"])
def test_x2_a_cancel_heard_before_or_after_the_hold_keeps_the_handler_from_starting(
    shape: str,
    when: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    engines: Callable[..., Engine],
) -> None:
    """The claim is answered; the operator cancels the processing row and the listener handles its
    NOTIFY just *before* the dispatcher holds the attempt (no attempt to tell yet: the cancel is kept
    for the hold) or just *after* (held and started, its handler not called yet). The job was
    canceled before its handler started: the handler must not start (X2'). (When the hold and the
    start were two moves, a cancel between them raised IllegalTransition on the listener's thread
    and was lost.)"""
    runs: list[Any] = []
    topic = f"ti.cancel.{when}.{shape}"
    jobs: list[str] = []
    e = engines(lease=6, workers=1)
    register(e, topic, shape, runs)
    handled, errors = hear_cancels(e, jobs)
    real_add = e.inflight.add

    def cancel(a: Any) -> None:
        if a.id in jobs and not handled.is_set():
            assert store.cancel(a.id)  # the row is processing under this claim
            assert handled.wait(30), "the listener handled the cancel"

    def add(a: Any, *rest: Any) -> bool:
        if when == "before":
            cancel(a)
        held = real_add(a, *rest)
        if when == "after" and held:
            cancel(a)
        return held

    e.inflight.add = add  # type: ignore[method-assign]
    e.start()
    wait_listening(pool, schema)
    enqueue_known(store, Job(topic, {"n": 0}), jobs)
    wait_for(handled.is_set, "the cancel handled", 30)
    wait_for(lambda: e.inflight.held() == [] and e.inflight.running() == [], "the attempt ended", 30)
    e.stop()
    assert q(pool, schema, "SELECT state FROM {job} WHERE id = %s", jobs[0])[0] == ("canceled",)
    assert runs == [], f"X2': the handler started for a job canceled before its start ({errors!r})"


@pytest.mark.parametrize("shape", ["sync", "async", "batch"])
def test_c11_a_stop_while_a_claim_is_taken_in_never_starts_its_handler_after_the_stop(
    shape: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """stop() comes while the dispatcher, stalled, holds an attempt it has not launched yet. stop()
    waits its timeout, cancels it, declares it hung at stop and hands its row back (pending, its
    attempt given back: stopping is not the job's failure, C11); the dispatcher, going on once stop()
    returned, must not start the handler. (An attempt held and not started was skipped by stop(),
    and the dispatcher then started its handler after the engine had stopped.)"""
    topic = f"ti.stop.{shape}"
    runs: list[Any] = []
    held = threading.Event()
    go = threading.Event()
    e = engines(lease=6, workers=1)
    register(e, topic, shape, runs)
    real_add = e.inflight.add

    def add(a: Any, *rest: Any) -> bool:
        got = real_add(a, *rest)
        if got and a.topic == topic:
            held.set()
            go.wait(60)  # the dispatcher stalls between the hold and the launch
        return got

    e.inflight.add = add  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    wait_for(held.is_set, "the claim held", 30)
    try:
        e.stop(timeout=0.5)
    finally:
        go.set()
    assert e._state == "stopped"
    for t in [t for t in threading.enumerate() if t.name == "brooq-dispatcher"]:
        t.join(30)
    wait_for(lambda: e.inflight.running() == [], "the launch after the stop ended the attempt", 30)
    assert q(pool, schema, "SELECT state, attempts FROM {job} WHERE id = %s", job)[0] == ("pending", 0)
    assert runs == [], "C11: a handler started after stop() returned"
