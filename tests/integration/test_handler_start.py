"""A handler's start (SPEC F0, C5, BD1): a claim no longer this engine's never starts its handler; any other cancel is the handler's to see."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from tests.polling import wait_for

LEASE = 3.0


def busy(e: Engine, topic: str) -> float:
    return e.metrics.child(e.metrics.busy, topic)._value.get()  # type: ignore[attr-defined]


def state(store: Store, jid: str) -> State | None:
    r = store.get(jid)
    return None if r is None else r.state


def hold_threads(e: Engine, go: threading.Event) -> None:
    real = e.runner.threads.run
    e.runner.threads.run = lambda fn: real(lambda: (go.wait(60), fn()))  # type: ignore[method-assign]


def settled_clean(e: Engine, topic: str, workers: int) -> None:
    wait_for(lambda: e.inflight.running_tokens() == [], "no attempt running", timeout=30)
    wait_for(lambda: e._slots is not None and e._slots.free == workers, "every slot free", timeout=30)
    wait_for(lambda: busy(e, topic) == 0, "busy gauge back to 0", timeout=30)
    assert e._slots is not None and e._slots.free == workers  # not freed twice (would be > workers)


def test_sync_canceled_before_start_never_runs_slot_freed_once_row_stays_canceled(
    store: Store, engines: Callable[..., Engine]
) -> None:
    runs: list[str] = []
    go = threading.Event()
    e = engines(workers=2, lease=LEASE, poll_interval=0.05)
    e.register_kind("hs.s", lambda ctx, claim: runs.append(claim.id) or "ran")
    hold_threads(e, go)
    e.start()
    jid = store.enqueue(Job("hs.s", {"n": 0})).id
    wait_for(lambda: state(store, jid) is State.PROCESSING, "claimed")
    assert e.cancel(jid)
    # the engine learns of it (heartbeat / notification): the attempt is no longer held
    wait_for(lambda: e.inflight.held() == [], "the engine saw the cancel", timeout=30)
    go.set()
    settled_clean(e, "hs.s", 2)
    assert runs == []
    assert state(store, jid) is State.CANCELED
    r = store.get(jid)
    assert r is not None and r.result is None
    # the engine goes on: a new job runs
    j2 = store.enqueue(Job("hs.s", {"n": 1})).id
    wait_for(lambda: state(store, j2) is State.DONE, "a later job runs", timeout=30)
    settled_clean(e, "hs.s", 2)
    assert e.metrics.child(e.metrics.hung, "hs.s")._value.get() == 0  # type: ignore[attr-defined]


def test_async_canceled_before_start_never_runs(store: Store, engines: Callable[..., Engine]) -> None:
    runs: list[str] = []
    go = threading.Event()

    async def handler(ctx: Context, claim: Claim) -> str:
        runs.append(claim.id)
        await asyncio.sleep(0)
        return "ran"

    e = engines(workers=2, lease=LEASE, poll_interval=0.05)
    e.register_kind("hs.a", handler)
    real = e.runner.loop.spawn_many
    e.runner.loop.spawn_many = lambda hs: threading.Thread(  # type: ignore[method-assign]
        target=lambda: (go.wait(60), real(hs)), daemon=True
    ).start()
    e.start()
    jid = store.enqueue(Job("hs.a", {"n": 0})).id
    wait_for(lambda: state(store, jid) is State.PROCESSING, "claimed")
    assert e.cancel(jid)
    wait_for(lambda: e.inflight.held() == [], "the engine saw the cancel", timeout=30)
    go.set()
    settled_clean(e, "hs.a", 2)
    assert runs == []
    assert state(store, jid) is State.CANCELED
    j2 = store.enqueue(Job("hs.a", {"n": 1})).id
    wait_for(lambda: state(store, j2) is State.DONE, "a later job runs", timeout=30)
    settled_clean(e, "hs.a", 2)


def test_batch_partly_canceled_before_the_call_gets_only_live_claims(
    store: Store, engines: Callable[..., Engine]
) -> None:
    calls: list[list[str]] = []
    go = threading.Event()

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        calls.append([c.id for c in claims])
        return ["ok"] * len(claims)

    e = engines(workers=2, lease=LEASE, poll_interval=0.05)
    e.register_batch("hs.b", handler, KindOptions(batch_size=2, batch_wait=5))
    hold_threads(e, go)
    ids = [r.id for r in store.enqueue_many([Job("hs.b", i) for i in range(2)])]
    e.start()
    wait_for(lambda: all(state(store, i) is State.PROCESSING for i in ids), "both claimed")
    assert e.cancel(ids[0])
    wait_for(lambda: len(e.inflight.held()) == 1, "the engine saw the cancel", timeout=30)
    go.set()
    wait_for(lambda: state(store, ids[1]) is State.DONE, "the live one done", timeout=30)
    settled_clean(e, "hs.b", 2)
    assert state(store, ids[0]) is State.CANCELED
    assert calls == [[ids[1]]], f"a job canceled before the call was handed to the handler: {calls}"


def test_batch_all_canceled_before_call_is_not_made(store: Store, engines: Callable[..., Engine]) -> None:
    calls: list[list[str]] = []
    go = threading.Event()

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        calls.append([c.id for c in claims])
        return ["ok"] * len(claims)

    e = engines(workers=2, lease=LEASE, poll_interval=0.05)
    e.register_batch("hs.c", handler, KindOptions(batch_size=2, batch_wait=5))
    hold_threads(e, go)
    ids = [r.id for r in store.enqueue_many([Job("hs.c", i) for i in range(2)])]
    e.start()
    wait_for(lambda: all(state(store, i) is State.PROCESSING for i in ids), "both claimed")
    for i in ids:
        assert e.cancel(i)
    wait_for(lambda: e.inflight.held() == [], "the engine saw the cancels", timeout=30)
    go.set()
    settled_clean(e, "hs.c", 2)
    assert calls == []
    assert all(state(store, i) is State.CANCELED for i in ids)


def test_batch_wait_longer_than_attempt_timeout_still_runs_the_job(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """A lone job of a batch kind waits batch_wait for a fuller batch; with attempt_timeout shorter,
    its ctx is cancelled (AttemptTimeout) before the call. Before 9b2e8dc the call was made (and a
    return was done); now the call is never made and the attempt is spent as a failure."""
    calls: list[list[str]] = []

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        calls.append([c.id for c in claims])
        return ["ok"] * len(claims)

    e = engines(workers=4, lease=LEASE, poll_interval=0.05)
    e.register_batch(
        "hs.t", handler, KindOptions(batch_size=4, batch_wait=1.5, attempt_timeout=0.5, max_attempts=2)
    )
    jid = store.enqueue(Job("hs.t", 0)).id
    e.start()
    wait_for(lambda: state(store, jid) in (State.DONE, State.DEAD), "an end", timeout=60)
    r = store.get(jid)
    assert r is not None
    assert calls, f"the handler was never called; the job ended {r.state} ({r.last_error})"
    assert r.state is State.DONE, (r.state, r.last_error)


def test_fenced_at_start_engine_claims_again_after_proof(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    own = Store(pool, schema=schema)
    runs: list[str] = []
    go = threading.Event()
    beats: list[int] = []
    beat = own.worker.beat

    def counted(*a: Any) -> Any:
        beats.append(1)
        return beat(*a)

    own.worker.beat = counted  # type: ignore[method-assign]
    e = engines(repo=own, lease=LEASE, workers=1, poll_interval=0.05)
    e.register_kind("hs.f", lambda ctx, claim: runs.append(claim.id) or "mine")
    real = e.runner.threads.run
    first = [True]

    def run(fn: Callable[[], None]) -> None:
        if first[0]:
            first[0] = False
            real(lambda: (go.wait(60), fn()))
        else:
            real(fn)

    e.runner.threads.run = run  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job("hs.f", {"n": 0})).id
    wait_for(lambda: state(store, job) is State.PROCESSING, "claimed")
    with psycopg.connect(dsn) as operator:
        operator.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(schema, "engine")),
            (e.worker_id,),
        )
        wait_for(lambda: not e._may_claim(), "the proof to run out", timeout=30)
        go.set()
        wait_for(lambda: e.inflight.running_tokens() == [], "the attempt ended", timeout=30)
        n0 = len(beats)
        operator.rollback()
    assert runs == []
    assert e._slots is not None and e._slots.free == 1
    assert busy(e, "hs.f") == 0
    wait_for(lambda: e._may_claim(), "proven again", timeout=30)
    j2 = store.enqueue(Job("hs.f", {"n": 1})).id
    wait_for(lambda: state(store, j2) is State.DONE, "the same engine runs a new job", timeout=30)
    # the first job: reaped and run (here, by the same engine) exactly once
    wait_for(lambda: state(store, job) is State.DONE, "the first job reaped and run", timeout=60)
    assert sorted(runs) == sorted([job, j2]), runs
    assert len(beats) - n0 < 200, "heartbeat spun"
    settled_clean(e, "hs.f", 1)


def test_run_once_after_a_stopped_engine(store: Store, engines: Callable[..., Engine]) -> None:
    runs: list[str] = []
    e = engines(workers=2, lease=LEASE, poll_interval=0.05)
    e.register_kind("hs.o", lambda ctx, claim: runs.append(claim.id) or "ran")
    e.register_batch("hs.ob", lambda ctx, claims: ["b"] * len(claims), KindOptions(batch_size=2))
    e.start()
    a = store.enqueue(Job("hs.o", {"n": 0})).id
    wait_for(lambda: state(store, a) is State.DONE, "ran while started")
    e.stop(timeout=5)
    # long after the heartbeat stopped: the proof is stale, run_once must not fence
    wait_for(lambda: not e._may_claim(), "stale proof", timeout=30)
    b = store.enqueue(Job("hs.o", {"n": 1})).id
    c = store.enqueue(Job("hs.ob", 1)).id
    total = 0
    for _ in range(5):
        total += e.run_once()
        if state(store, b) is State.DONE and state(store, c) is State.DONE:
            break
    assert state(store, b) is State.DONE and state(store, c) is State.DONE, (state(store, b), state(store, c))
    assert b in runs
