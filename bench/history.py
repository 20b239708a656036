"""W10H: the hot path beside a terminal history in tables of a day each (SPEC B2), vs none.

Two schemas hold the same active (pending) rows; one also ``terminal`` ended rows spread over
``days`` tables of history (written by generate_series, as W10 writes its big table). Claim (one
job), settle (one outcome) and heartbeat (100 leases) run interleaved on both, then an engine
drains the active rows of each, then workflows (a parent and a child after it: the release
trigger's functions read the job table alone, migration 0024). Then retention's two writes at
that scale: the drop of one day's table (seconds, and the job table's deleted row versions:
none), and the mover's pace (rows of the job table ended an hour ago moved to their day, rows a
second).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
from big_table import interleaved
from psycopg import sql
from util import fresh_schema, job_table, store_on
from workloads import LEASE

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job

TOPIC = "w10h"
DRAIN = "w10h.drain"  # the drains' own topic: the rows of TOPIC left by the interleaved loop wait


def _fill_active(conn: psycopg.Connection[Any], schema: str, active: int, topic: str = TOPIC) -> None:
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (topic, payload, state, available_at)"
            " SELECT %s, '{{\"n\": 1}}', 'pending', now() - interval '1 minute' + i * interval '1 microsecond'"
            " FROM generate_series(1, %s) AS i"
        ).format(job_table(schema)),
        (topic, active),
    )


def _fill_history(
    store: Store, conn: psycopg.Connection[Any], schema: str, terminal: int, days: int
) -> list[str]:
    """*terminal* ended rows, as many a day over the *days* days before today (UTC)."""
    (today,) = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone() or (None,)
    names = [(today - timedelta(days=d)).strftime("%Y%m%d") for d in range(1, days + 1)]
    store.worker.history.create(names)
    per_day = terminal // days
    for d, name in enumerate(names, start=1):
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (topic, payload, state, attempts, available_at, created_at, updated_at)"
                " SELECT 't' || (i %% 20), '{{\"n\": 1}}', (ARRAY['done', 'done', 'done', 'dead', 'canceled'])[1 + i %% 5],"
                " 1, t, t, t FROM (SELECT i, %s::date::timestamp AT TIME ZONE 'UTC' + i * %s::interval AS t"
                " FROM generate_series(0, %s - 1) AS i) AS g"
            ).format(sql.Identifier(schema, "job_history_" + name)),
            (today - timedelta(days=d), timedelta(seconds=86000 / max(per_day, 1)), per_day),
        )
    return names


def _ms(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t0)


def _noop(ctx: Any, claim: Any) -> None:
    return None


def _drain(store: Store, conn: psycopg.Connection[Any], schema: str, n: int, topic: str = DRAIN) -> float:
    """Jobs a second of one engine (4 workers) draining the *n* pending rows of *topic*."""
    engine = Engine(store, Config(workers=4, lease=LEASE))
    engine.register_kind(topic, _noop)
    query = sql.SQL("SELECT count(*) FROM ONLY {} WHERE topic = %s AND state <> 'done'").format(
        job_table(schema)
    )
    t0 = time.perf_counter()
    engine.start()
    try:
        while (conn.execute(query, (topic,)).fetchone() or (0,))[0] > 0:
            if time.perf_counter() - t0 > max(120.0, n / 100):
                raise RuntimeError(f"W10H: {topic} not drained in time")
            time.sleep(0.05)
        return n / (time.perf_counter() - t0)
    finally:
        engine.stop()
        engine.close()


def _drain_workflows(
    store: Store, conn: psycopg.Connection[Any], schema: str, pairs: int, topic: str
) -> float:
    """``_drain`` of *pairs* parents, each with a child after it: each parent's end runs the
    workflow's release trigger (job_parent_ended) on the job table."""
    for i in range(pairs):
        parent = store.enqueue(Job(topic, {"n": i}))
        store.enqueue(Job(topic, {"n": i}, after=[parent.id]))
    return _drain(store, conn, schema, 2 * pairs, topic)


def _deleted(conn: psycopg.Connection[Any], schema: str) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT n_tup_del FROM pg_stat_user_tables WHERE relid = %s::regclass", (f'"{schema}".job',)
    ).fetchone()
    return int(row[0]) if row else 0


def w10_history(
    dsn: str,
    terminal: int,
    active: int,
    days: int = 30,
    n: int = 300,
    drain_n: int = 20_000,
    move_n: int = 100_000,
    flow_pairs: int = 1_000,
) -> dict[str, Any]:
    out: dict[str, Any] = {"terminal": terminal, "days": days, "active": active, "ops": n}
    worker = "bench:w10h"
    with (
        fresh_schema(dsn, "w10hf") as fresh_s,
        fresh_schema(dsn, "w10hh") as hist_s,
        store_on(dsn, fresh_s, max_size=6) as fresh,
        store_on(dsn, hist_s, max_size=6) as hist,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        t0 = time.perf_counter()
        names = _fill_history(hist, conn, hist_s, terminal, days)
        for s in (fresh_s, hist_s):
            _fill_active(conn, s, active)
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(s)))
        out["fill_s"] = round(time.perf_counter() - t0, 1)
        stores = {"fresh": fresh, "hist": hist}
        out.update(interleaved(stores, n, worker, TOPIC))
        out["ratios_p50"] = {
            what: out["hist"][f"{what}_p50_ms"] / out["fresh"][f"{what}_p50_ms"]
            for what in ("claim", "settle", "renew")
        }
        # the engine's drain of the same pending rows: each schema twice, in the order a, b, b, a
        rates: dict[str, list[float]] = {"fresh": [], "hist": []}
        schemas = {"fresh": fresh_s, "hist": hist_s}
        for label in ("fresh", "hist", "hist", "fresh"):
            _fill_active(conn, schemas[label], drain_n // 2, DRAIN)
            rates[label].append(_drain(stores[label], conn, schemas[label], drain_n // 2))
        drains = {label: sum(r) / len(r) for label, r in rates.items()}
        out["drain_per_s"] = drains
        out["drain_ratio"] = drains["hist"] / drains["fresh"]
        # workflows: a parent's end releases its child through the triggers' functions (ONLY job)
        flows: dict[str, list[float]] = {"fresh": [], "hist": []}
        for i, label in enumerate(("fresh", "hist", "hist", "fresh")):
            flows[label].append(
                _drain_workflows(stores[label], conn, schemas[label], flow_pairs, f"w10h.wf{i}")
            )
        out["workflow_per_s"] = {label: sum(r) / len(r) for label, r in flows.items()}
        out["workflow_ratio"] = out["workflow_per_s"]["hist"] / out["workflow_per_s"]["fresh"]
        # the drop of the oldest day, as retention drops it
        before = _deleted(conn, hist_s)
        t0 = time.perf_counter()
        dropped = hist.drop_history(timedelta(days=days - 1))
        out["drop"] = {"seconds": round(time.perf_counter() - t0, 3), "days": dropped}
        time.sleep(1.0)  # the statistics of the drop's backend
        out["drop"]["job_rows_deleted"] = _deleted(conn, hist_s) - before
        # the mover's pace: rows ended an hour ago moved to today's table
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (topic, payload, state, attempts, available_at, updated_at)"
                " SELECT 'm', '{{\"n\": 1}}', 'done', 1, now(), now() - interval '1 hour' + i * interval '1 microsecond'"
                " FROM generate_series(1, %s) AS i"
            ).format(job_table(hist_s)),
            (move_n,),
        )
        t0 = time.perf_counter()
        moved = 0
        while batch := hist.move_terminal(timedelta(seconds=1), timedelta(days=days), 1000):
            moved += len(batch)
        seconds = time.perf_counter() - t0
        out["move"] = {
            "rows": moved,
            "seconds": round(seconds, 2),
            "per_s": round(moved / seconds) if seconds else None,
        }
        out["history_tables"] = len(names)
    return out
