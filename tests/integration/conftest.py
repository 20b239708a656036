"""Helpers the engine's integration tests share: engines on the test's Store, and test-side SQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.engine.clock import Clock
from brooq_py.postgres import Store
from tests import budget
from tests.budget import APP, MINE
from tests.integration.engine_procs import PROC
from tests.polling import wait_for
from tests.processes import Process

# Backoff short enough that a retried job comes back within a test's patience.
FAST = {"backoff_base": 0.01, "backoff_max": 0.02}


def q(pool: ConnectionPool[Any], schema: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run a test-side query against the schema's job table (`{job}` is the table)."""
    with pool.connection() as conn:
        rendered = sql.SQL(query).format(job=sql.Identifier(schema, "job"))  # type: ignore[arg-type]
        cur = conn.execute(rendered, params or None)
        return cur.fetchall() if cur.description is not None else []


def wait_listening(pool: ConnectionPool[Any], schema: str, engines: int = 1) -> None:
    """Wait until *engines* of this worker's connections LISTEN on *schema*'s channels (each runs its
    LISTENs in a row; the last one done): a test that needs a NOTIFY heard waits for the listener
    itself, never for a fixed time."""
    wait_for(
        lambda: (
            q(
                pool,
                schema,
                f"SELECT count(*) FROM pg_stat_activity WHERE {MINE} AND state = 'idle'"
                " AND query ~ %s AND position(%s in query) > 0",
                APP,
                "^(--[^\n]*\n)*LISTEN ",
                schema,
            )[0][0]
            >= engines
        ),
        f"{engines} engine(s) listening on {schema}",
    )


@pytest.fixture
def engines(store: Store) -> Iterator[Callable[..., Engine]]:
    made: list[Engine] = []

    def make(repo: Store | None = None, clock: Clock | None = None, **cfg: Any) -> Engine:
        params: dict[str, Any] = {
            "workers": 4,
            "poll_interval": 0.2,
            "lease": 3,
            "reaper_period": 0.5,
            **FAST,
        }
        params.update(cfg)
        if len(made) == 1:
            locks.append(budget.heavy_lock())  # a second engine's own connections pass the share
        e = Engine(repo or store, Config(**params), clock=clock)
        made.append(e)
        return e

    locks: list[Any] = []
    try:
        yield make
        for e in made:
            e.stop(timeout=2)
            e.close()
    finally:
        for lock in locks:
            lock.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Callable[..., Process]]:
    """Start real engine processes (tests/integration/engine_proc.py); each is stopped after the test."""
    made: list[Process] = []
    locks: list[Any] = []

    def spawn(**settings: Any) -> Process:
        if len(made) == 1:
            locks.append(budget.heavy_lock())  # a second engine process passes the share
        p = Process(PROC, {"dir": str(tmp_path), **settings}, tmp_path / f"proc{len(made)}.log")
        made.append(p)
        return p

    try:
        yield spawn
    finally:
        for p in made:
            p.stop()
        for lock in locks:
            lock.close()


@pytest.fixture
def day_table(dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]) -> str:
    """Today's table of terminal history (SPEC B2), made by a move of a job ended a second ago."""
    from tests.integration.history import made_day  # it reads jobs with q, of this module

    return made_day(dsn, schema, store, pool)


@pytest.fixture
def mover(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection that moves rows to the history by hand (``history.move_open``), its transaction
    left open."""
    with psycopg.connect(dsn) as conn:
        yield conn
