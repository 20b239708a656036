"""The topic overview's cache: fresh for ttl seconds, longer after a slow read, dropped by forget() (SPEC Z2)."""

from __future__ import annotations

from brooq_py.postgres.operator import overview as overview_module
from brooq_py.postgres.operator.overview import Overview, Topics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def counting(clock: Clock, read_seconds: float) -> tuple[Overview, list[int]]:
    reads: list[int] = []
    view = Overview(None, ttl=2.0, clock=clock)  # type: ignore[arg-type]

    def read() -> Topics:
        reads.append(1)
        clock.now += read_seconds
        return Topics([], view.cap, None)  # type: ignore[arg-type]

    view._read_topics = read  # type: ignore[method-assign]
    return view, reads


def test_z2_one_read_serves_every_viewer_for_ttl_seconds() -> None:
    clock = Clock()
    view, reads = counting(clock, 0.01)
    for _ in range(50):
        view.topics()
    assert len(reads) == 1
    clock.now += 1.9
    view.topics()
    assert len(reads) == 1
    clock.now += 0.2
    view.topics()
    assert len(reads) == 2
    view.forget()
    view.topics()
    assert len(reads) == 3


def test_z2_a_slow_read_is_kept_longer() -> None:
    clock = Clock()
    view, reads = counting(clock, 3.0)
    view.topics()
    clock.now += 2.0 * overview_module.READ_SHARE
    view.topics()
    assert len(reads) == 1  # 3 s to read: kept 15 s, not 2
    clock.now += 3.0 * overview_module.READ_SHARE
    view.topics()
    assert len(reads) == 2
