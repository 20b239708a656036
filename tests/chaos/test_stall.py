"""A stalled worker process and a pooler in transaction mode (SPEC P1'', F0, L5').

SIGSTOP freezes a worker mid-job for twice the lease: the others take its jobs only once its
proof of life is older than lease + margin; when it wakes it fences its handlers before writing
anything, names the fenced claims, and writes no outcome for a claim that is no longer its own.
Through PgBouncer in transaction mode no session state is needed for any of that.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable

import pytest

from tests.chaos import invariants
from tests.chaos.conftest import Worker, enqueue_parents, held_by, settled
from tests.chaos.test_kill import make_payloads
from tests.integration.pgbouncer import pgbouncer, pgbouncer_binary
from tests.polling import wait_for

LEASE = 2.0
LONG_JOBS = 9  # more than the two engines' slots: the worker to be frozen gets some


def test_f0_a_worker_stopped_for_two_leases_is_fenced_before_its_jobs_run_elsewhere_nothing_dead_or_twice(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker], capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(11)
    payloads = [{**p, "fail_first": 0} for p in make_payloads(90, rng, sleep=(0.2, 0.6))]  # no failure
    for p in payloads[:LONG_JOBS]:  # first in claim order: still running when the worker wakes
        p["sleep"] = 4 * LEASE
    long_ids = enqueue_parents(dsn, chaos_schema, payloads[:LONG_JOBS])
    ids = long_ids | enqueue_parents(dsn, chaos_schema, payloads[LONG_JOBS:])
    settings = {"workers": 3, "lease": LEASE, "reaper_period": 0.3, "max_attempts": 1}
    frozen = spawn(dsn, chaos_schema, **settings)
    frozen_id = f"chaos-{frozen.label}:{frozen.proc.pid}"
    other = spawn(dsn, chaos_schema, **settings)
    # A handler still running at the wake is fenced (the fence's log line); one whose job ended
    # during the stall returns at the wake and its done is refused, whichever thread runs first.
    wait_for(
        lambda: held_by(dsn, chaos_schema, frozen_id, among=sorted(long_ids)) > 0,
        "the worker to be frozen holding a long job",
        30,
    )
    os.killpg(frozen.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(2 * LEASE)
    finally:
        os.killpg(frozen.proc.pid, signal.SIGCONT)
    wait_for(lambda: settled(dsn, chaos_schema, ids), "every job to settle", timeout=120)
    assert frozen.stop() == 0, frozen.log_tail()
    assert other.stop() == 0, other.log_tail()
    log = frozen.log_path.read_text(errors="replace")
    report = invariants.check(dsn, chaos_schema, ids)
    report.assert_ok()  # P1'' checks every reap against the engine table
    assert report.states == {"done": 90}  # max_attempts=1, nothing dead: a stall is no failure
    assert report.reaps >= 1, "the stall did not outlast lease + margin"
    assert "fencing" in log, log[-3000:]
    with capsys.disabled():
        print(
            f"\n[chaos] sigstop {2 * LEASE:g}s: jobs={report.jobs} claims={report.claims}"
            f" reaped={report.reaps} overlaps-after-reap={report.overlaps_after_lost_lease}"
        )


@pytest.mark.skipif(
    pgbouncer_binary() is None, reason="pgbouncer is not installed (apt-get install pgbouncer)"
)
def test_p1_3000_jobs_through_pgbouncer_transaction_mode_with_a_worker_sigkilled(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker], capsys: pytest.CaptureFixture[str]
) -> None:
    binary = pgbouncer_binary()
    assert binary is not None
    rng = random.Random(5)
    payloads = [
        {"n": i, "sleep": 0.0 if i % 10 else 0.05, "fail_first": 0, "chain": False} for i in range(3000)
    ]
    ids = enqueue_parents(dsn, chaos_schema, payloads)
    with pgbouncer(dsn, binary) as bounced:
        settings = {
            "workers": 4,
            "lease": LEASE,
            "reaper_period": 0.3,
            "poll_interval": 0.05,
            "bouncer": True,
        }
        workers = [spawn(bounced, chaos_schema, **settings) for _ in range(3)]
        victim = workers[0]
        victim_id = f"chaos-{victim.label}:{victim.proc.pid}"
        wait_for(lambda: held_by(dsn, chaos_schema, victim_id) > 0, "the victim holding jobs", 60)
        victim.kill()
        workers.append(spawn(bounced, chaos_schema, **settings))
        wait_for(lambda: settled(dsn, chaos_schema, ids), "every job to settle", timeout=240)
        for w in workers[1:]:
            assert w.stop() == 0, w.log_tail()
    report = invariants.check(dsn, chaos_schema, ids)
    report.assert_ok()
    assert report.states == {"done": 3000}
    with capsys.disabled():
        print(
            f"\n[chaos] pgbouncer: jobs={report.jobs} claims={report.claims} reaped={report.reaps} seed={rng.random():.3f}"
        )
