"""Liveness per engine (SPEC P1'', F0, L5', W0) on real PostgreSQL: engines on one schema.

An engine proves it is alive in its own row; the reaper takes a claim back only when that proof
is older than lease + margin (or the engine dropped the claim); the engine fences itself first,
at lease - margin; a crash gives the attempt back. Job rows are not rewritten by heartbeats.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, LeaseLost, State
from brooq_py.queue.port import EngineProof, HeldLease, Renewal
from tests.integration.conftest import FAST, q
from tests.polling import wait_for

LEASE = 3.0


def row_version(pool: ConnectionPool[Any], schema: str, job_id: str) -> tuple[Any, ...]:
    (r,) = q(
        pool,
        schema,
        "SELECT xmin::text, ctid::text, state, attempts, crashes FROM {job} WHERE id = %s",
        job_id,
    )
    return r


def test_p1_f0_a_stalled_heartbeat_fences_before_another_engine_claims_and_the_job_is_never_dead(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """Lease 3 s, max_attempts=1: engine A's heartbeats stall 6 s while its handler is healthy.
    A fences its handler (LeaseLost) at lease - margin, before engine B may take the job at
    lease + margin; B runs it to done. The stall is a crash, not a failure: the job is never dead,
    its attempt given back, one crash counted (the seed's reaper rule, L5')."""
    stall = threading.Event()
    store_a = Store(pool, schema=store.schema)
    beat = store_a.worker.beat

    def stalled_beat(proof: EngineProof, leases: Sequence[HeldLease], *rest: Any) -> Renewal:
        if stall.is_set():
            stall.clear()
            time.sleep(6)  # one statement that does not come back for two leases
        return beat(proof, leases, *rest)

    store_a.worker.beat = stalled_beat  # type: ignore[method-assign]
    times: dict[str, float] = {}
    started = threading.Event()

    def healthy(ctx: Context, claim: Claim) -> None:
        started.set()
        ctx.wait(8)  # would return at 8 s
        if isinstance(ctx.cause, LeaseLost):
            times["fenced"] = time.monotonic()
            raise ctx.cause

    a = engines(store_a, workers=1, lease=LEASE)
    a.register_kind(
        "t", healthy, KindOptions(max_attempts=1, attempt_timeout=30, max_execution_timeout=60, **FAST)
    )
    jid = a.enqueue(Job("t")).id
    a.start()
    assert started.wait(20)
    stall.set()

    def by_b(ctx: Context, claim: Claim) -> None:
        times["b"] = time.monotonic()

    b = engines(Store(pool, schema=store.schema), workers=1, lease=LEASE)
    b.register_kind("t", by_b, KindOptions(max_attempts=1, **FAST))
    b.start()
    wait_for(lambda: store.get(jid) is not None and store.get(jid).state.terminal, what="ended", timeout=60)  # type: ignore[union-attr]
    row = store.get(jid)
    assert row is not None and row.state is State.DONE, row
    assert times["fenced"] < times["b"]  # fenced before anyone else ran it
    assert row_version(pool, store.schema, jid)[3:] == (1, 1)  # one attempt, one crash


def test_p1_a_row_locked_by_an_operator_past_the_lease_is_never_reaped_from_a_live_engine(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine], dsn: str
) -> None:
    """An operator holds the running job's row (SELECT ... FOR UPDATE) for three leases: the
    engine's proof of life is its own row, which the lock cannot touch; a second engine's reaper
    never takes the job; it finishes once, with no crash."""
    release = threading.Event()
    runs: list[str] = []

    def handler(ctx: Context, claim: Claim) -> None:
        runs.append(claim.lease.locked_by)
        release.wait(30)

    a = engines(workers=1, lease=LEASE)
    a.register_kind("t", handler, KindOptions(attempt_timeout=60, max_execution_timeout=120, **FAST))
    jid = a.enqueue(Job("t")).id
    a.start()
    wait_for(lambda: runs, what="running")
    other = engines(Store(pool, schema=store.schema), workers=1, lease=LEASE, reaper_period=0.2)
    other.register_kind("t", handler)
    other.start()
    with psycopg.connect(dsn) as op, op.transaction():
        op.execute(f'SELECT * FROM "{store.schema}".job WHERE id = %s FOR UPDATE', (jid,))
        time.sleep(3 * LEASE)
        assert row_version(pool, store.schema, jid)[2] == "processing"
    release.set()
    wait_for(lambda: store.get(jid) is not None and store.get(jid).state is State.DONE, what="done")  # type: ignore[union-attr]
    assert len(runs) == 1
    assert row_version(pool, store.schema, jid)[3:] == (1, 0)


def test_w0_the_heartbeat_writes_no_job_row_while_nothing_changed_and_progress_when_reported(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """A job running for several heartbeat periods keeps the row version its claim wrote; a
    progress report is written once, by the next heartbeat."""
    go_on = threading.Event()
    report = threading.Event()

    def long(ctx: Context, claim: Claim) -> None:
        report.wait(30)
        ctx.progress(0.5, "half")
        go_on.wait(30)

    e = engines(workers=1, lease=1.2)
    e.register_kind("t", long, KindOptions(attempt_timeout=60, max_execution_timeout=120, **FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: row_version(pool, store.schema, jid)[2] == "processing", what="claimed")
    claimed = row_version(pool, store.schema, jid)
    beats = q(pool, store.schema, "SELECT count(*) FROM {job}")  # a statement between samples
    assert beats
    time.sleep(2.0)  # more than five heartbeat periods (lease/4)
    assert row_version(pool, store.schema, jid) == claimed
    report.set()
    wait_for(lambda: (store.get(jid) or claimed).progress == 0.5, what="the progress written")  # type: ignore[union-attr]
    reported = row_version(pool, store.schema, jid)
    time.sleep(1.0)
    assert row_version(pool, store.schema, jid) == reported  # written once
    go_on.set()
    wait_for(lambda: store.get(jid).state is State.DONE, what="done")  # type: ignore[union-attr]


def test_p1_the_in_flight_view_names_the_engine_and_whether_its_claims_are_expired(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """The seed's operator question, "what is in flight and who holds it, lease expired?", answered
    by job_in_flight from the engine table (docs/operating.md)."""
    go_on = threading.Event()
    e = engines(workers=1, lease=LEASE)
    e.register_kind("t", lambda ctx, claim: go_on.wait(30), KindOptions(attempt_timeout=60, **FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    rows: list[tuple[Any, ...]] = []

    def seen() -> bool:
        rows[:] = q(
            pool,
            store.schema,
            f'SELECT id::text, locked_by, pid, expired FROM "{store.schema}".job_in_flight',
        )
        return bool(rows)

    wait_for(seen, what="the job in flight")
    [(job_id, holder, pid, expired)] = rows
    assert job_id == jid and holder == e.worker_id and pid > 0 and expired is False
    go_on.set()


def test_p1_a_claim_whose_answer_never_reached_its_engine_is_dropped_for_the_reaper(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """A claim committed under a live engine's id whose answer was lost (a connection cut at the
    commit) is held by no attempt: the heartbeat finds it (older than a lease, never sent) and
    drops it, and the reaper returns it as a crash while the engine's proof of life stays fresh."""
    e = engines(workers=1, lease=1.2, reaper_period=0.2)
    e.register_kind("t", lambda ctx, claim: None, KindOptions(**FAST))
    e.start()
    wait_for(lambda: q(pool, store.schema, f'SELECT 1 FROM "{store.schema}".engine'), what="the engine's row")
    jid = store.enqueue(Job("lost")).id  # a topic this engine does not run
    [lost] = store.worker.claim(["lost"], 1, e.worker_id, timedelta(seconds=1.2))  # its answer lost
    assert lost.id == jid
    q(pool, store.schema, "UPDATE {job} SET updated_at = now() - interval '1 minute' WHERE id = %s", jid)
    wait_for(
        lambda: row_version(pool, store.schema, jid)[2] == "pending", what="dropped and reaped", timeout=30
    )
    assert row_version(pool, store.schema, jid)[3:] == (0, 1)  # one crash, its attempt given back
    fresh = q(
        pool,
        store.schema,
        f"SELECT now() - seen_at < interval '1 second' FROM \"{store.schema}\".engine WHERE id = %s",
        e.worker_id,
    )
    assert fresh == [(True,)]  # taken back from a live engine: it named the claim dropped
