"""The promises where the engine meets the outside world, on real PostgreSQL (SPEC P1', X2', L3').

An operator's psql session holding a row lock past the lease, a cancel from the
Store or from a plain psql UPDATE, a cancel followed at once by a retry: each
test names the rule it checks and would fail on an engine that waits on the lock,
holds attempts by job id, or learns of a cancel only through its heartbeat.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, JobCanceledByOperator, KindOptions, LeaseLost, State
from tests.integration.conftest import FAST
from tests.polling import wait_for


def state(store: Store, job_id: str) -> State:
    r = store.get(job_id)
    assert r is not None
    return r.state


class Runs:
    """Each attempt's start and end (monotonic), and the ctx cause it saw, for overlap checks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[list[float]] = []
        self.causes: list[BaseException | None] = []

    def start(self) -> int:
        with self.lock:
            self.spans.append([time.monotonic(), float("inf")])
            self.causes.append(None)
            return len(self.spans) - 1

    def end(self, i: int, cause: BaseException | None) -> None:
        with self.lock:
            self.spans[i][1] = time.monotonic()
            self.causes[i] = cause


def _lock_row(dsn: str, schema: str, job_id: str, seconds: float, locked: threading.Event) -> None:
    """As an operator in psql: BEGIN; SELECT ... FOR UPDATE; wait; COMMIT."""
    with psycopg.connect(dsn) as conn:
        job = sql.Identifier(schema, "job")
        conn.execute(sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(job), (job_id,))
        locked.set()
        time.sleep(seconds)
        conn.commit()


@pytest.mark.parametrize("handler_ends", ["while the row is locked", "after the lock is gone"])
def test_p1_a_row_lock_held_past_the_lease_never_puts_the_job_on_two_workers(
    store: Store, schema: str, dsn: str, engines: Callable[..., Engine], handler_ends: str
) -> None:
    """Lease 3 s; an operator's transaction holds the running job's row lock for 5 s. The reaper
    must skip the locked row as renewals do, and the first renewal after the lock is gone extends
    the lease: the job runs once, and with max_attempts=1 a handler returning while the row is
    locked ends done (not dead by the poison rule)."""
    e = engines(lease=3, reaper_period=0.3, watchdog_grace=30)
    runs = Runs()
    locked = threading.Event()
    released = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        i = runs.start()
        try:
            assert locked.wait(30)
            if handler_ends == "while the row is locked":
                time.sleep(3.5)  # past the lease: the reaper would queue on the lock before the done
            else:
                assert released.wait(30)
                time.sleep(2.0)  # the lease must be extended again by now, or the reaper takes it
        finally:
            runs.end(i, ctx.cause)

    e.register_kind("t", handler, KindOptions(max_attempts=1, attempt_timeout=60, **FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: runs.spans, what="the handler running")
    _lock_row(dsn, schema, jid, 5.0, locked)
    released.set()
    wait_for(lambda: state(store, jid).terminal, what="the job settled", timeout=60)
    time.sleep(1.0)  # a second claim, if the reaper took the row, would show here
    r = store.get(jid)
    assert r is not None
    assert (r.state, r.attempts, r.last_error) == (State.DONE, 1, None)
    assert len(runs.spans) == 1 and runs.causes == [None]
    assert not e.registry.get_sample_value("brooq_reaped_total", {"topic": "t"})


@pytest.mark.parametrize("how", ["Store.cancel", "psql UPDATE"])
def test_x2_a_cancel_reaches_the_running_handler_within_a_second_whatever_the_lease(
    store: Store,
    schema: str,
    dsn: str,
    engines: Callable[..., Engine],
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    """Lease 120 s (a heartbeat every 40 s): a cancel must wake the engine that holds the job at
    once (NOTIFY naming it), its ctx cancelled with JobCanceledByOperator (a LeaseLost), nothing
    written over the canceled row, and the log says an operator canceled it."""
    e = engines(lease=120)
    started = threading.Event()
    seen: list[BaseException | None] = []

    def handler(ctx: Context, claim: Claim) -> None:
        started.set()
        ctx.wait(60)
        seen.append(ctx.cause)

    e.register_kind("t", handler, KindOptions(**FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    assert started.wait(30)
    caplog.set_level(logging.INFO, logger="brooq_py.engine")
    if how == "Store.cancel":
        assert store.cancel(jid)
    else:
        with psycopg.connect(dsn, autocommit=True) as conn:
            job = sql.Identifier(schema, "job")
            conn.execute(sql.SQL("UPDATE {} SET state = 'canceled' WHERE id = %s").format(job), (jid,))
    # Well under lease/3 (40 s), when only the heartbeat would tell: the NOTIFY did.
    wait_for(lambda: seen, what="the handler told of the cancel", timeout=15)
    assert isinstance(seen[0], JobCanceledByOperator) and isinstance(seen[0], LeaseLost)
    wait_for(lambda: not e.inflight.held(), what="the attempt settled")
    assert state(store, jid) is State.CANCELED
    messages = [r.getMessage() for r in caplog.records]
    assert any("canceled by an operator" in m for m in messages)
    assert not any("lease lost" in m for m in messages)


def test_p1_x2_cancel_then_retry_at_once_is_two_attempts_and_the_old_one_is_told_at_once(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """The dashboard's two buttons: cancel, then retry at once; the same engine claims the job
    again while its first handler still runs. The engine holds attempts by claim token: the
    first attempt's ctx is cancelled at once (not at its attempt_timeout), the second runs on."""
    e = engines(lease=120, workers=2)
    runs = Runs()
    second = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        i = runs.start()
        if i > 0:
            second.set()
        ctx.wait(60)
        runs.end(i, ctx.cause)

    e.register_kind("t", handler, KindOptions(attempt_timeout=300, max_execution_timeout=600, **FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: runs.spans, what="the first attempt running")
    assert store.cancel(jid)
    assert store.retry(jid)
    wait_for(lambda: runs.causes[0] is not None, what="the first attempt told", timeout=15)
    assert isinstance(runs.causes[0], LeaseLost)
    assert second.wait(15)
    assert len(runs.spans) == 2 and runs.causes[1] is None  # the retry still runs
    assert state(store, jid) is State.PROCESSING
    assert store.cancel(jid)
    wait_for(lambda: runs.causes[1] is not None, what="the second attempt told", timeout=15)
    assert isinstance(runs.causes[1], JobCanceledByOperator)


@pytest.mark.parametrize("settle_on", ["its own connection", "the pool"])
def test_l3_c10_a_psql_lock_on_one_finished_row_holds_up_no_other_outcome(
    store: Store, pool: Any, schema: str, dsn: str, engines: Callable[..., Engine], settle_on: str
) -> None:
    """An operator's open transaction holds one job's row lock when its handler returns: that
    outcome waits, but the other jobs of the engine must still end done meanwhile (every wait
    bounded, L3'), not queue behind it in the same batched write; on the pool as on the Store's
    own outcome connection. Once the lock is gone the locked job's outcome is written alone."""
    repo = store if settle_on == "its own connection" else Store(pool, schema=schema, conninfo=dsn)
    e = engines(repo, lease=3, watchdog_grace=30)
    job = sql.Identifier(schema, "job")
    locked = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        if claim.topic == "locked":
            assert locked.wait(30)  # returns once psql holds the row's lock

    e.register_kind("locked", handler, KindOptions(max_attempts=1, **FAST))
    e.register_kind("free", handler, KindOptions(**FAST))
    jid = e.enqueue(Job("locked")).id
    e.start()
    wait_for(lambda: state(store, jid) is State.PROCESSING)
    with psycopg.connect(dsn) as conn:  # as in psql: BEGIN; SELECT ... FOR UPDATE; (COMMIT later)
        conn.execute(sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(job), (jid,))
        locked.set()
        time.sleep(0.5)  # the locked job's outcome reaches the completer
        others = [e.enqueue(Job("free")).id for _ in range(3)]
        try:
            wait_for(
                lambda: all(state(store, o) is State.DONE for o in others),
                what="the other jobs done while the lock is held",
                timeout=20,
            )
            assert state(store, jid) is State.PROCESSING
        finally:
            conn.rollback()
    wait_for(lambda: state(store, jid) is State.DONE, what="the locked job done once released")
    r = store.get(jid)
    assert r is not None and r.attempts == 1
