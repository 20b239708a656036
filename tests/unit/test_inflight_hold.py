"""InFlight.add/cancel/canceled_before (hold and start in one move, SPEC P1, X2'): the
cancel is either told to a held, started attempt or kept for the hold, never both, never lost; no
deadlock between InFlight's lock and the attempts' own."""

from __future__ import annotations

import contextlib
import random
import threading
from datetime import UTC, datetime

from brooq_py.engine.attempt.attempt import Attempt, Hooks, Kind
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.engine.attempt.outcome import Phase
from brooq_py.queue import Claim, Context, JobCanceledByOperator, KindOptions, LeaseLost
from brooq_py.queue.port import ClaimedJob


def _attempt(i: int, hooks: Hooks | None = None, token: str | None = None) -> Attempt:
    row = ClaimedJob(
        id=f"00000000-0000-0000-0000-{i:012d}",
        topic="t",
        payload={},
        attempts=1,
        priority=0,
        claim_token=token or f"tok-{i}",
        locked_by="w",
        locked_until=datetime.now(UTC),
    )

    def handler(ctx: Context, claim: Claim) -> None:
        return None

    return Attempt(row, Kind.build("t", handler, KindOptions()), 0.0, Context(), hooks=hooks)


def test_add_holds_and_starts_in_one_move_a_poisoned_one_is_held_unstarted() -> None:
    f = InFlight()
    a = _attempt(1)
    assert f.add(a)
    assert a.phase is Phase.RUNNING
    p = _attempt(2)
    p.end(Phase.POISONED)
    assert f.add(p)
    assert p.phase is Phase.POISONED
    assert f.by_token(p.row.claim_token) is p
    assert f.running() == [a], "a poisoned attempt has no handler: never running"


def test_a_closed_inflight_holds_no_more_of_the_dispatchers_take_ins() -> None:
    f = InFlight()
    a, b, c = _attempt(1), _attempt(2), _attempt(3)
    assert f.add(a, dispatched=True)
    f.close()
    assert not f.add(b, dispatched=True)
    assert b.phase is Phase.CLAIMED and f.held() == [a] and f.running() == [a]
    assert f.add(c), "run_once after a stop holds its own claims"


def test_a_cancel_before_the_hold_is_kept_once_after_it_is_told() -> None:
    f = InFlight()
    a = _attempt(1)
    assert f.cancel(a.id, a.row.claim_token) is None
    assert f.add(a)
    assert f.canceled_before(a) is True
    assert f.canceled_before(a) is False  # forgotten once asked
    b = _attempt(2)
    assert f.add(b)
    assert f.cancel(b.id, b.row.claim_token) is b
    assert f.canceled_before(b) is False
    assert f.cancel(b.id, "") is b  # the job-id path: its newest held attempt


def test_a_cancel_of_an_old_claim_never_cancels_the_new_claim_of_the_job() -> None:
    f = InFlight()
    old = _attempt(1, token="old")
    assert f.add(old)
    assert f.drop(old)
    assert f.cancel(old.id, "old") is None  # kept for a hold of "old" that never comes
    new = _attempt(1, token="new")
    assert f.add(new)
    assert f.canceled_before(new) is False


def _race_round(n: int) -> None:
    f = InFlight()
    attempts = [_attempt(i) for i in range(n)]
    told: dict[int, Attempt | None] = {}
    before: dict[int, bool] = {}
    seen_unstarted: list[int] = []
    order = list(range(n))
    random.shuffle(order)
    barrier = threading.Barrier(2)

    def holder() -> None:
        barrier.wait()
        for i in range(n):
            assert f.add(attempts[i])
            before[i] = f.canceled_before(attempts[i])

    def canceler() -> None:
        barrier.wait()
        for i in order:
            a = f.cancel(attempts[i].id, attempts[i].row.claim_token)
            if a is not None and a.phase is not Phase.RUNNING:
                seen_unstarted.append(i)
            told[i] = a

    threads = [threading.Thread(target=holder), threading.Thread(target=canceler)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert seen_unstarted == []
    for i in range(n):
        assert (told[i] is not None) != before[i], (i, told[i], before[i])


def test_x2_racing_cancels_and_holds_each_cancel_told_once_never_to_an_unstarted_attempt() -> None:
    """Many holds and their cancels on threads of their own: each cancel is either returned with its
    attempt held and started, or kept and found by the hold's canceled_before; never both, never lost."""
    for _round in range(20):
        _race_round(200)


def test_no_deadlock_between_holds_cancels_endings_and_drops() -> None:
    """InFlight's lock is taken before an attempt's (add starts it under InFlight's lock): the
    endings (lost, declared hung, given up) and InFlight's own calls race without a deadlock."""
    hooks = Hooks()
    f = InFlight()
    hooks.left_running = f.end
    hooks.let_go = f.drop
    hooks.drop_claim = lambda a: f.drop_claim(a.row.claim_token, a.id)
    n = 300
    attempts = [_attempt(i, hooks) for i in range(n)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def guard(fn):  # type: ignore[no-untyped-def]
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        return run

    def holder() -> None:
        for a in attempts:
            f.add(a)
            f.canceled_before(a)

    def canceler() -> None:
        while not stop.is_set():
            a = attempts[random.randrange(n)]
            got = f.cancel(a.id, a.row.claim_token)
            if got is not None:
                got.lost(JobCanceledByOperator("x"))

    def watchdog() -> None:
        while not stop.is_set():
            for a in f.running():
                if a.phase is Phase.RUNNING and random.random() < 0.3:
                    a.given_up()
                a.declared_hung(0.0)
                f.held()
                f.hung_count()

    def ender() -> None:
        while not stop.is_set():
            for a in f.running():
                if random.random() < 0.3:
                    with contextlib.suppress(Exception):  # ended twice: this fake ends at random
                        a.raised(LeaseLost("end"))

    threads = [threading.Thread(target=guard(t)) for t in (holder, canceler, watchdog, ender)]
    for t in threads:
        t.start()
    threads[0].join(30)
    stop.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert errors == []
