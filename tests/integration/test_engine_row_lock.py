"""The heartbeat under a lock held on the engine's own row (SPEC P1'', F0, L5'), and its
wake-ups since commit b308206."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, State
from brooq_py.queue.port import EngineProof, HeldLease, Renewal
from tests.integration.conftest import q
from tests.polling import wait_for

LEASE = 3.0


def test_f0_an_operator_lock_on_the_engine_row_fences_before_a_reap_and_the_engine_comes_back(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """An operator holds FOR UPDATE on the engine's row for 3 leases while a handler runs. The beats
    cannot write: the engine fences its handler (LeaseLost) before its job can be reaped, the job is
    reaped and run again; once the lock is gone the engine proves itself again and claims a new job
    promptly, and its heartbeat did not spin meanwhile."""
    own = Store(pool, schema=schema)
    beat = own.worker.beat
    beats: list[float] = []

    def counted(proof: EngineProof, leases: Sequence[HeldLease], *rest: Any) -> Renewal:
        beats.append(time.monotonic())
        return beat(proof, leases, *rest)

    own.worker.beat = counted  # type: ignore[method-assign]
    spans: list[list[float]] = []
    first = threading.Event()

    def handler(ctx: Context, claim: Claim) -> str:
        span = [time.monotonic(), 0.0]
        spans.append(span)
        try:
            if claim.payload.get("n") == 0 and not first.is_set():
                first.set()
                if ctx.wait(60):
                    ctx.raise_if_done()
            return "ok"
        finally:
            span[1] = time.monotonic()

    e = engines(repo=own, lease=LEASE)
    e.register_kind("ra.hb", handler)
    e.start()
    job = store.enqueue(Job("ra.hb", {"n": 0})).id
    assert first.wait(30)
    with psycopg.connect(dsn) as op:
        op.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(schema, "engine")),
            (e.worker_id,),
        )
        locked_at = time.monotonic()
        n0 = len(beats)
        wait_for(
            lambda: (
                q(pool, schema, "SELECT state, crashes FROM {job} WHERE id = %s", job) == [("pending", 1)]
            ),
            "the job reaped while the engine row is locked (nobody else may run it: E is fenced)",
            60,
        )
        assert len(spans) == 1 and spans[0][1] > 0  # the fenced handler ended, nothing ran it again
        while time.monotonic() - locked_at < 3 * LEASE:
            time.sleep(0.1)
        during = len(beats) - n0
        op.rollback()
    released = time.monotonic()
    wait_for(lambda: (r := store.get(job)) is not None and r.state is State.DONE, "the job done", 60)
    later = store.enqueue(Job("ra.hb", {"n": 1})).id
    wait_for(lambda: (r := store.get(later)) is not None and r.state is State.DONE, "a new job runs", 60)
    back = time.monotonic() - released
    row = store.get(job)
    assert row is not None
    print(
        f"beats during {3 * LEASE:g}s lock: {during}; back in {back:.2f}s; crashes={row.crashes} spans={spans}"
    )
    assert len(spans) >= 2 and spans[0][1] <= spans[1][0], "the fenced handler still ran (P1)"
    assert during < 60, f"the heartbeat spun: {during} beats in {3 * LEASE:g}s"
    assert back < 2 * LEASE


def test_f0_p1_a_handler_whose_engine_lost_its_proof_before_the_start_never_runs(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """An engine stopped between its claim and the handler's start (a SIGSTOP, a frozen VM: here the
    handler's thread held back and the engine row locked, so no beat proves it) resumes with a stale
    proof: its claim may have been reaped and run elsewhere. The handler must not start: it did, at
    once, beside the other engine's run (a double execution seen by the chaos invariants)."""
    own = Store(pool, schema=schema)
    runs: list[str] = []
    go = threading.Event()

    def handler(ctx: Context, claim: Claim) -> str:
        runs.append("stalled engine")
        return "stale"

    e = engines(repo=own, lease=LEASE, workers=1)
    e.register_kind("ra.start", handler)
    real = e.runner.threads.run
    e.runner.threads.run = lambda fn: real(lambda: (go.wait(60), fn()))  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job("ra.start", {"n": 0})).id
    wait_for(lambda: (r := store.get(job)) is not None and r.state is State.PROCESSING, "claimed")
    with psycopg.connect(dsn) as operator:
        operator.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(schema, "engine")),
            (e.worker_id,),
        )
        wait_for(lambda: not e._may_claim(), "the engine's proof to run out", timeout=30)
        go.set()  # the handler's thread goes on, the proof still gone
        wait_for(lambda: e.inflight.running_tokens() == [], "the attempt ended", timeout=30)
        operator.rollback()
    assert runs == [], runs
    e.stop()
    other = engines(lease=LEASE)
    other.register_kind("ra.start", lambda ctx, claim: "fresh")
    other.start()
    wait_for(lambda: (r := store.get(job)) is not None and r.state is State.DONE, "run elsewhere", timeout=60)
    assert store.get(job).result == "fresh"  # type: ignore[union-attr]
    assert runs == [], runs


def test_f0_p1_a_claim_taken_in_after_the_proof_came_back_is_not_covered_by_it(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """An engine stalls between its claim's answer and taking the claim in (a SIGSTOP there). Its
    proof runs out, the claim is reaped and run by another engine; then the engine comes back and a
    beat proves it alive again *before* the stalled claim is taken in, so that beat could not name
    it. The proof of life is the engine's, not the claim's: the claim was made under the old proof
    and the chain of proofs broke since. The handler must not start (it did: the beat's fresh
    proof covered it, a run of a job another engine had run)."""
    own = Store(pool, schema=schema)
    runs: list[str] = []
    go = threading.Event()
    stalled = threading.Event()

    def handler(ctx: Context, claim: Claim) -> str:
        runs.append("stalled engine")
        return "stale"

    e = engines(repo=own, lease=LEASE, workers=1)
    e.register_kind("ra.takein", handler)
    real = e.intake.launch_all

    def held_back(rows: Any) -> None:
        stalled.set()
        go.wait(60)
        real(rows)

    e.intake.launch_all = held_back  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job("ra.takein", {"n": 0})).id
    wait_for(stalled.is_set, "the claim's answer", timeout=30)
    with psycopg.connect(dsn) as operator:  # no beat proves the engine: its claim is reaped
        operator.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(schema, "engine")),
            (e.worker_id,),
        )
        other = engines(lease=LEASE)
        other.register_kind("ra.takein", lambda ctx, claim: "fresh")
        other.start()
        wait_for(
            lambda: (r := store.get(job)) is not None and r.state is State.DONE, "run elsewhere", timeout=60
        )
        operator.rollback()
    wait_for(e._may_claim, "a beat to prove the engine again", timeout=30)
    go.set()  # the stalled claim is taken in under the new proof
    wait_for(lambda: e.inflight.held() == [], "the stale attempt ended", timeout=30)
    e.stop()
    assert runs == [], runs
    assert store.get(job).result == "fresh"  # type: ignore[union-attr]
