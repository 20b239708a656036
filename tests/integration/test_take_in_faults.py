"""A take-in that fails, or meets a stop, a cancel, the watchdog or a poisoned row (SPEC P1, X2', C1,
C11, C11'', L5', Q2, Q3): its handler never starts, its slot and its topic's room come back once, its
row is handed back unrun or settled, never left processing while the engine runs.

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
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from tests.integration.conftest import wait_listening
from tests.integration.take_in import (
    fault_after_hold,
    hear_cancels,
    job_state,
    join_dispatchers,
    poisoned_job,
    register,
    stall_take_in,
)
from tests.polling import wait_for


def _hung(e: Engine, topic: str) -> float:
    return float(e.metrics.child(e.metrics.hung, topic)._value.get())


class Peak:
    """Counts handlers running at once (max seen) and records the slots' free count over time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0

    def enter(self) -> None:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)

    def leave(self) -> None:
        with self.lock:
            self.active -= 1


def _watch_slots(e: Engine, stop: threading.Event, seen: list[int]) -> threading.Thread:
    """Record the highest free-slot count seen (a slot freed twice shows as free > workers)."""

    def run() -> None:
        while not stop.is_set():
            if e._slots is not None:
                seen[0] = max(seen[0], e._slots.free)
            time.sleep(0.005)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# --- 1. open() raises after the hold, the attempt ended meanwhile by another thread -------------------


def test_c1_take_in_raising_after_a_cancel_reached_the_held_attempt(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """The attempt is held and started; an operator's cancel reaches it (ended, let go) and then open()
    raises (a bug after the hold). The attempt, still running though no longer held, goes to its
    launch, where its start's check ends it: its slot is freed once (with workers=1, never two
    handlers at once, C1), and no hung handler is left. (The take-in found no held attempt, handed
    the row back and freed the slot; the watchdog then called the never-run attempt hung and freed
    it again.)"""
    topic, work = "r2.fault.canceled", "r2.work.canceled"
    e = engines(lease=6, workers=1, watchdog_grace=0.3)
    e.register_kind(topic, lambda ctx, claim: "ran", KindOptions(concurrency=1))
    peak = Peak()
    both = threading.Event()

    def worker(ctx: Context, claim: Claim) -> str:
        peak.enter()
        if peak.active >= 2:
            both.set()
        both.wait(3)  # held a while: a second handler beside it shows a slot too many
        peak.leave()
        return "ok"

    e.register_kind(work, worker)
    jobs: list[str] = []
    heard, errors = hear_cancels(e, jobs)
    faulted: list[str] = []
    real = e.inflight.canceled_before

    def canceled_before(a: Any) -> bool:
        if a.topic == topic and not faulted:
            faulted.append(a.id)
            jobs.append(a.id)
            assert store.cancel(a.id)  # processing under this claim: the NOTIFY names the held attempt
            assert heard.wait(30), "the listener handled the cancel"
            raise RuntimeError("injected: a bug in open() after the hold")
        return bool(real(a))

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    seen = [0]
    stop = threading.Event()
    problems = []
    e.start()
    _watch_slots(e, stop, seen)
    try:
        wait_listening(pool, schema)
        f = store.enqueue(Job(topic, {"n": 0})).id
        wait_for(lambda: faulted, "the fault", 30)
        wait_for(lambda: job_state(pool, schema, f)[0] == "canceled", "the canceled row written", 30)
        time.sleep(1.0)  # past the watchdog's grace (0.3 s): its verdict on the never-run attempt is in
        jobs2 = [store.enqueue(Job(work, {"n": i})).id for i in range(3)]
        wait_for(lambda: all(job_state(pool, schema, j)[0] == "done" for j in jobs2), "work done", 60)
        g = store.enqueue(Job(topic, {"n": 1})).id
        try:
            wait_for(lambda: job_state(pool, schema, g)[0] == "done", "the next job of the topic run", 15)
        except AssertionError as exc:
            problems.append(
                f"Q2: {exc} (row {job_state(pool, schema, g)}, capacity {dict(e.capacity._active)})"
            )
    finally:
        stop.set()
    if peak.peak > 1:
        problems.append(f"C1: {peak.peak} handlers at once with workers=1")
    if seen[0] > e.config.workers:
        problems.append(f"C1: slots free {seen[0]} > workers {e.config.workers} (a slot freed twice)")
    running = [(a.id, a.phase, a.handler) for a in e.inflight.running()]
    if running:
        problems.append(f"an attempt never launched left running: {running}")
    if _hung(e, topic) or e.health().hung:
        problems.append(f"a handler that never ran counted hung: {_hung(e, topic)}, health {e.health().hung}")
    if errors:
        problems.append(f"cancel errors {errors}")
    assert not problems, problems


def test_c1_take_in_raising_after_the_watchdog_gave_the_held_attempt_up(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """The attempt is held and started; the dispatcher stalls in open() past max_execution_timeout,
    the watchdog gives the attempt up (frees its slot), then open() raises. The slot is not freed a
    second time (C1), and the topic (concurrency=1) is claimed again (Q2)."""
    faulty, work = "r2.fault.gaveup", "r2.work"
    e = engines(lease=6, workers=1, watchdog_grace=0.3)
    peak = Peak()
    both = threading.Event()

    def worker(ctx: Context, claim: Claim) -> str:
        peak.enter()
        if peak.active >= 2:
            both.set()
        both.wait(3)  # held a while: a second handler beside it shows a slot too many
        peak.leave()
        return "ok"

    e.register_kind(
        faulty,
        lambda ctx, claim: "ok",
        KindOptions(attempt_timeout=1, max_execution_timeout=1, concurrency=1),
    )
    e.register_kind(work, worker)
    faulted: list[Any] = []
    real = e.inflight.canceled_before

    def canceled_before(a: Any) -> bool:
        if a.topic == faulty and not faulted:
            faulted.append(a)
            wait_for(lambda: a.ending is Phase.GAVE_UP, "the watchdog gave the held attempt up", 30)
            raise RuntimeError("injected: a bug in open() after the hold")
        return bool(real(a))

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    seen = [0]
    stop = threading.Event()
    e.start()
    _watch_slots(e, stop, seen)
    problems = []
    try:
        f = store.enqueue(Job(faulty, {})).id
        wait_for(lambda: faulted, "the fault", 30)
        wait_for(lambda: job_state(pool, schema, f)[0] != "processing", "the given-up attempt written", 30)
        jobs = [store.enqueue(Job(work, {"n": i})).id for i in range(3)]
        wait_for(lambda: all(job_state(pool, schema, j)[0] == "done" for j in jobs), "work done", 60)
        try:
            wait_for(lambda: job_state(pool, schema, f)[0] == "done", "the faulted job retried and done", 20)
        except AssertionError as exc:
            problems.append(
                f"Q2: {exc} (row {job_state(pool, schema, f)}, capacity {dict(e.capacity._active)})"
            )
    finally:
        stop.set()
    if peak.peak > 1:
        problems.append(f"C1: {peak.peak} handlers at once with workers=1")
    if seen[0] > e.config.workers:
        problems.append(f"C1: slots free {seen[0]} > workers {e.config.workers} (a slot freed twice)")
    running = [(a.id, a.phase, a.handler) for a in e.inflight.running()]
    if running:
        problems.append(f"an attempt never launched left running: {running}")
    assert not problems, problems


# --- 2. a poisoned row's hand-over raising: held for ever? ------------------------------------------


def test_l5_a_poisoned_rows_hand_over_raising_never_leaves_it_held_and_processing(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """Injected fault: the hand-over of a poisoned row's dead outcome raises (once). The attempt is let
    go for the reaper: the row never stays processing while the engine runs (its claim was renewed
    by every beat before)."""
    topic = "r2.poison.handover"
    runs: list[Any] = []
    e = engines(lease=3, workers=1)
    register(e, topic, "sync", runs)
    job = poisoned_job(store, pool, schema, topic)
    real = e.handover.hand_over
    faulted: list[str] = []

    def hand_over(a: Any, outcome: Any) -> None:
        if a.id == job and not faulted:
            faulted.append(a.id)
            raise RuntimeError("injected: the poisoned row's hand-over failed")
        real(a, outcome)

    e.handover.hand_over = hand_over  # type: ignore[method-assign]
    e.start()
    wait_for(lambda: faulted, "the fault", 30)
    try:
        wait_for(
            lambda: job_state(pool, schema, job)[0] != "processing",
            "the poisoned row out of processing (dead, or reaped and dead later)",
            20,  # over six leases
        )
    except AssertionError as exc:
        held = [(a.id, a.phase) for a in e.inflight.held()]
        raise AssertionError(f"{exc}: row {job_state(pool, schema, job)}, held {held}") from None
    wait_for(lambda: job_state(pool, schema, job)[0] == "dead", "dead in the end", 30)
    assert runs == []


# --- 3. the hold closed at stop ----------------------------------------------------------------------


def test_l5_c11_a_poisoned_row_taken_in_after_stop_is_handed_back_once_and_ends_dead_unrun(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """A poisoned row's take-in stalls before the hold; stop() closes the hold. The take-in ends it
    POISONED, finds the hold closed and hands it back (pending, attempt given back, no crash): its
    room and slot given back once; another engine then ends it dead without running it."""
    topic = "r2.poison.closed"
    runs: list[Any] = []
    e = engines(lease=6, workers=2, watchdog_grace=0.3)
    register(e, topic, "sync", runs, KindOptions(concurrency=2))
    gate = stall_take_in(e, topic)
    ended: list[str] = []
    real_ended = e.capacity.ended

    def capacity_ended(t: str) -> None:
        ended.append(t)
        real_ended(t)

    e.capacity.ended = capacity_ended  # type: ignore[method-assign]
    e.start()
    job = poisoned_job(store, pool, schema, topic)
    try:
        assert gate.entered.wait(30)
        t0 = time.monotonic()
        e.stop(timeout=0.5)
        took = time.monotonic() - t0
    finally:
        gate.go.set()
    join_dispatchers()
    wait_for(lambda: job_state(pool, schema, job)[0] != "processing", "handed back", 30)
    row = job_state(pool, schema, job)
    assert took <= 0.5 + 0.3 + 5, f"C11'': {took:.1f}s"
    assert row[:3] == ("pending", 0, 3), f"handed back unrun, attempt given back, no crash: {row}"
    assert ended == [topic], f"its room given back once: {ended}"
    assert e._slots is not None and e._slots.free == e.config.workers
    assert e.inflight.held() == [] and e.inflight.running() == []
    other_runs: list[Any] = []
    other = engines(lease=6)
    register(other, topic, "sync", other_runs)
    other.start()
    wait_for(lambda: job_state(pool, schema, job)[0] == "dead", "dead at its next claim", 30)
    assert runs == [] and other_runs == []


def test_c11_a_refused_take_ins_give_back_failing_leaves_the_row_to_the_reaper(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """As above, a plain row, and the hand-back's write fails (the database unreachable then). The
    row stays processing under a claim no engine holds; stop() removed the engine's row, so another
    engine's reaper takes it back and runs it once; never here."""
    topic = "r2.giveback.fails"
    runs: list[Any] = []
    e = engines(lease=3, workers=1, watchdog_grace=0.3)
    register(e, topic, "sync", runs)
    gate = stall_take_in(e, topic)
    real_repo = e.intake.repo
    failed: list[Any] = []

    class FailingSettle:
        def __getattr__(self, name: str) -> Any:
            return getattr(real_repo, name)

        def settle_many(self, outcomes: Any) -> Any:
            if not failed:
                failed.append(list(outcomes))
                raise RuntimeError("injected: the database unreachable for the hand-back")
            return real_repo.settle_many(outcomes)

    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    try:
        assert gate.entered.wait(30)
        e.stop(timeout=0.5)
        e.intake.repo = FailingSettle()  # type: ignore[assignment]
    finally:
        gate.go.set()
    join_dispatchers()
    assert failed, "the hand-back was tried"
    assert job_state(pool, schema, job)[0] == "processing"
    elsewhere: list[Any] = []
    other = engines(lease=3)
    register(other, topic, "sync", elsewhere, result="elsewhere")
    other.start()
    wait_for(lambda: (r := store.get(job)) is not None and r.state is State.DONE, "reaped and run", 30)
    assert runs == [] and [j for j, _ in elsewhere] == [job]


def test_c11_stop_while_the_dispatcher_is_stuck_in_its_claim_statement(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """The claim statement committed, its answer not back (stalled) when stop() comes: stop() returns
    within its bound; the answer, back after the stop, is handed back unrun (pending, attempt given
    back), never run here."""
    topic = "r2.stuck.claim"
    runs: list[Any] = []
    e = engines(lease=6, workers=2, watchdog_grace=0.3)
    register(e, topic, "sync", runs)
    answered, go = threading.Event(), threading.Event()
    real = e.intake.claim

    def claim(n: int, *rest: Any) -> Any:
        rows = real(n, *rest)
        if rows and not answered.is_set():
            answered.set()
            go.wait(60)
        return rows

    e.intake.claim = claim  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    try:
        assert answered.wait(30)
        t0 = time.monotonic()
        e.stop(timeout=0.5)
        took = time.monotonic() - t0
    finally:
        go.set()
    join_dispatchers()
    wait_for(lambda: job_state(pool, schema, job)[0] != "processing", "handed back", 30)
    assert took <= 0.5 + 0.3 + 5, f"C11'': {took:.1f}s"
    assert job_state(pool, schema, job)[:3] == ("pending", 0, 0)
    assert runs == []
    assert e._slots is not None and e._slots.free == e.config.workers


# --- 4. run_once and stop ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["sync", "async", "batch"])
def test_run_once_after_stop_holds_and_runs_its_claims(
    shape: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    topic = f"r2.once.after.stop.{shape}"
    runs: list[Any] = []
    e = engines(lease=6, workers=2)
    register(e, topic, shape, runs)
    e.start()
    e.stop(timeout=1)
    e.stop(timeout=1)  # a second stop is a no-op
    assert e.inflight.closed
    job = store.enqueue(Job(topic, {"n": 0})).id
    poisoned = poisoned_job(store, pool, schema, topic)
    assert e.run_once() == 2
    assert [j for j, _ in runs] == [job]
    assert job_state(pool, schema, job)[0] == "done"
    assert job_state(pool, schema, poisoned)[0] == "dead"
    assert e.inflight.held() == [] and e.inflight.running() == []


# --- 5. concurrency room with poisoned and refused rows ---------------------------------------------


def test_q2_poisoned_rows_between_normal_ones_never_let_a_topic_past_its_concurrency(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """concurrency=2, workers=6: poisoned rows (room given back by open) mixed with slow normal ones;
    never more than two handlers of the topic at once (a room given back twice lets a third run)."""
    topic = "r2.poison.cap"
    peak = Peak()

    def handler(ctx: Context, claim: Claim) -> str:
        peak.enter()
        time.sleep(0.1)
        peak.leave()
        return "ok"

    e = engines(lease=6, workers=6)
    e.register_kind(topic, handler, KindOptions(concurrency=2))
    poisoned, normal = [], []
    for i in range(10):
        poisoned.append(poisoned_job(store, pool, schema, topic))
        normal.append(store.enqueue(Job(topic, {"n": i})).id)
    e.start()
    wait_for(
        lambda: (
            all(job_state(pool, schema, j)[0] == "dead" for j in poisoned)
            and all(job_state(pool, schema, j)[0] == "done" for j in normal)
        ),
        "all settled",
        60,
    )
    assert peak.peak <= 2, f"Q2: {peak.peak} handlers of a concurrency=2 topic at once"
    wait_for(lambda: dict(e.capacity._active) == {}, "no room left taken", 10)


# --- 6. open() raising after the hold while the engine stops ----------------------------------------


def test_c11_take_in_raising_after_the_stops_cancel_gives_the_row_back(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """Held before the stop closed the hold; open() stalls after the hold past the stop's timeout (the
    stop cancels the attempt with EngineStopping), then raises. Ended as a raise after the stop's
    cancel: pending, its attempt given back, no crash, never run; stop() within its bound."""
    topic = "r2.fault.stopping"
    runs: list[Any] = []
    e = engines(lease=6, workers=1, watchdog_grace=1.0)
    register(e, topic, "sync", runs)
    held, go = threading.Event(), threading.Event()
    real = e.inflight.canceled_before

    def canceled_before(a: Any) -> bool:
        if a.topic == topic and not held.is_set():
            held.set()
            go.wait(60)
            raise RuntimeError("injected: a bug in open() after the hold")
        return bool(real(a))

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    took: list[float] = []

    def stop() -> None:
        t0 = time.monotonic()
        e.stop(timeout=0.5)
        took.append(time.monotonic() - t0)

    stopper = threading.Thread(target=stop, daemon=True)
    try:
        assert held.wait(30)
        a = e.inflight.by_token(e.inflight.held()[0].row.claim_token)
        stopper.start()
        wait_for(lambda: a is not None and a.ctx.done(), "the stop's cancel of the held attempt", 30)
    finally:
        go.set()
    stopper.join(30)
    join_dispatchers()
    wait_for(lambda: job_state(pool, schema, job)[0] != "processing", "written", 30)
    assert took and took[0] <= 0.5 + 1.0 + 5, f"C11'': {took}"
    assert job_state(pool, schema, job)[:3] == ("pending", 0, 0), job_state(pool, schema, job)
    assert runs == []


# --- 7. a global limit with poisoned rows and a raised take-in ----------------------------------------


def test_q3_a_global_limit_comes_back_after_poisoned_rows_and_a_raised_take_in(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """set_limit(topic, 1): poisoned rows, a take-in raising after the hold (handed back unrun) and
    plain rows; never two handlers at once, every row settled, the topic's room back."""
    topic = "r2.limit"
    peak = Peak()

    def handler(ctx: Context, claim: Claim) -> str:
        peak.enter()
        time.sleep(0.05)
        peak.leave()
        return "ok"

    store.set_limit(topic, 1)
    e = engines(lease=6, workers=4)
    e.register_kind(topic, handler)
    faulted = fault_after_hold(e)
    poisoned, normal = [], []
    for i in range(5):
        normal.append(store.enqueue(Job(topic, {"n": i})).id)
        poisoned.append(poisoned_job(store, pool, schema, topic))
    e.start()
    wait_for(
        lambda: (
            all(job_state(pool, schema, j)[0] == "dead" for j in poisoned)
            and all(job_state(pool, schema, j)[0] == "done" for j in normal)
        ),
        "all settled",
        60,
    )
    assert faulted
    more = [store.enqueue(Job(topic, {"n": 10 + i})).id for i in range(3)]
    wait_for(lambda: all(job_state(pool, schema, j)[0] == "done" for j in more), "still claiming", 30)
    assert peak.peak <= 1, f"Q3: {peak.peak} at once under a limit of 1"
    assert e._slots is not None
    wait_for(lambda: e._slots is not None and e._slots.free == e.config.workers, "slots back", 10)


# --- 8. a take-in raising for a job of one attempt ----------------------------------------------------


def test_a_take_in_raising_after_the_hold_never_kills_a_job_whose_handler_never_ran(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """max_attempts=1, open() raises after the hold (a bug of the engine): the row is handed back
    unrun (its attempt given back) and runs later, never ended failed or dead without its handler
    running (it was ended as if its handler had raised: the last attempt spent)."""
    topic = "r2.fault.last"
    runs: list[Any] = []
    e = engines(lease=6, workers=1)
    register(e, topic, "sync", runs, KindOptions(max_attempts=1))
    faulted = fault_after_hold(e)
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    wait_for(lambda: faulted, "the fault", 30)
    wait_for(lambda: job_state(pool, schema, job)[0] != "processing", "written", 30)
    deadline = time.monotonic() + 10
    while not runs and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runs, f"the job's handler never ran: row {job_state(pool, schema, job)}"


# --- 9. a batch kind waiting in the batcher at stop, beside a take-in refused -------------------------


def test_c11_a_batch_waiting_at_stop_runs_while_a_later_take_in_is_handed_back(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    topic = "r2.batch.stop"
    runs: list[Any] = []
    e = engines(lease=6, workers=3, watchdog_grace=0.5)
    register(e, topic, "batch-wait", runs, batch_wait=30)
    first: list[str] = []
    gate = stall_take_in(e, lambda row: bool(first) and row.id != first[0])
    e.start()
    first.append(store.enqueue(Job(topic, {"n": 0})).id)
    wait_for(lambda: e.runner.batcher.waiting(topic) == 1, "the first job waiting in the batcher", 30)
    second = store.enqueue(Job(topic, {"n": 1})).id
    try:
        assert gate.entered.wait(30)
        t0 = time.monotonic()
        e.stop(timeout=2)
        took = time.monotonic() - t0
    finally:
        gate.go.set()
    join_dispatchers()
    wait_for(lambda: job_state(pool, schema, second)[0] != "processing", "handed back", 30)
    assert took <= 2 + 0.5 + 5, f"C11'': {took:.1f}s"
    assert job_state(pool, schema, first[0])[0] == "done"
    assert job_state(pool, schema, second)[:3] == ("pending", 0, 0)
    assert [j for j, _ in runs] == [first[0]]
    assert e._slots is not None and e._slots.free == e.config.workers


# --- 10. run_once while stop() is under way --------------------------------------------------------


def test_c11_run_once_during_a_stop_claims_nothing(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """stop() waits for a slow handler; run_once() called meanwhile claims nothing (C11: a stopping
    engine claims nothing more): it refuses, as on a running engine. (It claimed and ran the job, and
    the stop called it hung and handed its row back while it ran.)"""
    slow, once = "r2.stop.slow", "r2.stop.once"
    release = threading.Event()
    started = threading.Event()
    once_runs: list[Any] = []
    e = engines(lease=6, workers=1, watchdog_grace=0.3)  # no free slot: the dispatcher claims nothing

    def slow_handler(ctx: Context, claim: Claim) -> str:
        started.set()
        release.wait(30)
        return "slow"

    def once_handler(ctx: Context, claim: Claim) -> str:
        once_runs.append(claim.id)
        time.sleep(2.0)  # past the stop's timeout and grace
        return "once"

    e.register_kind(slow, slow_handler)
    e.register_kind(once, once_handler)
    e.start()
    store.enqueue(Job(slow, {}))
    stopper = threading.Thread(target=lambda: e.stop(timeout=0.5), daemon=True)
    refused: list[BaseException] = []
    n = 0
    try:
        assert started.wait(30)
        job = store.enqueue(Job(once, {})).id
        stopper.start()
        wait_for(lambda: e._state == "stopping", "stopping", 30)
        try:
            n = e.run_once()
        except Exception as exc:  # refusing is fine
            refused.append(exc)
    finally:
        release.set()
    stopper.join(30)
    row = job_state(pool, schema, job)
    assert (n, once_runs) == (0, []), (
        f"C11: run_once() claimed {n} and ran {once_runs} on a stopping engine (row now {row})"
    )
