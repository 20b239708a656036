"""pg_terminate_backend of the engine's connections during load (SPEC C3, E6, P1-P3).

Two worker processes, one whose pool checks connections on checkout
(``check=ConnectionPool.check_connection``) and one that finds broken ones on error. Every
connection of this run whose application_name ends ``:chaos-engine-*`` (claim/pool, heartbeat, completion,
LISTEN) is terminated again and again; the engines reconnect and carry on.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import psycopg
import pytest

from tests.budget import app_name
from tests.chaos import invariants
from tests.chaos.conftest import Worker, enqueue_parents, settled
from tests.chaos.test_kill import make_payloads
from tests.polling import wait_for


def terminate_engine_connections(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE starts_with(application_name, %s) AND datname = current_database()"
            " AND pid <> pg_backend_pid()",
            [app_name("chaos-engine-")],
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)


def listening(dsn: str, label: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND query ILIKE '%%LISTEN %%'",
            [app_name(f"chaos-engine-{label}")],
        ).fetchone()
    return bool(row and row[0] > 0)


def test_terminated_connections_engine_reconnects_P1_P2_P3(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker], capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(2)
    ids = enqueue_parents(dsn, chaos_schema, make_payloads(100, rng, sleep=(0.05, 0.5)))
    checked = spawn(dsn, chaos_schema, label="checked", check=True, workers=3)
    unchecked = spawn(dsn, chaos_schema, label="unchecked", check=False, workers=3)
    drops = rounds = 0
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and not settled(dsn, chaos_schema, ids):
        drops += terminate_engine_connections(dsn)
        rounds += 1
        time.sleep(rng.uniform(0.2, 0.6))
    assert drops >= 5, f"only {drops} connections terminated"
    wait_for(lambda: settled(dsn, chaos_schema, ids), "every job to settle after the drops", timeout=120)
    # both engines still work: a second batch after the storm settles too, and LISTEN is back
    more = enqueue_parents(dsn, chaos_schema, make_payloads(20, rng, sleep=(0.0, 0.1)))
    wait_for(lambda: settled(dsn, chaos_schema, ids | more), "the batch after the storm", timeout=60)
    for w in (checked, unchecked):
        wait_for(lambda w=w: listening(dsn, w.label), f"{w.label} to LISTEN again", timeout=30)
        assert w.alive, w.log_tail()
        assert w.stop() == 0, w.log_tail()
    report = invariants.check(dsn, chaos_schema, ids | more)
    report.assert_ok()
    assert report.states == {"done": 120}
    with capsys.disabled():
        print(
            f"\n[chaos] pg_terminate_backend: jobs={report.jobs} rounds={rounds} connections dropped={drops}"
            f" claims={report.claims} reaped={report.reaps}"
        )
