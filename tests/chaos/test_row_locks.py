"""Operators holding row locks past the lease on running jobs while three workers drain (SPEC P1'').

Lease 3 s. Operator sessions (``SELECT ... FOR UPDATE`` in a transaction of
their own, as from psql) pick random running jobs and keep the row locked for
longer than the lease, again and again, while three worker processes drain
3,000 jobs; thirty of them run for eight seconds, so locks meet handlers that
are still running. An engine proves it is alive in its own row, which no job
row lock can touch: no worker dies here, so no claim is reaped at all (nor while
its handler runs), no job runs twice at once, and (max_attempts=1) no job whose
handler succeeded ends dead. An engine killed while an operator holds its job's
row has the job reaped once the lock is gone, as a crash.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from tests.chaos import invariants, overlaps
from tests.chaos.conftest import Worker, enqueue_parents, held_by, settled
from tests.polling import wait_for

LEASE = 3.0
HOLD = LEASE + 1.5  # each operator lock outlives the lease
JOBS = 3000
LONG = 6.0  # outlives an operator lock taken in its first second (HOLD), and the lease


def payloads(rng: random.Random) -> list[dict[str, float]]:
    # The long ones come in the first half of the queue: they end while the short ones drain.
    return [
        {"n": i, "sleep": LONG if i % 100 == 0 and i < JOBS // 2 else round(rng.uniform(0, 0.01), 4)}
        for i in range(JOBS)
    ]


class Operator(threading.Thread):
    """Locks one random running job's row at a time for HOLD seconds, in its own transaction."""

    def __init__(self, dsn: str, schema: str, seed: int) -> None:
        super().__init__(name=f"operator-{seed}", daemon=True)
        self.dsn = dsn
        self.schema = sql.Identifier(schema)
        self.rng = random.Random(seed)
        self.stopping = threading.Event()
        self.locks = 0

    def run(self) -> None:
        with psycopg.connect(self.dsn, application_name="operator") as conn:
            while not self.stopping.is_set():
                with conn.transaction():
                    # Running jobs, those whose handler started within the last second first: a lock
                    # early in a long handler's life outlasts the lease while the handler still runs.
                    running = conn.execute(
                        sql.SQL(
                            "SELECT j.id FROM {s}.job j JOIN {s}.chaos_exec e ON e.claim_token = j.claim_token"
                            " WHERE j.state = 'processing' AND e.ended_at IS NULL"
                            " ORDER BY e.started_at > clock_timestamp() - interval '1 second' DESC, random()"
                            " LIMIT 3"
                        ).format(s=self.schema)
                    ).fetchall()
                    if running:
                        conn.execute(
                            sql.SQL("SELECT id, state FROM {}.job WHERE id = %s FOR UPDATE").format(
                                self.schema
                            ),
                            [self.rng.choice(running)[0]],
                        )
                        self.locks += 1
                        self.stopping.wait(HOLD)  # the operator's transaction stays open
                if not running:
                    self.stopping.wait(0.05)


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_operator_row_locks_past_the_lease_never_put_a_job_on_two_workers_P1(
    dsn: str,
    chaos_schema: str,
    spawn: Callable[..., Worker],
    max_attempts: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    began = time.monotonic()
    ids = enqueue_parents(dsn, chaos_schema, payloads(random.Random(19)))
    workers = [
        spawn(dsn, chaos_schema, workers=4, lease=LEASE, watchdog_grace=LEASE, max_attempts=max_attempts)
        for _ in range(3)
    ]
    operators = [Operator(dsn, chaos_schema, seed) for seed in range(3)]
    for op in operators:
        op.start()
    try:
        wait_for(lambda: settled(dsn, chaos_schema, ids), "the drain under operator locks", 90, 0.2)
    finally:
        for op in operators:
            op.stopping.set()
        for op in operators:
            op.join(HOLD + 10)
    for w in workers:
        assert w.stop() == 0, w.log_tail()
    problems = (
        overlaps.reaped(dsn, chaos_schema)
        + overlaps.reaped_while_running(dsn, chaos_schema)
        + overlaps.overlapping_runs(dsn, chaos_schema)
        + overlaps.succeeded_but_dead(dsn, chaos_schema)
    )
    report = invariants.check(dsn, chaos_schema, ids)
    with capsys.disabled():
        print(
            f"\n[chaos] row locks (max_attempts={max_attempts}): jobs={report.jobs} states={report.states} "
            f"operator locks={sum(op.locks for op in operators)} claims={report.claims} reaps={report.reaps} "
            f"problems={len(problems)} {time.monotonic() - began:.1f}s"
        )
    assert not problems, "P1' broken by operator row locks:\n" + "\n".join(problems[:20])
    report.assert_ok()
    assert report.states == {"done": JOBS}


@pytest.fixture
def chaos_pool(dsn: str) -> Iterator[ConnectionPool[Any]]:
    with ConnectionPool(dsn, min_size=1, max_size=4, open=True) as pool:
        yield pool


def test_an_engine_killed_while_an_operator_holds_its_jobs_row_has_it_reaped_once_the_lock_goes_P1_R1(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker], chaos_pool: ConnectionPool[Any]
) -> None:
    """The worker process is SIGKILLed while an operator holds its running job's row: the reaper
    skips the locked row (never waits on it), and once the operator commits it returns the job,
    its attempt given back and one crash counted."""
    [jid] = enqueue_parents(dsn, chaos_schema, [{"n": 0, "sleep": 60}])
    worker = spawn(dsn, chaos_schema, workers=1, lease=1.5, watchdog_grace=60)
    store = Store(chaos_pool, schema=chaos_schema)  # the reaper of any other engine
    state = sql.SQL("SELECT state, attempts, crashes FROM {} WHERE id = %s").format(
        sql.Identifier(chaos_schema, "job")
    )
    try:
        wait_for(
            lambda: held_by(dsn, chaos_schema, f"chaos-{worker.label}:{worker.proc.pid}") == 1, "running", 30
        )
        with psycopg.connect(dsn, application_name="operator") as operator:
            operator.execute(
                sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(
                    sql.Identifier(chaos_schema, "job")
                ),
                [jid],
            )
            worker.kill()
            time.sleep(3 * 1.5)  # the engine's proof is stale: the reaper would take the row
            assert store.worker.reap() == []  # locked elsewhere: skipped, never waited on
            operator.commit()
        reaped = wait_for(lambda: store.worker.reap(), "the dead worker's claim reaped", 10, 0.1)
    finally:
        store.close()
    assert reaped == [(jid, "chaos")]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(state, [jid]).fetchone() == ("pending", 0, 1)
