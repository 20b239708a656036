"""Waiting for a job's end (SPEC V2): woken by the commit, one LISTEN connection per store."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store
from brooq_py.postgres import wait as waiting_module
from brooq_py.postgres.session.statements import settled_channel_for
from brooq_py.postgres.wait import Watch
from brooq_py.queue import (
    Claim,
    Context,
    Job,
    JobCanceled,
    JobFailed,
    JobNotFound,
    KindOptions,
    State,
    WaitTimeout,
)
from brooq_py.queue.port import Outcome
from tests.integration.conftest import q
from tests.polling import wait_for

LEASE = timedelta(seconds=30)


def backends(dsn: str, app: str) -> int:
    """The backends opened from *app*'s pool and the connections made from its conninfo."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture
def fixed_pool(dsn: str) -> Iterator[ConnectionPool[Any]]:
    # min = max: the pool never grows, so any new backend is the store's own.
    # Its own application_name: the count is of this test's backends, whatever else runs.
    conninfo = make_conninfo(dsn, application_name=f"wait-{uuid.uuid4().hex[:12]}")
    p: ConnectionPool[Any] = ConnectionPool(conninfo, min_size=4, max_size=4, open=True)
    p.wait()
    try:
        yield p
    finally:
        p.close()


def waiting(store: Store, wait: Callable[[], Any]) -> tuple[threading.Thread, dict[str, BaseException]]:
    """Run *wait* in a thread until the store's watch has registered it; its exception lands in the box."""
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            wait()
        except BaseException as exc:
            box["exc"] = exc

    t = threading.Thread(target=run)
    t.start()
    wait_for(lambda: store.waits._waiting, "the waiter to register")
    return t, box


def claim_one(store: Store, topic: str) -> tuple[str, str]:
    (row,) = store.worker.claim([topic], 1, "test", LEASE)
    return row.id, row.claim_token


def test_v2_wait_is_woken_by_the_commit_not_by_its_polling_fallback(store: Store) -> None:
    store.wait_poll_interval = 10.0
    jid = store.enqueue(Job("w", {"n": 1})).id
    _, token = claim_one(store, "w")
    box: dict[str, Any] = {}

    def waiter() -> None:
        box["row"] = store.wait(jid, timeout=60)
        box["at"] = time.monotonic()

    t = threading.Thread(target=waiter)
    t.start()
    # The watch is listening once its connection shows LISTEN's channel (pg_listening_channels is
    # per session, so look for the waiting thread's connection instead).
    wait_for(lambda: store.waits._conn is not None, "the LISTEN connection")
    time.sleep(0.2)  # let the first check and the notifies() call begin
    settled_at = time.monotonic()
    assert store.worker.settle_many([Outcome(jid, token, State.DONE, result='{"ok": 1}')]) == {jid}
    t.join(30)
    assert not t.is_alive()
    assert box["row"].state is State.DONE and box["row"].result == {"ok": 1}
    # Woken by the NOTIFY: far sooner than the 10 s fallback would have.
    assert box["at"] - settled_at < 5.0


def test_v2_result_raises_job_failed_and_job_canceled_and_times_out(store: Store) -> None:
    dead = store.enqueue(Job("r")).id
    _, token = claim_one(store, "r")
    store.worker.settle_many([Outcome(dead, token, State.DEAD, last_error="Boom: no", traceback="tb")])
    with pytest.raises(JobFailed) as failed:
        store.result(dead, timeout=5)
    assert failed.value.row.state is State.DEAD and failed.value.row.last_error == "Boom: no"
    assert failed.value.row.errors[0].traceback == "tb"

    canceled = store.enqueue(Job("r2")).id
    t, box = waiting(store, lambda: store.result(canceled, timeout=30))
    assert store.cancel(canceled)
    t.join(30)
    assert isinstance(box["exc"], JobCanceled)

    pending = store.enqueue(Job("r3")).id
    with pytest.raises(WaitTimeout):
        store.wait(pending, timeout=0.3)
    with pytest.raises(TimeoutError):  # WaitTimeout is a TimeoutError
        store.result(pending, timeout=0)
    with pytest.raises(JobNotFound):
        store.wait(str(uuid.uuid4()), timeout=1)
    with pytest.raises(JobNotFound):
        store.wait("not-a-uuid", timeout=1)


def test_v2_a_job_deleted_while_waited_on_raises_job_not_found(store: Store) -> None:
    store.wait_poll_interval = 0.2  # a DELETE notifies nobody: the fallback finds it gone
    jid = store.enqueue(Job("gone")).id
    t, box = waiting(store, lambda: store.wait(jid, timeout=30))
    q(store.session.pool, store.schema, "DELETE FROM {job} WHERE id = %s", jid)  # type: ignore[arg-type]
    t.join(30)
    assert isinstance(box["exc"], JobNotFound)


def test_v2_a_lost_notification_only_delays(store: Store) -> None:
    store.wait_poll_interval = 0.3
    jid = store.enqueue(Job("quiet")).id
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.setdefault("row", store.wait(jid, timeout=30)))
    t.start()
    wait_for(lambda: store.waits._waiting, "the waiter to register")
    # An UPDATE from psql sends no notification: the polling fallback sees it.
    q(store.session.pool, store.schema, "UPDATE {job} SET state = 'canceled' WHERE id = %s", jid)  # type: ignore[arg-type]
    t.join(30)
    assert box["row"].state is State.CANCELED


def test_v2_a_thousand_waiters_cost_one_backend(
    dsn: str, schema: str, fixed_pool: ConnectionPool[Any]
) -> None:
    store = Store(fixed_pool, schema=schema)
    try:
        ids = [r.id for r in store.enqueue_many([Job("many", {"i": i}) for i in range(1000)])]
        app = conninfo_to_dict(fixed_pool.conninfo)["application_name"]
        before = backends(dsn, app)
        results: dict[str, Any] = {}
        errors: list[BaseException] = []

        def waiter(jid: str) -> None:
            try:
                results[jid] = store.result(jid, timeout=120)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=waiter, args=(jid,)) for jid in ids]
        for t in threads:
            t.start()
        assert store.waits is not None
        waits = store.waits
        wait_for(lambda: len(waits._waiting) == 1000, "1000 waiters registered", timeout=60)
        # Measured while every waiter waits (claims and outcome batches then open the engine's own).
        assert backends(dsn, app) - before <= 1
        rows = store.worker.claim(["many"], 1000, "test", LEASE)
        outcomes = [Outcome(r.id, r.claim_token, State.DONE, result=str(r.payload["i"])) for r in rows]
        for i in range(0, len(outcomes), 100):  # ten batches, ten notifications
            store.worker.settle_many(outcomes[i : i + 100])
        for t in threads:
            t.join(120)
        assert not errors
        assert len(results) == 1000
        assert all(results[r.id] == r.payload["i"] for r in rows)
    finally:
        store.close()


def test_v2_closing_the_store_ends_its_listen_connection(store: Store) -> None:
    jid = store.enqueue(Job("c")).id
    with pytest.raises(WaitTimeout):
        store.wait(jid, timeout=0.2)
    watch = store.waits
    assert isinstance(watch, Watch)
    wait_for(lambda: watch._conn is not None, "the LISTEN connection")
    conn = watch._conn
    store.close()
    assert conn is not None and conn.closed


async def _async_pool(
    dsn: str, size: int, app: str | None = None, timeout: float = 30.0
) -> AsyncConnectionPool[Any]:
    conninfo = dsn if app is None else make_conninfo(dsn, application_name=app)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo, min_size=size, max_size=size, open=False, timeout=timeout
    )
    await pool.open(wait=True)
    return pool


def test_v2_async_wait_result_and_a_thousand_waiters(dsn: str, schema: str, store: Store) -> None:
    async def main() -> None:
        app = f"await-{uuid.uuid4().hex[:12]}"
        # 1,000 first reads share 4 connections: on a busy machine that outlasts the pool's 30 s.
        pool = await _async_pool(dsn, 4, app, timeout=300)
        astore = AsyncStore(pool, schema=schema)
        astore.wait_poll_interval = 600.0  # no fallback check: only the notification can wake them
        try:
            ids = [r.id for r in store.enqueue_many([Job("amany", {"i": i}) for i in range(1000)])]
            before = backends(dsn, app)
            tasks = [asyncio.create_task(astore.result(jid, timeout=600)) for jid in ids]
            deadline = time.monotonic() + 300
            watch = astore.waits
            while watch is None or len(watch._waiting) < 1000:
                failed = [t.exception() for t in tasks if t.done()]
                assert not failed, f"a waiter ended before its job: {failed[:3]}"
                assert time.monotonic() < deadline, "1,000 waiters not registered in 300 s"
                await asyncio.sleep(0.05)
                watch = astore.waits
            assert backends(dsn, app) - before <= 1
            rows = store.worker.claim(["amany"], 1000, "test", LEASE)
            outcomes = [Outcome(r.id, r.claim_token, State.DONE, result=str(r.payload["i"])) for r in rows]
            await asyncio.to_thread(store.worker.settle_many, outcomes)  # one batch: one notification
            got = await asyncio.wait_for(asyncio.gather(*tasks), 300)
            assert sorted(got) == list(range(1000))

            dead = store.enqueue(Job("adead")).id
            (row,) = store.worker.claim(["adead"], 1, "t", LEASE)
            store.worker.settle_many([Outcome(dead, row.claim_token, State.DEAD, last_error="E: x")])
            with pytest.raises(JobFailed):
                await astore.result(dead, timeout=5)
            pending = store.enqueue(Job("apending")).id
            with pytest.raises(WaitTimeout):
                await astore.wait(pending, timeout=0.2)
            with pytest.raises(JobNotFound):
                await astore.wait(str(uuid.uuid4()), timeout=1)
            canceled = asyncio.create_task(astore.result(pending, timeout=30))
            await asyncio.sleep(0.2)
            assert await astore.cancel(pending)
            with pytest.raises(JobCanceled):
                await asyncio.wait_for(canceled, 8)
        finally:
            await astore.close()
            await pool.close()

    # bounded: a hang fails with the traceback of the await it hung in
    asyncio.run(asyncio.wait_for(main(), 420))


def test_v2_engine_outcomes_wake_waiters(store: Store, engines: Callable[..., Engine]) -> None:
    store.wait_poll_interval = 10.0

    def handler(ctx: Context, claim: Claim) -> int:
        if claim.payload == "fail":
            raise RuntimeError("no")
        return int(claim.payload)

    e = engines()
    e.register_kind("eng", handler, KindOptions(max_attempts=1))
    ok = e.enqueue(Job("eng", "7")).id
    bad = e.enqueue(Job("eng", "fail")).id
    e.start()
    assert store.result(ok, timeout=8) == 7
    with pytest.raises(JobFailed) as failed:
        store.result(bad, timeout=8)
    assert failed.value.row.errors[0].error == "RuntimeError: no"


# Seconds a wait connection may take to read _flood's backlog: 200,000 notifications, some 13 MB,
# read a socket's worth per round of the watch's loop. That is 3 to 7 s on an idle 2-core machine and
# up to 20 s on a loaded one; a connection left unread never gets there (its backend stays in ClientWrite).
DRAIN = 40.0


def _flood(dsn: str, channel: str, n: int = 200_000) -> None:
    """Send *n* notifications on *channel*, distinct (so none are folded), as many outcome batches would."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(0, n, 50_000):
            conn.execute(
                "SELECT count(pg_notify(%s, i::text)) FROM generate_series(%s::int, %s::int) i",
                (channel, start, start + 49_999),
            )


def _backend(dsn: str, pid: int) -> tuple[str, str | None] | None:
    """(query, wait_event) of the backend *pid*, None once it is gone."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT query, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        return None if row is None else (str(row[0]), row[1])


def _listening(dsn: str, conn: Any) -> int:
    """The backend pid of a wait connection, once its LISTEN ran (notifications reach it from then on)."""
    pid = int(conn.info.backend_pid)
    wait_for(lambda: (b := _backend(dsn, pid)) is not None and "LISTEN" in b[0], "the LISTEN")
    return pid


def test_v2_an_idle_wait_connection_is_still_read_then_closed(
    dsn: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No waiter left, outcome batches go on: a LISTEN connection left unread blocks its server
    # process once the socket is full (ClientWrite), and that pins the cluster's NOTIFY queue,
    # which then grows until every NOTIFY - every outcome write and enqueue - fails.
    monkeypatch.setattr(waiting_module, "IDLE_CLOSE", 2 * DRAIN)  # open till the backlog is seen read
    jid = store.enqueue(Job("w")).id
    t, box = waiting(store, lambda: store.wait(jid, timeout=60))  # a waiter that really waits opens it
    watch = store.waits
    assert watch is not None
    wait_for(lambda: watch._conn is not None, "the LISTEN connection")
    assert store.cancel(jid)
    t.join(30)
    assert not t.is_alive() and not box, box
    pid = _listening(dsn, watch._conn)
    _flood(dsn, settled_channel_for(store.schema))
    wait_for(
        lambda: (b := _backend(dsn, pid)) is not None and b[1] == "ClientRead", "the backlog read", DRAIN
    )
    monkeypatch.setattr(waiting_module, "IDLE_CLOSE", 0.3)
    wait_for(lambda: _backend(dsn, pid) is None, "the idle LISTEN connection closed", 10)
    assert store.wait(jid, timeout=5).state is State.CANCELED  # the next wait opens it again


def test_v2_an_idle_async_wait_connection_is_still_read(
    dsn: str, schema: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kept open till its backlog is seen read: a connection closed meanwhile would prove nothing.
    monkeypatch.setattr(waiting_module, "IDLE_CLOSE", 2 * DRAIN)

    async def main() -> None:
        pool = await _async_pool(dsn, 2)
        astore = AsyncStore(pool, schema=schema)
        try:
            jid = store.enqueue(Job("w")).id
            waiter = asyncio.create_task(astore.wait(jid, timeout=60))  # a waiter that really waits opens it
            deadline = time.monotonic() + 30
            while (watch := astore.waits) is None or watch._conn is None:
                assert time.monotonic() < deadline, "no LISTEN connection"
                await asyncio.sleep(0.01)
            assert store.cancel(jid)
            assert (await waiter).state is State.CANCELED
            pid = await asyncio.to_thread(_listening, dsn, watch._conn)
            await asyncio.to_thread(_flood, dsn, settled_channel_for(schema))
            deadline = time.monotonic() + DRAIN
            while (b := await asyncio.to_thread(_backend, dsn, pid)) is None or b[1] != "ClientRead":
                assert b is not None, "the wait connection closed before its backlog was seen read"
                assert time.monotonic() < deadline, f"the backlog is still unread: {b}"
                await asyncio.sleep(0.05)
        finally:
            await astore.close()
            await pool.close()

    asyncio.run(main())
