"""Capacity (SPEC Q3): per-engine caps, the limited path and when it is tried again, on the fake repo."""

from __future__ import annotations

from datetime import timedelta

from brooq_py.engine.attempt.intake import Capacity
from brooq_py.queue import Job, State
from tests.unit.fake_repo import FakeRepo

LEASE = timedelta(seconds=30)


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def setup(caps: dict[str, int | None]) -> tuple[FakeRepo, Capacity, Clock, list[int]]:
    repo, clock, wakes = FakeRepo(), Clock(), []
    cap = Capacity(caps, 1.0, clock)
    cap.wake = lambda: wakes.append(1)
    for t in ("a", "b"):
        repo.enqueue_many([Job(t, {"n": n}) for n in range(10)])
    return repo, cap, clock, wakes


def test_q3_a_local_cap_takes_only_the_topics_free_capacity_and_an_end_wakes_the_dispatcher() -> None:
    repo, cap, _, wakes = setup({"a": 2, "b": None})
    rows = cap.claim(repo, ["a", "b"], 8, "w", LEASE)
    assert sum(r.topic == "a" for r in rows) == 2 and len(rows) == 8
    assert [r.topic for r in cap.claim(repo, ["a", "b"], 8, "w", LEASE)].count("a") == 0
    cap.ended("a")
    assert wakes == [1]
    assert [r.topic for r in cap.claim(repo, ["a"], 8, "w", LEASE)] == ["a"]


def test_q3_a_limited_topic_is_claimed_on_its_own_path_and_waits_after_a_short_claim() -> None:
    repo, cap, clock, wakes = setup({"a": None, "b": None})
    repo.settings["a"] = (False, 3)
    cap.set_limited(["a"])
    assert wakes == [1]  # newly limited: claim it now
    rows = cap.claim(repo, ["a", "b"], 20, "w", LEASE)
    assert sum(r.topic == "a" for r in rows) == 3 and sum(r.topic == "b" for r in rows) == 10
    assert repo.calls["claim_limited"] == 1
    cap.claim(repo, ["a", "b"], 20, "w", LEASE)  # it came back short: not tried before retry_after
    assert repo.calls["claim_limited"] == 1
    clock.t = 1.5
    assert cap.claim(repo, ["a", "b"], 20, "w", LEASE) == []  # tried: at its limit, nothing
    assert repo.calls["claim_limited"] == 2


def test_q3_a_limited_topic_is_tried_again_once_one_of_our_outcomes_is_written_not_before() -> None:
    repo, cap, _, wakes = setup({"a": None})
    repo.settings["a"] = (False, 1)
    cap.set_limited(["a"])
    (row,) = cap.claim(repo, ["a"], 5, "w", LEASE)
    assert cap.claim(repo, ["a"], 5, "w", LEASE) == []
    calls = repo.calls["claim_limited"]
    cap.ended("a")  # the handler returned; the row is still processing until its outcome is written
    assert len(wakes) == 1 and cap.claim(repo, ["a"], 5, "w", LEASE) == []
    assert repo.calls["claim_limited"] == calls
    repo.rows[row.id].state = State.DONE
    cap.settled(["a"])
    assert len(wakes) == 2
    assert len(cap.claim(repo, ["a"], 5, "w", LEASE)) == 1


def test_q2_q3_the_common_claim_leaves_out_paused_and_limited_topics_even_with_a_stale_view() -> None:
    repo, cap, _, _ = setup({"a": None, "b": None})
    repo.settings["a"] = (True, None)
    repo.settings["b"] = (False, 2)  # the engine has not read it yet
    assert cap.claim(repo, ["a", "b"], 20, "w", LEASE) == []


def test_q3_a_backlog_of_unlimited_topics_never_starves_a_limited_one() -> None:
    repo, cap, _, _ = setup({"a": None, "b": None})
    repo.settings["a"] = (False, 5)
    cap.set_limited(["a"])
    for _ in range(3):  # one slot free at a time, both topics with a backlog
        (row,) = cap.claim(repo, ["a", "b"], 1, "w", LEASE)
        assert row.topic == "a"


def test_q3_c11_rows_a_limited_claim_took_are_handed_out_when_the_common_claim_after_it_fails() -> None:
    """Scenario: a limited topic's claim commits its rows, then the common claim of the same round
    fails (a dropped connection). Those rows are processing in the database under this engine:
    losing them leaves them unrun until their lease expires and keeps the topic's local room taken
    for good (its handlers never end here)."""
    repo, cap, _, _ = setup({"a": 1, "b": None})
    repo.settings["a"] = (False, 5)
    cap.set_limited(["a"])
    real = repo.claim

    def broken(*args: object, **kwargs: object) -> list[object]:
        raise ConnectionError("connection lost")

    repo.claim = broken  # type: ignore[method-assign,assignment]
    rows = cap.claim(repo, ["a", "b"], 4, "w", LEASE)
    assert [r.topic for r in rows] == ["a"]
    repo.claim = real  # type: ignore[method-assign]
    cap.ended("a")
    cap.settled(["a"])
    assert [r.topic for r in cap.claim(repo, ["a"], 4, "w", LEASE)] == ["a"]
