"""The claim heads against real claims that overlap (SPEC B1, C1): Engine.run_once's read_whole()
(forget) holds while another claim of the same Store is in flight."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.postgres.worker.heads import FULL_RESCAN, ClaimHeads
from brooq_py.queue import Job
from tests.integration.test_claim_heads import LEASE, Clock, claim


class HookedHeads(ClaimHeads):
    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.after_forget = lambda: None

    def forget(self) -> None:
        super().forget()
        self.after_forget()


def test_c1_b1_run_once_reads_whole_even_when_another_claim_returns_after_its_forget(store: Store) -> None:
    """Another engine on the Store has a claim in flight (topics u and t, limit 1), planned before
    run_once's read_whole(): a whole read of both; its one row is u's priority-9 job, so it takes
    none of t. It returns after run_once's forget() and before run_once plans its claim (a window
    that holds run_once's limited- and capped-topic statements; here the test puts it there).
    run_once still claims t's ready back-dated row: a script's claim sees every ready row."""
    clock = Clock()
    heads = HookedHeads(clock)
    store.worker._heads = heads
    store.enqueue(Job("t", "warm"))
    assert claim(store) == ["warm"]  # read whole: the head is set
    store.enqueue(Job("t", "back-dated", available_at=datetime.now(UTC) - timedelta(hours=1)))
    store.enqueue(Job("u", "urgent", priority=9))
    clock.now += FULL_RESCAN  # the next claim of t reads it whole

    real = store.worker._own_or_pool
    waiting, go = threading.Event(), threading.Event()
    other_thread: list[threading.Thread] = []

    def slow_for_the_other(*args: Any) -> Any:
        if threading.current_thread() in other_thread:
            waiting.set()
            go.wait(10)  # the statement in flight
        return real(*args)

    store.worker._own_or_pool = slow_for_the_other  # type: ignore[method-assign]
    other_rows: list[Any] = []
    other = threading.Thread(
        target=lambda: other_rows.extend(store.worker.claim(["u", "t"], 1, "other", LEASE)), daemon=True
    )
    other_thread.append(other)
    other.start()
    assert waiting.wait(10)  # planned: a whole read of u and t

    def the_other_claim_returns() -> None:
        go.set()
        other.join(10)

    heads.after_forget = the_other_claim_returns
    ran: list[Any] = []
    engine = Engine(store, Config(workers=4))
    engine.register_kind("t", lambda ctx, c: ran.append(c.payload))
    try:
        engine.run_once()
    finally:
        engine.close()
    assert [r.payload for r in other_rows] == ["urgent"]
    assert ran == ["back-dated"], f"run_once ran {ran}: a ready row of t was not read"
