"""Claims answered late or taken in late (SPEC P1'': a slow statement never makes a claim expire; L5')
and run_once's check at a handler's start: every job runs, once, no attempt spent nor crash counted."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from tests.integration.conftest import q
from tests.polling import wait_for


class Shifted:
    """The real clocks, moved forward by *offset* seconds when a test says so (no sleeping)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.offset)


def _done(store: Store, job: str) -> bool:
    r = store.get(job)
    return r is not None and r.state is State.DONE


def _row(pool: ConnectionPool[Any], schema: str, job: str) -> tuple[Any, ...]:
    return q(pool, schema, "SELECT state, attempts, crashes FROM {job} WHERE id = %s", job)[0]


def test_run_once_keeps_a_capped_topics_room_after_a_row_it_gave_back(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """run_once claims a limited topic's row first (slow: the clock moves past lease - margin), then a
    capped topic's (concurrency=1): the second row is taken in late and handed back unrun. The capped
    topic must be claimable again by the next run_once (its claimed-here count given back)."""
    clock = Shifted()
    e = engines(clock=clock, lease=3, workers=2, claim_batch=2)

    def slow(ctx: Context, claim: Claim) -> str:
        clock.offset += 10.0  # the claim is lease - margin old when the next row is taken in
        return "slow"

    e.register_kind("late.limited", slow)
    e.register_kind("late.capped", lambda ctx, claim: "capped", KindOptions(concurrency=1))
    store.set_limit("late.limited", 10)  # a limited topic is claimed first, alone
    s = store.enqueue(Job("late.limited", {"n": 0})).id
    c = store.enqueue(Job("late.capped", {"n": 1})).id
    assert e.run_once() == 2
    assert store.get(s).state is State.DONE  # type: ignore[union-attr]
    got = store.get(c)
    assert got is not None and got.state in (State.PENDING, State.DONE), got
    assert (got.attempts, got.crashes) == ((0, 0) if got.state is State.PENDING else (1, 0)), got
    # the next run_once claims the capped topic's job
    ran = [e.run_once() for _ in range(3)]
    got = store.get(c)
    assert got is not None and got.state is State.DONE, (
        f"the handed-back capped job was never claimed again by this engine (run_once claimed {ran}): {got}"
    )


def test_run_once_batch_call_after_lease_margin_never_counts_a_crash(
    pool: ConnectionPool[Any], schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    """run_once, a batch kind of batch_size 1, two rows: the first call is slow (the clock moves past
    lease - margin), so the second call is not started (P1). That job never ran: it must neither be
    counted a crash nor poisoned (max_crashes=1), and must run later (L5')."""
    clock = Shifted()
    e = engines(clock=clock, lease=2, workers=2, claim_batch=2)
    calls: list[list[str]] = []

    def many(ctx: Context, claims: list[Claim]) -> list[str]:
        calls.append([c.id for c in claims])
        if len(calls) == 1:
            clock.offset += 10.0
        return ["ok"] * len(claims)

    e.register_batch("late.batch", many, KindOptions(batch_size=1, max_crashes=1))
    a = store.enqueue(Job("late.batch", {"n": 0})).id
    b = store.enqueue(Job("late.batch", {"n": 1})).id
    assert e.run_once() == 2
    assert calls[0] == [a], calls  # (since afa49ce the second call is not started: P1)
    # the row's lease (2 s) runs out; a reaper pass takes back what was left processing
    time.sleep(2.5)
    store.reap()
    after_reap = _row(pool, schema, b)
    for _ in range(3):
        e.run_once()
        if (r := store.get(b)) is not None and r.state is State.DONE:
            break
    got = store.get(b)
    assert got is not None and got.state is State.DONE, (
        f"L5': the never-run job (after the reap: {after_reap}) ended {got.state if got else None}: "
        f"{got.last_error if got else None}"
    )
    assert after_reap[2] == 0, f"L5': a job whose handler never started was counted a crash: {after_reap}"


def test_a_capped_topics_claim_answered_late_runs(
    pool: ConnectionPool[Any], schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    """One engine, a topic of concurrency 1: the first claim that returns a row is answered late (lease
    - margin after it began; a slow statement). The row is handed back unrun: pending, its attempt
    given back, no crash. It must then be claimed again and run by the same engine (the only one)."""
    own = Store(pool, schema=schema)
    e = engines(repo=own, lease=3, workers=2)
    ran: list[str] = []
    e.register_kind("late.cap1", lambda ctx, claim: ran.append(claim.id) or "ok", KindOptions(concurrency=1))
    real = own.worker.claim
    slowed: list[str] = []

    def slow_claim(names: Sequence[str], *rest: Any) -> Any:
        rows = real(names, *rest)
        if rows and not slowed:
            slowed.extend(r.id for r in rows)
            time.sleep(2.5)  # lease 3, margin 1: taken in after lease - margin
        return rows

    own.worker.claim = slow_claim  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job("late.cap1", {"n": 0})).id
    wait_for(lambda: slowed, "the slow claim", 30)
    wait_for(lambda: _row(pool, schema, job)[0] != "processing", "handed back", 30)
    state, attempts, crashes = _row(pool, schema, job)
    assert crashes == 0, (state, attempts, crashes)
    wait_for(
        lambda: (r := store.get(job)) is not None and r.state is State.DONE,
        f"the handed-back job run again (rows {_row(pool, schema, job)})",
        30,
    )
    assert ran == [job]
    state, attempts, crashes = _row(pool, schema, job)
    assert (attempts, crashes) == (1, 0), (state, attempts, crashes)


def test_a_sequence_heads_claim_answered_late_keeps_the_order(
    pool: ConnectionPool[Any], schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    """A sequence's head is claimed late and handed back: the sequence runs in enqueue order, each
    member once, no attempt spent nor crash counted by the hand-back."""
    own = Store(pool, schema=schema)
    e = engines(repo=own, lease=3, workers=4)
    ran: list[int] = []
    e.register_kind("late.seq", lambda ctx, claim: ran.append(claim.payload["n"]) or "ok")
    real = own.worker.claim
    slowed: list[str] = []

    def slow_claim(names: Sequence[str], *rest: Any) -> Any:
        rows = real(names, *rest)
        if rows and not slowed:
            slowed.extend(r.id for r in rows)
            time.sleep(2.5)
        return rows

    own.worker.claim = slow_claim  # type: ignore[method-assign]
    jobs = [store.enqueue(Job("late.seq", {"n": i}, sequence="s")).id for i in range(4)]
    e.start()
    wait_for(
        lambda: all((r := store.get(j)) is not None and r.state is State.DONE for j in jobs),
        "the sequence done",
        60,
    )
    assert ran == [0, 1, 2, 3], ran
    rows = [_row(pool, schema, j) for j in jobs]
    assert all(r[1:] == (1, 0) for r in rows), rows


def test_claims_answered_within_their_statement_budget_still_run(
    pool: ConnectionPool[Any], schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    """P1'' (a slow statement never makes a claim expire): every claim statement is slow, answered
    well within its own budget (statement_budget(2 s) = 2 s) but after lease - margin (1.33 s). The
    engine's row stays fresh all along; the jobs must still run (no livelock of hand-backs)."""
    own = Store(pool, schema=schema)
    e = engines(repo=own, lease=2, workers=2)
    e.register_kind("late.slowclaim", lambda ctx, claim: "ok")
    real = own.worker.claim
    rounds = [0]

    def slow_claim(names: Sequence[str], *rest: Any) -> Any:
        rounds[0] += 1
        time.sleep(1.5)  # a slow server: answered within the statement's budget
        return real(names, *rest)

    own.worker.claim = slow_claim  # type: ignore[method-assign]
    jobs = [store.enqueue(Job("late.slowclaim", {"n": i})).id for i in range(2)]
    e.start()
    try:
        wait_for(
            lambda: all((r := store.get(j)) is not None and r.state is State.DONE for j in jobs),
            "the jobs run",
            40,
        )
    finally:
        rows = [_row(pool, schema, j) for j in jobs]
    assert all(r[2] == 0 for r in rows), rows


def test_a_row_that_fails_to_be_taken_in_is_given_back_and_runs_later(
    pool: ConnectionPool[Any], schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    """Taking a claimed row in raises (a bug, here injected once): the row must not wait, answered and
    never named lost, for the engine's end; it is given back (no attempt spent, no crash) and runs."""
    e = engines(lease=3, workers=2)
    ran: list[str] = []
    e.register_kind("late.bug", lambda ctx, claim: ran.append(claim.id) or "ok")
    real = e.intake.open
    failed: list[str] = []

    def open_once_failing(row: Any, *rest: Any) -> Any:
        if not failed:
            failed.append(row.id)
            raise RuntimeError("injected")
        return real(row, *rest)

    e.intake.open = open_once_failing  # type: ignore[method-assign]
    job = store.enqueue(Job("late.bug", {"n": 0})).id
    e.start()
    wait_for(lambda: (r := store.get(job)) is not None and r.state is State.DONE, "the job run after all", 30)
    assert failed == [job] and ran == [job]
    assert _row(pool, schema, job)[1:] == (1, 0)


def test_lost_claim_answer_is_still_found_by_the_orphan_look_and_run(
    pool: ConnectionPool[Any], schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    """P1'': the claim commits, its answer is lost (the connection breaks at the commit). The row never
    reached Capacity, so it is not 'received': the orphan look must still name it, the reaper take it
    back, and the engine (the only one) run it, once, while it lives."""
    own = Store(pool, schema=schema)
    e = engines(repo=own, lease=3, workers=2)
    ran: list[str] = []
    e.register_kind("late.lost", lambda ctx, claim: ran.append(claim.id) or "ok")
    real = own.worker.claim
    lost: list[str] = []

    def lossy(names: Sequence[str], *rest: Any) -> Any:
        rows = real(names, *rest)
        if rows and not lost:
            lost.extend(r.id for r in rows)
            raise psycopg.OperationalError("injected: connection lost at the claim's commit")
        return rows

    own.worker.claim = lossy  # type: ignore[method-assign]
    job = store.enqueue(Job("late.lost", {"n": 0})).id
    e.start()
    wait_for(lambda: lost, "the lost claim", 30)
    wait_for(lambda: _done(store, job), f"the orphan run (row {_row(pool, schema, job)})", 60)
    assert ran == [job]
    assert e.inflight._received == set(), e.inflight._received


def test_lost_answer_of_a_later_statement_after_an_earlier_one_answered(
    pool: ConnectionPool[Any], schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    """A claim round: the capped topic's statement answers (its row received, run), then the common
    statement commits and its answer is lost. Capacity.claim keeps the earlier rows; the lost rows
    must come back through the orphan look and run, each job once; no room left held."""
    own = Store(pool, schema=schema)
    e = engines(repo=own, lease=3, workers=4)
    ran: list[str] = []
    e.register_kind("late.cap", lambda ctx, claim: ran.append(claim.id) or "ok", KindOptions(concurrency=1))
    e.register_kind("late.free", lambda ctx, claim: ran.append(claim.id) or "ok")
    real = own.worker.claim
    lost: list[str] = []

    def lossy(names: Sequence[str], *rest: Any) -> Any:
        rows = real(names, *rest)
        if rows and not lost and list(names) == ["late.free"]:
            lost.extend(r.id for r in rows)
            raise psycopg.OperationalError("injected: connection lost at the claim's commit")
        return rows

    own.worker.claim = lossy  # type: ignore[method-assign]
    a = store.enqueue(Job("late.cap", {"n": 0})).id
    b = store.enqueue(Job("late.free", {"n": 1})).id
    e.start()
    wait_for(lambda: lost, "the lost common claim", 30)
    wait_for(lambda: _done(store, a) and _done(store, b), "both jobs done", 60)
    assert sorted(ran) == sorted([a, b]), ran
    assert e.inflight._received == set(), e.inflight._received
    wait_for(lambda: not e.capacity._active, f"room given back ({e.capacity._active})", 10)


def test_poisoned_row_gives_its_capped_topics_room_back(
    pool: ConnectionPool[Any], schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    """Q3/T2: a poisoned row of a topic of concurrency=1 ends dead; the next job of the topic runs."""
    e = engines(lease=3, workers=2)
    ran: list[str] = []
    e.register_kind(
        "late.poison",
        lambda ctx, claim: ran.append(claim.id) or "ok",
        KindOptions(concurrency=1, max_crashes=1),
    )
    a = store.enqueue(Job("late.poison", {"n": 0})).id
    q(pool, schema, "UPDATE {job} SET crashes = 1 WHERE id = %s", a)
    e.start()
    wait_for(lambda: _row(pool, schema, a)[0] == "dead", "the poisoned row dead", 30)
    b = store.enqueue(Job("late.poison", {"n": 1})).id
    wait_for(lambda: _done(store, b), f"the next job run (active={dict(e.capacity._active)})", 30)
    assert ran == [b]
    wait_for(lambda: not e.capacity._active, f"room given back ({e.capacity._active})", 10)
    assert e.inflight._received == set()


def test_run_once_give_back_keeps_an_operator_cancel(
    pool: ConnectionPool[Any], schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    """run_once: the first handler cancels the second job and is slow (past lease - margin): the second
    handler is not started and its row given back. The operator's cancel must stand (not pending
    again), nothing spent for it; the next run_once must not run it."""
    clock = Shifted()
    e = engines(clock=clock, lease=3, workers=2, claim_batch=2)
    ran: list[str] = []
    jobs: list[str] = []

    def handler(ctx: Context, claim: Claim) -> str:
        ran.append(claim.id)
        if claim.id == jobs[0]:
            assert store.cancel(jobs[1])
            clock.offset += 10.0
        return "ok"

    e.register_kind("late.once", handler)
    jobs.append(store.enqueue(Job("late.once", {"n": 0})).id)
    jobs.append(store.enqueue(Job("late.once", {"n": 1})).id)
    assert e.run_once() == 2
    assert ran == [jobs[0]], ran
    assert _row(pool, schema, jobs[1])[0] == "canceled", _row(pool, schema, jobs[1])
    e.run_once()
    assert ran == [jobs[0]], ran
    assert _row(pool, schema, jobs[1])[0] == "canceled"
    assert _row(pool, schema, jobs[1])[2] == 0


def test_run_once_give_back_pending_unspent(
    pool: ConnectionPool[Any], schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    """run_once: the second handler is not started (its claim lease - margin old): pending again,
    attempts and crashes as before the claim (0, 0); the room of its capped topic given back; a later
    run_once runs it, attempts 1."""
    clock = Shifted()
    e = engines(clock=clock, lease=3, workers=2, claim_batch=2)
    ran: list[str] = []
    jobs: list[str] = []

    def handler(ctx: Context, claim: Claim) -> str:
        ran.append(claim.id)
        if claim.id == jobs[0]:
            clock.offset += 10.0
        return "ok"

    e.register_kind("late.once2", handler, KindOptions(concurrency=2))
    jobs.append(store.enqueue(Job("late.once2", {"n": 0})).id)
    jobs.append(store.enqueue(Job("late.once2", {"n": 1})).id)
    assert e.run_once() == 2
    assert ran == [jobs[0]]
    assert _row(pool, schema, jobs[1]) == ("pending", 0, 0)
    assert not e.capacity._active, e.capacity._active
    assert e.inflight._received == set()
    e.run_once()
    assert ran == jobs
    assert _row(pool, schema, jobs[1]) == ("done", 1, 0)


def test_run_once_gives_back_a_row_whose_taking_in_raises(
    pool: ConnectionPool[Any], schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    """run_once claims two rows and taking the first in raises (a bug, injected once): the row is given
    back, unspent, the other runs, and the next run_once runs the first; nothing is left noted as
    answered (a started engine's look for lost answers would never name it)."""
    e = engines(lease=3, workers=2, claim_batch=2)
    ran: list[str] = []
    e.register_kind("late.ro", lambda ctx, claim: ran.append(claim.id) or "ok")
    real = e.intake.open
    failed: list[str] = []

    def open_once_failing(row: Any, *rest: Any) -> Any:
        if not failed:
            failed.append(row.id)
            raise RuntimeError("injected")
        return real(row, *rest)

    e.intake.open = open_once_failing  # type: ignore[method-assign]
    jobs = [store.enqueue(Job("late.ro", {"n": i})).id for i in range(2)]
    assert e.run_once() == 2
    (bad,) = failed
    assert _row(pool, schema, bad) == ("pending", 0, 0)
    assert e.inflight._received == set()
    e.run_once()
    assert sorted(ran) == sorted(jobs) and all(_row(pool, schema, j) == ("done", 1, 0) for j in jobs)
