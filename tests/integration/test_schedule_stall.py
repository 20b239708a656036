"""Periodic jobs with a stalled engine (SPEC Q4, Q4'), on real processes.

A second process (tests/integration/engine_proc.py) is a real engine; SIGSTOP freezes it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context
from tests.integration.engine_procs import proc_state, rows
from tests.polling import wait_for
from tests.processes import Process


def test_q4_a_stalled_engine_inside_a_ticks_transaction_stops_no_other_engine_from_enqueueing_ticks(
    dsn: str, schema: str, tmp_path: Path, procs: Callable[..., Process], engines: Callable[..., Engine]
) -> None:
    """Q4': exactly one job per tick with a stalled engine. Engine A (a real process) is frozen by
    SIGSTOP inside its scheduler's enqueue_tick transaction (after schedule_tick_advance, before the
    insert and commit): a stall at an unlucky instant. Engine B, healthy, schedules the same cron
    (every second). Ticks keep coming while A is frozen: B must enqueue them."""
    a = procs(dsn=dsn, schema=schema, mode="tick_stall", lease=2.0)
    a.wait_ready()
    wait_for(lambda: (tmp_path / "tick_stalling").exists(), "A to reach its first tick", 60)
    wait_for(lambda: proc_state(a.proc.pid) == "T", "A to be stopped", 30)
    ran: list[str] = []

    def handler(ctx: Context, claim: Claim) -> None:
        ran.append(claim.id)

    b = engines(lease=2)
    b.register_kind("tick", handler)
    b.schedule("tick", "* * * * * *", {"by": "healthy"})
    b.start()
    stalled_at = datetime.now(UTC)
    try:
        # 3 ticks within 20 s of a healthy engine (a tick a second)
        wait_for(
            lambda: rows(dsn, schema, "SELECT count(*) FROM {job} WHERE topic = 'tick'")[0][0] >= 3,
            "the healthy engine B to enqueue ticks while A is frozen",
            20,
        )
    finally:
        activity = rows(
            dsn,
            schema,
            "SELECT state, wait_event_type, left(query, 60) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query ILIKE '%%schedule_tick%%' AND pid <> pg_backend_pid()",
        )
        print("pg_stat_activity while A is frozen:", activity)
        print("ticks enqueued:", rows(dsn, schema, "SELECT count(*) FROM {job} WHERE topic = 'tick'"))
        print("stalled since", stalled_at, "now", datetime.now(UTC))
        a.stop()


def test_q4_two_engines_one_frozen_across_ticks_with_a_tiny_ttl_run_each_tick_once(
    dsn: str,
    schema: str,
    store: Store,
    tmp_path: Path,
    procs: Callable[..., Process],
    engines: Callable[..., Engine],
) -> None:
    """Q4': A (a process) and B schedule the same cron (every 2 s), retention_ttl 1 s on both; A is
    frozen for 5 s across two ticks, then resumed. Every tick from B's start on runs exactly once."""
    a = procs(dsn=dsn, schema=schema, mode="tick", cron="*/2 * * * * *", lease=2.0, retention_ttl=1)
    a.wait_ready()
    keys: list[str] = []

    def handler(ctx: Context, claim: Claim) -> None:
        row = store.get(claim.id)
        assert row is not None and row.idempotency_key is not None
        keys.append(row.idempotency_key)

    b = engines(lease=2, retention_ttl=1, retention_period=0.2)
    b.register_kind("tick", handler)
    b.schedule("tick", "*/2 * * * * *", {"by": "b"})
    b.start()
    wait_for(lambda: len(keys) >= 2, "two ticks run", 30)
    os.killpg(a.proc.pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(a.proc.pid) == "T", "A frozen", 30)
    n = len(keys)
    wait_for(lambda: len(keys) >= n + 2, "ticks run while A is frozen", 30)
    a.cont()
    n = len(keys)
    wait_for(lambda: len(keys) >= n + 3, "ticks after A resumed", 30)
    a.stop()
    wait_for(
        lambda: rows(dsn, schema, "SELECT count(*) FROM {job} WHERE state <> 'done'")[0][0] == 0,
        "all done",
        30,
    )
    ticks = sorted(datetime.fromisoformat(k.removeprefix("cron:")) for k in keys)
    assert len(set(ticks)) == len(ticks), f"a tick ran twice: {ticks}"
    # no gap check: a tick missed while every scheduler was late (a loaded machine) is never made up,
    # by design (SPEC Q4: only the latest missed tick is)
