"""Shared fixtures: a real PostgreSQL, a fresh migrated schema per test, a pool and a Store.

Every test that touches the database gets its own schema, built by the real
migrations and dropped afterwards; nothing is written into ``public``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from brooq_py import devdb as devdb_module
from brooq_py.postgres import Store, migrations

_devdb: devdb_module.DevDatabase | None = None


def _acquire() -> devdb_module.DevDatabase:
    global _devdb
    if _devdb is None:
        _devdb = devdb_module.acquire()
    return _devdb


def pytest_report_header(config: pytest.Config) -> str:
    try:
        db = _acquire()
    except Exception as exc:
        return f"brooq_py database: unavailable ({type(exc).__name__})"
    return f"brooq_py database: {db.how} {devdb_module.mask_dsn(db.dsn)}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _devdb
    if _devdb is not None:
        _devdb.close()
        _devdb = None


@pytest.fixture(scope="session")
def devdb() -> devdb_module.DevDatabase:
    """The database of the session (brooq_py.devdb.acquire()), closed at session end."""
    return _acquire()


@pytest.fixture(scope="session")
def dsn(devdb: devdb_module.DevDatabase) -> str:
    return devdb.dsn


def ddl_dsn(dsn: str) -> str:
    """*dsn* for a test's schema DDL (migrate, drop): its commits need no WAL flush, since a
    crashed test server loses the whole test anyway. The tests' own connections keep the
    server's setting: what they commit is what users commit."""
    options = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=f"{options} -c synchronous_commit=off".strip())


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(ddl_dsn(dsn), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    """A fresh schema migrated to head by the real migrations, dropped after the test."""
    name = "t_" + uuid.uuid4().hex
    migrations.upgrade(ddl_dsn(dsn), schema=name)
    try:
        yield name
    finally:
        drop_schema(dsn, name)


@pytest.fixture
def pool(dsn: str) -> Iterator[ConnectionPool[Any]]:
    p: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=8, open=True)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def store(pool: ConnectionPool[Any], schema: str) -> Iterator[Store]:
    s = Store(pool, schema=schema)
    try:
        yield s
    finally:
        s.close()
