"""GroupCommit: the durable records of handlers that ask at once share one flush (postgres/worker/steps.py)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from brooq_py.postgres.worker.steps import GroupCommit


def test_each_caller_gets_its_own_answer_and_callers_that_wait_share_a_flush() -> None:
    batches: list[list[int]] = []
    first_in = threading.Event()
    release = threading.Event()

    def flush(requests: Sequence[int]) -> list[int]:
        batches.append(list(requests))
        if len(batches) == 1:
            first_in.set()
            assert release.wait(10)
        return [r * 10 for r in requests]

    gc: GroupCommit[int, int] = GroupCommit(flush)
    answers: dict[int, int] = {}

    def ask(n: int) -> None:
        answers[n] = gc.call(n)

    lead = threading.Thread(target=ask, args=(0,))
    lead.start()
    assert first_in.wait(10)
    rest = [threading.Thread(target=ask, args=(n,)) for n in range(1, 6)]
    for t in rest:
        t.start()
    while sum(1 for _ in gc._waiting) < 5:  # every other caller waits behind the running flush
        threading.Event().wait(0.001)
    release.set()
    for t in [lead, *rest]:
        t.join(10)
    assert answers == {n: n * 10 for n in range(6)}
    assert batches == [[0], [1, 2, 3, 4, 5]]
    assert gc.call(7) == 70  # a lone caller flushes at once


def test_a_flush_error_reaches_every_caller_of_its_batch_and_the_next_call_works() -> None:
    calls = {"n": 0}

    def flush(requests: Sequence[str]) -> list[str]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("down")
        return list(requests)

    gc: GroupCommit[str, str] = GroupCommit(flush)
    with pytest.raises(ConnectionError):
        gc.call("a")
    assert gc.call("b") == "b"
