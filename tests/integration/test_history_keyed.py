"""SPEC B2 with E1: keys beside the history ({live}): a keyed job retried and ended again never
moves and its key holds; psql cannot put a key on a row of the history."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.history import AFTER, TTL, ended, move, where

LEASE = timedelta(seconds=60)


def test_b2_a_keyed_job_retried_and_ended_again_never_moves_and_its_key_holds(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    first = store.enqueue(Job("k", {"n": 1}, idempotency_key="key"))
    ended(dsn, schema, [first.id], "dead", days_ago=1)
    assert move(store) == []
    assert store.retry(first.id)
    ended(dsn, schema, [first.id], "done", days_ago=1)
    fresh = Store(pool, schema=schema)
    assert fresh.move_terminal(AFTER, TTL, 10) == []
    fresh.close()
    assert where(pool, schema, first.id) == "job"
    again = store.enqueue(Job("k", {"n": 2}, idempotency_key="key"))
    assert again.id == first.id and not again.created
    assert [i for i, _ in store.delete_terminal(timedelta(hours=1), 10)] == [first.id]
    assert store.enqueue(Job("k", {"n": 3}, idempotency_key="key")).created


def test_b2_psql_cannot_put_a_key_on_a_row_of_the_history(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    moved = store.enqueue(Job("k", {})).id
    ended(dsn, schema, [moved], "done", days_ago=1)
    assert move(store)
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            sql.SQL("UPDATE {} SET idempotency_key = 'k' WHERE id = %s").format(
                sql.Identifier(schema, "job")
            ),
            (moved,),
        )
