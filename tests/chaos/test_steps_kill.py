"""A worker process SIGKILLed between durable steps: the next one resumes after the recorded steps
(SPEC DS1, DS2; L5': the crash spends no attempt)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py import Job
from brooq_py.postgres import Store
from tests.chaos.conftest import Worker
from tests.polling import wait_for


def rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params or None)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description is not None else []


def test_ds1_a_worker_killed_between_steps_is_resumed_after_the_recorded_ones(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker]
) -> None:
    schema = sql.Identifier(chaos_schema).as_string(None)
    rows(dsn, f"CREATE TABLE {schema}.step_calls (job uuid, step text, pid int)")
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = Store(pool, schema=chaos_schema)
        jid = store.enqueue(Job("chaos.steps")).id
        first = spawn(dsn, chaos_schema, workers=1, lease=2.0, step_gap=60)
        # killed after "one" and the transaction step "book" are recorded, in the pause after "book"
        wait_for(
            lambda: rows(dsn, f"SELECT count(*) FROM {schema}.job_step WHERE job_id = %s", jid)[0][0] == 2
        )
        first.kill()
        second = spawn(dsn, chaos_schema, workers=1, lease=2.0)

        def ended() -> Any:
            row = store.get(jid)
            return row if row is not None and row.state.terminal else None

        row = wait_for(ended, "the job to end after the kill", timeout=90)
        calls = rows(dsn, f"SELECT step, pid FROM {schema}.step_calls WHERE job = %s ORDER BY step", jid)
        store.close()
    assert str(row.state) == "done"
    first_pid, second_pid = first.proc.pid, second.proc.pid
    # each step ran once: "one" and "book" in the killed process, "three" in the next
    assert sorted(calls) == sorted([("one", first_pid), ("book", first_pid), ("three", second_pid)])
    assert row.result == [f"one@{first_pid}", f"book@{first_pid}", f"three@{second_pid}"]
    assert [s.name for s in row.steps] == ["one", "book", "three"]
    assert row.crashes == 1 and row.attempts == 1  # the crash gave its attempt back (L5')
