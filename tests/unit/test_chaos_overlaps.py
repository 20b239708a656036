"""The chaos tests' check of two runs of one job at once measures the time both ran."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.chaos.overlaps import overlapping

T = datetime(2026, 12, 5, 18, 30, tzinfo=UTC)


def run(worker: str, start: float, end: float) -> tuple[object, ...]:
    return (
        "job",
        worker,
        1,
        f"token-{worker}",
        T + timedelta(seconds=start),
        T + timedelta(seconds=end),
        "ok",
    )


def test_a_run_inside_a_longer_one_overlaps_it_for_its_own_length() -> None:
    """The second started after the first and ended first (a claim canceled before its handler
    started, told at once): they ran together only while the second ran."""
    long, short = run("w1", 0.0, 2.8), run("w0", 0.015, 0.2)
    assert overlapping([long, short], tolerance=timedelta(seconds=1)) == []
    assert overlapping([long, run("w0", 0.015, 1.5)], tolerance=timedelta(seconds=1)) != []


def test_a_run_starting_before_the_first_ended_overlaps_until_that_end() -> None:
    found = overlapping([run("w1", 0.0, 2.0), run("w0", 0.5, 5.0)])
    assert len(found) == 1 and "overlap by 1.500s" in found[0]
    assert overlapping([run("w1", 0.0, 2.0), run("w0", 2.0, 5.0)]) == []
