"""Durable steps in the engine against the in-memory repo (SPEC DS1, DS3): replay, a sleep's outcome."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from brooq_py.engine import Engine
from brooq_py.queue import Claim, Context, Job, KindOptions, Snooze, State
from tests.polling import wait_for
from tests.unit.fake_repo import FakeRepo

OPTS = KindOptions(max_attempts=3, backoff_base=0.001, backoff_max=0.002)


def test_a_retry_replays_recorded_steps_without_calling_them(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    calls: Counter[str] = Counter()

    def handler(ctx: Context, claim: Claim) -> Any:
        first = ctx.step("a", lambda: calls.update(["a"]) or "A")
        calls["run"] += 1
        if calls["run"] == 1:
            raise RuntimeError("fails after the step")
        return first

    e = make_engine()
    e.register_kind("t", handler, OPTS)
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.DONE)
    assert calls == {"a": 1, "run": 2}
    assert [s.name for s in repo.steps[jid].values()] == ["a"]


def test_jobs_without_steps_run_no_durable_statement(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    ids = [e.enqueue(Job("t")).id for _ in range(5)]
    e.start()
    wait_for(lambda: all(repo.row(i).state is State.DONE for i in ids))
    assert "steps_load" not in repo.calls and "step_record" not in repo.calls


def test_a_snooze_is_a_scheduled_outcome_with_the_attempt_given_back(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    def handler(ctx: Context, claim: Claim) -> None:
        raise Snooze(3600)

    e = make_engine()
    e.register_kind("t", handler, KindOptions(max_attempts=1))
    jid = e.enqueue(Job("t")).id
    assert e.run_once() == 1
    row = repo.row(jid)
    assert row.state is State.SCHEDULED and row.attempts == 0 and row.locked_by is None
    assert row.available_at > repo.now() + 3000
