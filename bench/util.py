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
# Head without the sequences' triggers (migration 0018): what jobs without a sequence would pay without them.
NO_SEQUENCES = "head-no-sequences"
_DROPPED = {
    NO_RELEASE: ("job_parent_ended",),
    NO_SEQUENCES: ("job_sequence_enqueued", "job_sequence_retried", "job_sequence_ended"),
}


@contextlib.contextmanager
def fresh_schema(dsn: str, prefix: str, revision: str = "head") -> Iterator[str]:
    """A schema migrated to *revision* (default head; NO_RELEASE: head without the release
    trigger) by the real migrations, dropped afterwards."""
    name = f"bench_{prefix}_{uuid.uuid4().hex[:10]}"
    migrations.upgrade(
        dsn, schema=name, revision="head" if revision in (NO_RELEASE, NO_SEQUENCES) else revision
    )
    if revision in (NO_RELEASE, NO_SEQUENCES):
        with psycopg.connect(dsn, autocommit=True) as conn:
            for trigger in _DROPPED[revision]:
                conn.execute(
                    sql.SQL("DROP TRIGGER {} ON {}").format(
                        sql.Identifier(trigger), sql.Identifier(name, "job")
                    )
                )
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


def raw_insert(conn: psycopg.Connection[Any], schema: str) -> sql.Composed:
    """W1's baseline: a table LIKE *schema*'s job table (defaults, constraints and indexes, no
    trigger) made on *conn*, and the INSERT of one job row into it (parameters: id, topic, payload)."""
    like = sql.Identifier(schema, "raw_job")
    conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(like, job_table(schema)))
    return sql.SQL(
        "INSERT INTO {} (id, topic, payload, idempotency_key, available_at, priority, state)"
        " VALUES (%s, %s, %s::jsonb, NULL, statement_timestamp(), 0, 'pending')"
    ).format(like)


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


# --- row versions written to the job table (SPEC W0) ------------------------------------------------

# The tables that hold the Store's job rows: `job` itself, its partitions (inheritance
# descendants), and, should `job` be a view over a hot table and a history, the tables its rule
# reads, with their partitions. Counters of pg_stat_user_tables: n_tup_upd includes HOT updates.
_JOB_TABLES = """
WITH RECURSIVE named AS (
    SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relname = 'job'
), read_by_view AS (
    SELECT DISTINCT d.refobjid AS oid
    FROM pg_rewrite r
    JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
        AND d.refclassid = 'pg_class'::regclass
    JOIN pg_class t ON t.oid = d.refobjid AND t.relkind IN ('r', 'p')
    WHERE r.ev_class IN (SELECT oid FROM named)
), tree AS (
    SELECT oid FROM named UNION SELECT oid FROM read_by_view
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.oid
)
SELECT s.relname, s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del
FROM pg_stat_user_tables s WHERE s.relid IN (SELECT oid FROM tree) ORDER BY s.relname
"""


def job_counters(conn: psycopg.Connection[Any], schema: str) -> dict[str, dict[str, int]]:
    """pg_stat_user_tables' write counters of the job tables of *schema*, by table.

    Flushes this connection's own pending counters first (pg_stat_force_next_flush, PG 15) and
    drops the statistics snapshot, so the figures are the ones other backends flushed so far.
    """
    if conn.info.server_version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute(_JOB_TABLES, {"schema": schema}).fetchall()
    return {
        str(name): {"ins": int(ins), "upd": int(upd), "hot_upd": int(hot), "del": int(dele)}
        for name, ins, upd, hot, dele in rows
    }


def settled_counters(
    conn: psycopg.Connection[Any], schema: str, quiet_s: float = 1.5, timeout_s: float = 15.0
) -> dict[str, dict[str, int]]:
    """job_counters once they stopped moving for *quiet_s* (other backends flush with a delay:
    within a second of going idle, up to 10 s when they flushed just before, at once on exit)."""
    last = job_counters(conn, schema)
    still_since = time.monotonic()
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        time.sleep(0.25)
        now = job_counters(conn, schema)
        if now != last:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= quiet_s:
            break
    return last


def versions_per_job(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], jobs: int
) -> dict[str, Any]:
    """Row versions written per job between two job_counters readings: inserts + updates
    (HOT included, n_tup_upd counts them) + deletes, over every job table."""
    delta: dict[str, int] = {"ins": 0, "upd": 0, "hot_upd": 0, "del": 0}
    for name, now in after.items():
        was = before.get(name, {})
        for k in delta:
            delta[k] += now[k] - was.get(k, 0)
    versions = delta["ins"] + delta["upd"] + delta["del"]
    return {
        "jobs": jobs,
        "tables": sorted(after),
        **delta,
        "versions": versions,
        "per_job": round(versions / jobs, 4) if jobs else None,
    }
