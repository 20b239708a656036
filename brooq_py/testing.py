"""Test your own code against brooq_py: a pytest plugin and helpers (docs/testing.md).

In your ``conftest.py``::

    pytest_plugins = ["brooq_py.testing"]

pytest is imported here, so only a test process imports this module; the rest of brooq_py never does.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
import psycopg.sql
import psycopg_pool
import pytest
from psycopg.conninfo import make_conninfo

from brooq_py import devdb
from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store, migrations
from brooq_py.postgres.operator import stats as ops
from brooq_py.queue import BrooqError, JobRow

__all__ = [
    "DrainReport",
    "aassert_enqueued",
    "ajobs",
    "assert_enqueued",
    "brooq_async_store",
    "brooq_dsn",
    "brooq_schema",
    "brooq_schema_dsn",
    "brooq_schema_setup",
    "brooq_store",
    "drain",
    "jobs",
]

Retries = Literal["now", "wait", "never"]
# brooq_schema_setup's answer: your DDL as SQL text, or setup(conn, schema) run in the test's schema.
SchemaSetup = str | Callable[[psycopg.Connection[Any], str], None]
OUTCOMES = ("done", "failed", "dead", "canceled")


@dataclass(frozen=True)
class DrainReport:
    """What a ``drain`` ran: attempts claimed, and outcomes written by outcome (``failed``: to be
    retried); jobs handed back unrun (a stop) are in ``ran`` only."""

    ran: int = 0
    done: int = 0
    failed: int = 0
    dead: int = 0
    canceled: int = 0

    def __str__(self) -> str:
        return (
            f"ran {self.ran}: {self.done} done, {self.failed} failed, "
            f"{self.dead} dead, {self.canceled} canceled"
        )


def _settled(engine: Engine) -> Counter[str]:
    """The engine's own count of outcomes written, by outcome (its brooq_settle_total)."""
    counts: Counter[str] = Counter()
    for family in engine.metrics.settled.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                counts[sample.labels["outcome"]] += int(sample.value)
    return counts


def drain(
    engine: Engine, *, retries: Retries = "now", timeout: float = 60.0, max_runs: int = 10_000
) -> DrainReport:
    """Run every ready job of *engine*'s topics in this thread until none is left; report the outcomes.

    Each round is ``engine.run_once()`` (claim, handler, outcome, chain, on_succeeded), so the
    engine must not be started. *retries* says what becomes of a job waiting out its backoff, or
    scheduled for later: ``"now"`` (default) makes it due at once, until done or dead; ``"wait"``
    sleeps until it is due, up to *timeout* seconds; ``"never"`` leaves it waiting.

    Raise TimeoutError when ``"wait"`` would pass *timeout*, and BrooqError after *max_runs*
    attempts (a handler that chains itself forever).
    """
    if not isinstance(engine, Engine):
        raise TypeError(f"drain() takes the Engine whose handlers run the jobs, got {type(engine).__name__}")
    if retries not in ("now", "wait", "never"):
        raise ValueError(f"retries must be 'now', 'wait' or 'never', got {retries!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds (0 or more), got {timeout!r}")
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise ValueError(f"max_runs must be an int of at least 1, got {max_runs!r}")
    store: Any = engine.store
    if not isinstance(store, Store):
        raise BrooqError(f"drain() needs an engine on a brooq_py Store, not {type(store).__name__}")
    before = _settled(engine)
    deadline = time.monotonic() + timeout
    ran = 0
    while True:
        if retries == "now":
            store.due_now(engine.topics)
        n = engine.run_once()
        ran += n
        if ran > max_runs:
            raise BrooqError(f"drain() ran {ran} attempts and jobs are still ready (max_runs={max_runs})")
        if n:
            continue
        if retries != "wait":
            break
        due_in = store.worker.next_due(engine.topics)
        if due_in is None:
            break
        if time.monotonic() + max(due_in, 0.0) > deadline:
            raise TimeoutError(
                f"drain(retries='wait'): a job is due in {due_in:.1f}s, past the {timeout}s timeout"
            )
        time.sleep(min(max(due_in, 0.01), 1.0))
    after = _settled(engine)
    return DrainReport(ran, *(after[o] - before[o] for o in OUTCOMES))


# A test's schema holds the test's own jobs: this many is "all of them".
MAX_LISTED = 100_000


def _store_of(store: Any, name: str, asynchronous: bool) -> None:
    """TypeError naming the helper for the other kind of store (or for no store at all)."""
    if isinstance(store, AsyncStore if asynchronous else Store):
        return
    other = {"jobs": "ajobs", "assert_enqueued": "aassert_enqueued"}
    if isinstance(store, Store if asynchronous else AsyncStore):
        hint = f"; use {name[1:]}()" if asynchronous else f"; use {other[name]}()"
    else:
        hint = ""
    want = "an AsyncStore" if asynchronous else "a Store"
    raise TypeError(f"{name}() takes {want}, got {type(store).__name__}{hint}")


def _topic(topic: Any) -> None:
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, got {type(topic).__name__}")


def jobs(store: Store, topic: str | None = None, state: str | None = None) -> list[JobRow]:
    """Return the jobs of *store*'s schema, of *topic* and/or *state* when given, oldest first."""
    _store_of(store, "jobs", asynchronous=False)
    return store.list_jobs(topic, None if state is None else str(state), MAX_LISTED)[::-1]


async def ajobs(store: AsyncStore, topic: str | None = None, state: str | None = None) -> list[JobRow]:
    """``jobs`` for an AsyncStore."""
    _store_of(store, "ajobs", asynchronous=True)
    return (await store.list_jobs(topic, None if state is None else str(state), MAX_LISTED))[::-1]


def _matches(payload: Any, expected: Any) -> bool:
    """True when *expected* is a subset of *payload*: every key of a mapping, recursively; else equal."""
    if isinstance(expected, Mapping):
        return isinstance(payload, Mapping) and all(
            k in payload and _matches(payload[k], v) for k, v in expected.items()
        )
    return bool(payload == expected)


def _check_enqueued(rows: list[JobRow], topic: str, payload: Any, count: int | None) -> list[JobRow]:
    found = [r for r in rows if payload is None or _matches(r.payload, payload)]
    if (found and count is None) or len(found) == count:
        return found
    want = "at least one job" if count is None else f"{count} job(s)"
    of = f"topic {topic!r}" + ("" if payload is None else f" with payload matching {payload!r}")
    seen = "\n".join(f"  {r.id} {r.state} {r.payload!r}" for r in rows[:20]) or "  (none)"
    raise AssertionError(f"expected {want} of {of}, found {len(found)}; jobs of the topic:\n{seen}")


def assert_enqueued(store: Store, topic: str, payload: Any = None, count: int | None = 1) -> list[JobRow]:
    """Assert that exactly *count* jobs of *topic* (any number >= 1 when None) match *payload*; return them.

    *payload* matches as a subset: ``{"user_id": 42}`` matches a job whose
    payload is ``{"user_id": 42, "lang": "fr"}``; nested mappings likewise.
    """
    _store_of(store, "assert_enqueued", asynchronous=False)
    _topic(topic)
    return _check_enqueued(jobs(store, topic), topic, payload, count)


async def aassert_enqueued(
    store: AsyncStore, topic: str, payload: Any = None, count: int | None = 1
) -> list[JobRow]:
    """``assert_enqueued`` for an AsyncStore."""
    _store_of(store, "aassert_enqueued", asynchronous=True)
    _topic(topic)
    return _check_enqueued(await ajobs(store, topic), topic, payload, count)


class _PerUsePool(psycopg_pool.AsyncConnectionPool[Any]):
    """An async pool that connects per use: a fixture cannot know the test's event loop, and this
    pool has no background task tied to one."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, open=False)
        self._dsn = dsn

    async def getconn(self, timeout: float | None = None) -> Any:
        return await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)

    async def putconn(self, conn: Any) -> None:
        await conn.close()


@pytest.fixture(scope="session")
def brooq_dsn() -> Iterator[str]:
    """A PostgreSQL DSN for the session (DATABASE_URL, else 127.0.0.1:5432, else a throwaway server)."""
    db = devdb.acquire()
    try:
        yield db.dsn
    finally:
        db.close()


@pytest.fixture
def brooq_schema_setup() -> SchemaSetup | None:
    """Your own tables in each test's schema: override this fixture (conftest.py or a test module).

    Return SQL text (your DDL) or a callable ``setup(conn, schema)``, or None (default) for none; it
    runs after brooq's migrations, in one transaction on the test's ``search_path``, so unqualified
    names land in the test's schema and are dropped with it.
    """
    return None


def _set_up(dsn: str, schema: str, setup: SchemaSetup) -> None:
    with psycopg.connect(dsn) as conn:  # one transaction: committed on a clean exit
        conn.execute(psycopg.sql.SQL("SET LOCAL search_path = {}").format(psycopg.sql.Identifier(schema)))
        if isinstance(setup, str):
            conn.execute(setup.encode())  # as psql would run it: no parameters
        else:
            setup(conn, schema)


@pytest.fixture
def brooq_schema(brooq_dsn: str, brooq_schema_setup: SchemaSetup | None) -> Iterator[str]:
    """A schema of the test's own, migrated to head (then ``brooq_schema_setup``'s tables added),
    dropped with everything in it afterwards."""
    name = "brooq_test_" + uuid.uuid4().hex[:16]
    migrations.upgrade(brooq_dsn, schema=name)
    try:
        if brooq_schema_setup is not None:
            _set_up(brooq_dsn, name, brooq_schema_setup)
        yield name
    finally:
        with psycopg.connect(brooq_dsn, autocommit=True) as conn:
            ops.run(conn, "schema_drop", name)


@pytest.fixture
def brooq_schema_dsn(brooq_dsn: str, brooq_schema: str) -> str:
    """``brooq_dsn`` with ``search_path`` set to ``brooq_schema``: give it to your own code, whose
    unqualified table names then mean the test's tables."""
    return make_conninfo(brooq_dsn, options=f"-c search_path={brooq_schema}")


@pytest.fixture
def brooq_store(brooq_dsn: str, brooq_schema: str) -> Iterator[Store]:
    """A Store on ``brooq_schema`` with a pool of its own (closed afterwards)."""
    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        brooq_dsn, min_size=1, max_size=4, open=True
    )
    store = Store(pool, schema=brooq_schema)
    try:
        yield store
    finally:
        store.close()
        pool.close()


@pytest.fixture
def brooq_async_store(brooq_dsn: str, brooq_schema: str) -> AsyncStore:
    """An AsyncStore on ``brooq_schema``; usable from any event loop (a connection per call)."""
    return AsyncStore(_PerUsePool(brooq_dsn), schema=brooq_schema)
