"""A take-in that raises hands its row back unrun (SPEC C1, C11, L5', Q2, Q3, Q5, X2', BD1): the
give-back with its own hand-over failing, a cancel racing it, a batch, an async kind, run_once,
events and metrics, sequences, unique keys, and a poisoned take-in raising before its dead outcome.

Faults are injected by wrapping engine methods; every blocked thread is released in a finally."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.engine.attempt.outcome import Phase
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Event, Job, KindOptions, State
from tests.integration.conftest import wait_listening
from tests.integration.take_in import (
    enqueue_known,
    fault_after_hold,
    hear_cancels,
    job_state,
    join_dispatchers,
    poisoned_job,
    register,
    stall_launch,
    stall_take_in,
)
from tests.polling import wait_for

SHAPES = ["sync", "async", "batch", "batch-wait"]


def _metric(e: Engine, name: str, *labels: str) -> float:
    return float(e.metrics.child(getattr(e.metrics, name), *labels)._value.get())


# --- 1. the UNRUN give-back's own hand-over raising ----------------------------------------------


def test_a_give_back_whose_hand_over_fails_never_leaves_the_row_processing_while_the_engine_runs(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """open() raises after the hold; the UNRUN give-back's hand-over then raises too (the store
    unreachable for that write, say). The attempt is let go: the reaper takes the row back and it
    runs, never processing for as long as the engine runs (it stayed held, its claim reported held by
    every beat)."""
    topic = "r3.unrun.handover.fails"
    runs: list[Any] = []
    e = engines(lease=3, workers=1)
    register(e, topic, "sync", runs)
    faulted = fault_after_hold(e, topic)
    real = e.handover.hand_over
    failed: list[str] = []

    def hand_over(a: Any, outcome: Any) -> None:
        if (
            outcome is not None
            and a.id in faulted
            and not failed
            and outcome.state is State.PENDING
            and outcome.give_back
        ):
            failed.append(a.id)
            raise RuntimeError("injected: the UNRUN give-back's write failed")
        real(a, outcome)

    e.handover.hand_over = hand_over  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    wait_for(lambda: failed, "the fault and the failed give-back", 30)
    try:
        wait_for(
            lambda: job_state(pool, schema, job)[0] != "processing",
            "the row out of processing (given back, or reaped)",
            20,  # over six leases
        )
    except AssertionError as exc:
        held = [(a.id, a.phase, a.handler) for a in e.inflight.held()]
        raise AssertionError(
            f"{exc}: row {job_state(pool, schema, job)}, still held {held}, dropped {e.inflight.dropped()}"
        ) from None
    wait_for(lambda: job_state(pool, schema, job)[0] == "done", "run in the end", 30)
    assert [j for j, _ in runs] == [job]


# --- 2. a poisoned take-in raising before its dead outcome is decided -----------------------------


def test_l5_poisoned_take_in_raising_before_its_dead_outcome_never_holds_the_row_forever(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """A poisoned row is ended POISONED and held; open() raises after the hold and before
    ``a.poisoned()`` (here: right after its room is given back). The attempt is let go: the reaper
    takes the row back and the next claim ends it dead (L5'), never processing for as long as the
    engine runs."""
    topic = "r3.poison.before.dead"
    runs: list[Any] = []
    e = engines(lease=3, workers=1)
    register(e, topic, "sync", runs)
    job = poisoned_job(store, pool, schema, topic)
    real = e.capacity.ended
    faulted: list[str] = []

    def ended(t: str) -> None:
        real(t)
        if t == topic and not faulted:  # its first end: open()'s poison branch, after the hold
            faulted.append(t)
            raise RuntimeError("injected: a bug in open() before the dead outcome")

    e.capacity.ended = ended  # type: ignore[method-assign]
    e.start()
    wait_for(lambda: faulted, "the fault", 30)
    try:
        wait_for(
            lambda: job_state(pool, schema, job)[0] != "processing",
            "the poisoned row out of processing (dead, or reaped and dead later)",
            20,
        )
    except AssertionError as exc:
        held = [(a.id, a.phase) for a in e.inflight.held()]
        raise AssertionError(f"{exc}: row {job_state(pool, schema, job)}, held {held}") from None
    wait_for(lambda: job_state(pool, schema, job)[0] == "dead", "dead in the end", 30)
    assert runs == []


# --- 3. a batch of three, its middle take-in raising -------------------------------------------


@pytest.mark.parametrize("is_async", [False, True])
def test_bd1_an_unrun_member_of_a_gathering_batch_is_left_out_and_the_others_run(
    is_async: bool, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """batch_size=3, batch_wait: three jobs claimed together, the second's take-in raises after the
    hold (UNRUN, handed back, launched into the batcher). The batch call never gets the unrun claim;
    the other two run once; the handed-back job runs later under a new claim; every slot and the
    topic's room come back; nothing counted hung."""
    topic = f"r3.batch.unrun.{'async' if is_async else 'sync'}"
    calls: list[list[tuple[str, str]]] = []
    e = engines(lease=6, workers=3, claim_batch=3)

    def many(ctx: Context, claims: list[Claim]) -> list[str]:
        calls.append([(c.id, c.claim_token) for c in claims])
        return ["ran"] * len(claims)

    async def many_async(ctx: Context, claims: list[Claim]) -> list[str]:
        return many(ctx, claims)

    e.register_batch(topic, many_async if is_async else many, KindOptions(batch_size=3, batch_wait=1.0))
    jobs = [store.enqueue(Job(topic, {"n": i})).id for i in range(3)]
    faulted: list[Any] = []
    real = e.inflight.canceled_before

    def canceled_before(a: Any) -> bool:
        if a.id == jobs[1] and not faulted:
            faulted.append(a)
            raise RuntimeError("injected: a bug in open() after the hold")
        return bool(real(a))

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    e.start()
    wait_for(lambda: all(job_state(pool, schema, j)[0] == "done" for j in jobs), "all three done", 60)
    wait_for(lambda: e.inflight.running() == [] and e.inflight.held() == [], "nothing left", 30)
    ran = [r for c in calls for r in c]
    assert faulted
    bad = faulted[0].row.claim_token
    assert [r for r in ran if r[1] == bad] == [], f"the unrun claim reached the batch call: {calls}"
    assert sorted(j for j, _ in ran) == sorted(jobs), f"each job run exactly once: {calls}"
    wait_for(lambda: e._slots is not None and e._slots.free == e.config.workers, "slots back", 10)
    assert dict(e.capacity._active) == {}
    assert _metric(e, "hung", topic) == 0 and e.health().hung == 0
    assert job_state(pool, schema, jobs[1])[:3] == ("done", 1, 0)


# --- 4. every shape: what lands in the row, the events and the counters ---------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_an_unrun_take_in_writes_a_requeue_once_and_counts_nothing_else(
    shape: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """open() raises after the hold: the row goes back pending (attempt given back, no crash, no
    error), runs once later; its events are claimed, requeued, claimed, done (never failed, dead or
    canceled); no failed, dead or hung counted; nothing busy in the end."""
    topic = f"r3.shape.{shape}"
    runs: list[Any] = []
    e = engines(lease=6, workers=2)
    register(e, topic, shape, runs, batch_wait=0.3)
    events: list[Event] = []
    e.on_event(events.append)
    faulted = fault_after_hold(e, topic)
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    wait_for(lambda: job_state(pool, schema, job)[0] == "done", "run in the end", 30)
    wait_for(lambda: e.inflight.running() == [] and e.inflight.held() == [], "nothing left", 30)
    wait_for(lambda: [ev.kind for ev in events if ev.job_id == job][-1:] == ["done"], "events delivered", 10)
    kinds = [ev.kind for ev in events if ev.job_id == job]
    row = job_state(pool, schema, job)
    assert faulted == [job]
    assert [j for j, _ in runs] == [job]
    assert row[:3] == ("done", 1, 0), row
    assert kinds == ["claimed", "requeued", "claimed", "done"], kinds
    for state in ("failed", "dead", "canceled"):
        assert _metric(e, "settled", topic, state) == 0, state
    assert _metric(e, "settled", topic, "done") == 1
    assert _metric(e, "hung", topic) == 0 and e.health().hung == 0
    assert _metric(e, "busy", topic) == 0
    wait_for(lambda: e._slots is not None and e._slots.free == e.config.workers, "slots back", 10)


# --- 5. the operator's cancel racing the UNRUN give-back ------------------------------------------


@pytest.mark.parametrize("when", ["during-hand-over", "after-give-back-before-launch"])
def test_x2_a_cancel_racing_the_unrun_give_back_wins(
    when: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """open() raises after the hold; the operator cancels the job while the UNRUN give-back is being
    handed over (row still processing under the claim) or once it is written and before the
    attempt's launch. The cancel wins: the row ends canceled, never pending again, never run."""
    topic = f"r3.cancel.unrun.{when}"
    runs: list[Any] = []
    jobs: list[str] = []
    e = engines(lease=6, workers=1)
    register(e, topic, "sync", runs)
    heard, errors = hear_cancels(e, jobs)
    faulted = fault_after_hold(e, topic)
    real = e.handover.hand_over
    canceled: list[bool] = []

    def hand_over(a: Any, outcome: Any) -> None:
        if (
            when == "during-hand-over"
            and outcome is not None
            and a.id in faulted
            and outcome.state is State.PENDING
            and not canceled
        ):
            canceled.append(store.cancel(a.id))
            assert heard.wait(30), "the listener handled the cancel"
        real(a, outcome)

    e.handover.hand_over = hand_over  # type: ignore[method-assign]
    stall = stall_launch(e, topic) if when != "during-hand-over" else None
    e.start()
    wait_listening(pool, schema)
    enqueue_known(store, Job(topic, {"n": 0}), jobs)
    job = jobs[0]
    try:
        if stall is not None:
            assert stall.held.wait(30)
            wait_for(lambda: job_state(pool, schema, job)[0] == "pending", "the give-back written", 30)
            canceled.append(store.cancel(job))
    finally:
        if stall is not None:
            stall.go.set()
    wait_for(lambda: canceled, "the cancel", 30)
    wait_for(lambda: e.inflight.running() == [] and e.inflight.held() == [], "nothing left", 30)
    time.sleep(1.0)  # a stray give-back or re-claim would land within this
    row = job_state(pool, schema, job)
    assert canceled == [True]
    assert row[0] == "canceled", f"the operator's cancel lost to the give-back: {row}"
    assert runs == []
    assert errors == []
    wait_for(lambda: e._slots is not None and e._slots.free == e.config.workers, "slots back", 10)


# --- 6. sequences and unique keys -----------------------------------------------------------------


def test_q5_a_sequence_member_handed_back_unrun_still_runs_first(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """A sequence of three; the first member's take-in raises after the hold (handed back unrun).
    The members still run one at a time, in enqueue order, each once."""
    topic = "r3.seq"
    order: list[str] = []
    active = [0]
    peak = [0]
    lock = threading.Lock()

    def handler(ctx: Context, claim: Claim) -> str:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        order.append(claim.id)
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return "ok"

    e = engines(lease=6, workers=3)
    e.register_kind(topic, handler)
    jobs = [store.enqueue(Job(topic, {"n": i}, sequence="s1")).id for i in range(3)]
    faulted = fault_after_hold(e, topic)
    e.start()
    wait_for(lambda: all(job_state(pool, schema, j)[0] == "done" for j in jobs), "the sequence done", 60)
    assert faulted == [jobs[0]]
    assert order == jobs, f"Q5: run out of order or twice: {order}"
    assert peak[0] == 1


def test_a_unique_job_handed_back_unrun_keeps_its_key_and_runs_once(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """A unique job's take-in raises after the hold; while it is handed back (and a new enqueue of
    its key comes), it stays one job, run once."""
    topic = "r3.unique"
    runs: list[Any] = []
    e = engines(lease=6, workers=1)
    register(e, topic, "sync", runs)
    faulted: list[str] = []
    dup: list[Any] = []
    real = e.inflight.canceled_before

    def canceled_before(a: Any) -> bool:
        if not faulted:
            faulted.append(a.id)
            dup.append(store.enqueue(Job(topic, {"n": 1}, unique_key="k1")))
            raise RuntimeError("injected: a bug in open() after the hold")
        return bool(real(a))

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job(topic, {"n": 0}, unique_key="k1")).id
    wait_for(lambda: job_state(pool, schema, job)[0] == "done", "done", 30)
    time.sleep(0.5)
    assert dup and dup[0].id == job and not dup[0].created, dup
    assert [j for j, _ in runs] == [job]


# --- 7. run_once with a take-in raising --------------------------------------------------------


@pytest.mark.parametrize("shape", ["sync", "async", "batch"])
def test_run_once_with_a_take_in_raising_hands_the_row_back_unrun(
    shape: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """run_once(): the take-in raises after the hold. The row is pending (attempt given back, no
    crash), the handler not run, nothing left held or running; a second run_once runs it once."""
    topic = f"r3.once.{shape}"
    runs: list[Any] = []
    e = engines(lease=6, workers=2, claim_batch=2)
    register(e, topic, shape, runs)
    faulted = fault_after_hold(e, topic)
    job = store.enqueue(Job(topic, {"n": 0})).id
    other = store.enqueue(Job(topic, {"n": 1})).id
    assert e.run_once() == 2
    assert len(faulted) == 1
    bad = faulted[0]
    good = other if bad == job else job
    assert job_state(pool, schema, bad)[:3] == ("pending", 0, 0), job_state(pool, schema, bad)
    assert job_state(pool, schema, good)[0] == "done"
    assert [j for j, _ in runs] == [good]
    assert e.inflight.held() == [] and e.inflight.running() == []
    assert e.run_once() == 1
    assert sorted(j for j, _ in runs) == sorted([job, other])
    assert job_state(pool, schema, bad)[:3] == ("done", 1, 0)


# --- 8. stop while an unrun attempt waits in the batcher -------------------------------------------


def test_c11_stop_while_an_unrun_attempt_waits_in_the_batcher(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """batch_wait=30: a batch member's take-in raises after the hold; its UNRUN attempt waits in the
    batcher beside a plain one. stop() within its bound; the plain job runs (a batch still gathering
    starts at stop), the unrun claim never reaches the call, slots back, nothing hung."""
    topic = "r3.stop.batcher"
    calls: list[list[tuple[str, str]]] = []
    e = engines(lease=6, workers=3, watchdog_grace=0.5)

    def many(ctx: Context, claims: list[Claim]) -> list[str]:
        calls.append([(c.id, c.claim_token) for c in claims])
        return ["ran"] * len(claims)

    e.register_batch(topic, many, KindOptions(batch_size=3, batch_wait=30))
    faulted: list[Any] = []
    real = e.inflight.canceled_before

    def canceled_before(a: Any) -> bool:
        if not faulted:
            faulted.append(a)
            raise RuntimeError("injected: a bug in open() after the hold")
        return bool(real(a))

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    e.start()
    first = store.enqueue(Job(topic, {"n": 0})).id
    wait_for(lambda: faulted, "the fault", 30)
    wait_for(lambda: e.runner.batcher.waiting(topic) >= 2, "the unrun and the re-claim waiting", 30)
    t0 = time.monotonic()
    e.stop(timeout=2)
    took = time.monotonic() - t0
    join_dispatchers()
    bad = faulted[0].row.claim_token
    ran = [r for c in calls for r in c]
    assert took <= 2 + 0.5 + 5, f"C11'': {took:.1f}s"
    assert [r for r in ran if r[1] == bad] == [], calls
    assert job_state(pool, schema, first)[0] in ("done", "pending"), job_state(pool, schema, first)
    assert len([r for r in ran if r[0] == first]) <= 1, calls
    assert e.inflight.running() == [] and e.inflight.held() == []
    assert e._slots is not None and e._slots.free == e.config.workers
    assert _metric(e, "hung", topic) == 0


# --- 9. a global limit and a concurrency cap with unrun batch members -----------------------------


def test_q2_q3_unrun_batch_members_never_let_a_limited_topic_past_its_limit(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """set_limit(topic, 2), concurrency=2, a batch kind: every third take-in raises after the hold.
    Never more than two claims of the topic in one call or at once; every job done once; the room
    comes back (more jobs run afterwards)."""
    topic = "r3.limit.batch"
    active = [0]
    peak = [0]
    lock = threading.Lock()
    ran: list[str] = []

    def many(ctx: Context, claims: list[Claim]) -> list[str]:
        with lock:
            active[0] += len(claims)
            peak[0] = max(peak[0], active[0])
            ran.extend(c.id for c in claims)
        time.sleep(0.05)
        with lock:
            active[0] -= len(claims)
        return ["ok"] * len(claims)

    store.set_limit(topic, 2)
    e = engines(lease=6, workers=4)
    e.register_batch(topic, many, KindOptions(batch_size=2, batch_wait=0.2, concurrency=2))
    n = [0]
    real = e.inflight.canceled_before

    def canceled_before(a: Any) -> bool:
        n[0] += 1
        if n[0] % 3 == 0:
            raise RuntimeError("injected: a bug in open() after the hold")
        return bool(real(a))

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    jobs = [store.enqueue(Job(topic, {"n": i})).id for i in range(12)]
    e.start()
    wait_for(lambda: all(job_state(pool, schema, j)[0] == "done" for j in jobs), "all done", 90)
    e.inflight.canceled_before = real  # type: ignore[method-assign]
    more = [store.enqueue(Job(topic, {"n": 100 + i})).id for i in range(4)]
    wait_for(lambda: all(job_state(pool, schema, j)[0] == "done" for j in more), "room back", 60)
    assert n[0] >= 3
    assert peak[0] <= 2, f"Q2/Q3: {peak[0]} claims of a topic limited to 2 at once"
    assert sorted(ran) == sorted(jobs + more), "each job run exactly once"
    wait_for(lambda: e._slots is not None and e._slots.free == e.config.workers, "slots back", 10)
    wait_for(lambda: dict(e.capacity._active) == {}, "room back", 10)


# --- 10. a take-in stalled past attempt_timeout + grace, then raising ------------------------------


def test_a_take_in_stalled_past_its_timeout_then_raising_counts_no_hung_handler(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """open() stalls after the hold past attempt_timeout and watchdog_grace, then raises. Its handler
    never ran: no hung handler counted (metrics, health), no crash on its row; the watchdog's verdict
    hands it back unrun. (Failed before ``Attempt.call``: the watchdog called the held attempt hung
    and the reaper took the dropped claim back with crashes+1.)"""
    topic = "r3.stall.hung"
    runs: list[Any] = []
    e = engines(lease=3, workers=1, watchdog_grace=0.3)
    register(e, topic, "sync", runs, KindOptions(attempt_timeout=0.5, max_execution_timeout=60))
    real = e.inflight.canceled_before
    faulted: list[Any] = []

    def canceled_before(a: Any) -> bool:
        if not faulted:
            faulted.append(a)
            wait_for(lambda: a.ctx.done(), "timed out", 30)
            time.sleep(1.0)  # past the grace
            raise RuntimeError("injected: a bug in open() after the hold")
        return bool(real(a))

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    wait_for(lambda: job_state(pool, schema, job)[0] == "done", "run in the end", 60)
    row = job_state(pool, schema, job)
    problems = []
    if _metric(e, "hung", topic):
        problems.append(f"a handler that never ran counted hung: {_metric(e, 'hung', topic)}")
    if row[2]:
        problems.append(f"a crash counted for a handler that never ran: {row}")
    if faulted and faulted[0].ending is not Phase.UNRUN:
        problems.append(f"ended {faulted[0].ending}, not unrun")
    assert [j for j, _ in runs] == [job]
    assert not problems, problems


# --- 11. counters of a never-run attempt ------------------------------------------------------------


def _duration_count(e: Engine, topic: str) -> float:
    child = e.metrics.child(e.metrics.duration, topic)
    return float(sum(b.get() for b in child._buckets))


@pytest.mark.parametrize("shape", ["sync", "async"])
def test_an_unrun_attempt_is_not_observed_as_a_handler_run(
    shape: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """brooq_attempt_duration_seconds ("handler run time per attempt"): a job whose first take-in
    raised (never run) and that then ran once is one observation, not two. (Fails, minor: the
    launch's start check of the UNRUN attempt goes through Runner._observe, as any attempt ended
    before its start does.)"""
    topic = f"r3.duration.{shape}"
    runs: list[Any] = []
    e = engines(lease=6, workers=1)
    register(e, topic, shape, runs)
    fault_after_hold(e, topic)
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    wait_for(lambda: job_state(pool, schema, job)[0] == "done", "run in the end", 30)
    wait_for(lambda: e.inflight.running() == [], "nothing running", 30)
    assert len(runs) == 1
    assert _duration_count(e, topic) == 1, f"{_duration_count(e, topic)} handler runs observed for one"


# --- 12. stop while an UNRUN attempt waits for its launch --------------------------------------------


def test_c11_an_unrun_attempt_not_launched_at_stop_is_not_counted_hung(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """A claim of two rows: the first's take-in raises after the hold (UNRUN, its row handed back at
    once), the second's take-in stalls, so the first is not launched yet when stop() comes. The stop
    cancels the never-run attempt and, still "running" after its grace, declares it hung: a handler
    that never ran (its row already written pending) counted hung. stop() stays within its bound;
    the rows are pending, attempts given back, never run."""
    topic = "r3.stop.unrun.unlaunched"
    runs: list[Any] = []
    e = engines(lease=6, workers=2, claim_batch=2, watchdog_grace=0.3)
    register(e, topic, "sync", runs)
    faulted = fault_after_hold(e, topic)
    # the second row of the claim: the first's launch waits behind it
    gate = stall_take_in(e, lambda row: bool(faulted) and row.id not in faulted)
    jobs = [store.enqueue(Job(topic, {"n": i})).id for i in range(2)]
    e.start()
    took = 0.0
    try:
        assert gate.entered.wait(30)
        wait_for(lambda: job_state(pool, schema, faulted[0])[0] == "pending", "the give-back written", 30)
        t0 = time.monotonic()
        e.stop(timeout=0.5)
        took = time.monotonic() - t0
    finally:
        gate.go.set()
    join_dispatchers()
    wait_for(lambda: e.inflight.running() == [], "the launch ended the attempt", 30)
    for j in jobs:
        wait_for(lambda j=j: job_state(pool, schema, j)[0] != "processing", "handed back", 30)
    assert took <= 0.5 + 0.3 + 5, f"C11'': {took:.1f}s"
    assert runs == []
    assert [job_state(pool, schema, j)[:3] for j in jobs] == [("pending", 0, 0)] * 2
    assert e._slots is not None and e._slots.free == e.config.workers
    assert _metric(e, "hung", topic) == 0, (
        f"a never-run (unrun) attempt counted hung: {_metric(e, 'hung', topic)}"
    )


# --- 13. a canceled sequence member whose take-in raises ---------------------------------------------


@pytest.mark.parametrize("when", ["canceled-then-fault", "fault-then-canceled-pending"])
def test_q5_x2_a_canceled_member_whose_take_in_raised_lets_its_sequence_go_on(
    when: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """A sequence A, B. A's take-in raises after the hold, and A is canceled by an operator: before
    the fault (the cancel reaches the held attempt) or after the give-back (A pending). A never runs
    and ends canceled; B runs once (the sequence is not left halted by the never-run member)."""
    topic = f"r3.seq.cancel.{when}"
    runs: list[str] = []
    jobs: list[str] = []
    e = engines(lease=3, workers=2)

    def handler(ctx: Context, claim: Claim) -> str:
        runs.append(claim.id)
        return "ok"

    e.register_kind(topic, handler)
    heard, errors = hear_cancels(e, jobs)
    faulted: list[str] = []
    real = e.inflight.canceled_before

    def canceled_before(a: Any) -> bool:
        if not faulted:
            faulted.append(a.id)
            if when == "canceled-then-fault":
                assert store.cancel(a.id)
                assert heard.wait(30), "the listener handled the cancel"
            raise RuntimeError("injected: a bug in open() after the hold")
        return bool(real(a))

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    stall = stall_launch(e, topic) if when != "canceled-then-fault" else None
    e.start()
    wait_listening(pool, schema)
    a_id = store.enqueue(Job(topic, {"n": 0}, sequence="s")).id
    jobs.append(a_id)
    b_id = store.enqueue(Job(topic, {"n": 1}, sequence="s")).id
    try:
        if stall is not None:
            assert stall.held.wait(30)
            wait_for(lambda: job_state(pool, schema, a_id)[0] == "pending", "A given back", 30)
            assert store.cancel(a_id)
    finally:
        if stall is not None:
            stall.go.set()
    wait_for(lambda: job_state(pool, schema, b_id)[0] == "done", "B run after the canceled A", 30)
    assert job_state(pool, schema, a_id)[0] == "canceled"
    assert runs == [b_id]
    assert errors == []
