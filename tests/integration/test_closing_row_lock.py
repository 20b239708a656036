"""A closing transaction (chain, on_succeeded) whose row an operator holds locked (SPEC O4, C9, C11).

As in psql: ``BEGIN; SELECT ... FOR UPDATE;`` on a job whose handler returns with closing work,
the transaction left open. The closing transaction must not wait on that lock: it locks its row
first (SKIP LOCKED), rolls back at once when the row is held elsewhere, before any of its work
ran, and is tried again from the completer's queue, its slot, thread and pooled connection freed
meanwhile. So, on a pool of one connection and two slots, the other jobs (closing work of their
own included) end done while the lock is held, and no backend waits behind the operator's
transaction. Once the lock is gone the job ends done once, its callback run once and its effects
and chained job written once. A stop while the lock is still held returns and leaves the row to
the reaper, nothing of the closing transaction run and no backend waiting.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store, as_psycopg
from brooq_py.queue import Claim, Context, Job, KindOptions, State, Tx
from tests.integration.conftest import FAST, q
from tests.polling import wait_for


def state(store: Store, job_id: str) -> State:
    r = store.get(job_id)
    assert r is not None
    return r.state


@pytest.fixture
def small_store(dsn: str, schema: str) -> Iterator[Store]:
    """A Store on a pool of ONE connection: a closing transaction that kept it would starve the rest."""
    pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=1, open=True, timeout=60)
    s = Store(pool, schema=schema)
    try:
        yield s
    finally:
        s.close()
        pool.close()


@pytest.fixture
def effects(pool: ConnectionPool[Any], schema: str) -> str:
    """A table the callbacks write to (a side effect in the closing transaction)."""
    with pool.connection() as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (job uuid NOT NULL)").format(sql.Identifier(schema, "effects")))
    return schema


class Operator:
    """An open psql transaction holding one job's row lock (FOR UPDATE) until released."""

    def __init__(self, dsn: str, schema: str, job_id: str) -> None:
        self.conn = psycopg.connect(dsn, application_name="operator")
        self.conn.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(schema, "job")),
            (job_id,),
        )
        self.pid = self.conn.info.backend_pid

    def waiting_behind(self, dsn: str) -> list[tuple[Any, ...]]:
        """The backends that wait for a lock this transaction holds (none may, L3')."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute(
                "SELECT pid, left(query, 80) FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))",
                (self.pid,),
            ).fetchall()

    def release(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


class Closing:
    """Handlers that end with closing work: a callback writing to ``effects``, or a chained job."""

    def __init__(self, schema: str, how: str) -> None:
        self.effects = sql.SQL("INSERT INTO {} VALUES (%s)").format(sql.Identifier(schema, "effects"))
        self.how = how
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()  # callback runs by job id (its effects outside the database)
        self.go = threading.Event()  # the locked job's handler returns once the operator holds its row
        self.returned = threading.Event()

    def handler(self, ctx: Context, claim: Claim) -> None:
        if claim.topic == "locked":
            assert self.go.wait(30)
        if self.how == "on_succeeded":
            claim.on_succeeded(lambda tx: self.callback(tx, claim.id))
        else:
            claim.chain(Job("child", {"parent": claim.id}))
        if claim.topic == "locked":
            self.returned.set()

    def callback(self, tx: Tx, job_id: str) -> None:
        with self.lock:
            self.calls[job_id] += 1
        conn = as_psycopg(tx)
        assert conn is not None
        conn.execute(self.effects, (job_id,))

    def written(self, pool: ConnectionPool[Any], schema: str, job_id: str) -> int:
        """How many times the closing work of *job_id* was committed."""
        if self.how == "on_succeeded":
            return int(q(pool, schema, f"SELECT count(*) FROM {schema}.effects WHERE job = %s", job_id)[0][0])
        rows = q(
            pool,
            schema,
            "SELECT count(*) FROM {job} WHERE topic = 'child' AND payload->>'parent' = %s",
            job_id,
        )
        return int(rows[0][0])


@pytest.mark.parametrize("how", ["on_succeeded", "chain"])
def test_l3_a_closing_transaction_never_waits_on_its_row_locked_elsewhere(
    store: Store,
    small_store: Store,
    pool: ConnectionPool[Any],
    effects: str,
    dsn: str,
    engines: Callable[..., Engine],
    how: str,
) -> None:
    schema = effects
    closing = Closing(schema, how)
    e = engines(small_store, lease=3, workers=2, watchdog_grace=30)
    e.register_kind("locked", closing.handler, KindOptions(max_attempts=1, **FAST))
    e.register_kind("free", closing.handler, KindOptions(max_attempts=1, **FAST))
    jid = store.enqueue(Job("locked")).id
    e.start()
    wait_for(lambda: state(store, jid) is State.PROCESSING, what="the job running")
    op = Operator(dsn, schema, jid)
    try:
        closing.go.set()
        assert closing.returned.wait(30)
        # (a) Other jobs, closing work included, end done while the lock is held: on one pooled
        # connection and two slots, none of which the locked job's closing transaction keeps.
        others = [store.enqueue(Job("free")).id for _ in range(4)]
        wait_for(
            lambda: all(state(store, o) is State.DONE for o in others),
            what="the other jobs done while the row is locked",
            timeout=20,
        )
        # (b) No backend waits behind the operator's transaction, and nothing of the locked
        # job's closing transaction ran (its row is locked first).
        assert op.waiting_behind(dsn) == []
        assert state(store, jid) is State.PROCESSING
        assert closing.calls[jid] == 0 and closing.written(pool, schema, jid) == 0
        assert jid in {a.id for a in e.inflight.held()}  # its lease still held by the engine
    finally:
        op.release()
    # (c) Once the lock is gone: done once, its closing work committed once.
    wait_for(lambda: state(store, jid) is State.DONE, what="the locked job done once released", timeout=20)
    r = store.get(jid)
    assert r is not None and r.attempts == 1
    assert closing.written(pool, schema, jid) == 1
    assert all(closing.written(pool, schema, o) == 1 for o in others)
    if how == "on_succeeded":
        assert closing.calls[jid] == 1 and all(closing.calls[o] == 1 for o in others)
    wait_for(lambda: not e.inflight.held(), what="every lease let go")


@pytest.mark.parametrize("lock", ["held past the stop", "released during the stop"])
def test_l3_c11_a_stop_while_a_closing_transactions_row_is_locked_waits_boundedly(
    store: Store,
    small_store: Store,
    pool: ConnectionPool[Any],
    effects: str,
    dsn: str,
    engines: Callable[..., Engine],
    lock: str,
) -> None:
    """stop() while the row is locked: it waits for the lock at most a lease. Released meanwhile,
    the job ends done with its work committed once; held past it, stop() returns, nothing of the
    closing transaction is written (then or after the release), no backend waits behind the
    operator, and the row is left to the reaper: no engine holds it."""
    schema = effects
    closing = Closing(schema, "on_succeeded")
    e = engines(small_store, lease=2, workers=1, watchdog_grace=30)
    e.register_kind("locked", closing.handler, KindOptions(max_attempts=1, **FAST))
    jid = store.enqueue(Job("locked")).id
    e.start()
    wait_for(lambda: state(store, jid) is State.PROCESSING, what="the job running")
    op = Operator(dsn, schema, jid)
    try:
        closing.go.set()
        assert closing.returned.wait(30)
        stopper = threading.Thread(target=lambda: e.stop(timeout=1), daemon=True)
        stopper.start()
        stopper.join(0.5)
        assert op.waiting_behind(dsn) == []  # the stop waits, no backend does
        if lock == "released during the stop":
            op.release()
        stopper.join(30)
        assert not stopper.is_alive(), "stop() did not return"
        assert not e.inflight.held()
        if lock == "held past the stop":
            assert op.waiting_behind(dsn) == []
            assert state(store, jid) is State.PROCESSING
    finally:
        op.release()
    if lock == "released during the stop":
        assert state(store, jid) is State.DONE
        assert closing.calls[jid] == 1 and closing.written(pool, schema, jid) == 1
        return
    # Nothing of the closing transaction runs after the stop, even once the lock is gone: the
    # reaper returns the job (its engine's row is gone, the claim's own lease ends).
    wait_for(lambda: store.worker.reap(), what="the row reaped after its lease", timeout=20)
    assert state(store, jid) is State.PENDING
    assert closing.calls[jid] == 0 and closing.written(pool, schema, jid) == 0  # none of it ran


def test_c9_an_operators_lock_asked_while_the_callbacks_run_waits_for_the_closing_transaction(
    store: Store,
    pool: ConnectionPool[Any],
    effects: str,
    dsn: str,
    engines: Callable[..., Engine],
) -> None:
    """The closing transaction holds its row from its first statement: an operator who asks for
    the row's lock while the callback runs gets it once the done is committed, and sees it done;
    the callback ran once, its work committed once."""
    schema = effects
    closing = Closing(schema, "on_succeeded")
    seen: list[str] = []

    def operator(job_id: str) -> None:
        with psycopg.connect(dsn, application_name="operator") as conn:
            row = conn.execute(
                sql.SQL("SELECT state FROM {} WHERE id = %s FOR UPDATE").format(
                    sql.Identifier(schema, "job")
                ),
                (job_id,),
            ).fetchone()
            seen.append(str(row[0]) if row else "gone")

    def callback(tx: Tx, job_id: str) -> None:
        closing.callback(tx, job_id)
        t = threading.Thread(target=operator, args=(job_id,), daemon=True)
        t.start()
        t.join(0.5)  # the operator waits behind this transaction, never the other way round
        assert t.is_alive()

    def handler(ctx: Context, claim: Claim) -> None:
        claim.on_succeeded(lambda tx: callback(tx, claim.id))

    e = engines(lease=3, workers=1, watchdog_grace=30)
    e.register_kind("t", handler, KindOptions(max_attempts=1, **FAST))
    jid = store.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: seen, what="the operator's lock granted")
    assert seen == ["done"]
    assert state(store, jid) is State.DONE
    assert closing.calls[jid] == 1 and closing.written(pool, schema, jid) == 1
