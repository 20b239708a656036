"""A transaction step's exactly-once against real worker processes (SPEC DS2, F0, L5'): a worker
SIGKILLed inside the step's transaction or right after its commit, and a worker SIGSTOPped inside
it past its lease while another takes the job over and then resumed. The step's own write exists
exactly once, and the record is the run's that wrote it."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py import Job
from brooq_py.postgres import Store
from tests.chaos.conftest import Worker
from tests.polling import wait_for


@pytest.fixture
def setup(dsn: str, chaos_schema: str) -> Iterator[tuple[Store, str]]:
    schema = sql.Identifier(chaos_schema).as_string(None)
    rows(dsn, f"CREATE TABLE {schema}.step_calls (job uuid, step text, pid int)")
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = Store(pool, schema=chaos_schema)
        yield store, schema
        store.close()


def rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params or None)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description is not None else []


def marker(directory: Path, name: str, worker: Worker) -> bool:
    return (directory / f"{name}.{worker.proc.pid}").exists()


def ended(store: Store, jid: str) -> Any:
    def check() -> Any:
        row = store.get(jid)
        return row if row is not None and row.state.terminal else None

    return wait_for(check, "the job to end", timeout=90)


SETTINGS = {"workers": 1, "lease": 2.0, "reaper_period": 0.3}


@pytest.mark.parametrize("when", ["inside the transaction", "right after the commit"])
def test_ds2_a_worker_killed_inside_or_right_after_a_transaction_step_writes_once(
    dsn: str,
    chaos_schema: str,
    setup: tuple[Store, str],
    spawn: Callable[..., Worker],
    tmp_path: Path,
    when: str,
) -> None:
    store, schema = setup
    inside = when == "inside the transaction"
    jid = store.enqueue(Job("chaos.txstep", {"dir": str(tmp_path)})).id
    hold = {"txstep_hold": 60} if inside else {"txstep_after": 60}
    first = spawn(dsn, chaos_schema, **SETTINGS, **hold)
    wait_for(lambda: marker(tmp_path, "in_tx" if inside else "committed", first), f"the step {when}")
    first.kill()
    second = spawn(dsn, chaos_schema, **SETTINGS)
    row = ended(store, jid)
    writer = second if inside else first  # killed inside: its write rolled back with its record
    calls = rows(dsn, f"SELECT step, pid FROM {schema}.step_calls WHERE job = %s", jid)
    assert str(row.state) == "done"
    assert calls == [("book", writer.proc.pid)]
    assert row.result == f"book@{writer.proc.pid}"
    assert [s.name for s in row.steps] == ["book"]
    assert row.crashes == 1 and row.attempts == 1
    second.stop()


def test_ds2_f0_a_worker_stopped_inside_a_transaction_step_past_its_lease_records_nothing_when_it_resumes(
    dsn: str, chaos_schema: str, setup: tuple[Store, str], spawn: Callable[..., Worker], tmp_path: Path
) -> None:
    """SIGSTOP inside the step's fn (its write made, its record not yet); another engine takes the
    job over after lease + margin and runs the step; SIGCONT: the stalled attempt's record finds the
    job no longer its own (LeaseLost, or its connection gone) and its write rolls back."""
    store, schema = setup
    jid = store.enqueue(Job("chaos.txstep", {"dir": str(tmp_path)})).id
    stalled = spawn(dsn, chaos_schema, **SETTINGS, txstep_hold=1.0)
    wait_for(lambda: marker(tmp_path, "in_tx", stalled), "the step inside its transaction")
    os.killpg(stalled.proc.pid, signal.SIGSTOP)
    try:
        other = spawn(dsn, chaos_schema, **SETTINGS)
        row = ended(store, jid)
        assert str(row.state) == "done" and row.result == f"book@{other.proc.pid}"
    finally:
        os.killpg(stalled.proc.pid, signal.SIGCONT)

    def stalled_ended() -> Any:
        got = rows(
            dsn, f"SELECT step FROM {schema}.step_calls WHERE job = %s AND pid = %s", jid, stalled.proc.pid
        )
        return got if any(s.startswith("raised:") for (s,) in got) else None

    got = wait_for(stalled_ended, "the resumed worker's step to end", timeout=60)
    assert [s for (s,) in got if s.startswith("raised:")] == ["raised:LeaseLost"], got
    calls = rows(dsn, f"SELECT step, pid FROM {schema}.step_calls WHERE job = %s AND step = 'book'", jid)
    assert calls == [("book", other.proc.pid)]  # the stalled attempt's write rolled back
    row = store.get(jid)
    assert row is not None and str(row.state) == "done" and row.result == f"book@{other.proc.pid}"
    assert [s.name for s in row.steps] == ["book"] and row.crashes == 1
    other.stop()
    stalled.stop()


def test_ds2_f0_a_worker_stopped_between_a_transaction_steps_record_and_its_commit_keeps_the_job(
    dsn: str, chaos_schema: str, setup: tuple[Store, str], spawn: Callable[..., Worker], tmp_path: Path
) -> None:
    """SIGSTOP after the step's record, before its commit: the record holds the job's row (FOR SHARE),
    so no engine takes the job over however long the stall (the reaper skips a locked row) and the
    other engine runs other jobs meanwhile; SIGCONT: the step commits, and the run after the stalled
    engine gives the job back gets the recorded result without writing again."""
    store, schema = setup
    jid = store.enqueue(Job("chaos.txstep", {"dir": str(tmp_path)})).id
    stalled = spawn(dsn, chaos_schema, **SETTINGS, txstep_record_hold=1.0, txstep_dir=str(tmp_path))
    wait_for(lambda: marker(tmp_path, "recorded", stalled), "the step recorded, not committed")
    os.killpg(stalled.proc.pid, signal.SIGSTOP)
    try:
        other = spawn(dsn, chaos_schema, **SETTINGS)
        stale = (
            f"SELECT count(*) FROM {schema}.job j JOIN {schema}.engine e ON e.id = j.locked_by"
            " WHERE j.id = %s AND e.seen_at + e.lease + e.margin < now()"
        )
        wait_for(lambda: rows(dsn, stale, jid) == [(1,)], "the stalled engine's proof of life to lapse")
        alone = store.enqueue(Job("chaos.txstep", {"dir": str(tmp_path)})).id
        assert ended(store, alone).result == f"book@{other.proc.pid}"  # the other engine is not held up
        row = store.get(jid)  # past lease + margin, reaper passes since: still the stalled engine's
        assert row is not None and str(row.state) == "processing" and row.crashes == 0
    finally:
        os.killpg(stalled.proc.pid, signal.SIGCONT)
    row = ended(store, jid)
    assert str(row.state) == "done" and row.result == f"book@{stalled.proc.pid}"
    calls = rows(dsn, f"SELECT step, pid FROM {schema}.step_calls WHERE job = %s", jid)
    assert calls == [("book", stalled.proc.pid)]
    assert [s.name for s in row.steps] == ["book"]
    other.stop()
    stalled.stop()
