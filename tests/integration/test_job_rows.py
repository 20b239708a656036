"""Every read that returns JobRow fills every field as ``get()`` does (SPEC R0).

The job read here failed once, then succeeded with a value: it has a result, an
attempt history, meta, parents and progress, which a listing once left empty.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from brooq_py import testing
from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store
from brooq_py.queue import Claim, Context, Job, JobRow, State
from tests.integration.conftest import q
from tests.integration.test_async_store import open_pool
from tests.integration.test_cli_operator import cli


@pytest.fixture
def full_row(store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]) -> JobRow:
    """A job with every JobRow field set: failed once, then done with a result."""
    engine = engines()

    def handler(ctx: Context, claim: Claim) -> Any:
        if claim.attempt == 1:
            raise RuntimeError("first attempt fails")
        return {"value": 42, "payload": claim.payload}

    engine.register_kind("parent", lambda ctx, claim: "p")
    engine.register_kind("rows", handler)
    parent = store.enqueue(Job("parent")).id
    job_id = store.enqueue(Job("rows", {"n": 1}, meta={"origin": "test"}, after=[parent])).id
    testing.drain(engine)
    # progress is written with lease renewals (V4), which a drain does not run
    q(pool, schema, "UPDATE {job} SET progress = 0.5, progress_note = 'half' WHERE id = %s", job_id)
    row = store.get(job_id)
    assert row is not None and row.state is State.DONE and row.attempts == 2
    assert row.result == {"value": 42, "payload": {"n": 1}}
    assert [e.attempt for e in row.errors] == [1] and "first attempt fails" in row.errors[0].error
    assert row.meta == {"origin": "test"} and row.parents == (parent,)
    assert row.progress == 0.5 and row.progress_note == "half"
    return row


def test_r0_store_list_jobs_fills_every_field(store: Store, full_row: JobRow) -> None:
    assert store.list_jobs("rows") == [full_row]
    listed = store.list_jobs()  # unfiltered: the parent too, each as get() reads it
    assert full_row in listed and all(row == store.get(row.id) for row in listed)


def test_r0_async_store_list_jobs_fills_every_field(dsn: str, schema: str, full_row: JobRow) -> None:
    async def read() -> list[JobRow]:
        pool = await open_pool(dsn, max_size=2)
        try:
            return await AsyncStore(pool, schema=schema).list_jobs("rows")
        finally:
            await pool.close()

    assert asyncio.run(read()) == [full_row]


def test_r0_testing_jobs_fills_every_field(store: Store, full_row: JobRow) -> None:
    assert testing.jobs(store, "rows") == [full_row]


def test_r0_cli_jobs_json_fills_every_field(
    store: Store, dsn: str, schema: str, tmp_path: Path, full_row: JobRow
) -> None:
    code, out, err = cli(dsn, schema, tmp_path, "jobs", "--topic", "rows", "--json")
    assert code == 0, err
    assert [json.loads(line) for line in out.splitlines()] == [full_row.to_json()]


@pytest.mark.parametrize("limit", [-1, 2.5, True, "3"])
def test_r0_list_jobs_refuses_a_limit_that_is_no_count(store: Store, limit: object) -> None:
    """A negative limit answered [] as if no job were there; a float or text was cut or failed late."""
    store.enqueue(Job("t", 1))
    with pytest.raises(ValueError, match="limit"):
        store.list_jobs("t", limit=limit)  # type: ignore[arg-type]
    assert store.list_jobs("t", limit=0) == []
    assert len(store.list_jobs("t", limit=1)) == 1
