"""The attempt lifecycle on real PostgreSQL (SPEC L1-L7, C5, C9, C11, P3, X2): each test names the rule it checks."""

from __future__ import annotations

import asyncio
import itertools
import socket
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.postgres.worker.repo import WorkerRepo
from brooq_py.queue import BrooqError, Claim, Context, Job, KindOptions, State, Tx
from tests.integration.conftest import FAST, q
from tests.integration.test_cli import cli_env, run_cli
from tests.polling import wait_for


@pytest.fixture
def release() -> Iterator[threading.Event]:
    ev = threading.Event()
    yield ev
    ev.set()


def row(store: Store, job_id: str) -> Any:
    r = store.get(job_id)
    assert r is not None
    return r


def test_l1_c11_hung_at_stop_with_chain_and_on_succeeded_is_pending_and_chains_nothing(
    store: Store,
    pool: ConnectionPool[Any],
    schema: str,
    engines: Callable[..., Engine],
    release: threading.Event,
) -> None:
    e = engines(watchdog_grace=0.3)
    started = threading.Event()
    callbacks: list[int] = []

    def handler(ctx: Context, claim: Claim) -> None:
        claim.chain(Job("child", {"from": claim.id}))
        claim.on_succeeded(lambda tx: callbacks.append(1))
        started.set()
        release.wait(60)  # ignores the stop's cancel

    e.register_kind("t", handler, KindOptions(**FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    assert started.wait(30)
    e.stop(timeout=0.1)
    r = row(store, jid)
    assert r.state is State.PENDING and r.attempts == 0
    release.set()
    wait_for(lambda: not e.inflight.running(), what="the late handler ended")
    assert q(pool, schema, "SELECT count(*) FROM {job} WHERE topic = 'child'") == [(0,)]
    assert callbacks == []
    assert row(store, jid).state is State.PENDING


def test_l2_c4_async_handler_ignoring_ctx_past_attempt_timeout_that_returns_is_done(
    store: Store, engines: Callable[..., Engine]
) -> None:
    e = engines(watchdog_grace=10)

    async def handler(ctx: Context, claim: Claim) -> None:
        await asyncio.sleep(0.5)  # attempt_timeout passes meanwhile; the task is never cancelled

    e.register_kind("t", handler, KindOptions(attempt_timeout=0.05, max_execution_timeout=60, **FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: row(store, jid).state is State.DONE, what="done")
    r = row(store, jid)
    assert r.attempts == 1 and r.last_error is None


def test_l2_500_concurrent_async_handlers_with_fewer_than_64_threads(
    store: Store, engines: Callable[..., Engine]
) -> None:
    e = engines(workers=500)
    running = 0
    peak = 0
    gate: list[asyncio.Event] = []
    loop: list[asyncio.AbstractEventLoop] = []

    async def handler(ctx: Context, claim: Claim) -> None:
        nonlocal running, peak
        if not gate:
            gate.append(asyncio.Event())
            loop.append(asyncio.get_running_loop())
        running += 1  # the loop's thread only
        peak = max(peak, threading.active_count())
        await gate[0].wait()

    e.register_kind("t", handler)
    ids = [r.id for r in e.enqueue_many([Job("t", {"n": i}) for i in range(500)])]
    before = threading.active_count()
    e.start()
    wait_for(lambda: running == 500, what="500 async handlers running at once", timeout=60)
    during = threading.active_count()
    print(f"threads: before start {before}, with 500 async handlers running {during}, peak {peak}")
    assert during - before < 64 and peak - before < 64
    loop[0].call_soon_threadsafe(gate[0].set)
    wait_for(
        lambda: store.get(ids[-1]) is not None and all(row(store, i).state is State.DONE for i in ids[::50]),
        what="all done",
        timeout=60,
    )


def test_l3_a_psql_row_lock_held_three_leases_costs_no_other_lease(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, engines: Callable[..., Engine]
) -> None:
    # A shorter one lapses on a machine busy enough to starve the heartbeat, lock or not (2.5 s did
    # beside another suite: both jobs fenced at once, the locked one and the other).
    lease = 5.0
    e = engines(lease=lease, workers=2, watchdog_grace=30)
    causes: dict[str, BaseException | None] = {}

    def handler(ctx: Context, claim: Claim) -> None:
        ctx.wait(lease * 3 + 1.5)  # runs past the three leases the lock is held
        causes[claim.topic] = ctx.cause

    e.register_kind("locked", handler, KindOptions(attempt_timeout=60, max_execution_timeout=120))
    e.register_kind("free", handler, KindOptions(attempt_timeout=60, max_execution_timeout=120))
    locked = e.enqueue(Job("locked")).id
    free = e.enqueue(Job("free")).id
    e.start()
    wait_for(
        lambda: row(store, locked).state is State.PROCESSING and row(store, free).state is State.PROCESSING
    )
    with psycopg.connect(dsn) as conn:  # an operator's open transaction, as in psql
        conn.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(schema, "job")),
            (locked,),
        )
        time.sleep(lease * 3)
        conn.rollback()
    wait_for(lambda: row(store, free).state is State.DONE, what="the other job done")
    r = row(store, free)
    assert r.attempts == 1 and causes["free"] is None
    assert not e.registry.get_sample_value("brooq_reaped_total", {"topic": "free"})
    assert not e.registry.get_sample_value("brooq_lease_lost_total", {"topic": "free"})


def test_l5_a_hung_handler_is_a_crash_dead_after_max_crashes(
    store: Store, engines: Callable[..., Engine], release: threading.Event
) -> None:
    e = engines(lease=1, reaper_period=0.2, watchdog_grace=0.2, workers=1)
    calls: list[int] = []

    def hang(ctx: Context, claim: Claim) -> None:
        calls.append(claim.attempt)
        release.wait(120)

    e.register_kind(
        "t", hang, KindOptions(max_attempts=2, max_crashes=2, attempt_timeout=0.1, max_execution_timeout=120)
    )
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: row(store, jid).state is State.DEAD, what="dead", timeout=60)
    assert calls == [1, 1]  # each hung claim taken back as a crash, its attempt given back (L5')
    r = row(store, jid)
    assert r.attempts == 1 and "2 engines stopped while running it" in (r.last_error or "")


class DownServer:
    """A TCP port that accepts and hangs up at once (a server that is down), counting connections."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(time.monotonic())
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_l7_a_down_server_sees_exponentially_spaced_reconnects(
    pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    down = DownServer()
    store = Store(pool, schema=schema, conninfo=f"postgresql://root@127.0.0.1:{down.port}/test")
    try:
        e = engines(store, lease=30)  # the heartbeat's own retries: every 1.9, 3.75, 7.5 s
        e.register_kind("t", lambda ctx, claim: None)
        e.start()
        wait_for(lambda: len(down.accepted) >= 1, what="a first LISTEN attempt")
        time.sleep(8)
        n = len(down.accepted)
        e.stop(timeout=1)
        gaps = [b - a for a, b in itertools.pairwise(down.accepted)]
        print(f"reconnects in 8s: {n}; gaps: {[round(g, 2) for g in gaps]}")
        # the listener exponential from 0.5s: 0, .5, 1.5, 3.5, 7.5; the heartbeat's own: 0, 1.9,
        # 5.6 (a fixed 0.5s retry of the listener alone makes 16)
        assert n <= 9
    finally:
        down.close()
        store.close()


def test_start_refuses_an_unmigrated_schema_naming_the_fix(
    pool: ConnectionPool[Any], dsn: str, engines: Callable[..., Engine]
) -> None:
    name = "t_" + uuid.uuid4().hex
    e = engines(Store(pool, schema=name))
    e.register_kind("t", lambda ctx, claim: None)
    with pytest.raises(BrooqError, match=f"migrate up --schema {name}"):
        e.start()
    assert not e.running


def test_worker_schema_is_checked_against_the_apps_store(dsn: str, schema: str, tmp_path: Path) -> None:
    (tmp_path / "schemaapp.py").write_text(
        textwrap.dedent(
            """
            import os

            from psycopg_pool import ConnectionPool

            from brooq_py import Config, Engine
            from brooq_py.postgres import Store


            def make_engine():
                pool = ConnectionPool(os.environ["DATABASE_URL"], min_size=1, max_size=2, open=True)
                return Engine(Store(pool, schema=os.environ["APP_SCHEMA"]), Config(workers=1))
            """
        )
    )
    env = cli_env(dsn, BROOQ_HTTP_ADDR="127.0.0.1:0", APP_SCHEMA=schema)
    result = run_cli(
        "worker", "--app", "schemaapp:make_engine", "--schema", "other", dsn=dsn, cwd=tmp_path, env=env
    )
    assert result.returncode == 2, result.stderr
    assert "--schema other does not match" in result.stderr and "Traceback" not in result.stderr
    env["APP_SCHEMA"] = "t_never_migrated_" + uuid.uuid4().hex[:8]
    result = run_cli("worker", "--app", "schemaapp:make_engine", dsn=dsn, cwd=tmp_path, env=env)
    assert result.returncode == 1, result.stderr
    assert f"migrate up --schema {env['APP_SCHEMA']}" in result.stderr and "Traceback" not in result.stderr


# --- where two rules meet at one moment ---------------------------------------------------


def children(pool: ConnectionPool[Any], schema: str) -> list[Any]:
    return [
        r[0] for r in q(pool, schema, "SELECT payload FROM {job} WHERE topic = 'child' ORDER BY created_at")
    ]


def state(store: Store, job_id: str) -> State:
    return State(row(store, job_id).state)


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
        run = len(calls)
        claim.chain(Job("child", {"run": run}))
        claim.on_succeeded(lambda tx: callbacks.append(run))
        if run == 1:
            release.wait(120)  # ignores its ctx: hung, its claim dropped for the reaper

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
    # Taken back by the reaper, the hung claim was a crash (its attempt given back, L5'); handed
    # back at the stop, its attempt stays counted (C5). With another engine either can come first:
    # the reaper may take the given-up claim before this thread gets to stop engine A.
    assert r is not None and r.state is State.DONE
    if claimer == "same engine":
        assert (r.attempts, r.crashes) == (1, 1)
    else:
        assert (r.attempts, r.crashes) in ((2, 0), (1, 1))
    assert children(pool, schema) == [{"run": 2}]
    assert callbacks == [2]


def test_x2_c9_a_cancel_asked_during_the_closing_transaction_waits_for_it_and_finds_the_job_done(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, engines: Callable[..., Engine]
) -> None:
    """An operator cancels from psql while the closing transaction runs the handler's on_succeeded:
    the closing transaction locked the row first, so the cancel waits for its commit and then
    finds the job done (0 rows); the chained child and the done are written once (O4, C9)."""
    e = engines()
    job = sql.Identifier(schema, "job")
    canceled: list[int] = []

    def cancel_from_psql() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            cur = conn.execute(
                sql.SQL("UPDATE {} SET state = 'canceled' WHERE id = %s AND state = 'processing'").format(
                    job
                ),
                (jid,),
            )
            canceled.append(cur.rowcount)

    def callback(tx: Tx) -> None:
        t = threading.Thread(target=cancel_from_psql, daemon=True)
        t.start()
        t.join(0.5)
        assert t.is_alive()  # waiting behind this transaction

    def handler(ctx: Context, claim: Claim) -> None:
        claim.chain(Job("child", {"from": claim.id}))
        claim.on_succeeded(callback)

    e.register_kind("t", handler, KindOptions(**FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: canceled, what="the cancel answered")
    assert canceled == [0]
    assert state(store, jid) is State.DONE
    assert len(children(pool, schema)) == 1
    assert e.registry.get_sample_value("brooq_settle_total", {"topic": "t", "outcome": "done"}) == 1


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


class _SlowClaimAnswers(WorkerRepo):
    """A Store's worker part whose claims answer late once ``hold`` is set: the rows are claimed,
    the answer waits. It keeps every connection the Store opens for itself."""

    def __init__(self, store: Store) -> None:
        self.hold = False
        self.claimed = threading.Event()
        self.answer = threading.Event()
        self.opened: list[psycopg.Connection[Any]] = []
        connect = store.session.connect_own

        def kept(options: str = "") -> psycopg.Connection[Any]:
            self.opened.append(conn := connect(options))
            return conn

        store.session.connect_own = kept  # type: ignore[method-assign]
        super().__init__(store.session, store.producer, store.flow)

    def claim(self, topics: Any, limit: int, worker: str, lease: Any) -> Any:
        rows = super().claim(topics, limit, worker, lease)
        if rows and self.hold:
            self.claimed.set()
            self.answer.wait(30)
        return rows


def test_c11_rows_of_a_claim_answered_after_close_go_back_and_no_own_connection_stays_open(
    pool: ConnectionPool[Any], schema: str
) -> None:
    """C11 with Engine.close() (API: the Store's own connections are closed by Engine.close()):
    stop() gives up waiting for a claim whose answer comes late; once it comes, its rows go back
    to pending unrun, and that hand-back must not leave a connection of the Store's open behind it."""
    store = Store(pool, schema=schema)
    s = _SlowClaimAnswers(store)
    e = Engine(s, Config(workers=2, poll_interval=0.2, lease=3, **FAST))
    e.register_kind("t", lambda ctx, claim: None)
    e.start()
    done = e.enqueue(Job("t")).id  # the claim and settle connections are open and in use
    wait_for(lambda: row(s, done).state is State.DONE, what="a first job done")
    s.hold = True
    jid = e.enqueue(Job("t")).id
    assert s.claimed.wait(30)
    dispatcher = e._dispatcher
    assert dispatcher is not None and dispatcher._thread is not None
    late, stop = dispatcher._thread, dispatcher.stop
    dispatcher.stop = lambda timeout=10.0: stop(timeout=0.1)  # type: ignore[method-assign]
    e.close()  # gives up on the claim's answer
    assert row(s, jid).state is State.PROCESSING
    s.answer.set()
    late.join(30)
    r = row(s, jid)
    assert r.state is State.PENDING and r.attempts == 0  # handed back unrun (C11)
    assert [c for c in s.opened if not c.closed] == []


def test_l3_l6_a_psql_lock_outlasting_the_lease_of_a_returned_jobs_row_still_ends_it_done_once(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, engines: Callable[..., Engine]
) -> None:
    """A handler returns while an operator's open transaction holds its row's lock, for longer than
    the lease: renewals skip the row and count it as still held (L3), and the outcome write waits
    or is retried (L6). Once the lock goes, the row must end done from that one run: not be
    taken by the reaper meanwhile (its locked_until passed under the lock) and run a second time."""
    lease = 3.0
    e = engines(lease=lease, watchdog_grace=30)
    job = sql.Identifier(schema, "job")
    locked = threading.Event()
    runs: list[int] = []

    def handler(ctx: Context, claim: Claim) -> None:
        runs.append(claim.attempt)
        if claim.attempt == 1:
            assert locked.wait(30)  # returns once psql holds the row's lock

    e.register_kind("t", handler, KindOptions(**FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: runs == [1], what="the handler running")
    with psycopg.connect(dsn) as conn:  # as in psql: BEGIN; SELECT ... FOR UPDATE; (ROLLBACK later)
        conn.execute(sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(job), (jid,))
        locked.set()
        wait_for(lambda: not e.inflight.running(), what="the handler returned")
        time.sleep(lease * 1.5)  # the row's locked_until passes while the lock is held
        conn.rollback()
    wait_for(lambda: not e.inflight.held(), what="the outcome settled")
    r = row(store, jid)
    assert (r.state, r.attempts, runs) == (State.DONE, 1, [1])
    assert not e.registry.get_sample_value("brooq_reaped_total", {"topic": "t"})


def test_c1_c10_claims_and_outcomes_go_on_when_the_stores_own_connections_cannot_be_opened(
    dsn: str, schema: str
) -> None:
    """C1, C10, L6: the claim and outcome connections are the Store's own, over the pool's.
    When the server refuses them (a role's connection limit met by the pool, max_connections
    reached) the engine must still claim and settle through its healthy pool, not stop working."""
    role = "brooq_lim_" + uuid.uuid4().hex[:8]
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 2").format(sql.Identifier(role)))
        for grant in (
            "GRANT USAGE ON SCHEMA {s} TO {r}",
            "GRANT ALL ON ALL TABLES IN SCHEMA {s} TO {r}",
            "GRANT ALL ON ALL SEQUENCES IN SCHEMA {s} TO {r}",
        ):
            admin.execute(sql.SQL(grant).format(s=sql.Identifier(schema), r=sql.Identifier(role)))
    try:
        limited = psycopg.conninfo.make_conninfo(dsn, user=role)
        with ConnectionPool(limited, min_size=2, max_size=2, open=True) as pool:
            pool.wait()  # the role's two connections are the pool's
            store = Store(pool, schema=schema)
            e = Engine(store, Config(workers=2, poll_interval=0.1, lease=30, **FAST))
            e.register_kind("t", lambda ctx, claim: None)
            ids = [r.id for r in store.enqueue_many([Job("t", i) for i in range(5)])]
            e.start()
            try:
                wait_for(lambda: all(row(store, i).state is State.DONE for i in ids), what="every job done")
            finally:
                e.close()
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("REASSIGN OWNED BY {r} TO CURRENT_USER; DROP OWNED BY {r}; DROP ROLE {r}").format(
                    r=sql.Identifier(role)
                )
            )
