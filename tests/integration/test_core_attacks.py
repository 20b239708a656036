"""Attacks on the engine core's promises against real PostgreSQL (SPEC P1'', F0, L5', O4, W0).

Each test names a way the core might break a promise: a claim sent by an engine whose proof of
life is stale, two engines sharing a worker id, an outcome batch holding two claims of one job,
the row versions a job writes while heartbeats and progress go on.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.engine.attempt.handover import Handover
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.engine.metrics import Metrics
from brooq_py.engine.services.completer import Completer
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from brooq_py.queue.port import EngineProof, Outcome
from tests.integration.conftest import FAST, q
from tests.polling import wait_for

LEASE = timedelta(seconds=60)


@pytest.fixture
def db(dsn: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A raw autocommit connection with search_path on the test schema (test-side SQL only)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield conn


def test_p1_f0_a_claim_by_an_engine_whose_proof_is_stale_is_never_reapable_at_once(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """An engine that decided it may claim and then stalled (GC, swap, SIGSTOP) past lease +
    margin sends its claim with a proof of life the database already holds for gone. Rows it
    claims then would be the reaper's at once: another engine could run them while this one
    starts them too. The claim must take nothing (or nothing another engine may take)."""
    store.enqueue(Job("a"))
    store.worker.beat(EngineProof("w", "host", 1, LEASE, LEASE / 3), [])
    db.execute("UPDATE engine SET seen_at = now() - interval '1 hour' WHERE id = 'w'")
    claimed = store.worker.claim(["a"], 1, "w", LEASE)
    reaped = store.worker.reap()  # another engine's reaper, the next moment
    assert not (claimed and reaped), "a claim of a stale engine was reaped at once: two runners"


def test_p1_f0_a_claim_just_inside_the_proof_leaves_the_engine_time_to_fence_first(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """A claim sent when the engine's proof is older than lease - margin on the database clock
    (its own fence is due) would be reapable within moments: the claim takes nothing."""
    store.enqueue(Job("a"))
    store.worker.beat(EngineProof("w", "host", 1, LEASE, LEASE / 3), [])
    db.execute("UPDATE engine SET seen_at = now() - interval '41 seconds' WHERE id = 'w'")
    assert store.worker.claim(["a"], 1, "w", LEASE) == []
    db.execute("UPDATE engine SET seen_at = now() - interval '39 seconds' WHERE id = 'w'")
    assert len(store.worker.claim(["a"], 1, "w", LEASE)) == 1  # a young enough proof claims as before


def test_p1_an_engine_with_no_row_yet_claims_under_the_rows_own_lease(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """run_once and testing.drain claim with no engine row: the row's locked_until guards it."""
    store.enqueue(Job("a"))
    [c] = store.worker.claim(["a"], 1, "solo", LEASE)
    assert store.worker.reap() == []
    assert c.locked_by == "solo"


def test_p1_f0_a_limited_topics_claim_by_a_stale_engine_takes_nothing(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """The same for a globally limited topic's claim (its own statement, under the topic's lock)."""
    store.enqueue(Job("a"))
    store.set_limit("a", 5)
    store.worker.beat(EngineProof("w", "host", 1, LEASE, LEASE / 3), [])
    db.execute("UPDATE engine SET seen_at = now() - interval '1 hour' WHERE id = 'w'")
    assert list(store.worker.claim_limited("a", 1, "w", LEASE)) == []
    db.execute("UPDATE engine SET seen_at = now() WHERE id = 'w'")
    assert len(store.worker.claim_limited("a", 1, "w", LEASE)) == 1


class _Events:
    """An event sink that keeps what it was given."""

    active = True

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def emit(self, kind: str, job_id: str, topic: str, attempt: int, error: str | None = None) -> None:
        self.seen.append((kind, job_id))


def test_p3_o4_a_stale_outcome_batched_with_its_jobs_current_one_is_not_told_as_written(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """One batch holds two outcomes of one job: a late failed of a claim the reaper took back and
    the done of the job's claim now. Only the done is written; the failed must not be counted
    (brooq_settle_total) nor told (a ``failed`` event) as if it were."""
    jid = store.enqueue(Job("a")).id
    [old] = store.worker.claim(["a"], 1, "w", LEASE)
    db.execute("UPDATE job SET locked_until = now() - interval '1 second'")
    assert store.worker.reap() == [(jid, "a")]
    [new] = store.worker.claim(["a"], 1, "w", LEASE)
    registry = CollectorRegistry()
    handover = Handover(store, InFlight(), Metrics(registry), logging.getLogger("test"))
    events = _Events()
    handover.events = events  # type: ignore[assignment]
    completer = Completer(store.worker.settle_many, handover.on_written, logging.getLogger("test"))
    stale = Outcome(jid, old.claim_token, State.FAILED, last_error="late", topic="a")
    current = Outcome(jid, new.claim_token, State.DONE, topic="a")
    completer.put(stale)
    completer.put(current)
    completer.flush_once()
    r = store.get(jid)
    assert r is not None and r.state == State.DONE
    assert events.seen == [("done", jid)]
    assert registry.get_sample_value("brooq_settle_total", {"topic": "a", "outcome": "failed"}) in (None, 0)


def _count_writes(db: psycopg.Connection[Any], schema: str) -> None:
    """Count every row version of a job row written (inserts and updates) in job_writes."""
    db.execute("CREATE TABLE job_writes (id uuid, op text, state text)")
    db.execute(
        sql.SQL(
            """
            CREATE FUNCTION count_job_writes() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO {}.job_writes VALUES (NEW.id, TG_OP, NEW.state);
                RETURN NEW;
            END $$
            """
        ).format(sql.Identifier(schema))
    )
    db.execute(
        "CREATE TRIGGER count_job_writes AFTER INSERT OR UPDATE ON job "
        "FOR EACH ROW EXECUTE FUNCTION count_job_writes()"
    )


def test_w0_a_job_claimed_once_that_succeeds_writes_three_row_versions_whatever_its_heartbeats(
    store: Store, db: psycopg.Connection[Any], engines: Callable[..., Engine], schema: str
) -> None:
    """Lease 3 s (a heartbeat every 0.75 s), handlers of 4 s: five heartbeats each, and still
    enqueue, claim, done; a handler that reports progress once writes one version more. (A shorter
    lease fenced its jobs on a machine busy enough to hold the heartbeat up for 0.8 s.)"""
    _count_writes(db, schema)

    def slow(ctx: Context, claim: Claim) -> None:
        time.sleep(4)
        if claim.payload == "progress":
            ctx.progress(0.5)
            time.sleep(1)

    e = engines(workers=8, lease=3)
    e.register_kind("w", slow, KindOptions(attempt_timeout=30, max_execution_timeout=60, **FAST))
    ids = [e.enqueue(Job("w", None)).id for _ in range(6)]
    with_progress = e.enqueue(Job("w", "progress")).id
    e.start()
    wait_for(
        lambda: db.execute("SELECT count(*) FROM job WHERE state = 'done'").fetchone() == (7,),
        timeout=60,
    )
    counts = dict(db.execute("SELECT id::text, count(*) FROM job_writes GROUP BY id").fetchall())
    assert {i: counts[i] for i in ids} == {i: 3 for i in ids}
    assert counts[with_progress] == 4


def test_p1_two_engines_sharing_a_worker_id_never_take_a_running_job_from_each_other(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """Engines A and B are given one worker_id; A runs a job for 7 s (lease 2 s), B runs another
    topic, C (its own id) the same topic as A. A's live claim must never be taken from it: the job
    runs once, is never cancelled, counts no crash. B's heartbeats are refused while A lives (the
    engine row names A's instance), so B never claims."""
    runs: list[str] = []
    causes: list[str] = []
    started = threading.Event()

    def long(label: str) -> Callable[[Context, Claim], None]:
        def handler(ctx: Context, claim: Claim) -> None:
            runs.append(label)
            started.set()
            ctx.wait(7)
            if ctx.cause is not None:
                causes.append(f"{label}: {type(ctx.cause).__name__}")
                raise ctx.cause

        return handler

    def make(label: str, worker_id: str | None, topic: str) -> Engine:
        cfg = Config(workers=1, lease=2, poll_interval=0.2, reaper_period=0.5, **FAST)
        e = Engine(Store(pool, schema=schema), cfg, worker_id=worker_id)
        e.register_kind(topic, long(label), KindOptions(attempt_timeout=30, max_execution_timeout=60, **FAST))
        return e

    a, b, c = make("A", "twin", "t"), make("B", "twin", "u"), make("C", None, "t")
    try:
        jid = a.enqueue(Job("t")).id
        a.start()
        assert started.wait(20)
        b.start()
        c.start()
        wait_for(lambda: (r := store.get(jid)) is not None and r.state.terminal, timeout=30)
        crashes = q(pool, schema, "SELECT state, crashes FROM {job} WHERE id = %s", jid)
        assert (runs, causes, crashes) == (["A"], [], [("done", 0)])
    finally:
        for e in (a, b, c):
            e.stop(timeout=2)
            e.close()


def test_r0_a_jobs_crash_count_is_read_with_its_row(store: Store, db: psycopg.Connection[Any]) -> None:
    """``crashes`` (this round's column, L5') is how an operator spots a job whose engines stop
    while running it: get, list_jobs and to_json (CLI --json, HTTP) carry it."""
    jid = store.enqueue(Job("a")).id
    store.worker.claim(["a"], 1, "w", LEASE)
    db.execute("UPDATE job SET locked_until = now() - interval '1 second'")
    assert store.worker.reap() == [(jid, "a")]
    r = store.get(jid)
    assert r is not None and r.crashes == 1
    assert r.to_json()["crashes"] == 1
    assert [x.crashes for x in store.list_jobs(topic="a")] == [1]


def test_l5_crashes_make_a_job_dead_only_at_max_crashes_never_drift_attempts_and_retry_resets_them(
    store: Store, db: psycopg.Connection[Any], engines: Callable[..., Engine]
) -> None:
    """max_attempts=1: two crashes leave the job pending with attempts 0 (never dead); the third
    makes it dead unrun, saying why; retry runs it again from a clean count."""
    ran: list[int] = []
    e = engines()
    e.register_kind("a", lambda ctx, claim: ran.append(claim.attempt), KindOptions(max_attempts=1, **FAST))
    jid = store.enqueue(Job("a")).id
    for n in (1, 2, 3):
        [c] = store.worker.claim(["a"], 1, "gone", LEASE)
        assert c.attempts == 1
        db.execute("UPDATE job SET locked_until = now() - interval '1 second'")
        assert store.worker.reap() == [(jid, "a")]
        r = store.get(jid)
        assert r is not None and (r.state, r.attempts, r.crashes) == (State.PENDING, 0, n)
    assert e.run_once() == 1
    r = store.get(jid)
    assert r is not None and r.state == State.DEAD and ran == []
    assert "3 engines stopped" in (r.last_error or "")
    assert store.retry(jid)
    r = store.get(jid)
    assert r is not None and (r.attempts, r.crashes) == (0, 0)
    assert e.run_once() == 1
    r = store.get(jid)
    assert r is not None and r.state == State.DONE and ran == [1]


class SlowProxy:
    """A TCP proxy in front of PostgreSQL; once ``slow`` is set, every answer of the server is
    held *delay* seconds before it is passed on (a database that answers, slowly)."""

    def __init__(self, host: str, port: int, delay: float) -> None:
        self.target = (host, port)
        self.delay = delay
        self.slow = False
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.socks.append(client)
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                continue
            self.socks.append(upstream)
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(65536):
                if answers and self.slow:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.server.close()
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def test_c11_stop_is_bounded_when_every_answer_of_the_database_is_slow(dsn: str, schema: str) -> None:
    """Every answer held 2 s: stop(timeout=1) with watchdog_grace 1 s returns within
    1 + 1 + 5 s, with handlers that end at once after the stop and outcomes to write (C11'')."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    proxy = SlowProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432), 2.0)
    slow_dsn = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
    pool: ConnectionPool[Any] = ConnectionPool(slow_dsn, min_size=1, max_size=8, open=True)
    started = threading.Event()

    def short(ctx: Context, claim: Claim) -> None:
        started.set()
        ctx.wait(30)

    try:
        store = Store(pool, schema=schema)
        e = Engine(store, Config(workers=2, lease=3, poll_interval=0.2, watchdog_grace=1, **FAST))
        e.register_kind("s", short, KindOptions(attempt_timeout=60, max_execution_timeout=120))
        for _ in range(2):
            store.enqueue(Job("s"))
        e.start()
        assert started.wait(20)
        time.sleep(0.5)
        proxy.slow = True
        t0 = time.monotonic()
        e.stop(timeout=1)
        took = time.monotonic() - t0
        proxy.slow = False
        e.close()
        assert took <= 1 + 1 + 5, f"stop took {took:.1f}s"
    finally:
        proxy.slow = False
        pool.close(timeout=5)
        proxy.close()
