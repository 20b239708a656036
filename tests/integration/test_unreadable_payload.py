"""A payload psql wrote that Python's json cannot read back (SPEC E4', L5').

jsonb holds numbers Python's int does not read as jsonb gives them back (``1e5000`` comes back as
an integer of 5,001 digits) and nesting deeper than json's recursion. The Store refuses both at
enqueue; psql does not. Such a row used to fail every statement that read it: ``get`` raised
ValueError, the CLI printed a traceback, and each claim that took it failed whole, so the jobs
claimed beside it were handed to the reaper again and again until their crash count made them dead.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job, State, UnreadablePayload
from tests.integration.conftest import q
from tests.integration.test_cli import run_cli
from tests.integration.test_durable_steps import ended

HUGE = '{"n": 1e5000}'
DEEP = "[" * 3000 + "]" * 3000


def _psql_insert(pool: ConnectionPool[Any], schema: str, topic: str, payload: str) -> str:
    (row,) = q(
        pool,
        schema,
        "INSERT INTO {job} (topic, payload) VALUES (%s, %s::jsonb) RETURNING id::text",
        topic,
        payload,
    )
    return str(row[0])


def test_e4_a_row_psql_wrote_beyond_pythons_json_is_read_as_its_text(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, tmp_path: Path
) -> None:
    huge = _psql_insert(pool, schema, "t", HUGE)
    deep = _psql_insert(pool, schema, "t", DEEP)
    row = store.get(huge)
    assert row is not None and isinstance(row.payload, UnreadablePayload)
    assert (
        row.payload.startswith('{"n": 1000') and len(row.payload) > 5000 and "ValueError" in row.payload.error
    )
    deep_row = store.get(deep)
    assert deep_row is not None and isinstance(deep_row.payload, UnreadablePayload)
    assert "RecursionError" in deep_row.payload.error
    assert {r.id for r in store.list_jobs(topic="t")} == {huge, deep}
    assert copy.deepcopy(row) == row and pickle.loads(pickle.dumps(row)).payload.error == row.payload.error
    for args in (["get", huge], ["jobs", "--topic", "t"]):
        p = run_cli(*args, "--schema", schema, dsn=dsn, cwd=tmp_path)
        assert p.returncode == 0 and "Traceback" not in p.stderr, (args, p.stderr[-400:])


def test_l5_a_claimed_row_beyond_pythons_json_ends_dead_and_the_jobs_beside_it_run(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    ran: list[Any] = []
    huge = _psql_insert(pool, schema, "w", HUGE)
    good = [store.enqueue(Job("w", {"fine": i})).id for i in range(5)]
    e = engines(workers=4, claim_batch=8)
    e.register_kind("w", lambda ctx, claim: ran.append(claim.payload))
    e.start()
    for job_id in good:
        assert ended(store, job_id).state == State.DONE
    dead = ended(store, huge)
    assert dead.state == State.DEAD and dead.last_error is not None
    assert "cannot be read by Python's json" in dead.last_error, dead.last_error
    assert sorted(p["fine"] for p in ran) == list(range(5))  # the unreadable one never ran
    assert all(r.crashes == 0 for r in (store.get(j) for j in good) if r is not None)


def test_l5_a_claimed_row_whose_meta_is_beyond_pythons_json_ends_dead_and_the_others_run(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    ran: list[Any] = []
    (row,) = q(
        pool,
        schema,
        "INSERT INTO {job} (topic, payload, meta) VALUES ('m', %s::jsonb, %s::jsonb) RETURNING id::text",
        "{}",
        HUGE,
    )
    bad = str(row[0])
    good = [store.enqueue(Job("m", {"fine": i})).id for i in range(3)]
    e = engines(workers=4, claim_batch=8)
    e.register_kind("m", lambda ctx, claim: ran.append(claim.payload))
    e.start()
    for job_id in good:
        assert ended(store, job_id).state == State.DONE
    dead = ended(store, bad)
    assert dead.state == State.DEAD and "its meta cannot be read" in (dead.last_error or ""), dead.last_error
    assert len(ran) == 3
