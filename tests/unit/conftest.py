"""Fixtures the engine's unit tests share: an in-memory repo and engines on it, stopped in teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from brooq_py.engine import Config, Engine
from tests.unit.fake_repo import FakeRepo

# Backoff short enough that a retried job comes back within a test's patience.
FAST = {"backoff_base": 0.001, "backoff_max": 0.002}


@pytest.fixture
def repo() -> FakeRepo:
    return FakeRepo()


@pytest.fixture
def make_engine(repo: FakeRepo) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def make(**cfg: object) -> Engine:
        params: dict[str, object] = {"workers": 2, "poll_interval": 0.05, "lease": 3, **FAST}
        params.update(cfg)
        e = Engine(repo, Config(**params))  # type: ignore[arg-type]
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.stop(timeout=1)
