"""Poison verdicts held back (SPEC L5, L6'), on the in-memory repo: a verdict that meets its row
locked elsewhere, a stop meeting a verdict being written, and what a written verdict tells."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence

import pytest

from brooq_py.engine import Engine
from brooq_py.engine.attempt import held
from brooq_py.engine.repo import Outcome
from brooq_py.engine.services import late
from brooq_py.queue import Job, KindOptions, State
from tests.polling import wait_for
from tests.unit.conftest import FAST
from tests.unit.fake_repo import FakeRepo


def poisoned(repo: FakeRepo, e: Engine, handler: Callable[..., object] = lambda ctx, claim: None) -> str:
    """A job of topic "t" whose one attempt ended without an outcome, for *e* to claim (poison)."""
    e.register_kind("t", handler, KindOptions(max_attempts=1, **FAST))
    jid = e.enqueue(Job("t")).id
    repo.row(jid).attempts = 1
    return jid


def test_l6_a_verdict_that_met_a_lock_waits_once_it_goes_for_the_late_done_backing_off_on_it(
    repo: FakeRepo, make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator holds the poison claim's row locked when its verdict comes due. The last attempt
    ran in another engine, whose late done backs off on that lock, up to LATE_LOCKED_MAX between
    tries. Whenever the lock goes, that done must still come first: here it tries again
    LATE_LOCKED_MAX after the lock went, which fell just before the verdict's next turn."""
    cap = 1.0
    monkeypatch.setattr(held, "LATE_LOCKED_MAX", cap)
    monkeypatch.setattr(late, "LOCKED_MAX", cap)
    e = make_engine(lease=2)
    jid = poisoned(repo, e)
    e.start()
    wait_for(lambda: repo.row(jid).attempts == 2, what="the poison claim")
    repo.locked.add(jid)  # the operator's transaction
    wait_for(lambda: repo.calls.get("settle_many", 0) >= 1, what="the verdict to meet the lock")
    met = time.monotonic()
    assert repo.row(jid).state is State.PROCESSING
    # The verdict's next turn comes no earlier than 2 * LATE_LOCKED_MAX after it met the lock: the
    # lock goes just before, the other engine's done comes LATE_LOCKED_MAX after that.
    time.sleep(max(0.0, met + 2 * cap - 0.3 - time.monotonic()))
    repo.locked.discard(jid)
    time.sleep(cap)
    lost = Outcome(id=jid, claim_token=str(uuid.uuid4()), state=State.DONE, topic="t", result='{"by": "a"}')
    assert repo.settle_lost(lost, 1, "engine-a", True), repo.row(jid).state  # the late done wins (L6')
    wait_for(lambda: not e.inflight.held(), what="the verdict to find the row no longer its claim's")
    r = repo.row(jid)
    assert (r.state, r.attempts, r.claim_token) == (State.DONE, 1, lost.claim_token)
    assert not e.registry.get_sample_value("brooq_settle_total", {"topic": "t", "outcome": "dead"})


def test_l6_a_verdict_whose_row_stays_locked_is_never_written_over_a_cancel_and_lets_it_go(
    repo: FakeRepo, make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row stays locked well past the verdict's hold; the operator's transaction cancels the job
    and commits. The verdict, held back meanwhile with its lease kept, writes nothing: canceled."""
    monkeypatch.setattr(held, "LATE_LOCKED_MAX", 0.5)
    e = make_engine(lease=1)
    jid = poisoned(repo, e)
    e.start()
    wait_for(lambda: repo.row(jid).attempts == 2, what="the poison claim")
    repo.locked.add(jid)
    wait_for(lambda: repo.calls.get("settle_many", 0) >= 1, what="the verdict to meet the lock")
    time.sleep(1.5)  # renewals meanwhile: the row is still the claim's, its lease held
    (a,) = e.inflight.held()
    assert repo.row(jid).state is State.PROCESSING and e.inflight.fresh(a)
    with repo.lock:  # the operator's UPDATE, then its commit
        assert repo.cancel(jid)
        repo.locked.discard(jid)
    wait_for(lambda: not e.inflight.held(), what="the verdict to let the row go")
    assert repo.row(jid).state is State.CANCELED
    e.stop(timeout=1)
    assert repo.row(jid).state is State.CANCELED


def test_c11_a_stop_meeting_a_verdict_being_written_still_writes_it(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """The stop hands every held verdict over (L5) while the late-outcomes thread is writing one that
    meets its row locked: that verdict is not held back again behind the stop's back, left unwritten
    once the engine stopped (C11). The lock goes as that write returns: the stop writes it."""
    e = make_engine(lease=1)
    jid = poisoned(repo, e)
    entered, stopping = threading.Event(), threading.Event()
    real_settle = repo.settle_many

    def settle_many(outcomes: Sequence[Outcome]) -> set[str]:
        if threading.current_thread().name != "brooq-late-outcomes" or entered.is_set():
            return real_settle(outcomes)
        entered.set()
        stopping.wait(5)
        time.sleep(0.3)  # the stop's hand-over of the held verdicts runs meanwhile
        written = real_settle(outcomes)
        repo.locked.discard(jid)  # the operator commits
        return written

    repo.settle_many = settle_many  # type: ignore[method-assign]
    real_release = e.handover.release_held

    def release_held(everything: bool = False) -> int:
        if everything:
            stopping.set()
        return real_release(everything)

    e.handover.release_held = release_held  # type: ignore[method-assign]
    e.start()
    wait_for(lambda: repo.row(jid).attempts == 2, what="the poison claim")
    repo.locked.add(jid)
    assert entered.wait(10)
    e.stop(timeout=1)
    assert repo.row(jid).state is State.DEAD


def test_q3_a_verdict_written_late_makes_room_in_its_limited_topic_at_once(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """A topic limited to one processing job: the poison claim takes its room while its verdict is
    held back. Once the verdict is written, the next job of the topic is claimed then, not a poll
    interval later (the written outcome wakes the claim, as every outcome written does)."""
    repo.settings["t"] = (False, 1)
    e = make_engine(lease=1, poll_interval=30)
    ran = threading.Event()
    jid = poisoned(repo, e, lambda ctx, claim: ran.set())
    other = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).attempts == 2, what="the poison claim")
    wait_for(lambda: repo.row(jid).state is State.DEAD, what="the verdict", timeout=10)
    assert ran.wait(10), "the next job of the limited topic was not claimed"
    wait_for(lambda: repo.row(other).state is State.DONE, what="the next job done")


def test_l5_n1_a_verdict_the_ticker_writes_is_counted_told_and_its_attempt_settled_once(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """Written by the late-outcomes ticker, not the completer: the same bookkeeping (O1, N1)."""
    e = make_engine(lease=0.5)
    jid = poisoned(repo, e)
    events: list[tuple[str, str]] = []
    e.on_event(lambda ev: events.append((ev.kind, ev.job_id)))
    e.start()
    wait_for(lambda: repo.row(jid).state is State.DEAD, what="the verdict")
    wait_for(lambda: ("dead", jid) in events, what="its event")
    assert not e.inflight.held()
    e.stop(timeout=1)
    assert events.count(("dead", jid)) == 1
    assert e.registry.get_sample_value("brooq_settle_total", {"topic": "t", "outcome": "dead"}) == 1


def test_l3_c11_a_stop_while_the_verdicts_row_stays_locked_returns_and_writes_nothing(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """The operator's lock outlasts the engine: the stop tries the verdict once more and returns,
    the row left processing under the poison claim (the reaper's once the lock goes)."""
    e = make_engine(lease=0.5)
    jid = poisoned(repo, e)
    e.start()
    wait_for(lambda: repo.row(jid).attempts == 2, what="the poison claim")
    repo.locked.add(jid)
    wait_for(lambda: repo.calls.get("settle_many", 0) >= 1, what="the verdict to meet the lock")
    e.stop(timeout=1)
    assert repo.row(jid).state is State.PROCESSING
    assert e.handover.release_held(everything=True) == 0  # nothing held back behind the stop
