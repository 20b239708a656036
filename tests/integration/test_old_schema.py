"""The code of this round against a schema of the previous one (migrated up to 0009 only)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store, WrapTx, migrations
from brooq_py.queue import BrooqError, Job
from tests.conftest import drop_schema

PREVIOUS = "0009"


@pytest.fixture
def old_schema(dsn: str) -> Iterator[str]:
    name = "t_" + uuid.uuid4().hex
    migrations.upgrade(dsn, schema=name, revision=PREVIOUS)
    try:
        yield name
    finally:
        drop_schema(dsn, name)


def test_an_engine_refuses_a_schema_of_the_previous_round_naming_the_fix(
    pool: ConnectionPool[Any], old_schema: str, engines: Callable[..., Engine]
) -> None:
    """Its claims read columns of 0010 (rate limits): started, it would fail every poll."""
    e = engines(Store(pool, schema=old_schema))
    e.register_kind("t", lambda ctx, claim: None)
    with pytest.raises(BrooqError, match=f"at migration {PREVIOUS}.*migrate up --schema {old_schema}"):
        e.start()
    assert not e.running


def test_a_producer_on_a_schema_older_than_0010_is_refused_naming_the_fix_and_writes_nothing(
    pool: ConnectionPool[Any], old_schema: str, dsn: str
) -> None:
    """Every enqueue writes Job.meta (a column of 0010): on an older schema each form is refused
    with the command that fixes it, nothing is written, and a caller's transaction stays the
    caller's to roll back."""
    store = Store(pool, schema=old_schema)
    fix = f"older than this brooq_py.*migrate up --schema {old_schema}"
    try:
        with pytest.raises(BrooqError, match=fix):
            store.enqueue(Job("t", {"i": 1}))
        with pytest.raises(BrooqError, match=fix):
            store.enqueue(Job("t", {"i": 2}, idempotency_key="k"))
        with pytest.raises(BrooqError, match=fix):
            store.enqueue_many([Job("t", {}), Job("t", {}, idempotency_key="k")])
        with psycopg.connect(dsn) as conn:
            with pytest.raises(BrooqError, match=fix):
                store.enqueue_tx(WrapTx(conn), Job("t", {"i": 4}))
            conn.rollback()
            conn.execute("SELECT 1")  # the caller's connection is usable again
        with pool.connection() as conn:
            (n,) = conn.execute(f'SELECT count(*) FROM "{old_schema}".job').fetchone() or (None,)
        assert n == 0
    finally:
        store.close()
