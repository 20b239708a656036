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


def test_a_producer_on_a_schema_of_the_previous_round_still_enqueues_plain_and_keyed_jobs(
    pool: ConnectionPool[Any], old_schema: str, dsn: str
) -> None:
    """Producers deployed before ``migrate up``: what the previous round's code could enqueue, this
    code still can (the depth caps it reads first are none there), in the caller's transaction too."""
    store = Store(pool, schema=old_schema)
    try:
        assert store.enqueue(Job("t", {"i": 1})).created
        k = store.enqueue(Job("t", {"i": 2}, idempotency_key="k"))
        assert store.enqueue(Job("t", {"i": 3}, idempotency_key="k")) == (k.id, False)
        assert [r.created for r in store.enqueue_many([Job("t", {}), Job("t", {}, idempotency_key="k")])] == [
            True,
            False,
        ]
        with psycopg.connect(dsn) as conn:
            r = store.enqueue_tx(WrapTx(conn), Job("t", {"i": 4}))
            conn.execute("SELECT 1")  # the caller's transaction is still usable
            conn.commit()
        assert store.get(r.id) is not None
    finally:
        store.close()
