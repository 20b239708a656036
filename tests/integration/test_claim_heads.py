"""SPEC B1 and C1: a claim reads past the head its topic's claims reached, and nothing is lost
before the head (postgres/worker/heads.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.postgres.worker.heads import FULL_RESCAN, RESCAN, ClaimHeads
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome
from tests.integration.test_store_worker import db  # noqa: F401 - the fixture: the test schema's raw connection

LEASE = timedelta(seconds=60)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(store: Store) -> Clock:
    """The Store's claim heads on a clock the test moves (RESCAN: when a topic is read from a minute
    before its head; FULL_RESCAN: from its start)."""
    c = Clock()
    store.worker._heads = ClaimHeads(clock=c)
    return c


def claim(store: Store, n: int = 10, topic: str = "t") -> list[Any]:
    return [r.payload for r in store.worker.claim([topic], n, "w", LEASE)]


def _scan_buffers(plan: dict[str, Any]) -> int:
    """Buffers read by the claim index scans that ran."""
    total = 0
    stack = [plan]
    while stack:
        node = stack.pop()
        if node.get("Index Name") == "job_claim_idx" and node.get("Actual Loops", 0) > 0:
            total += node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
        stack.extend(node.get("Plans", []))
    return total


def test_b1_past_its_head_a_claim_reads_none_of_the_dead_entries_a_held_horizon_keeps(
    dsn: str,
    store: Store,
    db: psycopg.Connection[Any],  # noqa: F811
) -> None:
    """While an xid is held, every job claimed leaves a dead entry at the head of the claim index
    that vacuum cannot remove: read from its start, the claim walks them all; past its head, none."""
    with psycopg.connect(dsn, autocommit=True) as hold:
        hold.execute("BEGIN")
        hold.execute("SELECT txid_current()")
        last = None
        for _ in range(8):
            store.enqueue_many([Job("t", i) for i in range(500)])
            rows = store.worker.claim(["t"], 500, "w", LEASE)
            store.worker.settle_many([Outcome(r.id, r.claim_token, State.DONE) for r in rows])
            last = rows[-1]
        assert last is not None and last.available_at is not None
        store.enqueue_many([Job("t", i) for i in range(20)])
        costs = {}
        for name, priority, after in (("whole", None, None), ("past the head", 0, last.available_at)):
            params = {
                "topics": ["t"],
                "priority": [priority],
                "after": [after],
                "slack": "2 seconds",
                "limit": 10,
                "worker": "w",
                "lease": LEASE,
            }
            with db.transaction(force_rollback=True):
                [[explained]] = db.execute(
                    b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + store.session.q["job_claim"].composed,
                    params,
                ).fetchall()
            costs[name] = _scan_buffers(explained[0]["Plan"])
        hold.execute("ROLLBACK")
    assert costs["past the head"] <= 20, costs
    assert costs["whole"] >= 5 * costs["past the head"], costs


def test_b1_a_job_that_sorts_before_the_head_is_claimed_by_the_next_wide_or_whole_read(
    store: Store, clock: Clock
) -> None:
    store.enqueue_many([Job("t", i) for i in range(3)])
    assert claim(store) == [0, 1, 2]  # read whole: the head is set
    now = datetime.now(UTC)
    store.enqueue(Job("t", "an hour back", available_at=now - timedelta(hours=1)))
    store.enqueue(Job("t", "30 s back", available_at=now - timedelta(seconds=30)))
    store.enqueue(Job("t", "new"))
    assert claim(store) == ["new"]  # past the head: the back-dated rows are not read
    clock.now += RESCAN
    assert claim(store) == ["30 s back"]  # read from a minute before the head
    clock.now += FULL_RESCAN
    assert claim(store) == ["an hour back"]  # read from the start


def test_b1_c1_a_higher_priority_enqueued_after_the_head_still_goes_first(store: Store, clock: Clock) -> None:
    store.enqueue_many([Job("t", i) for i in range(3)])
    assert claim(store, 1) == [0]
    store.enqueue(Job("t", "urgent", priority=5))
    store.enqueue(Job("t", "urgent, older", priority=5, available_at=datetime.now(UTC) - timedelta(hours=1)))
    assert claim(store, 3) == ["urgent, older", "urgent", 1]


def test_b1_lower_priorities_are_claimed_when_the_usual_one_has_too_few(store: Store, clock: Clock) -> None:
    store.enqueue_many([Job("t", i) for i in range(2)])
    assert claim(store, 1) == [0]
    store.enqueue(Job("t", "later", priority=-1))
    store.enqueue(Job("t", "later, older", priority=-1, available_at=datetime.now(UTC) - timedelta(hours=1)))
    assert claim(store, 5) == [1, "later, older", "later"]


def test_b1_a_row_locked_when_a_claim_passed_it_is_claimed_once_unlocked(
    store: Store,
    db: psycopg.Connection[Any],  # noqa: F811
    clock: Clock,
) -> None:
    """An operator's lock made the claim skip a row, and the next claims read past it: the next
    read from the start takes it, nothing is left behind."""
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    locked = store.enqueue(Job("t", 0, available_at=hour_ago)).id  # sorts before the head, by more than SLACK
    store.enqueue_many([Job("t", i) for i in (1, 2)])
    with db.transaction():
        db.execute("SELECT 1 FROM job WHERE id = %s FOR UPDATE", (locked,))
        assert claim(store) == [1, 2]
    store.enqueue(Job("t", 3))
    assert claim(store) == [3]
    clock.now += RESCAN
    assert claim(store) == []  # an hour before the head: beyond the wide reads
    clock.now += FULL_RESCAN
    assert claim(store) == [0]


def test_b1_run_once_reads_whole_so_a_script_sees_every_ready_row(store: Store, clock: Clock) -> None:
    """Engine.run_once (scripts, tests, testing.drain) claims rows before the head at once."""
    ran: list[Any] = []
    engine = Engine(store, Config(workers=4))
    engine.register_kind("t", lambda ctx, claim: ran.append(claim.payload))
    try:
        store.enqueue_many([Job("t", i) for i in range(2)])
        assert engine.run_once() == 2
        store.enqueue(Job("t", "back-dated", available_at=datetime.now(UTC) - timedelta(hours=1)))
        assert engine.run_once() == 1
        assert ran == [0, 1, "back-dated"]
    finally:
        engine.close()
