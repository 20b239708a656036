"""A page view costs the database a bounded number of index scans and no sequential scan (SPEC S4, Z2).

Read from pg_stat_user_tables around real page views of a dashboard on a
table of 30,000 jobs in several states. The Store runs on a pool of one
connection, so forcing that connection's statistics out is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.http.server import ThreadedUvicorn
from brooq_py.postgres import Store
from brooq_py.postgres.operator.overview import SEARCH_SCAN, Overview
from brooq_py.queue import Job
from brooq_py.web import dashboard
from tests.polling import wait_for
from tests.web.conftest import TOKEN, Board

TOPICS = ("cost.a", "cost.b", "cost.c")


@pytest.fixture
def one_conn_store(dsn: str, schema: str) -> Iterator[tuple[Store, ConnectionPool[Any]]]:
    pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=1, open=True)
    store = Store(pool, schema=schema)
    try:
        yield store, pool
    finally:
        store.close()
        pool.close()


def fill(conn: psycopg.Connection[Any], schema: str) -> None:
    job = sql.Identifier(schema, "job")
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (topic, payload, state, attempts, available_at, updated_at, last_error) "
            "SELECT (%s::text[])[1 + n %% 3], jsonb_build_object('n', n), "
            "CASE WHEN n %% 10 < 6 THEN 'done' WHEN n %% 10 < 8 THEN 'pending' WHEN n %% 10 = 8 THEN 'dead' "
            "ELSE 'canceled' END, 1, now() - interval '2 hours', now() - (n %% 7200) * interval '1 second', "
            "CASE WHEN n %% 10 = 8 THEN 'RuntimeError: boom' END "
            "FROM generate_series(1, 30000) AS n"
        ).format(job),
        (list(TOPICS),),
    )
    conn.execute(sql.SQL("ANALYZE {}").format(job))


def scans(dsn: str, schema: str, pool: ConnectionPool[Any]) -> tuple[int, int]:
    """Return (seq_scan, idx_scan) of the job table, after the Store's connection flushed its statistics."""
    with pool.connection() as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'job'",
            (schema,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def settled(dsn: str, schema: str, pool: ConnectionPool[Any]) -> tuple[int, int]:
    """Scans once two reads in a row agree (the flush of the last idle transaction has landed)."""
    last: list[tuple[int, int]] = []

    def same() -> bool:
        last.append(scans(dsn, schema, pool))
        return len(last) > 1 and last[-1] == last[-2]

    wait_for(same, "pg_stat_user_tables to settle", interval=0.2)
    return last[-1]


def test_z2_a_page_view_costs_a_bounded_number_of_index_scans(
    dsn: str, schema: str, one_conn_store: tuple[Store, ConnectionPool[Any]]
) -> None:
    store, pool = one_conn_store
    with pool.connection() as conn:
        fill(conn, schema)
    # The topic counts are cached for cache_seconds (2 s by default, or five times the last read):
    # ten minutes here, so that the second view still finds them cached after the settling reads
    # of pg_stat_user_tables around the first, which take seconds on a busy machine.
    server = ThreadedUvicorn(dashboard(store, token=TOKEN, cache_seconds=600), "127.0.0.1", 0)
    try:
        board = Board(f"http://127.0.0.1:{server.address[1]}", server.address[1])
        job_id = Overview(store).jobs(None, "dead", limit=1).jobs[0].id
        costs: dict[str, tuple[int, int]] = {}
        for name, path in (
            ("topics", "/"),
            ("topics again (cached)", "/topics.rows"),
            ("pending page", f"/jobs?topic={TOPICS[0]}&state=pending"),
            ("done page", f"/jobs?topic={TOPICS[1]}&state=done"),
            ("dead page", "/dead"),
            ("job page", f"/jobs/{job_id}"),
            ("pending search", f"/jobs?topic={TOPICS[0]}&state=pending&payload=%7B%22n%22%3A3%7D"),
            ("dead search", "/dead?payload=%7B%22n%22%3A3%7D"),
        ):
            before = settled(dsn, schema, pool)
            reply = board.request("GET", path, token=TOKEN)
            assert reply.status == 200, (path, reply.body[:300])
            after = settled(dsn, schema, pool)
            costs[name] = (after[0] - before[0], after[1] - before[1])
    finally:
        server.close()
    assert all(seq == 0 for seq, _ in costs.values()), costs
    # The overview: a skip scan per topic (and one over parked jobs), four capped counts and a few
    # priority probes per topic, and the last hour from the retention index: bounded by the topics,
    # never by the 30,000 rows.
    assert 1 <= costs["topics"][1] <= 8 + 10 * len(TOPICS), costs
    assert costs["topics again (cached)"] == (0, 0), costs
    for page in ("pending page", "done page", "dead page", "job page"):
        assert 1 <= costs[page][1] <= 2, costs
    # A payload search: the listing's window of SEARCH_SCAN rows (one index scan), then one
    # primary key probe per row of it: bounded by the window, never by the 30,000 rows (the
    # margin of 2 is for a late statistics flush of the page before, as the settling allows).
    for page in ("pending search", "dead search"):
        assert 2 <= costs[page][1] <= 1 + SEARCH_SCAN + 2, costs


def test_the_tenants_page_costs_index_scans_bounded_by_its_tenants(
    dsn: str, schema: str, one_conn_store: tuple[Store, ConnectionPool[Any]]
) -> None:
    """SPEC T1-T3: a topic's tenants page reads the tenant index a few times a tenant (a skip scan,
    two counts), never the 30,000 rows nor the 6,000 jobs of the tenants: no sequential scan."""
    store, pool = one_conn_store
    tenants = 20
    with pool.connection() as conn:
        fill(conn, schema)
    store.enqueue_many([Job("cost.t", {"n": n}, tenant=f"t{n % tenants}") for n in range(6000)])
    store.enqueue_many([Job("cost.t", {"n": n}) for n in range(50)])  # the tenant of no name
    with pool.connection() as conn:
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "job")))
    server = ThreadedUvicorn(dashboard(store, token=TOKEN), "127.0.0.1", 0)
    try:
        board = Board(f"http://127.0.0.1:{server.address[1]}", server.address[1])
        before = settled(dsn, schema, pool)
        reply = board.request("GET", "/topics/cost.t/tenants", token=TOKEN)
        assert reply.status == 200 and reply.body.count("<tr data-tenant=") == tenants + 1, reply.body[:500]
        after = settled(dsn, schema, pool)
    finally:
        server.close()
    seq, idx = after[0] - before[0], after[1] - before[1]
    assert seq == 0, (seq, idx)
    assert 1 <= idx <= 8 + 3 * tenants, (seq, idx)
