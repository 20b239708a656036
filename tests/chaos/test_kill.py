"""SIGKILL of worker processes mid-job while others keep working (SPEC P1, P2, P3, R1, C1, C9)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import pytest

from tests.chaos import invariants
from tests.chaos.conftest import Worker, enqueue_parents, kill_mid_job, settled
from tests.polling import wait_for


def make_payloads(
    n: int, rng: random.Random, *, sleep: tuple[float, float] = (0.1, 0.8)
) -> list[dict[str, Any]]:
    return [
        {
            "n": i,
            "sleep": round(rng.uniform(*sleep), 3),
            "fail_first": 1 if i % 5 == 0 else 0,
            "chain": i % 2 == 0,
        }
        for i in range(n)
    ]


def run_kills(
    dsn: str, schema: str, spawn: Callable[..., Worker], *, jobs: int, kills: int, processes: int, seed: int
) -> tuple[invariants.Report, int, int]:
    rng = random.Random(seed)
    ids = enqueue_parents(dsn, schema, make_payloads(jobs, rng))
    # A job may be on several victims in turn, and on a starved machine a live engine can miss its
    # lease too: each counts as a crash. Ending such a job dead is the poison rule (L5', tested on
    # its own); here every job must end done.
    settings = {"workers": 3, "lease": 2.0, "reaper_period": 0.5, "max_crashes": 50}
    live: list[tuple[Worker, str]] = []
    for _ in range(processes):
        w = spawn(dsn, schema, **settings)
        live.append((w, f"chaos-{w.label}:{w.proc.pid}"))
    mid_job = kill_mid_job(dsn, schema, spawn, live, settings, rng, kills=kills, pause=(0.3, 1.0), wait=5)
    done_kills = kills
    wait_for(lambda: settled(dsn, schema, ids), "every job to settle after the kills", timeout=120)
    for w, _ in live:
        assert w.stop() == 0, w.log_tail()
    report = invariants.check(dsn, schema, ids)
    return report, done_kills, mid_job


def test_sigkill_workers_mid_job_P1_P2_P3(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker], capsys: pytest.CaptureFixture[str]
) -> None:
    """Three worker processes; one of them SIGKILLed mid-job again and again (and replaced) while the
    others keep working. Every job settles, none twice, no overlap without a reaped lease, attempts
    = failures + reaped claims + 1, children exactly for done parents."""
    report, kills, mid_job = run_kills(dsn, chaos_schema, spawn, jobs=120, kills=6, processes=3, seed=1)
    report.assert_ok()
    assert report.states == {"done": 120}
    assert mid_job >= 1, "no kill hit a worker holding a job"
    assert report.reaps >= 1, "no reaped claim: the kills did not exercise the reaper"
    with capsys.disabled():
        print(
            f"\n[chaos] sigkill: jobs={report.jobs} kills={kills} (mid-job {mid_job}) claims={report.claims}"
            f" executions={report.executions} reaped={report.reaps}"
            f" overlaps-after-lost-lease={report.overlaps_after_lost_lease}"
        )


@pytest.mark.slow
def test_sigkill_workers_long_P1_P2_P3(dsn: str, chaos_schema: str, spawn: Callable[..., Worker]) -> None:
    """The long variant (BROOQ_SLOW=1): more jobs, more processes, more kills."""
    seed = int(os.environ.get("BROOQ_CHAOS_SEED", "7"))
    report, kills, mid_job = run_kills(dsn, chaos_schema, spawn, jobs=600, kills=30, processes=4, seed=seed)
    report.assert_ok()
    assert report.states == {"done": 600}
    print(f"[chaos] sigkill long: jobs={report.jobs} kills={kills} mid-job={mid_job} reaped={report.reaps}")
