"""An immediate-mode stop of PostgreSQL under load, then crash recovery (SPEC P1-P3, C1, C3).

Every write commits synchronously, the claim included: no job runs in two workers at once and
every done row was recorded by its run, across two stops. A claim committed with
``synchronous_commit = off`` fails here (4 runs in 7 when tried): its rows reach the worker,
the handler starts, the crash loses the claim before its WAL is written, recovery shows the
job pending, and a second worker claims and runs it beside the first. The server is a
throwaway one this test starts, stopped with SIGQUIT (``pg_ctl stop -m immediate``: backends
killed, WAL buffers in shared memory lost, recovery replays what was written). Never the
machine's shared server.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Callable

import psycopg
import pytest

from brooq_py import devdb
from tests.chaos import invariants
from tests.chaos.conftest import Worker, enqueue_parents, make_chaos_schema, settled
from tests.chaos.test_kill import make_payloads
from tests.chaos.test_restart import done_count, throwaway  # noqa: F401 - the fixture
from tests.polling import wait_for


def synchronous(db: devdb.DevDatabase) -> None:
    """The throwaway server starts with synchronous_commit off for speed (a command-line setting);
    this test needs it on in every session: a database default outranks the command line."""
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = on', current_database()); END $$"
        )
    assert _setting(db.dsn) == "on"


def _setting(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
    return str(row[0]) if row else ""


def stop_immediately(db: devdb.DevDatabase) -> None:
    """SIGQUIT to the postmaster: the immediate shutdown mode, then wait until it is gone."""
    pid = db.pid
    assert pid is not None
    os.kill(pid, signal.SIGQUIT)
    wait_for(lambda: db.pid is None, "the throwaway server to exit", timeout=60)


def test_immediate_stop_under_load_loses_no_outcome_P1_P2_P3(
    throwaway: devdb.DevDatabase,  # noqa: F811
    spawn: Callable[..., Worker],
    capsys: pytest.CaptureFixture[str],
) -> None:
    dsn = throwaway.dsn
    synchronous(throwaway)
    schema = make_chaos_schema(dsn)
    rng = random.Random(14)
    ids = enqueue_parents(dsn, schema, make_payloads(120, rng, sleep=(0.01, 0.2)))
    workers = [spawn(dsn, schema, check=(i == 0), workers=4) for i in range(2)]

    def done_at_least(n: int) -> Callable[[], bool]:
        return lambda: done_count(dsn, schema) >= n

    for stop_at in (10, 40):
        wait_for(done_at_least(stop_at), f"{stop_at} jobs done", timeout=90)
        stop_immediately(throwaway)
        throwaway.restart()  # crash recovery on the same port and data directory
    wait_for(lambda: settled(dsn, schema, ids), "every job to settle after the stops", timeout=180)
    for w in workers:
        assert w.alive, w.log_tail()
        assert w.stop() == 0, w.log_tail()
    report = invariants.check(dsn, schema, ids)
    report.assert_ok()
    assert report.states == {"done": 120}
    with capsys.disabled():
        print(f"\n[chaos] immediate stop x2: jobs={report.jobs} claims={report.claims} reaped={report.reaps}")
