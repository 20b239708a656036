"""Claim.parent_results(by=...) and parent_states() over the parents a store reads (SPEC BD2, BD3),
and what a batch answer becomes for each claim (SPEC BD1)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from brooq_py.engine.attempt.batch import BatchAnswerMismatch, spread
from brooq_py.queue import BrooqError, Claim, Lease, State
from brooq_py.queue.claim import Parent

PARENTS = [
    Parent("own-id", None, State.DONE, "own"),
    Parent("b-id", "b", State.DONE, {"b": 1}),
    Parent("a-id", "a", State.DEAD, None),
]


def claim(parents: Any = lambda job_id: list(PARENTS)) -> Claim:
    return Claim(
        id="c",
        topic="t",
        payload=None,
        attempt=1,
        max_attempts=1,
        lease=Lease("w", datetime.now(UTC)),
        parents=parents,
    )


def test_bd3_by_id_name_and_order() -> None:
    c = claim()
    assert c.parent_results() == {"own-id": "own", "b-id": {"b": 1}, "a-id": None}
    assert c.parent_results(by="name") == {"own-id": "own", "b": {"b": 1}, "a": None}
    assert c.parent_results(by="order") == ["own", {"b": 1}, None]
    assert c.parent_states() == {"own-id": State.DONE, "b-id": State.DONE, "a-id": State.DEAD}


def test_bd3_a_bad_by_is_a_value_error_before_any_read() -> None:
    reads: list[str] = []
    c = claim(lambda job_id: reads.append(job_id) or [])
    with pytest.raises(ValueError, match="by must be"):
        c.parent_results(by="names")  # type: ignore[arg-type]
    assert reads == []


def test_a_claim_without_a_store_says_so() -> None:
    with pytest.raises(BrooqError):
        claim(None).parent_states()


class _A:
    def __init__(self) -> None:
        self.result: str | None = None


def test_bd1_spread_answers_each_claim_or_all_of_them() -> None:
    batch = [_A(), _A(), _A()]
    boom = ValueError("two")
    errors = spread(batch, [1, boom, {"x": 3}], lambda v: repr(v))  # type: ignore[arg-type]
    assert errors == [None, boom, None]
    assert [a.result for a in batch] == ["1", None, "{'x': 3}"]
    for answer in ([1, 2], "abc", {"a": 1}, None, iter([1, 2, 3])):
        errors = spread(batch, answer, repr)  # type: ignore[arg-type]
        assert len(errors) == 3 and all(isinstance(e, BatchAnswerMismatch) for e in errors)

    def refuse(value: Any) -> str:
        raise TypeError("not JSON")

    errors = spread(batch, [1, 2, 3], refuse)  # type: ignore[arg-type]
    assert all(isinstance(e, TypeError) for e in errors)
