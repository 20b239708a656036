"""Durable steps, sleeps, waits and signals where they meet dropped connections (pg_terminate_backend),
operator locks, cancels and retries (SPEC DS1-DS5, L5'): a durable call whose own statement met an
outage ends its attempt as a crash (docs/durable.md: the claim let go, the reaper takes the job back,
the attempt given back), never as the handler's failure."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, LeaseLost, State, StoreUnavailable, Tx
from tests.budget import app_name
from tests.integration.test_durable_steps import ended, in_state
from tests.polling import wait_for

OPTS = KindOptions(max_attempts=5, backoff_base=0.01, backoff_max=0.02)
ENGINE_APP = app_name("drops-engine")


@pytest.fixture
def epool(dsn: str) -> Iterator[ConnectionPool[Any]]:
    """A pool for the engine alone, its connections named so the test can terminate only them."""
    p: ConnectionPool[Any] = ConnectionPool(
        dsn, min_size=1, max_size=8, kwargs={"application_name": ENGINE_APP}, open=True
    )
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def estore(epool: ConnectionPool[Any], schema: str) -> Iterator[Store]:
    s = Store(epool, schema=schema)
    try:
        yield s
    finally:
        s.close()


def admin(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, application_name=app_name("drops-admin"))


def terminate(dsn: str, where: str, *params: Any) -> int:
    """pg_terminate_backend of the engine's backends matching *where* (SQL on pg_stat_activity)."""
    with admin(dsn) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database() AND pid <> pg_backend_pid()"
            f" AND ({where})",
            (ENGINE_APP, *params),
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)


def backends(dsn: str, where: str, *params: Any) -> list[tuple[Any, ...]]:
    with admin(dsn) as conn:
        return conn.execute(
            "SELECT pid, state, wait_event_type, left(query, 60) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database() AND pid <> pg_backend_pid()"
            f" AND ({where})",
            (ENGINE_APP, *params),
        ).fetchall()


def statement(name: str) -> str:
    return f"query LIKE '-- name: {name}%%'"


def tq(store: Store, query: str, *args: Any) -> list[tuple[Any, ...]]:
    pool = store.session.pool
    assert pool is not None
    with pool.connection() as conn:
        cur = conn.execute(query.replace("{s}", f'"{store.schema}"'), args or None)
        return cur.fetchall() if cur.description is not None else []


def drop_record_under_lock(dsn: str, store: Store, jid: str, go: threading.Event) -> None:
    """Hold job *jid*'s row as an operator would (FOR UPDATE), let the handler go on to its record,
    and terminate the record's backend while it waits on that lock; then let the row go."""
    pool = store.session.pool
    assert pool is not None
    with pool.connection() as conn, conn.transaction():
        conn.execute(f'SELECT id FROM "{store.schema}".job WHERE id = %s FOR UPDATE', (jid,)).fetchall()
        go.set()
        wait_for(
            lambda: backends(dsn, statement("job_step_record") + " AND wait_event_type = 'Lock'"),
            "the record to wait on the lock",
        )
        assert terminate(dsn, statement("job_step_record")) == 1


# --- a transaction step's COMMIT killed -------------------------------------------------------------


def _slow_commit_table(store: Store, table: str, seconds: float) -> None:
    """*table*, whose COMMIT runs a deferred trigger that sleeps *seconds*."""
    tq(
        store,
        f"CREATE TABLE {{s}}.{table} (k text, token text);"
        f"CREATE FUNCTION {{s}}.{table}_slow() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN PERFORM pg_sleep({seconds}); RETURN NULL; END $$;"
        f"CREATE CONSTRAINT TRIGGER {table}_slow AFTER INSERT ON {{s}}.{table}"
        f" DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {{s}}.{table}_slow()",
    )


def test_a_transaction_steps_commit_killed_writes_once(
    dsn: str, store: Store, estore: Store, engines: Callable[..., Engine]
) -> None:
    """The COMMIT of a transaction step runs a deferred trigger (slow); its backend is terminated during
    the COMMIT. Either nothing committed (fn runs again) or both did: exactly one row in the end, one
    record, the job done."""
    _slow_commit_table(store, "pay", 2.0)
    table = sql.Identifier(store.schema, "pay")
    errors: list[BaseException] = []
    runs: Counter[str] = Counter()

    def charge(tx: Tx, token: str) -> str:
        runs["charge"] += 1
        tx.execute(sql.SQL("INSERT INTO {} VALUES ('x', %s)").format(table), (token,))
        return token

    def handler(ctx: Context, claim: Claim) -> Any:
        try:
            return ctx.transaction_step("charge", charge, claim.claim_token)
        except BaseException as exc:
            errors.append(exc)
            raise

    e = engines(estore, workers=1, lease=5)
    e.register_kind("drop.txstep", handler, OPTS)
    jid = store.enqueue(Job("drop.txstep")).id
    e.start()
    wait_for(lambda: backends(dsn, "query ILIKE 'commit%%' AND state = 'active'"), "the step's COMMIT to run")
    assert terminate(dsn, "query ILIKE 'commit%%' AND state = 'active'") == 1
    row = ended(store, jid)
    assert row.state is State.DONE, (row.state, row.last_error)
    # the handler sees its claim lost (its cause the outage), not a raw error
    assert errors and isinstance(errors[0], LeaseLost), errors
    assert isinstance(errors[0].__cause__, StoreUnavailable) and "let go" in str(errors[0])
    assert (row.attempts, row.crashes) == (1, 1)  # the dropped attempt was given back, as a crash
    assert runs["charge"] == 2  # the killed COMMIT committed nothing: fn ran again, once
    assert tq(store, "SELECT count(*) FROM {s}.pay") == [(1,)]
    assert [s.name for s in row.steps] == ["charge"]


# --- a wait's record dropped: "waiting never makes a job dead" ------------------------------------


@pytest.mark.parametrize("how", ["wait_for", "sleep"])
def test_a_waits_record_dropped_never_makes_the_job_dead(
    dsn: str, store: Store, estore: Store, engines: Callable[..., Engine], how: str
) -> None:
    """docs/durable.md: "A sleep or a wait gives its attempt back: waiting never makes a job dead." The
    wait's (the sleep's) record is dropped (its backend terminated while it waits on psql's row lock,
    which the docs say it waits for "however long") on a job of max_attempts=1: the job must not end
    dead for it; it waits again (or sleeps) and then ends done."""
    errors: list[BaseException] = []
    running, go = threading.Event(), threading.Event()

    def handler(ctx: Context, claim: Claim) -> Any:
        running.set()
        assert go.wait(30)
        try:
            if how == "sleep":
                ctx.sleep(0.5)
                return 7
            return ctx.wait_for("go", 60)
        except BaseException as exc:
            errors.append(exc)
            raise

    e = engines(estore, workers=1, lease=3)
    e.register_kind("drop.wait", handler, KindOptions(max_attempts=1))
    jid = store.enqueue(Job("drop.wait")).id
    e.start()
    assert running.wait(30)
    drop_record_under_lock(dsn, store, jid, go)
    wait_for(lambda: errors, "the handler to see the drop")

    def settled() -> Any:
        row = store.get(jid)
        return row if row is not None and (row.state.terminal or row.waiting_for == "go") else None

    row = wait_for(settled, "the job to wait again or end")
    assert row.state is not State.DEAD, (row.state, row.attempts, row.last_error)
    if how == "wait_for":
        assert store.signal(jid, "go", 7)
    row = ended(store, jid)
    assert row.state is State.DONE and row.result == 7


def test_a_step_record_dropped_gives_the_attempt_back(
    dsn: str, store: Store, estore: Store, engines: Callable[..., Engine]
) -> None:
    """A plain step's record dropped (its fn returned) on max_attempts=1: the outage of the engine's own
    statement is no failure of the handler's; the attempt is given back, the step runs again (its
    record never committed) and the job ends done."""
    running, go = threading.Event(), threading.Event()
    calls: list[int] = []

    def handler(ctx: Context, claim: Claim) -> Any:
        running.set()
        assert go.wait(30)

        def once() -> int:
            calls.append(1)
            return len(calls)

        return ctx.step("a", once)

    e = engines(estore, workers=1, lease=3)
    e.register_kind("drop.last", handler, KindOptions(max_attempts=1))
    jid = store.enqueue(Job("drop.last")).id
    e.start()
    assert running.wait(30)
    drop_record_under_lock(dsn, store, jid, go)
    row = ended(store, jid)
    assert row.state is State.DONE, (row.state, row.attempts, row.last_error)
    assert (row.result, len(calls), row.attempts) == (2, 2, 1)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_idle_pool_connections_dropped_between_two_steps_give_the_attempt_back(
    dsn: str, store: Store, estore: Store, engines: Callable[..., Engine], kind: str
) -> None:
    """No lock, no race: between two steps, the engine pool's idle connections are terminated (a
    pooler or server restart, an idle timeout, a failover). The next durable call takes a dead
    connection from the pool: the attempt is given back (max_attempts=1, yet the job ends done), not
    failed; an ``async def`` handler's ``astep`` alike. (A pool opened with
    ``check=ConnectionPool.check_connection``, as docs/high-availability.md advises, would not lend
    the dead connection; README's pools have no check.)"""
    between, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def handler(ctx: Context, claim: Claim) -> Any:
        a = ctx.step("a", lambda: 1)
        between.set()
        assert go.wait(30)
        try:
            return a + ctx.step("b", lambda: 2)
        except BaseException as exc:
            errors.append(exc)
            raise

    async def ahandler(ctx: Context, claim: Claim) -> Any:
        a = await ctx.astep("a", lambda: 1)
        between.set()
        assert await asyncio.to_thread(go.wait, 30)
        try:
            return a + await ctx.astep("b", lambda: 2)
        except BaseException as exc:
            errors.append(exc)
            raise

    e = engines(estore, workers=1, lease=3)
    e.register_kind("drop.idle.step", handler if kind == "sync" else ahandler, KindOptions(max_attempts=1))
    jid = store.enqueue(Job("drop.idle.step")).id
    e.start()
    assert between.wait(30)
    assert terminate(dsn, "state = 'idle' AND query NOT ILIKE '%%LISTEN%%'") >= 1
    go.set()
    row = ended(store, jid)
    assert row.state is State.DONE, (row.state, row.attempts, row.last_error)
    assert (row.result, row.attempts) == (3, 1)
    assert errors and all(isinstance(x, LeaseLost) for x in errors), errors
    assert isinstance(errors[0].__cause__, StoreUnavailable)


# --- Store.signal in the caller's transaction, the caller's backend terminated ----------------------


def test_a_signal_in_a_caller_tx_whose_backend_dies_never_happened(
    dsn: str, store: Store, estore: Store, engines: Callable[..., Engine]
) -> None:
    """signal(tx=conn), then conn's backend is terminated before the commit: the job keeps waiting (no
    wake-up, no payload seen), the caller gets a clear error, and a later signal is the first (True)."""
    seen: list[Any] = []

    def handler(ctx: Context, claim: Claim) -> Any:
        got = ctx.wait_for("go", 60)
        seen.append(got)
        return got

    e = engines(estore, workers=1)
    e.register_kind("drop.sig", handler, OPTS)
    jid = store.enqueue(Job("drop.sig")).id
    e.start()
    wait_for(lambda: (r := store.get(jid)) is not None and r.waiting_for == "go", "the job to wait")
    caller = psycopg.connect(dsn, application_name=app_name("drops-caller"))
    try:
        assert store.signal(jid, "go", "ghost", tx=caller) is True
        pid = caller.info.backend_pid
        with admin(dsn) as a:
            assert a.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        with pytest.raises(psycopg.OperationalError):
            caller.commit()
    finally:
        caller.close()
    row = store.get(jid)
    assert row is not None and row.state is State.SCHEDULED and row.waiting_for == "go"
    assert store.signal(jid, "go", "real") is True
    row = ended(store, jid)
    assert row.result == "real" and seen == ["real"]


# --- an operator's cancel and retry during a wait: what the row says ---------------------------------


def test_a_waiting_job_canceled_then_retried_row_tells_the_story(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """DS5: ``JobRow.waiting_for`` is the signal a *scheduled* job waits for (docs/durable.md). A job
    canceled during its wait is not waiting for anything; retried, it is pending, not waiting, until its
    replay waits again; and the signal then wakes it."""

    def handler(ctx: Context, claim: Claim) -> Any:
        return ctx.wait_for("go", 60)

    e = engines(workers=1)
    e.register_kind("cancel.wait", handler, OPTS)
    jid = store.enqueue(Job("cancel.wait")).id
    e.start()
    in_state(store, jid, State.SCHEDULED)
    assert store.cancel(jid)
    row = store.get(jid)
    assert row is not None and row.state is State.CANCELED
    assert store.signal(jid, "go", 1) is False
    canceled_waiting_for = row.waiting_for
    assert store.retry(jid)
    wait_for(
        lambda: (r := store.get(jid)) is not None and r.state is State.SCHEDULED and r.waiting_for == "go",
        "the retried job to wait again",
    )
    assert store.signal(jid, "go", 2) is True
    assert ended(store, jid).result == 2
    assert canceled_waiting_for is None, f"a canceled job still says waiting_for={canceled_waiting_for!r}"


def test_a_durable_call_that_always_loses_its_connection_ends_dead_by_the_crash_count(
    store: Store, estore: Store, engines: Callable[..., Engine]
) -> None:
    """An outage gives the attempt back, so one that comes back every run (here a transaction step
    whose own statement ends its backend; in life, say, a step outliving
    idle_in_transaction_session_timeout) must not loop forever: each such attempt counts with the
    crashes (L5'), and at max_crashes (3) the job ends dead saying why, with attempts to spare."""
    runs: list[int] = []

    def kill_own_connection(tx: Tx) -> None:
        runs.append(1)
        tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    def handler(ctx: Context, claim: Claim) -> Any:
        return ctx.transaction_step("doomed", kill_own_connection)

    e = engines(estore, workers=1)
    e.register_kind("drop.always", handler, KindOptions(max_attempts=10, max_crashes=3))
    jid = store.enqueue(Job("drop.always")).id
    e.start()
    row = ended(store, jid)
    assert row.state is State.DEAD, (row.state, row.attempts, row.last_error)
    assert "3 engines stopped while running it" in (row.last_error or ""), row.last_error
    assert "cut off from the database" in (row.last_error or "")
    assert len(runs) == 3 and not row.steps
    assert tq(store, "SELECT crashes FROM {s}.job WHERE id = %s", jid) == [(3,)]
