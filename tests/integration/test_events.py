"""Engine.on_event on real PostgreSQL: every event after its commit, off the handler threads (SPEC N1)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import BrooqError, Claim, Context, Event, Job, KindOptions, MustCancelTask
from tests.polling import wait_for


class Recorder:
    """Records each event with the row's state as a separate connection sees it at delivery."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.table = sql.Identifier(schema, "job")
        self.lock = threading.Lock()
        self.seen: list[tuple[Event, str | None, str]] = []

    def __call__(self, event: Event) -> None:
        row = self.conn.execute(
            sql.SQL("SELECT state FROM {} WHERE id = %s").format(self.table), (event.job_id,)
        ).fetchone()
        with self.lock:
            self.seen.append((event, None if row is None else row[0], threading.current_thread().name))

    def kinds(self, job_id: str) -> list[str]:
        with self.lock:
            return [e.kind for e, _, _ in self.seen if e.job_id == job_id]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def recorder(dsn: str, schema: str) -> Any:
    r = Recorder(dsn, schema)
    yield r
    r.close()


def test_done_failed_dead_and_canceled_arrive_after_their_commit(
    store: Store, engines: Callable[..., Engine], recorder: Recorder
) -> None:
    e = engines(workers=2)
    handler_threads: set[str] = set()

    def flaky(ctx: Context, claim: Claim) -> None:
        handler_threads.add(threading.current_thread().name)
        if claim.payload == "fail":
            raise RuntimeError("boom")
        if claim.payload == "cancel":
            raise MustCancelTask()

    e.register_kind("ev", flaky, KindOptions(max_attempts=2))
    e.on_event(recorder)
    e.start()
    ok = store.enqueue(Job("ev", "ok")).id
    bad = store.enqueue(Job("ev", "fail")).id
    gone = store.enqueue(Job("ev", "cancel")).id
    wait_for(lambda: recorder.kinds(ok)[-1:] == ["done"], "done event")
    wait_for(lambda: recorder.kinds(bad)[-1:] == ["dead"], "dead event")
    wait_for(lambda: recorder.kinds(gone)[-1:] == ["canceled"], "canceled event")
    assert recorder.kinds(ok) == ["claimed", "done"]
    assert recorder.kinds(bad) == ["claimed", "failed", "claimed", "dead"]
    assert recorder.kinds(gone) == ["claimed", "canceled"]
    with recorder.lock:
        seen = list(recorder.seen)
    for event, state_at_delivery, thread in seen:
        # delivered after the commit: the row already shows what the event says
        if event.kind in ("done", "dead", "canceled"):
            assert state_at_delivery == event.kind, event
        if event.kind == "failed":
            assert state_at_delivery in ("failed", "pending", "processing", "dead"), event
        assert thread not in handler_threads
        assert event.topic == "ev"
    failed = [ev for ev, _, _ in seen if ev.kind == "failed"]
    assert failed[0].attempt == 1 and failed[0].error is not None and "RuntimeError: boom" in failed[0].error
    dead = [ev for ev, _, _ in seen if ev.kind == "dead"]
    assert dead[0].attempt == 2


def test_a_closing_transaction_done_is_an_event(
    store: Store, engines: Callable[..., Engine], recorder: Recorder
) -> None:
    e = engines()

    def chained(ctx: Context, claim: Claim) -> None:
        claim.chain(Job("ev.next"))

    e.register_kind("ev", chained)
    e.register_kind("ev.next", lambda ctx, claim: None)
    e.on_event(recorder)
    e.start()
    jid = store.enqueue(Job("ev")).id
    wait_for(lambda: recorder.kinds(jid)[-1:] == ["done"], "done event of the closing transaction")
    with recorder.lock:
        states = [s for ev, s, _ in recorder.seen if ev.job_id == jid and ev.kind == "done"]
    assert states == ["done"]


def test_a_listener_that_raises_changes_nothing(
    store: Store, engines: Callable[..., Engine], recorder: Recorder
) -> None:
    e = engines()
    e.register_kind("ev", lambda ctx, claim: None)

    def bad(event: Event) -> None:
        raise SystemExit("listener gone wrong")

    e.on_event(bad)
    e.on_event(recorder)
    e.start()
    ids = [store.enqueue(Job("ev", i)).id for i in range(5)]
    for jid in ids:
        wait_for(lambda jid=jid: recorder.kinds(jid)[-1:] == ["done"], "done events after a raising listener")
        row = store.get(jid)
        assert row is not None and row.state == "done"
    assert e.metrics.event_listener_errors._value.get() >= 10  # claimed + done for each, all raised
    assert e.running


def test_events_of_the_stops_last_flush_are_delivered_before_stop_returns(
    store: Store, engines: Callable[..., Engine], recorder: Recorder
) -> None:
    e = engines(workers=4)
    release = threading.Event()

    def slow(ctx: Context, claim: Claim) -> None:
        release.wait(10)

    e.register_kind("ev", slow)
    e.on_event(recorder)
    e.start()
    ids = [store.enqueue(Job("ev", i)).id for i in range(4)]
    wait_for(lambda: all(recorder.kinds(j) == ["claimed"] for j in ids), "all claimed")
    threading.Timer(0.2, release.set).start()
    e.stop(timeout=10)
    for jid in ids:
        assert recorder.kinds(jid) == ["claimed", "done"]


def test_on_event_after_start_is_refused(engines: Callable[..., Engine]) -> None:
    e = engines()
    e.register_kind("ev", lambda ctx, claim: None)
    e.start()
    with pytest.raises(BrooqError):
        e.on_event(lambda ev: None)


def test_events_of_run_once_and_drain_are_delivered(
    store: Store, engines: Callable[..., Engine], recorder: Recorder
) -> None:
    # drain runs jobs through the engine's own path (K4): a listener hears them as it would
    # under a started engine, off the calling thread, all delivered by close() at the latest.
    from brooq_py.testing import drain

    e = engines()
    e.on_event(recorder)
    e.register_kind("ok", lambda ctx, claim: 1)
    e.register_kind("bad", lambda ctx, claim: 1 / 0, KindOptions(max_attempts=1))
    ok = e.enqueue(Job("ok")).id
    bad = e.enqueue(Job("bad")).id
    drain(e)
    e.close()
    assert recorder.kinds(ok) == ["claimed", "done"]
    assert recorder.kinds(bad) == ["claimed", "dead"]
    assert all(state in ("processing", "done", "dead") for _, state, _ in recorder.seen)
    assert {name for _, _, name in recorder.seen} == {"brooq-events"}
