"""Two lifecycle rules at one moment, on real PostgreSQL (SPEC P3, C3, C9, X2, L1, L3).

A hung handler that returns after its row was reaped and claimed again; a
cancel that commits while the closing transaction runs; an operator's row lock
held while the closing transaction waits to write the row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State, Tx
from tests.polling import wait_for

FAST = {"backoff_base": 0.01, "backoff_max": 0.02}


def children(pool: ConnectionPool[Any], schema: str) -> list[Any]:
    with pool.connection() as conn:
        query = sql.SQL("SELECT payload FROM {} WHERE topic = 'child' ORDER BY created_at").format(
            sql.Identifier(schema, "job")
        )
        return [r[0] for r in conn.execute(query).fetchall()]


@pytest.fixture
def release() -> Iterator[threading.Event]:
    ev = threading.Event()
    yield ev
    ev.set()


@pytest.fixture
def engines(store: Store) -> Iterator[Callable[..., Engine]]:
    made: list[Engine] = []

    def make(**cfg: Any) -> Engine:
        params: dict[str, Any] = {
            "workers": 2,
            "poll_interval": 0.2,
            "lease": 3,
            "reaper_period": 0.3,
            **FAST,
        }
        params.update(cfg)
        e = Engine(store, Config(**params))
        made.append(e)
        return e

    yield make
    for e in made:
        e.stop(timeout=2)
        e.close()


def state(store: Store, job_id: str) -> State:
    r = store.get(job_id)
    assert r is not None
    return r.state


@pytest.mark.parametrize("claimer", ["same engine", "another engine"])
def test_p3_l1_a_hung_handler_returning_after_its_row_was_claimed_again_writes_nothing(
    store: Store,
    pool: ConnectionPool[Any],
    schema: str,
    engines: Callable[..., Engine],
    release: threading.Event,
    claimer: str,
) -> None:
    """Attempt 1 chains a child, registers on_succeeded and hangs; the reaper returns the row and
    attempt 2 (this engine again, or another one) ends done with its own child. When attempt 1
    finally returns, it must write nothing: not done over the row, no second child, no callback."""
    calls: list[int] = []
    callbacks: list[int] = []

    def handler(ctx: Context, claim: Claim) -> None:
        calls.append(claim.attempt)
        claim.chain(Job("child", {"attempt": claim.attempt}))
        claim.on_succeeded(lambda tx: callbacks.append(claim.attempt))
        if claim.attempt == 1:
            release.wait(120)  # ignores its ctx: hung, its lease left to expire

    opts = KindOptions(attempt_timeout=0.1, max_execution_timeout=120, max_attempts=3, **FAST)
    a = engines(lease=1, watchdog_grace=0.2)
    a.register_kind("t", handler, opts)
    jid = a.enqueue(Job("t")).id
    a.start()
    wait_for(lambda: a.inflight.hung_count() == 1, what="attempt 1 hung")
    if claimer == "another engine":
        a.stop(timeout=0)  # hung before the stop: its row is handed back at once, attempt counted
        b = engines(lease=1, watchdog_grace=0.2)
        b.register_kind("t", handler, opts)
        b.start()
    wait_for(lambda: state(store, jid) is State.DONE, what="attempt 2 done", timeout=60)
    release.set()
    wait_for(lambda: not a.inflight.running(), what="attempt 1 returned")
    time.sleep(0.5)  # a write it wrongly made would land now
    r = store.get(jid)
    assert r is not None and r.state is State.DONE and r.attempts == 2
    assert children(pool, schema) == [{"attempt": 2}]
    assert callbacks == [2]


def test_x2_c9_a_cancel_committed_during_the_closing_transaction_rolls_back_chain_and_done(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, engines: Callable[..., Engine]
) -> None:
    """The row is canceled (and committed) from psql while the closing transaction runs the
    handler's on_succeeded, before it writes the row: the write finds the row no longer this
    claim's, so the whole transaction rolls back (no child) and the row stays canceled."""
    e = engines()
    job = sql.Identifier(schema, "job")

    def cancel_from_psql(tx: Tx) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("UPDATE {} SET state = 'canceled' WHERE id = %s AND state = 'processing'").format(
                    job
                ),
                (jid,),
            )

    def handler(ctx: Context, claim: Claim) -> None:
        claim.chain(Job("child", {"from": claim.id}))
        claim.on_succeeded(cancel_from_psql)

    e.register_kind("t", handler, KindOptions(**FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: state(store, jid) is not State.PENDING and not e.inflight.held(), what="settled")
    assert state(store, jid) is State.CANCELED
    assert children(pool, schema) == []
    assert not e.registry.get_sample_value("brooq_settle_total", {"topic": "t", "outcome": "done"})


def test_l3_c9_a_psql_lock_on_the_row_while_the_closing_transaction_waits_to_write_it(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, engines: Callable[..., Engine]
) -> None:
    """An operator's uncommitted cancel in psql holds the row's lock for more than a lease while
    the handler's closing transaction waits to write done: the heartbeat skips the row and keeps
    it held (no lease lost, no fencing), another job of the engine runs on, and once the cancel
    commits the closing transaction writes nothing and chains nothing."""
    lease = 1.5
    e = engines(lease=lease, watchdog_grace=30)
    job = sql.Identifier(schema, "job")
    locked = threading.Event()
    hold = threading.Event()
    causes: list[BaseException | None] = []

    def handler(ctx: Context, claim: Claim) -> None:
        if claim.topic == "locked":
            claim.chain(Job("child", {"from": claim.id}))
            claim.on_succeeded(lambda tx: None)
            assert locked.wait(30)  # returns once psql holds the row's lock
        else:
            ctx.wait(lease * 1.5)  # runs across several renewals while the lock is held
            causes.append(ctx.cause)

    e.register_kind("locked", handler, KindOptions(**FAST))
    e.register_kind("free", handler, KindOptions(**FAST))
    jid = e.enqueue(Job("locked")).id

    def operator() -> None:
        wait_for(lambda: state(store, jid) is State.PROCESSING)
        with psycopg.connect(dsn) as conn:  # as in psql: BEGIN; UPDATE ...; (COMMIT later)
            conn.execute(sql.SQL("UPDATE {} SET state = 'canceled' WHERE id = %s").format(job), (jid,))
            locked.set()
            hold.wait(30)
            conn.commit()

    op = threading.Thread(target=operator, daemon=True)
    op.start()
    e.start()
    assert locked.wait(30)
    time.sleep(lease * 1.5)  # the closing transaction waits on the lock for longer than a lease
    other = e.enqueue(Job("free")).id
    wait_for(lambda: state(store, other) is State.DONE, what="another job of the engine done")
    assert causes == [None]  # never fenced nor lost: the held lock cost no other lease
    hold.set()
    op.join(30)
    wait_for(lambda: not e.inflight.held(), what="the closing transaction ended")
    assert state(store, jid) is State.CANCELED
    assert children(pool, schema) == []
    assert not e.registry.get_sample_value("brooq_lease_lost_total", {"topic": "locked"})
    assert not e.registry.get_sample_value("brooq_reaped_total", {"topic": "free"})
    r = store.get(other)
    assert r is not None and r.attempts == 1


@pytest.mark.xfail(
    strict=True,
    reason="L3: the completer's batched outcome write waits on a row an operator's open transaction "
    "holds, and every later outcome of the engine waits behind it. Needs settle_many to skip locked "
    "rows and report them apart from rows no longer ours (job_settle_many.sql, the Repo's answer, the "
    "completer's retry).",
)
def test_l3_c10_a_psql_lock_on_one_finished_row_holds_up_no_other_outcome(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, engines: Callable[..., Engine]
) -> None:
    """An operator's open transaction holds one job's row lock when its handler returns: that
    outcome waits, but the other jobs of the engine must still end done meanwhile (every wait
    bounded, L3), not queue behind it in the same batched write."""
    e = engines(lease=3, watchdog_grace=30)
    job = sql.Identifier(schema, "job")
    locked = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        if claim.topic == "locked":
            assert locked.wait(30)  # returns once psql holds the row's lock

    e.register_kind("locked", handler, KindOptions(**FAST))
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
        finally:
            conn.rollback()
    wait_for(lambda: state(store, jid) is State.DONE, what="the locked job done once released")
