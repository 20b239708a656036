"""Idempotency keys beside a terminal history (SPEC B2, E1, S4): a job with a key never moves, so a
lookup by key never reads a day's table; the tables of history refuse a key (a check the planner
also uses to leave them out of a psql lookup by key)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.history import days, ended, move

ROWS = 20_000


def fill_history(dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]) -> str:
    """One day of history of ROWS ended jobs without keys, analyzed; its table's name."""
    seed = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [seed], "done", days_ago=1)
    assert move(store)
    (table,) = days(pool, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {t} (id, topic, payload, state, updated_at)"
                " SELECT gen_random_uuid(), 'h', '{{}}', 'done', now() - interval '1 day'"
                " FROM generate_series(1, %s)"
            ).format(t=sql.SQL(table)),
            (ROWS,),
        )
        conn.execute(sql.SQL("ANALYZE {}").format(sql.SQL(table)))
    return table


def test_b2_e1_a_key_holds_beside_the_history_and_its_lookup_reads_no_day(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    first = store.enqueue(Job("h", {"n": 1}, idempotency_key="k1"))
    table = fill_history(dsn, schema, store, pool)
    again = store.enqueue(Job("h", {"n": 2}, idempotency_key="k1"))
    assert again.id == first.id and not again.created
    store.set_max_depth("h", 1_000_000)  # a capped topic's batch probes each job's key
    batch = store.enqueue_many([Job("h", {"n": 3}, idempotency_key="k1"), Job("h", {"n": 4})])
    assert batch[0].id == first.id and not batch[0].created and batch[1].created
    with psycopg.connect(dsn, autocommit=True) as conn:
        plan = "\n".join(
            str(r[0])
            for r in conn.execute(
                sql.SQL("EXPLAIN SELECT id FROM {} WHERE topic = %s AND idempotency_key = %s").format(
                    sql.Identifier(schema, "job")
                ),
                ("h", "k1"),
            ).fetchall()
        )
    assert table.split(".")[-1].strip('"') not in plan, plan


def test_b2_a_table_of_history_refuses_a_job_with_a_key(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    table = fill_history(dsn, schema, store, pool)
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (topic, payload, state, idempotency_key) VALUES ('h', '{{}}', 'done', 'k')"
            ).format(sql.SQL(table))
        )
