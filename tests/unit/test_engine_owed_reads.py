"""The dispatcher claims when the Repo says a read is owed, whatever the poll interval (SPEC B1:
the claim heads' wider reads, postgres/worker/heads.py), through the engine's fake Repo."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from datetime import timedelta

import pytest

from brooq_py.engine import Config, Engine
from brooq_py.queue import Job, State
from brooq_py.queue.port import ClaimedJob
from tests.polling import wait_for
from tests.unit.conftest import FAST
from tests.unit.fake_repo import FakeRepo


class OwingRepo(FakeRepo):
    """Enqueues that wake no one (a row the claims' heads passed), and a read owed at ``owe_at``."""

    def __init__(self) -> None:
        super().__init__()
        self.silent = False
        self.owe_at: float | None = None
        self.asked: list[tuple[str, ...]] = []
        self.claimed: list[tuple[str, ...]] = []

    def _notify(self, kind: str, topic: str) -> None:
        if not self.silent:
            super()._notify(kind, topic)

    def owed_in(self, topics: Sequence[str]) -> float | None:
        with self.lock:
            self.asked.append(tuple(topics))
            return None if self.owe_at is None else max(0.0, self.owe_at - time.monotonic())

    def take_owed(self, topics: Sequence[str]) -> list[str]:
        with self.lock:
            if self.owe_at is None or self.owe_at > time.monotonic():
                return []
            self.owe_at = None
            return ["t"]

    def claim(self, topics: Sequence[str], limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        self.claimed.append(tuple(topics))
        return super().claim(topics, limit, worker, lease)


@pytest.fixture
def owing() -> Iterator[OwingRepo]:
    yield OwingRepo()


def test_an_owed_read_brings_in_a_row_nothing_woke_the_engine_for(owing: OwingRepo) -> None:
    e = Engine(owing, Config(workers=2, poll_interval=3600, lease=3, **FAST))  # type: ignore[arg-type]
    e.register_kind("t", lambda ctx, claim: None)
    e.register_kind("u", lambda ctx, claim: None)
    try:
        owing.silent = True
        owing.owe_at = time.monotonic() + 1.0  # as a claim past the heads leaves it
        e.start()
        wait_for(lambda: owing.asked, "the dispatcher's first wait")  # its start-up claim is made
        jid = owing.enqueue(Job("t")).id  # only the owed read can bring it in
        wait_for(lambda: owing.row(jid).state is State.DONE, "the row the owed read claims", 30)
        assert ("t", "u") in owing.asked  # asked for the engine's own topics
        assert owing.claimed[-1] == ("t",)  # the owed topic claimed alone, not with "u"
    finally:
        e.stop(timeout=1)


def test_no_owed_read_leaves_an_unannounced_row_to_the_poll(owing: OwingRepo) -> None:
    """The control: without the owed read, the same row waits for the poll (an hour here)."""
    e = Engine(owing, Config(workers=2, poll_interval=3600, lease=3, **FAST))  # type: ignore[arg-type]
    e.register_kind("t", lambda ctx, claim: None)
    try:
        e.start()
        time.sleep(0.3)  # the start-up claims are over
        owing.silent = True
        jid = owing.enqueue(Job("t")).id
        time.sleep(1.5)
        assert owing.row(jid).state is State.PENDING
    finally:
        e.stop(timeout=1)
