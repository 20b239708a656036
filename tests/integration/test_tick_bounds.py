"""The bounds of a periodic tick's transaction (SPEC Q4'; sql/schedule_tick_bounds.sql): SET LOCAL,
so nothing of them is left on the connection, directly or through a transaction-pooling bouncer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.pgbouncer import pgbouncer, pgbouncer_binary

SETTINGS = ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")


def show(conn: Any) -> tuple[str, ...]:
    return tuple(conn.execute(f"SHOW {s}").fetchone()[0] for s in SETTINGS)


def test_q4_tick_bounds_do_not_leak_to_the_pool_connection(dsn: str, schema: str) -> None:
    pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=1, open=True)
    try:
        with pool.connection() as conn:
            before = show(conn)
        store = Store(pool, schema=schema)
        t = datetime(2026, 1, 1, tzinfo=UTC)
        assert store.enqueue_tick("s", t, Job("tick", 1)) is not None
        assert store.enqueue_tick("s", t, Job("tick", 1)) is None  # the refused path (returns early)
        with pool.connection() as conn:
            assert show(conn) == before
            conn.execute("BEGIN")
            assert show(conn) == before
            conn.execute("ROLLBACK")
    finally:
        pool.close()


@pytest.fixture(scope="module")
def bouncer(dsn: str) -> Iterator[str]:
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip("pgbouncer is not installed")
    with pgbouncer(dsn, binary) as url:
        yield url


def test_q4_ticks_through_pgbouncer_racing_and_no_leak(bouncer: str, dsn: str, schema: str) -> None:
    pool: ConnectionPool[Any] = ConnectionPool(
        bouncer, min_size=1, max_size=6, open=True, kwargs={"prepare_threshold": None}
    )
    other: ConnectionPool[Any] = ConnectionPool(
        bouncer, min_size=1, max_size=1, open=True, kwargs={"prepare_threshold": None}
    )
    try:
        with other.connection() as conn:
            before = show(conn)
        store = Store(pool, schema=schema)
        base = datetime(2026, 1, 1, tzinfo=UTC)
        made: list[Any] = []
        errors: list[BaseException] = []
        for k in range(5):
            tick = base + timedelta(minutes=k)
            barrier = threading.Barrier(6)

            def race(tick: datetime = tick, barrier: threading.Barrier = barrier, k: int = k) -> None:
                barrier.wait()
                try:
                    made.append(store.enqueue_tick("s", tick, Job("tick", k)))
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=race) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        assert not errors, errors
        assert len([m for m in made if m is not None]) == 5
        with other.connection() as conn:
            for _ in range(5):
                assert show(conn) == before
    finally:
        pool.close()
        other.close()
