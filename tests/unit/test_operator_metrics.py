"""The operator controls' gauges (SPEC Q2-Q4): brooq_topic_paused, brooq_topic_limit and the
periodic jobs' next tick, on the fake repo."""

from __future__ import annotations

import math
import time

from brooq_py.engine import Config, Engine
from tests.polling import wait_for
from tests.unit.fake_repo import FakeRepo


def value(e: Engine, name: str, topic: str) -> float | None:
    v = e.registry.get_sample_value(name, {"topic": topic})
    return None if v is None else float(v)


def test_q2_q3_topic_gauges_follow_the_settings_at_each_read() -> None:
    repo = FakeRepo()
    e = Engine(repo, Config(workers=2))
    e.register_kind("a", lambda ctx, claim: None)
    e.register_kind("b", lambda ctx, claim: None)
    repo.settings["a"] = (True, None)
    repo.settings["b"] = (False, 3)
    e.run_once()
    assert value(e, "brooq_topic_paused", "a") == 1.0 and value(e, "brooq_topic_limit", "a") == math.inf
    assert value(e, "brooq_topic_paused", "b") == 0.0 and value(e, "brooq_topic_limit", "b") == 3.0
    repo.settings.clear()
    e.run_once()
    assert value(e, "brooq_topic_paused", "a") == 0.0 and value(e, "brooq_topic_limit", "b") == math.inf


def test_q4_the_next_tick_gauge_is_the_schedules_next_tick() -> None:
    e = Engine(FakeRepo(), Config(workers=1, poll_interval=0.1))
    e.schedule("t", "0 0 1 1 *")  # once a year: its next tick is known at start
    e.start()
    try:
        at = wait_for(lambda: value(e, "brooq_schedule_next_tick_timestamp_seconds", "t"), "the gauge")
        assert at > time.time()
    finally:
        e.stop(timeout=1)
