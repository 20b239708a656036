"""Cancel-and-retry storms from a second process while three workers drain (SPEC P1', X2').

A separate process cancels random running jobs and retries each at once (the
dashboard's two buttons). Each retry makes a new attempt; the attempt it
replaced is told at once. Two handlers of one job never run at once beyond the
time a cancel may take to reach the handler (X2': under 1 s), and every
handler whose job was cancelled under it ends within that second.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.chaos import overlaps
from tests.chaos.conftest import Worker, enqueue_parents
from tests.polling import wait_for
from tests.processes import REPO_ROOT

LEASE = 3.0
TOLD_WITHIN = timedelta(seconds=1)  # X2': a cancel reaches the running handler within 1 s
STORM = Path(__file__).with_name("storm_proc.py")
STORMS = 10  # cancel-and-retry pairs the storm goes on to (up to its cap), fewer tell nothing


def counts(dsn: str, schema: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT state, count(*) FROM {}.job GROUP BY state").format(sql.Identifier(schema))
        ).fetchall()
    return {str(s): int(n) for s, n in rows}


def late_cancels(dsn: str, schema: str) -> list[str]:
    """Handlers still running TOLD_WITHIN after their job was cancelled under them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT a.job_id, a.at, e.worker, e.ended_at, e.how FROM {s}.chaos_audit a"
                " JOIN {s}.chaos_exec e ON e.claim_token = a.old_token"
                " WHERE a.old_state = 'processing' AND a.new_state = 'canceled'"
                " AND coalesce(e.ended_at, clock_timestamp()) > a.at + %s"
            ).format(s=sql.Identifier(schema)),
            [TOLD_WITHIN],
        ).fetchall()
    return [f"job {r[0]} canceled at {r[1]}; {r[2]} ran on to {r[3]} ({r[4]})" for r in rows]


def test_cancel_and_retry_storm_never_runs_two_handlers_of_one_job_at_once_P1_X2(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker], capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    rng = random.Random(23)
    workers = [spawn(dsn, chaos_schema, workers=12, lease=LEASE, watchdog_grace=LEASE) for _ in range(3)]
    # The storm process is up (imported and connected) before any job runs: a job runs 2 to 4 s, and a
    # process started after them may find every job done already (on a busy machine it did).
    storm = subprocess.Popen(
        [
            sys.executable,
            str(STORM),
            json.dumps(
                {"dsn": dsn, "schema": chaos_schema, "seconds": 8, "storms": STORMS, "cap": 60, "seed": 7}
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=str(REPO_ROOT),
    )
    try:
        assert storm.stdout is not None and storm.stdin is not None
        assert storm.stdout.readline() == "ready\n", storm.communicate()[1]
        # More slots than jobs: a retried job is claimed at once (no backlog ahead of it), as on a quiet queue.
        payloads = [{"n": i, "sleep": round(rng.uniform(2.0, 4.0), 3)} for i in range(30)]
        ids = enqueue_parents(dsn, chaos_schema, payloads)
        wait_for(lambda: counts(dsn, chaos_schema).get("processing", 0) >= 6, "handlers running", 30)
        storm.stdin.write("go\n")
        storm.stdin.flush()
        out, err = storm.communicate(timeout=120)
    finally:
        if storm.poll() is None:
            storm.kill()
            storm.communicate()
    assert storm.returncode == 0, err
    storms = int(out.split()[-1])
    wait_for(
        lambda: set(counts(dsn, chaos_schema)) <= {"done", "canceled"},
        "every job to settle after the storm",
        60,
        0.2,
    )
    for w in workers:
        assert w.stop() == 0, w.log_tail()
    problems = (
        overlaps.overlapping_runs(dsn, chaos_schema, tolerance=TOLD_WITHIN)
        + late_cancels(dsn, chaos_schema)
        + overlaps.reaped(dsn, chaos_schema)
    )
    final = counts(dsn, chaos_schema)
    with capsys.disabled():
        print(
            f"\n[chaos] cancel-and-retry storm: jobs={len(ids)} storms={storms} states={final} "
            f"problems={len(problems)} {time.monotonic() - began:.1f}s"
        )
    assert storms >= STORMS, "the storm hit too few running jobs to tell anything"
    assert not problems, "cancel and retry put one job on two handlers:\n" + "\n".join(problems[:20])
    assert final == {"done": len(ids)}, "a retried job did not end done"
