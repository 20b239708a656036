"""A closing transaction whose row is locked elsewhere waits alone, off its slot (SPEC O4, C9, C11): fake repo.

The fake's ``locked`` rows stand for an operator's open ``SELECT ... FOR UPDATE``: the closing
transaction locks its row first (never waiting), finds it held, rolls back before any of its
work ran, and is tried again from the completer's queue. Meanwhile its slot serves other jobs;
the closing work commits once, after the lock is gone; a stop lets a still-locked one go to the
reaper, nothing of it committed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import Callable

import pytest

from brooq_py.engine import Engine
from brooq_py.queue import Claim, Context, Job, KindOptions, State, Tx
from tests.polling import wait_for
from tests.unit.conftest import FAST
from tests.unit.fake_repo import FakeRepo


def children(repo: FakeRepo, parent: str) -> int:
    with repo.lock:
        return sum(1 for r in repo.rows.values() if r.topic == "child" and r.payload == {"parent": parent})


class Closing:
    def __init__(self, repo: FakeRepo) -> None:
        self.repo = repo
        self.calls: Counter[str] = Counter()
        self.returned = threading.Event()

    def close(self, claim: Claim) -> None:
        def callback(tx: Tx) -> None:
            self.calls[claim.id] += 1

        claim.on_succeeded(callback)
        claim.chain(Job("child", {"parent": claim.id}))
        if claim.topic == "locked":
            with self.repo.lock:  # as an operator's psql transaction: the row held until released
                self.repo.locked.add(claim.id)
            self.returned.set()

    def sync_handler(self, ctx: Context, claim: Claim) -> None:
        self.close(claim)

    async def async_handler(self, ctx: Context, claim: Claim) -> None:
        await asyncio.sleep(0)
        self.close(claim)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_l3_a_locked_closing_transaction_frees_its_slot_and_runs_its_closing_work_once(
    repo: FakeRepo, make_engine: Callable[..., Engine], kind: str
) -> None:
    """One slot: while the locked job's closing transaction waits, the slot runs the other jobs
    (closing work included) to done; nothing of the locked job's closing work commits until the
    lock is gone (its callback not run meanwhile), then all of it once."""
    e = make_engine(workers=1)
    closing = Closing(repo)
    handler = closing.sync_handler if kind == "sync" else closing.async_handler
    e.register_kind("locked", handler, KindOptions(max_attempts=1, **FAST))
    e.register_kind("free", handler, KindOptions(max_attempts=1, **FAST))
    jid = e.enqueue(Job("locked")).id
    e.start()
    assert closing.returned.wait(10)
    others = [e.enqueue(Job("free")).id for _ in range(5)]
    wait_for(
        lambda: all(repo.row(o).state is State.DONE for o in others),
        what="the other jobs done on the one slot while the row is locked",
    )
    assert repo.row(jid).state is State.PROCESSING
    assert closing.calls[jid] == 0 and children(repo, jid) == 0  # nothing runs before the row is ours
    assert jid in {a.id for a in e.inflight.held()}  # the claim is still held
    with repo.lock:
        repo.locked.discard(jid)
    wait_for(lambda: repo.row(jid).state is State.DONE, what="done once the lock is gone")
    assert closing.calls[jid] == 1 and children(repo, jid) == 1
    assert all(closing.calls[o] == 1 and children(repo, o) == 1 for o in others)
    assert repo.row(jid).history == [State.PROCESSING, State.DONE]
    wait_for(lambda: not e.inflight.held(), what="every lease let go")


def test_l3_c11_a_stop_lets_a_still_locked_closing_transaction_go_to_the_reaper(
    repo: FakeRepo, make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    """The lock outlasts the stop's wait (a lease): stop() returns, the attempt is let go, the row
    stays processing for the reaper, and nothing of its closing work committed, then or later."""
    e = make_engine(lease=0.6)
    closing = Closing(repo)
    e.register_kind("locked", closing.sync_handler, KindOptions(max_attempts=1, **FAST))
    jid = e.enqueue(Job("locked")).id
    e.start()
    assert closing.returned.wait(10)
    with caplog.at_level(logging.WARNING):
        e.stop(timeout=0.1)
    assert not e.inflight.held()
    assert repo.row(jid).state is State.PROCESSING
    assert any("done not written at stop" in r.getMessage() for r in caplog.records)
    with repo.lock:
        repo.locked.discard(jid)
    assert repo.row(jid).state is State.PROCESSING
    assert closing.calls[jid] == 0 and children(repo, jid) == 0  # none of it ran


def test_l3_run_once_waits_in_place_for_a_locked_closing_transaction(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """Without start() (run_once, drain) the closing transaction is tried again in the caller's
    thread while the claim is held: run_once returns with the job done, its closing work once."""
    e = make_engine(lease=10)
    closing = Closing(repo)
    e.register_kind("locked", closing.sync_handler, KindOptions(max_attempts=1, **FAST))
    jid = e.enqueue(Job("locked")).id

    def unlock() -> None:
        assert closing.returned.wait(10)
        with repo.lock:
            repo.locked.discard(jid)

    t = threading.Timer(0.3, unlock)
    t.start()
    assert e.run_once() == 1
    t.join()
    assert repo.row(jid).state is State.DONE
    assert closing.calls[jid] == 1 and children(repo, jid) == 1  # run once, after the lock


def test_p1_c11_a_claim_called_hung_and_locked_at_stop_is_the_reapers_once_the_lock_is_gone(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """The handler was called hung (nothing written, its claim dropped) while an operator holds
    its row: the stop's hand-back meets the lock and returns all the same; once the lock is gone
    the reaper returns the row (the engine's row is gone, the claim's own lease passes), counted
    as a crash."""
    e = make_engine(lease=0.6, watchdog_grace=0.2)
    release = threading.Event()

    def stuck(ctx: Context, claim: Claim) -> None:
        release.wait(30)  # ignores its context: hung at its attempt_timeout

    e.register_kind("t", stuck, KindOptions(max_attempts=3, attempt_timeout=0.8, **FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.PROCESSING, what="the job running")
    with repo.lock:
        repo.locked.add(jid)
    wait_for(lambda: e.inflight.hung_count() == 1, what="the handler called hung")
    e.stop(timeout=0.1)
    release.set()
    assert repo.row(jid).state is State.PROCESSING
    with repo.lock:
        repo.locked.discard(jid)
    wait_for(lambda: repo.reap() != [] or repo.row(jid).state is State.PENDING, what="reaped")
    assert repo.row(jid).state is State.PENDING and repo.row(jid).crashes == 1
