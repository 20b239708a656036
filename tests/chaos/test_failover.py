"""A primary failover survived (SPEC H1): a real primary, a synchronous standby, an immediate stop, a promotion.

The servers are started by the test (tests/chaos/replica.py), never the
machine's shared one. Producers and an engine use a libpq multi-host conninfo
with ``target_session_attrs=read-write``; the audit trigger of the chaos suite
records every state change of every job. Across the switch: every enqueue that
returned ends done exactly once, no terminal state is rewritten, nothing stays
processing. An engine started while the only server up is the read-only standby
starts, retries, and works once the standby is promoted, whether its conninfo
refuses the standby at connect time (multi-host, read-write) or lands on it and
has its statements refused (SQLSTATE 25006, a single host).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from brooq_py.devdb import PostgresNotFound
from brooq_py.engine import Config, Engine
from brooq_py.postgres import AsyncStore, Store, migrations
from brooq_py.queue import Job, KindOptions, State, StoreUnavailable
from brooq_py.queue.port import EngineProof, HeldLease, Outcome
from tests.chaos import invariants
from tests.chaos.replica import ReplicaPair
from tests.polling import wait_for

TOPIC = "ha"
LEASE = 3.0

EFFECT = """
CREATE TABLE {s}.ha_effect (
    claim_token uuid PRIMARY KEY,
    job_id uuid NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def start_pair() -> ReplicaPair:
    try:
        return ReplicaPair().start()
    except PostgresNotFound as exc:
        pytest.skip(f"no PostgreSQL server binaries to start a primary and a standby: {exc}")


@pytest.fixture
def pair() -> Iterator[ReplicaPair]:
    with start_pair() as p:
        yield p


def prepare(dsn: str) -> str:
    """A migrated schema on the primary with the audit tables and the handler's side-effect table."""
    schema = "ha_" + random.Random().randbytes(6).hex()
    migrations.upgrade(dsn, schema=schema)
    invariants.install(dsn, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(EFFECT).format(s=sql.Identifier(schema)))
    return schema


def open_pool(conninfo: str, **kwargs: Any) -> ConnectionPool[Any]:
    """The pool as docs/high-availability.md says: dead connections are checked out of it."""
    return ConnectionPool(
        conninfo,
        min_size=1,
        max_size=8,
        timeout=2,
        check=ConnectionPool.check_connection,
        open=True,
        **kwargs,
    )


def make_engine(store: Store) -> Engine:
    config = Config(
        workers=4,
        lease=LEASE,
        reaper_period=0.5,
        poll_interval=0.2,
        retention_ttl=3600,  # retention runs (and deletes nothing): its statement meets the standby too
        retention_period=0.5,
        backoff_base=0.05,
        backoff_max=0.2,
    )
    engine = Engine(store, config, worker_id="ha-engine")
    opts = KindOptions(
        max_attempts=50, attempt_timeout=30, max_execution_timeout=60, backoff_base=0.05, backoff_max=0.2
    )
    effect = sql.SQL("INSERT INTO {}.ha_effect (claim_token, job_id) VALUES (%s, %s)").format(
        sql.Identifier(store.schema)
    )

    def handle(ctx: Any, claim: Any) -> None:
        p = claim.payload if isinstance(claim.payload, dict) else {}
        ctx.wait(float(p.get("sleep", 0.0)))
        ctx.raise_if_done()
        if p.get("close"):
            # Half the jobs end in a closing transaction (done + side effect together), half in
            # the batched outcome statement: both outcome paths cross the switch.
            claim.on_succeeded(lambda tx: tx.execute(effect.as_string(None), [claim.claim_token, claim.id]))

    engine.register_kind(TOPIC, handle, opts)
    return engine


def states(dsn: str, schema: str) -> dict[str, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, state FROM {}.job WHERE topic = %s").format(sql.Identifier(schema)), [TOPIC]
        ).fetchall()
    return {str(i): s for i, s in rows}


def all_done(dsn: str, schema: str, ids: set[str]) -> bool:
    try:
        now = states(dsn, schema)
    except psycopg.OperationalError:
        return False
    return all(now.get(i) == "done" for i in ids)


def check_history(dsn: str, schema: str, ids: set[str], closing: set[str]) -> dict[str, int]:
    """Every job of *ids* done exactly once, nothing processing, no terminal row changed; the counts."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        s = sql.Identifier(schema)
        dones: dict[str, int] = dict(
            conn.execute(
                sql.SQL(
                    "SELECT job_id::text, count(*) FROM {}.chaos_audit WHERE new_state = 'done' GROUP BY 1"
                ).format(s)
            ).fetchall()
        )
        effects: dict[str, int] = dict(
            conn.execute(
                sql.SQL("SELECT job_id::text, count(*) FROM {}.ha_effect GROUP BY 1").format(s)
            ).fetchall()
        )
        processing = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.job WHERE state = 'processing'").format(s)
        ).fetchone()
        violations = conn.execute(sql.SQL("SELECT count(*) FROM {}.chaos_violation").format(s)).fetchone()
    now = states(dsn, schema)
    not_done = sorted(i for i in ids if now.get(i) != "done")
    assert not not_done, f"{len(not_done)} committed enqueues did not end done: {not_done[:5]}"
    twice = {i: n for i, n in dones.items() if n != 1}
    assert not twice, f"jobs that became done more than once: {list(twice.items())[:5]}"
    assert set(dones) >= ids
    assert {i: effects.get(i, 0) for i in closing} == dict.fromkeys(closing, 1), (
        "a side effect not exactly once"
    )
    assert processing == (0,), "rows left processing"
    assert violations == (0,), "a terminal row was rewritten (chaos_violation)"
    report = invariants.check(dsn, schema, ids, child_topic="none")
    report.assert_ok()
    return {"jobs": len(ids), "claims": report.claims, "reaps": report.reaps}


class Producer(threading.Thread):
    """Enqueues keyed jobs one by one; a refused enqueue is retried with the same key until it returns.

    ``committed`` holds the ids of enqueues that returned: those must end done.
    An enqueue still failing when the producer is stopped may or may not have
    committed, and is not counted.
    """

    def __init__(self, name: str, conninfo: str, schema: str) -> None:
        super().__init__(name=f"producer-{name}", daemon=True)
        self.label = name
        self.pool = open_pool(conninfo)
        self.store = Store(self.pool, schema=schema)
        self.committed: set[str] = set()
        self.closing: set[str] = set()
        self.refused = 0
        self.stopping = threading.Event()
        self.rng = random.Random(name)

    def run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            close = n % 2 == 0
            # Every 20th job runs for a second: some are surely running when the primary dies.
            sleep = 1.0 if n % 20 == 0 else self.rng.uniform(0, 0.02)
            job = Job(
                TOPIC,
                {"n": n, "close": close, "sleep": sleep},
                idempotency_key=f"{self.label}-{n}",
            )
            while not self.stopping.is_set():
                try:
                    result = self.store.enqueue(job)
                except (StoreUnavailable, psycopg.Error):
                    self.refused += 1
                    time.sleep(0.05)
                    continue
                self.committed.add(result.id)
                if close:
                    self.closing.add(result.id)
                break
            time.sleep(0.03)

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        self.store.close()
        self.pool.close()


def no_stack_for_outages(records: list[logging.LogRecord]) -> None:
    """A server going away or refusing writes is weather: logged without a traceback, never as a crash."""
    stacks = [
        r.getMessage()
        for r in records
        if r.exc_info and isinstance(r.exc_info[1], (psycopg.Error, StoreUnavailable))
    ]
    assert not stacks, f"outage logged with a traceback: {stacks[:3]}"


def test_failover_under_load_every_committed_enqueue_done_once_H1(
    pair: ReplicaPair, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger="brooq_py")
    began = time.monotonic()
    schema = prepare(pair.primary.dsn)
    pool = open_pool(pair.multi_host, kwargs={"application_name": "ha-engine"})
    store = Store(pool, schema=schema)
    engine = make_engine(store)
    producers = [Producer(f"p{i}", pair.multi_host, schema) for i in range(2)]
    engine.start()
    try:
        for p in producers:
            p.start()
        wait_for(lambda: sum(len(p.committed) for p in producers) >= 150, "enqueues before the switch", 30)
        wait_for(
            lambda: sum(1 for s in states(pair.primary.dsn, schema).values() if s == "done") >= 50, "drain"
        )
        wait_for(lambda: running(pair.primary.dsn, schema) >= 2, "handlers running at the crash")
        before = sum(len(p.committed) for p in producers)

        pair.fail_primary()
        # An outage longer than the lease: handlers running at the crash are fenced (L4) and their
        # jobs reaped on the new primary; outcomes buffered at the crash are written there or dropped.
        wait_for(lambda: all(p.refused for p in producers), "producers refused by the dead primary", 30)
        time.sleep(LEASE + 1)
        pair.promote()
        promoted = sum(len(p.committed) for p in producers)
        wait_for(
            lambda: sum(len(p.committed) for p in producers) >= promoted + 150,
            "enqueues on the promoted standby",
            30,
        )
    finally:
        for p in producers:
            p.stop()
    ids = set().union(*(p.committed for p in producers))
    closing = set().union(*(p.closing for p in producers))
    try:
        wait_for(lambda: all_done(pair.standby.dsn, schema, ids), "every committed enqueue done", 45, 0.2)
        assert engine.running, "the engine stopped by itself"
        wait_for(lambda: engine.health().ok, "the engine healthy on the new primary", 30, 0.1)
        listening = wait_for(lambda: listeners(pair.standby.dsn), "LISTEN on the new primary", 30, 0.1)
    finally:
        engine.stop()
        store.close()
        pool.close()
    counts = check_history(pair.standby.dsn, schema, ids, closing)
    no_stack_for_outages(caplog.records)
    refused = sum(p.refused for p in producers)
    with capsys.disabled():
        print(
            f"\n[chaos] failover: enqueued {len(ids)} ({before} before the stop), refused enqueues retried "
            f"{refused}, claims {counts['claims']}, reaped {counts['reaps']}, listeners {listening}, "
            f"{time.monotonic() - began:.1f}s"
        )


def running(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.job WHERE state = 'processing'").format(sql.Identifier(schema))
        ).fetchone()
    return int(row[0]) if row else 0


def listeners(dsn: str) -> int:
    """How many of the engine's connections on *dsn* are LISTEN sessions."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ha-engine' AND query ~ '^(--[^\n]*\n)*LISTEN '"
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("route", ["multi-host", "standby only"])
def test_engine_started_on_the_read_only_standby_works_after_promotion_H1(
    pair: ReplicaPair, route: str, caplog: pytest.LogCaptureFixture
) -> None:
    """multi-host: target_session_attrs refuses the standby at connect time. standby only: the
    connection lands on the standby and every write is refused with 25006."""
    caplog.set_level(logging.INFO, logger="brooq_py")
    schema = prepare(pair.primary.dsn)
    with ConnectionPool(pair.primary.dsn, min_size=1, max_size=2, open=True) as seed:
        early = {
            r.id for r in Store(seed, schema=schema).enqueue_many([Job(TOPIC, {"n": i}) for i in range(40)])
        }
    pair.fail_primary()
    conninfo = pair.multi_host if route == "multi-host" else pair.standby.dsn
    pool = open_pool(conninfo, kwargs={"application_name": "ha-engine"})
    store = Store(pool, schema=schema)
    engine = make_engine(store)
    engine.start()  # the schema can be read on the standby, or not at all: never refused
    try:
        wait_for(lambda: engine.running and not engine.health().database, "the engine failing on the standby")
        if route == "standby only":
            # Claims, LISTEN and the background services met the standby's 25006 as outages.
            wait_for(lambda: refusals_logged(caplog.records) >= 2, "25006 logged as an outage", 30, 0.1)
        assert states(pair.standby.dsn, schema) == dict.fromkeys(early, "pending")
        pair.promote()
        with ConnectionPool(pair.standby.dsn, min_size=1, max_size=2, open=True) as seed:
            late = {
                r.id
                for r in Store(seed, schema=schema).enqueue_many([Job(TOPIC, {"n": i}) for i in range(40)])
            }
        wait_for(
            lambda: all_done(pair.standby.dsn, schema, early | late),
            "every job done after promotion",
            45,
            0.2,
        )
        wait_for(lambda: engine.health().ok, "the engine healthy after promotion", 30, 0.1)
        wait_for(lambda: listeners(pair.standby.dsn), "LISTEN re-established", 30, 0.1)
    finally:
        engine.stop()
        store.close()
        pool.close()
    check_history(pair.standby.dsn, schema, early | late, set())
    no_stack_for_outages(caplog.records)


def refusals_logged(records: list[logging.LogRecord]) -> int:
    """Log lines that report a read-only refusal as the database being unavailable."""
    return sum(
        1
        for r in records
        if "database unavailable" in r.getMessage() and "ReadOnlySqlTransaction" in r.getMessage()
    )


# --- the Store's statements on a read-only standby -------------------------------------------------


@pytest.fixture(scope="module")
def standby() -> Iterator[tuple[ReplicaPair, str]]:
    """A pair whose standby stays read-only, and a schema migrated on the primary (replicated)."""
    with start_pair() as p:
        schema = prepare(p.primary.dsn)
        # A synchronous commit waits for the standby's flush, not its replay: read it once replayed.
        with psycopg.connect(p.primary.dsn, autocommit=True) as conn:
            lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
        with psycopg.connect(p.standby.dsn, autocommit=True) as conn:
            wait_for(
                lambda: (
                    conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", lsn).fetchone() == (True,)
                ),
                "the standby to replay the schema",
                60,
                0.05,
            )
        yield p, schema


def test_every_engine_statement_refused_by_the_standby_is_store_unavailable_H1(
    standby: tuple[ReplicaPair, str],
) -> None:
    pair, schema = standby
    with ConnectionPool(pair.standby.dsn, min_size=1, max_size=2, open=True, timeout=5) as pool:
        store = Store(pool, schema=schema)
        lease = timedelta(seconds=LEASE)
        store.worker.bound_waits(lease)
        try:
            token = "00000000-0000-0000-0000-000000000001"
            refused: dict[str, Callable[[], object]] = {
                "claim": lambda: store.worker.claim([TOPIC], 4, "w", lease),
                "beat": lambda: store.worker.beat(
                    EngineProof("w", "h", 1, lease, lease / 3), [HeldLease(token, token)]
                ),
                "settle_many": lambda: store.worker.settle_many([Outcome(token, token, State.DONE)]),
                "reap": store.worker.reap,
                "delete_terminal": lambda: store.worker.delete_terminal(lease, 10),
                "stage": lambda: store.worker.stage([TOPIC], 10),
                "listen": lambda: store.worker.listen([TOPIC]),
                "enqueue": lambda: store.enqueue(Job(TOPIC, {})),
                "cancel": lambda: store.cancel(token),
            }
            for name, call in refused.items():
                with pytest.raises(StoreUnavailable, match="ReadOnlySqlTransaction") as info:
                    call()
                assert isinstance(info.value.__cause__, errors.ReadOnlySqlTransaction), name
            # The Store's own connections that met the standby were closed: the next statement reopens.
            assert store.worker._heartbeat._conn is None
            assert store.worker._claimer is not None and store.worker._claimer._conn is None
            assert store.worker._settler is not None and store.worker._settler._conn is None
            with pytest.raises(StoreUnavailable, match="ReadOnlySqlTransaction"), store.begin() as tx:
                store.enqueue_tx(tx, Job(TOPIC, {}))
            # Reads work on a standby and are left alone.
            assert store.get(token) is None
            assert store.worker.schema_version() is not None
        finally:
            store.close()


def test_pool_connections_refused_by_the_standby_are_closed_not_reused_H1(
    standby: tuple[ReplicaPair, str],
) -> None:
    pair, schema = standby
    with ConnectionPool(pair.standby.dsn, min_size=1, max_size=1, open=True, timeout=5) as pool:
        store = Store(pool, schema=schema)
        with pool.connection() as conn:
            first = conn.info.backend_pid
        with pytest.raises(StoreUnavailable):
            store.enqueue(Job(TOPIC, {}))
        with pool.connection() as conn:
            assert conn.info.backend_pid != first, "the connection on the standby went back to the pool"


def test_async_store_refused_by_the_standby_is_store_unavailable_H1(standby: tuple[ReplicaPair, str]) -> None:
    pair, schema = standby

    async def go() -> None:
        async with AsyncConnectionPool(pair.standby.dsn, min_size=1, max_size=1, open=False) as pool:
            store = AsyncStore(pool, schema=schema)
            async with pool.connection() as conn:
                first = conn.info.backend_pid
            with pytest.raises(StoreUnavailable, match="ReadOnlySqlTransaction"):
                await store.enqueue(Job(TOPIC, {}))
            with pytest.raises(StoreUnavailable, match="ReadOnlySqlTransaction"):
                async with store.begin() as tx:
                    await store.enqueue_tx(tx, Job(TOPIC, {}))
            async with pool.connection() as conn:
                assert conn.info.backend_pid != first

    asyncio.run(go())


def test_the_callers_own_read_only_transaction_is_not_an_outage(standby: tuple[ReplicaPair, str]) -> None:
    pair, schema = standby
    with psycopg.connect(pair.primary.dsn) as conn:
        conn.execute("SET TRANSACTION READ ONLY")
        store = Store(None, schema=schema)
        with pytest.raises(errors.ReadOnlySqlTransaction):
            store.enqueue_tx(conn, Job(TOPIC, {}))
