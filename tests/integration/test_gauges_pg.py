"""Gauges from memory and health from the engine's own statements, on real PostgreSQL (SPEC Z2, O1).

The refresher reads the gauges; /metrics and /healthz answer from memory, so
a burst of requests costs the database nothing. Stopping a server happens on a
throwaway one this test starts, never on the shared server.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py import devdb
from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store, migrations
from brooq_py.postgres.worker import repo as worker_side
from brooq_py.queue import BrooqError, Claim, Context
from brooq_py.service import Server, serve
from tests.conftest import drop_schema
from tests.polling import wait_for

TOPIC = "gauge.a"
OTHER = "gauge.b"


def handler(ctx: Context, claim: Claim) -> None:
    return None


class CountingStore(Store):
    """The real Store, counting every statement it runs on a pool connection by what it was doing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statements: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        autocommit = self.session.autocommit

        def counted(doing: str, timeout: float | None = None) -> Any:
            with self._count_lock:
                self.statements[doing] += 1
            return autocommit(doing, timeout)

        self.session.autocommit = counted  # type: ignore[method-assign]

    def snapshot(self) -> Counter[str]:
        with self._count_lock:
            return Counter(self.statements)


def get(server: Server, path: str) -> tuple[int, bytes]:
    # Generous: under load a burst of connections may wait on the listen backlog (SYN retries).
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=150)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def execute(dsn: str, schema: str, statement: str, params: Any = None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(statement).format(job=sql.Identifier(schema, "job")), params)  # type: ignore[arg-type]


# --- what the refresher reads ---------------------------------------------------------------------


def test_o1_z2_gauges_count_each_active_state_and_the_oldest_ready_age(
    dsn: str, schema: str, store: Store
) -> None:
    """SPEC O1, S5: depth per topic and state (pending, scheduled, processing, failed; terminal rows
    never), and the oldest *ready* age: a pending job due in the future is not ready, nor a blocked one."""
    # The state check of the schema under test may predate `scheduled`; this test's rows need it.
    execute(dsn, schema, "ALTER TABLE {job} DROP CONSTRAINT IF EXISTS job_state_check")
    rows = [
        (TOPIC, "pending", "-100 seconds", 3),
        (TOPIC, "scheduled", "1 hour", 4),
        (TOPIC, "processing", "-1 second", 2),
        (TOPIC, "failed", "30 seconds", 1),
        (TOPIC, "blocked", "-500 seconds", 6),
        (TOPIC, "parked", "-600 seconds", 7),
        (TOPIC, "done", "-1 second", 5),
        (TOPIC, "dead", "-1 second", 1),
        (OTHER, "pending", "1 hour", 2),
    ]
    for topic, state, offset, n in rows:
        execute(
            dsn,
            schema,
            "INSERT INTO {job} (topic, payload, state, available_at, locked_by, locked_until) "
            "SELECT %(topic)s, '{{}}', %(state)s, now() + %(offset)s::interval, "
            "CASE WHEN %(state)s = 'processing' THEN 'w' END, "
            "CASE WHEN %(state)s = 'processing' THEN now() + interval '1 minute' END "
            "FROM generate_series(1, %(n)s)",
            {"topic": topic, "state": state, "offset": offset, "n": n},
        )
    g = store.worker.gauges([TOPIC, OTHER, "gauge.none"])
    counts = {(c.topic, str(c.state)): c.count for c in g.counts}
    assert counts == {
        (TOPIC, "pending"): 3,
        (TOPIC, "scheduled"): 4,
        (TOPIC, "processing"): 2,
        (TOPIC, "failed"): 1,
        (TOPIC, "blocked"): 6,
        (TOPIC, "parked"): 7,
        (OTHER, "pending"): 2,
        (OTHER, "scheduled"): 0,
        (OTHER, "processing"): 0,
        (OTHER, "failed"): 0,
        (OTHER, "blocked"): 0,
        (OTHER, "parked"): 0,
        ("gauge.none", "pending"): 0,
        ("gauge.none", "scheduled"): 0,
        ("gauge.none", "processing"): 0,
        ("gauge.none", "failed"): 0,
        ("gauge.none", "blocked"): 0,
        ("gauge.none", "parked"): 0,
    }
    assert 100 <= g.oldest_ready_seconds[TOPIC] < 200
    assert g.oldest_ready_seconds[OTHER] == 0.0
    assert g.oldest_ready_seconds["gauge.none"] == 0.0


def test_o1_gauge_counts_stop_at_the_cap(
    dsn: str, schema: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC O1: each count reads at most GAUGE_CAP rows (a count at the cap means at least that many)."""
    execute(
        dsn,
        schema,
        "INSERT INTO {job} (topic, payload, state, locked_by, locked_until) "
        "SELECT %(t)s, '{{}}', s, CASE WHEN s = 'processing' THEN 'w' END, "
        "CASE WHEN s = 'processing' THEN now() + interval '1 minute' END "
        "FROM unnest(ARRAY['pending', 'processing', 'failed', 'blocked', 'parked']) AS s, generate_series(1, 5)",
        {"t": TOPIC},
    )
    monkeypatch.setattr(worker_side, "GAUGE_CAP", 3)
    counts = {str(c.state): c.count for c in store.worker.gauges([TOPIC]).counts}
    assert counts == {"pending": 3, "scheduled": 0, "processing": 3, "failed": 3, "blocked": 3, "parked": 3}


@contextlib.contextmanager
def transaction_left_open(dsn: str, app: str) -> Iterator[None]:
    """A session in `BEGIN` that has taken a transaction id, named *app*: psql when installed."""
    if shutil.which("psql") is None:
        with psycopg.connect(dsn, application_name=app) as conn:
            conn.execute("SELECT txid_current()")
            yield
            conn.rollback()
        return
    psql = subprocess.Popen(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", dsn],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PGAPPNAME": app},
    )
    assert psql.stdin is not None
    try:
        psql.stdin.write(b"BEGIN;\nSELECT txid_current();\n")
        psql.stdin.flush()
        yield
    finally:
        psql.stdin.close()
        psql.wait(timeout=30)


def test_z2_oldest_transaction_age_sees_a_psql_transaction_left_open(dsn: str, store: Store) -> None:
    """SPEC Z2: a transaction left open in psql (it pins VACUUM) shows in the oldest transaction age."""
    app = "brooq_test_" + uuid.uuid4().hex[:8]

    def open_for() -> float | None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM now() - xact_start)::float8 FROM pg_stat_activity "
                "WHERE application_name = %s AND xact_start IS NOT NULL",
                [app],
            ).fetchone()
        return None if row is None else float(row[0])

    engine = Engine(store, Config(workers=1))
    try:
        with transaction_left_open(dsn, app):
            wait_for(lambda: (age := open_for()) is not None and age >= 1.0, "the transaction to be 1 s old")
            before = open_for()
            engine.refresher.run_once()
            seen = engine.registry.get_sample_value("brooq_oldest_transaction_age_seconds")
        assert before is not None and seen is not None
        assert seen >= before >= 1.0, (seen, before)  # ours at least; another may be older still
    finally:
        engine.close()


def test_z2_dead_tuples_of_the_job_table(dsn: str, schema: str, store: Store) -> None:
    """SPEC Z2: deleted rows show as dead tuples of this schema's job table."""
    execute(dsn, schema, "ALTER TABLE {job} SET (autovacuum_enabled = false)")
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = sql.Identifier(schema, "job")
        conn.execute(
            sql.SQL("INSERT INTO {} (topic, payload) SELECT 'x', '{{}}' FROM generate_series(1, 300)").format(
                job
            )
        )
        conn.execute(sql.SQL("DELETE FROM {}").format(job))
        conn.execute("SELECT pg_stat_force_next_flush()")
    wait_for(lambda: store.worker.database_gauges().job_dead_tuples >= 300, "300 dead tuples")
    # (Whether a VACUUM now clears them depends on every other session of the shared server:
    # one transaction open anywhere on the database keeps them. That is the point of the gauge.)


def test_z2_jobs_enqueued_by_another_process_count_in_the_engines_inserted_total(
    dsn: str, schema: str, store: Store
) -> None:
    """brooq_enqueued_total counts what passes through the engine; brooq_job_inserted_total sees
    every producer: here the CLI, a process of its own with no engine."""
    engine = Engine(store, Config(workers=1, gauges_period=3600))
    try:
        engine.refresher.run_once()
        before = engine.registry.get_sample_value("brooq_job_inserted_total")
        assert before is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUE_", "BROOQ_"))}
        env["DATABASE_URL"] = dsn
        for n in range(3):
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "brooq_py",
                    "enqueue",
                    OTHER,
                    json.dumps({"n": n}),
                    "--schema",
                    schema,
                ],
                env=env,
                check=True,
                capture_output=True,
                timeout=120,
            )

        def inserted() -> float:
            engine.refresher.run_once()
            return engine.registry.get_sample_value("brooq_job_inserted_total") or 0.0

        wait_for(lambda: inserted() >= before + 3, "the CLI's 3 jobs counted", 30, 0.2)
        assert engine.registry.get_sample_value("brooq_enqueued_total", {"topic": OTHER}) is None
    finally:
        engine.close()


# --- the cost of a scrape -------------------------------------------------------------------------


@pytest.fixture
def quiet_engine(pool: ConnectionPool[Any], schema: str) -> Iterator[tuple[Engine, CountingStore]]:
    """An engine that runs no periodic statement but its first ones (every period an hour)."""
    store = CountingStore(pool, schema=schema)
    hour = 3600
    cfg = Config(workers=2, poll_interval=hour, reaper_period=hour, retention_ttl=0, gauges_period=hour)
    engine = Engine(store, cfg)
    engine.register_kind(TOPIC, handler)
    try:
        yield engine, store
    finally:
        engine.close()


def test_z2_100_concurrent_scrapes_cost_the_database_at_most_one_refresh(
    quiet_engine: tuple[Engine, CountingStore],
) -> None:
    """SPEC Z2: 100 concurrent /metrics and 100 /healthz requests over real HTTP run no statement:
    the refresher read the gauges once, every request answers from memory."""
    engine, store = quiet_engine
    engine.start()
    wait_for(lambda: engine.refresher.view().fresh, "the first refresh")
    with serve(engine, port=0, concurrency=128) as srv:
        wait_for(lambda: get(srv, "/healthz")[0] == 200, "/healthz 200")
        before = store.snapshot()
        results: list[tuple[str, int, bytes]] = []
        retried: list[BaseException] = []
        lock = threading.Lock()
        for path in ("/metrics", "/healthz"):  # 100 requests at once of each
            # Connected one by one first (the surface's listen backlog is short), then all
            # 100 requests are sent at the same moment: 100 handlers answer concurrently.
            conns = []
            for _ in range(100):
                conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
                conn.connect()
                conns.append(conn)
                time.sleep(0.005)
            barrier = threading.Barrier(100)

            def hit(conn: http.client.HTTPConnection, path: str = path, barrier: Any = barrier) -> None:
                barrier.wait()
                try:
                    conn.request("GET", path)
                    resp = conn.getresponse()
                    answer = (path, resp.status, resp.read())
                except OSError as exc:  # a connection the kernel dropped: ask again, as a scraper would
                    with lock:
                        retried.append(exc)
                    answer = (path, *get(srv, path))
                finally:
                    conn.close()
                with lock:
                    results.append(answer)

            threads = [threading.Thread(target=hit, args=(c,)) for c in conns]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
        after = store.snapshot()
    assert len(results) == 200, retried
    assert all(status == 200 for _, status, _ in results), Counter(s for _, s, _ in results)
    for path, _, body in results:
        if path == "/metrics":
            assert b'brooq_jobs{state="pending",topic="gauge.a"} 0.0' in body
            assert b"brooq_up 1.0" in body
            assert b"_created" not in body
    spent = after - before
    refreshes = spent["reading gauges"] + spent["reading database gauges"]
    assert refreshes <= 2, spent  # at most one refresh: its two statements
    assert sum(spent.values()) <= 2, spent


# --- health --------------------------------------------------------------------------------------


def test_z2_healthz_503_on_an_unmigrated_schema(dsn: str, pool: ConnectionPool[Any]) -> None:
    """Issue 9 item 8, SPEC Z2: an engine whose every statement fails (no job table) never answers 200."""
    schema = "t_" + uuid.uuid4().hex  # never migrated
    store = Store(pool, schema=schema)
    engine = Engine(store, Config(workers=1, poll_interval=0.2, gauges_period=0.5))
    engine.register_kind(TOPIC, handler)
    try:
        with serve(engine, port=0) as srv:
            try:
                engine.start()
            except BrooqError:
                pass  # refused at start: not running, so 503 all the same
            else:
                wait_for(lambda: engine.health().error is not None, "a failed statement")
                health = engine.health()
                assert not health.database and health.error is not None
                assert "UndefinedTable" in health.error, health.error
            for _ in range(5):
                status, body = get(srv, "/healthz")
                assert status == 503, body
            status, body = get(srv, "/metrics")
            assert status == 200 and b"brooq_up 0.0" in body
    finally:
        engine.close()
        drop_schema(dsn, schema)


def test_z2_healthz_503_while_the_database_is_gone_and_200_after_it_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SPEC Z2: statements failing for longer than the grace turn /healthz 503; 200 again once they
    succeed. /metrics keeps answering meanwhile (brooq_up 0, the last gauges)."""
    caplog.set_level(logging.CRITICAL)
    try:
        throwaway = devdb.start_throwaway()  # this test's own server: the shared one is never stopped
    except devdb.PostgresNotFound as exc:
        pytest.skip(f"no PostgreSQL server binaries to start a throwaway server: {exc}")
    server = throwaway.server
    assert server is not None
    schema = "t_" + uuid.uuid4().hex
    migrations.upgrade(throwaway.dsn, schema=schema)
    pool: ConnectionPool[Any] = ConnectionPool(throwaway.dsn, min_size=1, max_size=4, timeout=2, open=True)
    store = Store(pool, schema=schema)
    # health grace = max(3 x 0.2 s, 2 x 0.5 s) = 1 s
    engine = Engine(store, Config(workers=1, poll_interval=0.2, gauges_period=0.5, lease=30))
    engine.register_kind(TOPIC, handler)
    try:
        engine.start()
        with serve(engine, port=0) as srv:
            wait_for(lambda: get(srv, "/healthz")[0] == 200, "/healthz 200 with the database up")
            wait_for(lambda: b"brooq_up 1.0" in get(srv, "/metrics")[1], "a first refresh")
            server._shutdown()  # the database goes away (the server is this test's own)
            wait_for(
                lambda: get(srv, "/healthz")[0] == 503, "/healthz 503 with the database gone", timeout=60
            )
            # the refresher's own failing read (it may wait out the pool's timeout) flips brooq_up
            wait_for(lambda: b"brooq_up 0.0" in get(srv, "/metrics")[1], "brooq_up 0 with the database gone")
            status, body = get(srv, "/metrics")
            assert status == 200 and b"brooq_jobs{" in body  # the last gauges read are still served
            server._spawn_and_wait()  # back on the same port and data directory
            wait_for(lambda: get(srv, "/healthz")[0] == 200, "/healthz 200 after recovery", timeout=120)
            wait_for(lambda: b"brooq_up 1.0" in get(srv, "/metrics")[1], "fresh gauges after recovery")
    finally:
        engine.close()
        pool.close()
        throwaway.close()
