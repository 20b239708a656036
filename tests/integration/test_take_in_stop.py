"""A take-in meeting the engine's stop, an operator's cancel, a poisoned row, the watchdog or a bug
of its own (SPEC P1, X2', C1, C11, C11'', L5'): an attempt is held and started in one move, its
slot taken before; stop() closes the hold to later take-ins, which hand their rows back.

Hooks wrap engine methods (take_in, inflight.add, canceled_before, runner.launch_many); every
blocked thread is released in a finally."""

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
from tests.integration.conftest import q, wait_listening
from tests.integration.take_in import (
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
_register = register


def _settle(pool: ConnectionPool[Any], schema: str, job: str, timeout: float = 15) -> None:
    """Give the row *timeout* s to leave processing (not an assertion: the caller looks at it)."""
    deadline = time.monotonic() + timeout
    while job_state(pool, schema, job)[0] == "processing" and time.monotonic() < deadline:
        time.sleep(0.05)


def _hung(e: Engine, topic: str) -> float:
    return float(e.metrics.child(e.metrics.hung, topic)._value.get())


# --- 4. stop() while the dispatcher is stalled in take-in, BEFORE the hold ------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_c11_stop_while_take_in_stalls_before_the_hold_never_starts_the_handler_after_stop(
    shape: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """The claim is answered and the dispatcher (its slot taken) is in take_in, not yet at the hold,
    when stop() comes. stop() returns within its bound; the take-in, going on, finds the hold closed
    and hands the row back: the handler never starts after stop() returned (C11). (Nothing told the
    take-in before: the handler ran after the engine's row was removed.)"""
    topic = f"rv.stop.before.{shape}"
    runs: list[Any] = []
    e = engines(lease=6, workers=1, watchdog_grace=0.5)
    _register(e, topic, shape, runs)
    gate = stall_take_in(e, topic)
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    try:
        assert gate.entered.wait(30), "the claim taken in"
        t0 = time.monotonic()
        e.stop(timeout=0.5)
        took = time.monotonic() - t0
    finally:
        gate.go.set()
    join_dispatchers()
    wait_for(lambda: e.inflight.running() == [], "the attempt ended (run or not)", 30)
    _settle(pool, schema, job)
    row = job_state(pool, schema, job)
    assert took <= 0.5 + 0.5 + 5, f"C11'': stop() took {took:.1f}s"
    assert runs == [], f"C11: the handler started after stop() returned (row {row})"
    assert row[0] in ("pending", "canceled"), f"C11: row {row}"


def test_p1_a_claim_taken_in_after_stop_never_runs_once_the_reaper_gave_it_to_another_engine(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """As above, the claim older than its lease: stop() removes the engine's row, so another
    engine's reaper takes the claim back and runs the job. The stalled take-in, going on, must not
    run the handler of a claim this engine no longer holds (P1; its fence's proof is still fresh)."""
    topic = "rv.p1.after.stop"
    runs: list[Any] = []
    elsewhere: list[str] = []
    e = engines(lease=9, workers=1, watchdog_grace=0.3)
    _register(e, topic, "sync", runs)
    gate = stall_take_in(e, topic, seconds=90)
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    try:
        assert gate.entered.wait(30)
        wait_for(
            lambda: q(pool, schema, "SELECT locked_until < now() FROM {job} WHERE id = %s", job)[0][0],
            "the claim's own locked_until past (the engine's beats keep it ours)",
            30,
        )
        assert job_state(pool, schema, job)[0] == "processing"

        def fresh(ctx: Context, claim: Claim) -> str:
            elsewhere.append(claim.id)
            return "fresh"

        other = engines(lease=9)
        other.register_kind(topic, fresh)
        other.start()
        e.stop(timeout=0.2)
        wait_for(lambda: (r := store.get(job)) is not None and r.state is State.DONE, "run elsewhere", 30)
        other.stop()
    finally:
        gate.go.set()
    join_dispatchers()
    wait_for(lambda: e.inflight.running() == [], "the stale attempt ended", 30)
    assert elsewhere == [job]
    assert runs == [], "P1: the handler started here for a claim reaped and run by another engine"


# --- 4. stop() while the launch is stalled AFTER the hold (regression, more shapes) ---------------


@pytest.mark.parametrize("cancel", ["cancel-before-stop", "cancel-during-stop"])
@pytest.mark.parametrize("shape", ["sync", "async", "batch-wait"])
def test_c11_x2_stop_and_cancel_of_a_held_attempt_not_launched(
    shape: str,
    cancel: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    engines: Callable[..., Engine],
) -> None:
    topic = f"rv.stop.after.{shape}.{cancel}"
    runs: list[Any] = []
    jobs: list[str] = []
    e = engines(lease=6, workers=1, watchdog_grace=0.5)
    _register(e, topic, shape, runs)
    heard, errors = hear_cancels(e, jobs)
    stall = stall_launch(e, topic)
    held, go = stall.held, stall.go
    e.start()
    wait_listening(pool, schema)
    jobs.append(store.enqueue(Job(topic, {"n": 0})).id)
    job = jobs[0]
    stopper: threading.Thread | None = None
    took: list[float] = []
    try:
        assert held.wait(30)
        if cancel == "cancel-before-stop":
            assert store.cancel(job)
            assert heard.wait(30)

        def stop() -> None:
            t0 = time.monotonic()
            e.stop(timeout=0.5)
            took.append(time.monotonic() - t0)

        stopper = threading.Thread(target=stop, daemon=True)
        stopper.start()
        if cancel == "cancel-during-stop":
            wait_for(lambda: e._state == "stopping", "stopping", 30)
            assert store.cancel(job)
            assert heard.wait(30)
        stopper.join(60)
        assert not stopper.is_alive()
    finally:
        go.set()
    join_dispatchers()
    wait_for(lambda: e.inflight.running() == [], "the attempt ended", 30)
    row = job_state(pool, schema, job)
    assert errors == []
    assert took and took[0] <= 0.5 + 0.5 + 5, f"C11'': {took}"
    assert runs == [], f"the handler started after stop()/cancel (row {row})"
    if cancel == "no-cancel":
        assert row[:2] == ("pending", 0), f"C11: {row}"
    else:
        assert row[0] == "canceled", row


# --- 2. poisoned rows ---------------------------------------------------------------------------


def test_l5_stop_while_a_poisoned_row_is_held_releases_its_slot_once_and_counts_no_hung_handler(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """A poisoned row is ended POISONED, then held (never running) until its dead outcome is handed
    over. stop() in that window leaves it alone: its slot is freed once (by the take-in) and no
    handler is counted hung. (Held as running, it was declared hung at stop, its slot freed twice.)"""
    topic = "rv.poison.stop"
    runs: list[Any] = []
    e = engines(lease=6, workers=1, watchdog_grace=0.5)
    _register(e, topic, "sync", runs)
    job = poisoned_job(store, pool, schema, topic)
    entered = threading.Event()
    go = threading.Event()
    real_add = e.inflight.add

    def add(a: Any, *rest: Any) -> bool:
        got = real_add(a, *rest)
        if a.id == job and not entered.is_set():
            entered.set()
            go.wait(60)  # held, its dead outcome not handed over yet
        return got

    e.inflight.add = add  # type: ignore[method-assign]
    e.start()
    try:
        assert entered.wait(30)
        e.stop(timeout=0.5)
    finally:
        go.set()
    join_dispatchers()
    wait_for(lambda: job_state(pool, schema, job)[0] != "processing", "the poisoned row written", 30)
    problems = []
    row = job_state(pool, schema, job)
    if row[0] != "dead":
        problems.append(f"L5': the poisoned row ended {row}")
    if runs:
        problems.append(f"L5': ran {runs}")
    assert e._slots is not None
    if e._slots.free > e.config.workers:
        problems.append(f"slots: free {e._slots.free} > workers {e.config.workers} (released twice)")
    if _hung(e, topic):
        problems.append(f"a poisoned attempt (never run) counted hung: {_hung(e, topic)}")
    assert not problems, problems


@pytest.mark.parametrize("when", ["before-hold", "after-hold"])
def test_x2_l5_a_poisoned_row_canceled_while_taken_in(
    when: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    topic = f"rv.poison.cancel.{when}"
    runs: list[Any] = []
    e = engines(lease=6, workers=1)
    _register(e, topic, "sync", runs)
    jobs: list[str] = []
    heard, errors = hear_cancels(e, jobs)
    real_add = e.inflight.add

    def add(a: Any, *rest: Any) -> bool:
        if a.id in jobs and when == "before-hold" and not heard.is_set():
            assert store.cancel(a.id)
            assert heard.wait(30)
        got = real_add(a, *rest)
        if a.id in jobs and when == "after-hold" and not heard.is_set():
            assert store.cancel(a.id)
            assert heard.wait(30)
        return got

    e.inflight.add = add  # type: ignore[method-assign]
    e.start()
    # The job comes once the engine listens: a cancel sent before its LISTEN was in place (the
    # claim can come first at start) would not be heard by the notification this test waits for.
    wait_listening(pool, schema)
    job = poisoned_job(store, pool, schema, topic, jobs)
    wait_for(heard.is_set, "the cancel heard", 30)
    wait_for(lambda: e.inflight.held() == [] and e.inflight.running() == [], "the attempt settled", 30)
    wait_for(lambda: e._slots is not None and e._slots.free == e.config.workers, "slots back", 30)
    assert errors == []
    assert runs == []
    assert job_state(pool, schema, job)[0] == "canceled"


# --- 1. slot accounting -------------------------------------------------------------------------


def test_c1_poisoned_rows_and_normal_ones_leave_the_slots_as_they_were(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    topic = "rv.slots.poison"
    active = [0]
    peak = [0]
    lock = threading.Lock()

    def handler(ctx: Context, claim: Claim) -> str:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return "ok"

    e = engines(lease=6, workers=2)
    e.register_kind(topic, handler)
    poisoned = [poisoned_job(store, pool, schema, topic) for _ in range(8)]
    normal = [store.enqueue(Job(topic, {"n": i})).id for i in range(6)]
    e.start()
    wait_for(
        lambda: (
            all(job_state(pool, schema, j)[0] == "dead" for j in poisoned)
            and all(job_state(pool, schema, j)[0] == "done" for j in normal)
        ),
        "all settled",
        60,
    )
    wait_for(lambda: e.inflight.running() == [], "nothing running", 30)
    assert e._slots is not None
    wait_for(lambda: e._slots is not None and e._slots.free == e.config.workers, "slots back", 10)
    more = [store.enqueue(Job(topic, {"n": 10 + i})).id for i in range(6)]
    wait_for(lambda: all(job_state(pool, schema, j)[0] == "done" for j in more), "still claiming", 60)
    assert peak[0] <= e.config.workers
    assert e._slots.free == e.config.workers


def test_c1_a_take_in_raising_after_the_hold_frees_its_slot_once(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """Injected fault: open() raises after the hold (here in canceled_before). The attempt, held and
    started, is ended as if its handler had raised (retried); its slot is freed once. (It stayed held
    and running while take_in's caller freed its slot, and the watchdog's give-up freed it again:
    two handlers at once with workers=1, C1.)"""
    faulty, work = "rv.fault", "rv.work"
    e = engines(lease=6, workers=1, watchdog_grace=0.3)
    active = [0]
    peak = [0]
    lock = threading.Lock()
    both = threading.Event()

    def worker(ctx: Context, claim: Claim) -> str:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            if active[0] >= 2:
                both.set()
        both.wait(3)  # held a while: a second claim beside it shows a slot too many
        with lock:
            active[0] -= 1
        return "ok"

    e.register_kind(faulty, lambda ctx, claim: "ok", KindOptions(attempt_timeout=1, max_execution_timeout=1))
    e.register_kind(work, worker)
    fault_after_hold(e, faulty)
    e.start()
    f = store.enqueue(Job(faulty, {})).id
    wait_for(lambda: job_state(pool, schema, f)[0] == "done", "the faulted job retried and done", 30)
    jobs = [store.enqueue(Job(work, {"n": i})).id for i in range(3)]
    wait_for(lambda: all(job_state(pool, schema, j)[0] == "done" for j in jobs), "work done", 60)
    assert e._slots is not None
    assert (peak[0], e._slots.free) == (1, 1), (
        f"C1: {peak[0]} handlers at once with workers=1; slots free {e._slots.free}"
    )


def test_a_take_in_raising_after_the_hold_never_leaves_the_row_processing_while_the_engine_runs(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """Injected fault as above, default timeouts: the faulted row does not stay processing while
    the engine runs (its lease was renewed by every beat, never launched), and its topic's
    concurrency room comes back (a concurrency=1 topic is claimed again)."""
    topic = "rv.fault.stuck"
    runs: list[Any] = []
    e = engines(lease=3, workers=2)
    _register(e, topic, "sync", runs, KindOptions(concurrency=1))
    faulted = fault_after_hold(e)
    e.start()
    f = store.enqueue(Job(topic, {"n": 0})).id
    wait_for(lambda: faulted, "the fault", 30)
    g = store.enqueue(Job(topic, {"n": 1})).id
    try:
        wait_for(
            lambda: job_state(pool, schema, f)[0] != "processing" and job_state(pool, schema, g)[0] == "done",
            "the faulted row back (or run) and the next job of its topic run",
            20,
        )
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}: faulted row {job_state(pool, schema, f)}, next {job_state(pool, schema, g)}, runs {runs}"
        ) from None


# --- 5. the watchdog on an attempt held whose launch is stalled ---------------------------------


@pytest.mark.parametrize("shape", ["sync", "batch-wait"])
def test_watchdog_gives_up_an_attempt_held_whose_launch_stalls_then_it_never_runs(
    shape: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    topic = f"rv.wd.{shape}"
    runs: list[Any] = []
    e = engines(lease=6, workers=1, watchdog_grace=0.3)
    # batch_wait below max_execution_timeout, else every attempt is given up in the batcher
    _register(e, topic, shape, runs, KindOptions(attempt_timeout=1, max_execution_timeout=1), batch_wait=0.3)
    stall = stall_launch(e, topic)
    held, go, first = stall.held, stall.go, stall.first
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    try:
        assert held.wait(30)
        wait_for(lambda: first[0].ending is Phase.GAVE_UP, "given up at max_execution_timeout", 30)
        if not shape.startswith("batch"):  # a batch's attempt is never called hung by the watchdog
            wait_for(lambda: job_state(pool, schema, job)[0] != "processing", "its failure written", 30)
    finally:
        go.set()
    wait_for(lambda: job_state(pool, schema, job)[0] == "done", "the job run on a later attempt", 60)
    wait_for(lambda: e.inflight.running() == [], "nothing running", 30)
    assert e._slots is not None
    wait_for(lambda: e._slots is not None and e._slots.free == e.config.workers, "slots back", 10)
    token = first[0].row.claim_token
    assert [r for r in runs if r[1] == token] == [], f"the given-up attempt's handler ran: {runs}"
    assert len(runs) == 1, runs


def test_watchdog_hung_verdict_on_an_attempt_held_whose_launch_stalls(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """attempt_timeout only: timed out, declared hung after the grace (its claim dropped for the
    reaper) while its launch stalls; launched later, it must not run; the job runs again later."""
    topic = "rv.wd.hung"
    runs: list[Any] = []
    e = engines(lease=3, workers=1, watchdog_grace=0.3)
    _register(e, topic, "sync", runs, KindOptions(attempt_timeout=0.5, max_execution_timeout=60))
    stall = stall_launch(e, topic)
    held, go, first = stall.held, stall.go, stall.first
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    try:
        assert held.wait(30)
        wait_for(lambda: first[0].hung, "declared hung", 30)
    finally:
        go.set()
    wait_for(lambda: job_state(pool, schema, job)[0] == "done", "reaped and run again", 60)
    wait_for(lambda: e._slots is not None and e._slots.free == e.config.workers, "slots back", 30)
    token = first[0].row.claim_token
    assert [r for r in runs if r[1] == token] == [], f"the hung attempt's handler ran: {runs}"


# --- 3. the cancel's lookup: by token, the heartbeat's fallback ---------------------------------


def test_x2_a_cancel_whose_notify_is_lost_is_found_by_the_heartbeat_before_the_launch(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    topic = "rv.cancel.beat"
    runs: list[Any] = []
    e = engines(lease=3, workers=1)
    _register(e, topic, "sync", runs)
    e.intake.on_cancel = lambda job_id, token: None  # type: ignore[method-assign]
    stall = stall_launch(e, topic)
    held, go, first = stall.held, stall.go, stall.first
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    try:
        assert held.wait(30)
        assert store.cancel(job)
        wait_for(lambda: first[0].ending is Phase.LOST, "the heartbeat told the cancel", 30)
    finally:
        go.set()
    wait_for(lambda: e.inflight.running() == [] and e.inflight.held() == [], "ended", 30)
    assert runs == []
    assert job_state(pool, schema, job)[0] == "canceled"
    assert e._slots is not None and e._slots.free == e.config.workers


def test_x2_a_cancel_heard_for_the_old_claim_does_not_cancel_the_new_claim_of_the_job(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """The job's first claim ends hung (dropped for the reaper), the reaper gives it back and this
    engine claims it again under a new token. A late NOTIFY naming the first token, heard before
    the new claim is held, must not cancel the new attempt (canceled_before is per token)."""
    topic = "rv.cancel.reclaim"
    runs: list[Any] = []
    release = threading.Event()
    e = engines(lease=3, workers=2, watchdog_grace=0.3)

    def handler(ctx: Context, claim: Claim) -> str:
        runs.append((claim.id, claim.attempt, claim.claim_token))
        if len(runs) == 1:
            release.wait(30)  # hangs past its timeout: hung
        return "ran"

    e.register_kind(topic, handler, KindOptions(attempt_timeout=0.5, max_execution_timeout=60))
    real_add = e.inflight.add
    told: list[Any] = []

    def add(a: Any, *rest: Any) -> bool:
        if runs and a.row.claim_token != runs[0][2] and not told:
            told.append(e.inflight.cancel(a.id, runs[0][2]))  # the late NOTIFY of the old claim
        return bool(real_add(a, *rest))

    e.inflight.add = add  # type: ignore[method-assign]
    e.start()
    job = store.enqueue(Job(topic, {"n": 0})).id
    try:
        wait_for(lambda: job_state(pool, schema, job)[0] == "done", "run again and done", 60)
    finally:
        release.set()
    assert told == [None]
    assert len(runs) == 2 and runs[0][2] != runs[1][2], runs


# --- 6. run_once: take_in without slots ----------------------------------------------------------


def test_run_once_takes_in_poisoned_and_plain_rows_of_each_shape_without_slots(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    runs: list[Any] = []
    e = engines(lease=6, workers=8, claim_batch=8)
    for shape in ("sync", "async", "batch"):
        _register(e, f"rv.once.{shape}", shape, runs)
    plain = [store.enqueue(Job(f"rv.once.{s}", {"n": 0})).id for s in ("sync", "async", "batch")]
    poisoned = [poisoned_job(store, pool, schema, f"rv.once.{s}") for s in ("sync", "async", "batch")]
    assert e.run_once() == 6
    assert sorted(r[0] for r in runs) == sorted(plain)
    assert [job_state(pool, schema, j)[0] for j in plain] == ["done"] * 3
    assert [job_state(pool, schema, j)[0] for j in poisoned] == ["dead"] * 3
    assert e.inflight.held() == [] and e.inflight.running() == []
