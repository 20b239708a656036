"""The code of this round against a schema of the previous one (migrated up to 0009 only)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store, migrations
from brooq_py.queue import BrooqError
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
