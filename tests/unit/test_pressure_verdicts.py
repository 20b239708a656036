"""The pressure bench's verdicts (bench/pressure_report.py): each pressure phase is judged against the
clean phase before it and the recovery after it."""

from __future__ import annotations

import queue
import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))

from pressure_report import Events, verdicts

PHASES = [
    ("clean", 10.0),
    ("hold", 20.0),
    ("recovery", 10.0),
    ("clean2", 15.0),
    ("rr", 30.0),
    ("recovery2", 15.0),
]


def test_in_a_run_of_both_phases_rr_is_judged_against_clean2_and_recovery2() -> None:
    events = Events(queue.Queue())
    events.close()  # rows are set by hand below
    phases, windows, t = [], [], 0.0
    for name, latency_ms in PHASES:
        phases.append({"name": name, "t0": t, "t1": t + 100})
        for s in range(5, 101, 5):  # a report and a 5 s window every 5 s, one latency (ms) each
            events.rows.append(("done", t + s, 1, [latency_ms]))
            windows.append({"t": t + s, "backlog": 0, "dead": 0, "total_bytes": 1, "tables": {}})
        t += 100
    res: dict[str, Any] = {"system": "brooq_py", "phases": phases, "windows": windows, "rate": 10}
    out = verdicts(res, events, [])
    assert out["hold"]["clean_p99_ms"] == 10.0 and out["hold"]["recovery_last_minute_p99_ms"] == 10.0
    assert out["rr"]["clean_p99_ms"] == 15.0  # clean2, not the first clean phase
    assert out["rr"]["recovery_last_minute_p99_ms"] == 15.0  # recovery2, not the hold's recovery
    assert out["rr"]["last_minute_p99_x_clean"] == 2.0
