"""Shared helpers of the benchmark suite: schemas, pools, percentiles, memory."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store, migrations

# A pseudo revision: head with the workflows' release trigger dropped (what jobs would pay
# without workflows; today's code needs head's schema, so an older revision cannot stand in).
NO_RELEASE = "head-no-release"


@contextlib.contextmanager
def fresh_schema(dsn: str, prefix: str, revision: str = "head") -> Iterator[str]:
    """A schema migrated to *revision* (default head; NO_RELEASE: head without the release
    trigger) by the real migrations, dropped afterwards."""
    name = f"bench_{prefix}_{uuid.uuid4().hex[:10]}"
    migrations.upgrade(dsn, schema=name, revision="head" if revision == NO_RELEASE else revision)
    if revision == NO_RELEASE:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TRIGGER job_parent_ended ON {}").format(sql.Identifier(name, "job")))
    try:
        yield name
    finally:
        drop_schema(dsn, name)


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextlib.contextmanager
def store_on(dsn: str, schema: str, max_size: int = 4, factory: Any = None) -> Iterator[Store]:
    pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=max_size, open=True)
    store = (factory or Store)(pool, schema=schema)
    try:
        yield store
    finally:
        store.close()
        pool.close()


def job_table(schema: str) -> sql.Composed:
    return sql.SQL("{}").format(sql.Identifier(schema, "job"))


def count_not_done(conn: psycopg.Connection[Any], schema: str) -> int:
    q = sql.SQL("SELECT count(*) FROM {} WHERE state <> 'done'").format(job_table(schema))
    row = conn.execute(q).fetchone()
    assert row is not None
    return int(row[0])


def wait_all_done(
    conn: psycopg.Connection[Any], schema: str, deadline_s: float, every: float = 0.05
) -> float | None:
    """Poll until every job of *schema* is done; return the time.perf_counter() it was seen, or None."""
    end = time.perf_counter() + deadline_s
    while time.perf_counter() < end:
        if count_not_done(conn, schema) == 0:
            return time.perf_counter()
        time.sleep(every)
    return None


def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100), nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))
    return s[k]


def rss_mb() -> float:
    """This process's resident set size in MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def side_by_side(run: Any, rounds: int) -> list[tuple[float, float]]:
    """Run ``run(False, barrier)`` and ``run(True, barrier)`` at the same time, *rounds* times.

    Each returns a rate; both wait on the barrier before they start timing, so the machine's
    load (other processes) weighs on both alike. Return the (False, True) rates of each round.
    """
    pairs: list[tuple[float, float]] = []
    for _ in range(rounds):
        barrier = threading.Barrier(2)
        out: dict[bool, float] = {}

        def one(flag: bool, out: dict[bool, float] = out, barrier: threading.Barrier = barrier) -> None:
            out[flag] = run(flag, barrier)

        threads = [threading.Thread(target=one, args=(flag,)) for flag in (False, True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pairs.append((out[False], out[True]))
    return pairs
