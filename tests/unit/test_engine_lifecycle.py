"""The attempt lifecycle in the engine, on the fake repo (SPEC L1-L7, C3-C5, C11)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from brooq_py.engine import Engine
from brooq_py.engine.attempt.outcome import Ending, Phase, decide
from brooq_py.engine.attempt.runner import SlotPool
from brooq_py.engine.engine import _stop_wait
from brooq_py.engine.services.dispatcher import Dispatcher
from brooq_py.engine.services.liveness import Heartbeat
from brooq_py.engine.services.wakeups import RECONNECT_MAX, WakeListener
from brooq_py.queue import (
    BrooqError,
    Claim,
    Context,
    EngineStopping,
    Job,
    KindOptions,
    LeaseLost,
    MustCancelTask,
    MustDelay,
    MustPreserveAttempt,
    State,
    StoreUnavailable,
    Tx,
)
from brooq_py.queue.port import ClaimedJob, Outcome
from tests.polling import wait_for
from tests.unit.conftest import FAST
from tests.unit.fake_repo import FakeRepo


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set in teardown: handlers that ignore their ctx wait on it."""
    ev = threading.Event()
    yield ev
    ev.set()


def children(repo: FakeRepo, topic: str) -> list[str]:
    with repo.lock:
        return [r.id for r in repo.rows.values() if r.topic == topic]


# --- item 1: hung handlers never close done -------------------------------------------


def test_l1_c11_hung_at_stop_with_chain_and_on_succeeded_goes_back_to_pending(
    repo: FakeRepo, make_engine: Callable[..., Engine], release: threading.Event
) -> None:
    e = make_engine(watchdog_grace=0.1)
    ran: list[str] = []
    started = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        claim.chain(Job("child"))
        claim.on_succeeded(lambda tx: ran.append("callback"))
        started.set()
        release.wait(30)  # ignores the stop's cancel: hung at stop

    e.register_kind("t", handler, KindOptions(**FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    assert started.wait(10)
    e.stop(timeout=0.05)
    row = repo.row(jid)
    assert row.state is State.PENDING and row.attempts == 0
    assert State.DONE not in row.history
    release.set()  # the handler returns now: still nothing closes
    wait_for(lambda: not e.inflight.running(), what="the late handler ended")
    assert children(repo, "child") == [] and ran == []
    assert repo.row(jid).state is State.PENDING


def test_l1_c5_hung_any_time_never_writes_done_nor_chains(
    repo: FakeRepo, make_engine: Callable[..., Engine], release: threading.Event
) -> None:
    e = make_engine(watchdog_grace=0.05)
    ran: list[str] = []

    def handler(ctx: Context, claim: Claim) -> None:
        claim.chain(Job("child"))
        claim.on_succeeded(lambda tx: ran.append("callback"))
        release.wait(30)

    e.register_kind("t", handler, KindOptions(attempt_timeout=0.05, max_execution_timeout=60, **FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: e.inflight.hung_count() == 1, what="hung")
    release.set()
    wait_for(lambda: not e.inflight.running(), what="the late handler ended")
    row = repo.row(jid)
    assert row.state is State.PROCESSING  # the lease is left to expire (C5)
    assert children(repo, "child") == [] and ran == []


# --- item 2: async handlers are tasks --------------------------------------------------


def test_l2_c4_async_handler_ignoring_ctx_past_timeout_that_returns_is_done(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine(watchdog_grace=10)
    seen: list[BaseException | None] = []

    async def handler(ctx: Context, claim: Claim) -> None:
        await asyncio.sleep(0.3)  # past attempt_timeout, ignoring ctx: the task is not cancelled
        seen.append(ctx.cause)

    e.register_kind("t", handler, KindOptions(attempt_timeout=0.05, max_execution_timeout=60, **FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.DONE, what="done")
    assert repo.row(jid).attempts == 1 and repo.row(jid).last_error is None
    assert len(seen) == 1 and seen[0] is not None


def test_l2_c5_async_handler_ignoring_ctx_is_hung_and_frees_its_slot(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine(workers=1, watchdog_grace=0.05)
    forever = asyncio.Event()

    async def hang(ctx: Context, claim: Claim) -> None:
        await forever.wait()  # never set: the task lives on; it cannot be killed

    e.register_kind("hang", hang, KindOptions(attempt_timeout=0.05, max_execution_timeout=60, **FAST))
    e.register_kind("ok", lambda ctx, claim: None)
    hung_id = e.enqueue(Job("hang")).id
    e.start()
    wait_for(lambda: e.inflight.hung_count() == 1, what="hung")
    ok_id = e.enqueue(Job("ok")).id
    wait_for(lambda: repo.row(ok_id).state is State.DONE, what="the freed slot runs other work")
    assert repo.row(hung_id).state is State.PROCESSING


def test_l2_500_async_handlers_run_at_once_on_few_threads(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine(workers=500)
    running = 0
    peak_threads = 0
    gate: asyncio.Event | None = None
    lock = threading.Lock()

    async def handler(ctx: Context, claim: Claim) -> None:
        nonlocal running, gate, peak_threads
        if gate is None:
            gate = asyncio.Event()
        with lock:
            running += 1
            peak_threads = max(peak_threads, threading.active_count())
        await gate.wait()

    e.register_kind("t", handler)
    e.enqueue_many([Job("t", {"n": i}) for i in range(500)])
    before = threading.active_count()  # other tests' leftovers (hung handlers' threads) included
    e.start()
    wait_for(lambda: running == 500, what="500 handlers running at once")
    assert threading.active_count() - before < 64 and peak_threads - before < 64
    assert gate is not None
    loop_gate = gate
    e._async._ensure().call_soon_threadsafe(loop_gate.set)
    wait_for(lambda: all(r.state is State.DONE for r in repo.rows.values()), what="all done")


# --- item 4: poison jobs end -----------------------------------------------------------


@pytest.mark.parametrize("crashes, attempts", [(3, 0), (0, 3)])
def test_l5_a_claim_after_max_crashes_ends_dead_without_running(
    repo: FakeRepo, make_engine: Callable[..., Engine], crashes: int, attempts: int
) -> None:
    """Three engines stopped while running it (or, from an older release's reaper, attempts past
    max_attempts): the claim does not run it but writes it dead, saying why (L5')."""
    e = make_engine()
    calls: list[int] = []
    e.register_kind("t", lambda ctx, claim: calls.append(1), KindOptions(max_attempts=2, **FAST))
    jid = e.enqueue(Job("t")).id
    repo.row(jid).crashes, repo.row(jid).attempts = crashes, attempts
    assert e.run_once() == 1
    row = repo.row(jid)
    assert row.state is State.DEAD and calls == []
    assert ("3 engines stopped while running it" if crashes else "claimed for attempt 4 of 2") in (
        row.last_error or ""
    )


def test_l5_hung_handler_is_a_crash_dead_after_max_crashes_whatever_max_attempts(
    repo: FakeRepo, make_engine: Callable[..., Engine], release: threading.Event
) -> None:
    """A hung handler's claim is dropped and taken back at once, its attempt given back: with
    max_crashes=2 the third claim finds two crashes and ends the job dead, never run a third time."""
    e = make_engine(watchdog_grace=0.05, reaper_period=0.05)
    calls: list[int] = []

    def hang(ctx: Context, claim: Claim) -> None:
        calls.append(claim.attempt)
        release.wait(30)

    e.register_kind(
        "t",
        hang,
        KindOptions(max_attempts=5, max_crashes=2, attempt_timeout=0.05, max_execution_timeout=60, **FAST),
    )
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.DEAD, what="dead")
    assert calls == [1, 1]  # each crash gave its attempt back
    assert repo.row(jid).crashes == 2 and "2 engines stopped" in (repo.row(jid).last_error or "")


# --- item 5: the listener's backoff ----------------------------------------------------


def test_l7_listener_reconnects_with_exponential_backoff_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    waits: list[float] = []
    log = logging.getLogger("test.listener")
    up = threading.Event()

    class Sub:
        def wait(self, timeout: float) -> bool:
            w._stop.set()  # one healthy wait, then the test is over
            return False

        def close(self) -> None:
            pass

    def listen() -> Sub:
        if not up.is_set():
            raise ConnectionError("down")
        return Sub()

    class Recorded(WakeListener):
        def _wait(self, seconds: float) -> bool:
            waits.append(seconds)
            if len(waits) == 9:
                up.set()
            return len(waits) > 12 or self._stop.is_set()

    w = Recorded(listen, lambda: None, log)
    with caplog.at_level(logging.DEBUG, logger="test.listener"):
        w._loop()
    assert waits[:8] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, RECONNECT_MAX, RECONNECT_MAX]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage().startswith("listener failed") for r in warnings[:1]] == [True]
    assert len([r for r in warnings if "failed (" in r.getMessage()]) == 1  # the first failure, once
    recovered = [r for r in caplog.records if "works again" in r.getMessage()]
    assert len(recovered) == 1


# --- item 6: self-fencing --------------------------------------------------------------


def test_f0_heartbeats_silent_for_lease_minus_margin_fence_the_handler_and_write_nothing(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """Heartbeats block (a socket gone silent): the watchdog fences at lease - margin from the send
    time of the last good one, before anyone may take the job (lease + margin after the database
    wrote it); nothing is written, no new claim is made until a heartbeat names the fenced claim,
    and the reaper then takes it back at once, its attempt given back (F0, L5')."""
    e = make_engine(lease=0.9, watchdog_grace=10, reaper_period=0.05)
    causes: list[BaseException | None] = []
    fenced_at: list[float] = []

    def handler(ctx: Context, claim: Claim) -> None:
        ctx.wait(20)
        fenced_at.append(time.monotonic())
        causes.append(ctx.cause)

    e.register_kind("t", handler)
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.PROCESSING, what="running")
    repo.renew_hang.clear()  # every heartbeat blocks, as on a socket that went silent
    try:
        wait_for(lambda: causes, what="the handler cancelled", timeout=20)
        assert isinstance(causes[0], LeaseLost)
        wait_for(lambda: not e.inflight.running())
        assert repo.row(jid).state is State.PROCESSING  # nothing written
        other = e.enqueue(Job("t")).id
        time.sleep(0.3)
        assert repo.row(other).state is State.PENDING  # fenced: no claim
        assert e.registry.get_sample_value("brooq_lease_lost_total", {"topic": "t"}) == 1.0
    finally:
        repo.renew_hang.set()
    wait_for(lambda: repo.row(jid).crashes == 1, what="the fenced claim named and taken back")
    wait_for(lambda: repo.row(other).state is not State.PENDING, what="claims again after that")


# --- item 7: the smaller ones ----------------------------------------------------------


def test_c3_a_renewal_between_the_write_and_its_bookkeeping_is_no_lease_lost(
    repo: FakeRepo, make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    write = repo.settle_many
    beats: list[int] = []

    def settle_then_beat(outcomes: list[Outcome]) -> set[str]:
        written = write(outcomes)
        hb = next(s for s in e._services if isinstance(s, Heartbeat))
        hb.run_once()  # a heartbeat lands after the commit, before the in-flight set forgets the job
        beats.append(1)
        return written

    repo.settle_many = settle_then_beat  # type: ignore[method-assign]
    jid = e.enqueue(Job("t")).id
    with caplog.at_level(logging.WARNING):
        e.start()
        wait_for(lambda: repo.row(jid).state is State.DONE and beats)
    assert not e.registry.get_sample_value("brooq_lease_lost_total", {"topic": "t"})
    assert not [r for r in caplog.records if "lease lost" in r.getMessage()]


def test_l6_connection_lost_at_the_closing_commit_is_retried_never_dead(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine()
    ran: list[int] = []

    def handler(ctx: Context, claim: Claim) -> None:
        claim.chain(Job("child"))
        claim.on_succeeded(lambda tx: ran.append(1))

    e.register_kind("t", handler, KindOptions(max_attempts=1, **FAST))
    repo.fail_close = 2
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.DONE, what="done after the retries")
    assert State.DEAD not in repo.row(jid).history and State.FAILED not in repo.row(jid).history
    assert len(children(repo, "child")) == 1


def test_l6_o4_an_outcome_whose_writes_fail_stays_queued_and_is_written_once_the_store_answers(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """Every write and heartbeat fails for several leases: the outcome is neither dropped nor made
    dead; it waits in the completer's queue and is written, under its own claim, once the store
    answers again, as long as nobody took the row meanwhile (O4, L6)."""
    e = make_engine(lease=0.6)
    e.register_kind("t", lambda ctx, claim: None, KindOptions(max_attempts=1, **FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.DONE, what="a first job done")
    repo.fail_settle = repo.fail_renew = 10**9
    jid = e.enqueue(Job("t")).id
    wait_for(lambda: repo.row(jid).state is State.PROCESSING, what="claimed")
    time.sleep(1.5)  # more than two leases
    assert repo.row(jid).state is State.PROCESSING  # never dead
    repo.fail_settle = repo.fail_renew = 0
    wait_for(lambda: repo.row(jid).state is State.DONE, what="written late")
    assert repo.row(jid).history == [State.PROCESSING, State.DONE]


def test_c11_rows_a_claim_returns_after_stop_are_handed_back_unrun() -> None:
    release = threading.Event()
    handed: list[list[ClaimedJob]] = []
    launched: list[ClaimedJob] = []
    row = ClaimedJob("00000000-0000-0000-0000-000000000009", "t", {}, 1, 0, "tok", "w", None)  # type: ignore[arg-type]

    def claim(limit: int) -> list[ClaimedJob]:
        release.wait(10)  # waiting on the pool longer than stop() waits for the dispatcher
        return [row]

    d = Dispatcher(claim, SlotPool(1), launched.extend, 0.05, logging.getLogger("t"), hand_back=handed.append)
    d.start()
    d.stop(timeout=0.05)
    release.set()
    wait_for(lambda: handed, what="handed back")
    assert handed == [[row]] and launched == []


def test_c1_a_backlog_is_claimed_in_statements_of_claim_batch_rows_never_past_the_free_slots() -> None:
    """C1 with ``claim_batch``: ten free slots and a batch of three claim 3, 3, 3, 1 at once (a
    backlog, no wake-up waited for), each claim launched as it returns."""
    limits: list[int] = []
    launched: list[ClaimedJob] = []
    slots = SlotPool(10)
    n = iter(range(100))

    def claim(limit: int) -> list[ClaimedJob]:
        limits.append(limit)
        assert limit <= slots.free  # never beyond the free slots
        return [
            ClaimedJob(f"00000000-0000-0000-0000-{next(n):012d}", "t", {}, 1, 0, "tok", "w", None)  # type: ignore[arg-type]
            for _ in range(limit)
        ]

    def launch(rows: list[ClaimedJob]) -> None:
        for row in rows:
            slots.take()  # the handlers never end: the slots stay taken
            launched.append(row)

    d = Dispatcher(claim, slots, launch, 3600, logging.getLogger("t"), batch=3)
    d.start()
    try:
        wait_for(lambda: len(launched) == 10, what="every slot filled")
    finally:
        d.stop()
    assert limits[:4] == [3, 3, 3, 1] and len(launched) == 10 and slots.free == 0


def test_c11_a_stop_in_the_middle_of_successive_claims_claims_nothing_more() -> None:
    """A backlog filled by successive claim_batch claims: stop() arrives while the second claim is
    in flight. Its rows are handed back unrun and no third claim is made (C11 with C1's batches)."""
    in_second = threading.Event()
    release = threading.Event()
    limits: list[int] = []
    launched: list[ClaimedJob] = []
    handed: list[list[ClaimedJob]] = []
    slots = SlotPool(6)
    n = iter(range(100))

    def claim(limit: int) -> list[ClaimedJob]:
        limits.append(limit)
        if len(limits) == 2:
            in_second.set()
            release.wait(10)
        return [
            ClaimedJob(f"00000000-0000-0000-0000-{next(n):012d}", "t", {}, 1, 0, "tok", "w", None)  # type: ignore[arg-type]
            for _ in range(limit)
        ]

    def launch(rows: list[ClaimedJob]) -> None:
        for row in rows:
            slots.take()
            launched.append(row)

    d = Dispatcher(claim, slots, launch, 3600, logging.getLogger("t"), hand_back=handed.append, batch=2)
    d.start()
    assert in_second.wait(10)
    d.stop(timeout=0.05)  # gives up waiting for the claim in flight
    release.set()
    wait_for(lambda: handed, what="the second claim's rows handed back")
    assert limits == [2, 2] and len(launched) == 2 and [len(h) for h in handed] == [2]


def test_c1_an_engine_claims_at_most_claim_batch_rows_a_statement_and_runs_them_all(
    repo: FakeRepo, make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    limits: list[int] = []
    claim = repo.claim

    def recording(topics: list[str], limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        limits.append(limit)
        return claim(topics, limit, worker, lease)

    monkeypatch.setattr(repo, "claim", recording)
    e = make_engine(workers=8, claim_batch=3)
    e.register_kind("t", lambda ctx, claim: None)
    ids = [e.enqueue(Job("t")).id for _ in range(20)]
    e.start()
    wait_for(lambda: all(repo.row(j).state is State.DONE for j in ids), what="all 20 done")
    assert limits and max(limits) == 3


def test_c1_run_once_claims_at_most_claim_batch_rows(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine(workers=5, claim_batch=2)
    e.register_kind("t", lambda ctx, claim: None)
    for _ in range(5):
        e.enqueue(Job("t"))
    assert [e.run_once(), e.run_once(), e.run_once(), e.run_once()] == [2, 2, 1, 0]


def test_a_claimed_row_of_an_unregistered_topic_is_handed_back(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    jid = e.enqueue(Job("other")).id
    [row] = repo.claim(["other"], 1, "w", timedelta(seconds=30))
    e.intake.launch_all([row]) if e._slots is not None else e.intake.open(row)
    r = repo.row(jid)
    assert r.state is State.PENDING and r.attempts == 0


# --- item 8: the schema check -----------------------------------------------------------


@pytest.mark.parametrize("version", [None, "0003"])
def test_start_refuses_a_schema_missing_or_too_old(
    repo: FakeRepo, make_engine: Callable[..., Engine], version: str | None
) -> None:
    repo.version = version
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    with pytest.raises(BrooqError, match="migrate up --schema public"):
        e.start()
    assert not e.running


def test_start_takes_a_schema_check_that_could_not_answer_as_no_verdict(
    repo: FakeRepo,
    make_engine: Callable[..., Engine],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A check the store could not answer (StoreUnavailable: its own waits ran out) starts the engine
    with a warning naming why; a check that fails otherwise fails the start."""

    def unavailable() -> str | None:
        raise StoreUnavailable("reading the schema version: LockNotAvailable")

    monkeypatch.setattr(repo, "schema_version", unavailable)
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    with caplog.at_level(logging.WARNING):
        e.start()
    assert e.running
    assert "cannot check schema 'public' now (reading the schema version: LockNotAvailable)" in caplog.text

    def broken() -> str | None:
        raise RuntimeError("not an outage")

    monkeypatch.setattr(repo, "schema_version", broken)
    other = make_engine()
    with pytest.raises(RuntimeError, match="not an outage"):
        other.start()
    assert not other.running


def test_start_bounds_the_stores_own_waits_by_the_lease_l3(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine(lease=9)
    e.start()
    assert repo.bounded == timedelta(seconds=9)


# --- where two rules meet at one moment --------------------------------------------------


# --- C4 meets L5 ------------------------------------------------------------------------


def test_c4_l5_max_execution_on_the_last_attempt_never_makes_the_job_dead(
    repo: FakeRepo, make_engine: Callable[..., Engine], release: threading.Event
) -> None:
    """A sync handler blocked (in a database call, say) past max_execution_timeout on its last
    attempt is given up on: failed, never dead (C4), written once the handler is declared hung
    (C4': a short grace here). Its next claim must run it, not call it poisoned (L5): the
    given-up attempt had an outcome, it did not hang without one."""
    e = make_engine(watchdog_grace=0.3)
    calls: list[int] = []

    def handler(ctx: Context, claim: Claim) -> None:
        calls.append(claim.attempt)
        if len(calls) == 1:
            release.wait(30)  # blocked past the hard ceiling, ignoring ctx

    e.register_kind(
        "t", handler, KindOptions(max_attempts=1, attempt_timeout=0.05, max_execution_timeout=0.1, **FAST)
    )
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.DONE, what="run again and done")
    row = repo.row(jid)
    assert State.DEAD not in row.history and State.FAILED in row.history
    assert len(calls) == 2


# --- C11: stop against stop, against the completer, from a handler -----------------------


def test_c11_a_second_stop_returns_only_once_the_engine_stopped(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """stop() while another stop() is under way (a signal handler and the main thread's close()):
    the second call must not return before the first has flushed every outcome, or close() shuts
    the store under the first stop and the row stays processing."""
    e = make_engine()
    started = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        started.set()
        time.sleep(0.5)  # finishes well within the first stop's timeout

    e.register_kind("t", handler)
    jid = e.enqueue(Job("t")).id
    e.start()
    assert started.wait(10)
    first = threading.Thread(target=e.stop, kwargs={"timeout": 30})
    first.start()
    wait_for(lambda: not e.running, what="the first stop under way")
    e.close()
    assert repo.row(jid).state is State.DONE
    assert not repo.closed or repo.row(jid).state is State.DONE
    first.join(30)


def test_c11_an_outcome_settled_after_the_completer_stopped_is_still_written(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """A handler that returns while stop() stops the completer (a settler thread slow to run,
    a thread preempted between its return and its put): its outcome must be written, not
    appended to a buffer nobody flushes any more."""
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    e.start()
    jid = e.enqueue(Job("t")).id
    wait_for(lambda: repo.row(jid).state is State.DONE)
    other = e.enqueue(Job("other")).id
    [row] = repo.claim(["other"], 1, e.worker_id, timedelta(seconds=30))
    completer = e._completer
    assert completer is not None
    completer.stop()  # what stop() does just before it switches to writing at once
    e.handover.write(Outcome(id=row.id, claim_token=row.claim_token, state=State.DONE, topic="other"))
    assert repo.row(other).state is State.DONE


def test_c11_stop_waits_for_a_closing_transaction_under_way(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """A handler returned before the stop, but its closing transaction (chain + on_succeeded) is
    still being retried after a connection lost at COMMIT (L6) when the stop's timeout and grace
    are over: stop() must not return while that outcome is still on its way (a process exits
    right after stop(), and the daemon thread writing it dies with it)."""
    e = make_engine(watchdog_grace=0.05)
    returned = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        claim.chain(Job("child"))
        claim.on_succeeded(lambda tx: None)
        returned.set()

    e.register_kind("t", handler)
    repo.fail_close = 4  # retried with backoff for a good while, outside the fake's lock
    jid = e.enqueue(Job("t")).id
    e.start()
    assert returned.wait(10)
    e.stop(timeout=0.01)
    assert repo.row(jid).state is State.DONE and len(children(repo, "child")) == 1


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_c11_l1_stop_called_from_a_handler_does_not_hang_that_handler(
    repo: FakeRepo, make_engine: Callable[..., Engine], kind: str
) -> None:
    """A handler that calls stop() (a "shutdown" job) cannot wait for itself: stop() from a
    handler starts the stop and returns; the handler's own return is then done, like any
    handler that returns during a stop, instead of being called hung at stop and run again."""
    e = make_engine(watchdog_grace=0.2)
    stopped_from: list[str] = []

    def sync_handler(ctx: Context, claim: Claim) -> None:
        e.stop(timeout=10)
        stopped_from.append("sync")

    async def async_handler(ctx: Context, claim: Claim) -> None:
        e.stop(timeout=10)
        await asyncio.sleep(0)
        stopped_from.append("async")

    e.register_kind("t", sync_handler if kind == "sync" else async_handler)
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: stopped_from, what="the handler returned from stop()")
    e.stop()  # from the test's thread: returns once the stop is over
    row = repo.row(jid)
    assert row.state is State.DONE and row.attempts == 1
    assert e.inflight.hung_count() == 0


def test_c11_close_after_run_once_with_an_async_handler_ends_the_loop_thread(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """run_once() runs an async handler on the engine's loop without start(); close() must end
    that loop's thread too (stop() has nothing to stop), or each such engine leaks one."""
    e = make_engine()
    seen: list[threading.Thread] = []

    async def handler(ctx: Context, claim: Claim) -> None:
        seen.append(threading.current_thread())  # the loop's own thread
        claim.chain(Job("child"))

    e.register_kind("t", handler)
    jid = e.enqueue(Job("t")).id
    assert e.run_once() == 1
    assert repo.row(jid).state is State.DONE and len(children(repo, "child")) == 1
    e.close()
    wait_for(lambda: not seen[0].is_alive(), what="the loop's thread ended")


# --- C8 meets C11: signals raised after each cause ----------------------------------------


def _decide(error: BaseException, cause: BaseException | None, attempt: int = 1) -> Outcome | None:
    return decide(
        id="j",
        claim_token="tok",
        topic="t",
        attempt=attempt,
        options=KindOptions(max_attempts=3, backoff_max=60),
        ending=Ending(Phase.RAISED, error=error, cause=cause, stopping=True),
    )


def test_c8_c11_must_delay_after_the_stops_cancel_keeps_its_delay_and_gives_the_attempt_back() -> None:
    """MustDelay(d) raised after EngineStopping: stopping is not the job's failure (attempt
    given back, C11) and the handler's own "not before d" still holds (C8): another engine
    must not run it at once."""
    o = _decide(MustDelay(30), EngineStopping("stop"))
    assert o is not None and o.give_back
    assert o.delay == timedelta(seconds=30)
    o = _decide(MustDelay(3600), EngineStopping("stop"), attempt=3)  # the last attempt: not dead
    assert o is not None and o.give_back and o.state is not State.DEAD
    assert o.delay == timedelta(seconds=60)  # clamped to backoff_max


def test_c8_c11_other_signals_after_the_stops_cancel() -> None:
    """MustCancelTask after the stop's cancel still cancels (the handler's word); MustPreserveAttempt
    gives the attempt back and is never dead."""
    o = _decide(MustCancelTask("no"), EngineStopping("stop"))
    assert o is not None and o.state is State.CANCELED
    o = _decide(MustPreserveAttempt("later"), EngineStopping("stop"), attempt=3)
    assert o is not None and o.give_back and o.state is not State.DEAD


# --- C4: the hard ceiling against a handler's return ----------------------------------------


def test_c4_l1_give_up_from_a_stale_look_after_the_handler_returned_leaves_it_done(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """The watchdog took its list of running attempts; the handler returns (an async one: its end
    recorded on the loop, its settling queued for a settler); then the watchdog reaches it past
    max_execution_timeout. The handler was not "still running then" (C4): its return decides,
    done, not a failed attempt written over its return."""
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    e.start()
    jid = e.enqueue(Job("t")).id
    e.stop()  # nothing claims it: the test drives the attempt's moves itself
    [row] = repo.claim(["t"], 1, e.worker_id, timedelta(seconds=30))
    a = e.intake.open(row)
    assert a is not None
    a.code_ended()  # the handler returned
    e.supervisor.give_up(a)  # the watchdog, from the list it took before
    e.runner.finish(a, None)  # the settler's turn
    r = repo.row(jid)
    assert r.state is State.DONE and r.last_error is None


# --- L6 meets L5 ----------------------------------------------------------------------------


def test_l6_l5_a_done_lost_with_its_engine_on_the_last_attempt_never_makes_the_job_dead(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """The handler returned on its last attempt, but the store was unreachable until another
    engine's reaper took the job back: the late done finds the row no longer its claim's and
    writes nothing; the next claim runs it again (a crash is no failure), never poisoned (L5')."""
    e = make_engine(lease=0.6, reaper_period=60)
    calls: list[int] = []
    e.register_kind("t", lambda ctx, claim: calls.append(claim.attempt), KindOptions(max_attempts=1, **FAST))
    e.start()
    wait_for(lambda: repo.engines, what="the first heartbeat")
    repo.fail_settle = repo.fail_renew = 10**9
    jid = e.enqueue(Job("t")).id
    wait_for(lambda: calls, what="run once", timeout=20)
    repo.expire(jid)
    assert repo.reap() == [(jid, "t")]  # another engine's reaper, say
    repo.fail_settle = repo.fail_renew = 0  # the store is back
    wait_for(lambda: repo.row(jid).state.terminal, what="settled again")
    assert repo.row(jid).state is State.DONE and calls == [1, 1]


def _unused(tx: Tx) -> None:  # keeps Tx imported for the callbacks' annotations
    return None


# --- async handlers settled on the loop (C10, L2) ------------------------------------------


@pytest.mark.parametrize("offer", ["as it is", "refused after has_room"])
def test_c10_l2_async_returns_meeting_a_full_outcome_buffer_are_settled_once_each_slot_freed_once(
    repo: FakeRepo, make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, offer: str
) -> None:
    """Async handlers return while the outcome writes are held up and the completer's buffer fills
    (max_buffer): returns that find no room wait on settler threads, their slots still taken (the
    claims stop), never on the loop. Once the writes go through, every job is done exactly once,
    every slot is free again and the busy gauge is back to zero. Run again with ``offer`` refused
    after ``has_room`` said yes (the buffer filled in between): the settler puts it and frees the slot."""
    e = make_engine(workers=40, lease=30)
    writes = threading.Event()
    settle = repo.settle_many

    def held_up(outcomes: list[Outcome]) -> set[str]:
        assert writes.wait(30)
        return settle(outcomes)

    monkeypatch.setattr(repo, "settle_many", held_up)
    loop_beats: list[float] = []

    async def handler(ctx: Context, claim: Claim) -> None:
        loop_beats.append(time.monotonic())
        await asyncio.sleep(0)

    e.register_kind("t", handler)
    n = 2500
    ids = [r.id for r in e.enqueue_many([Job("t", i) for i in range(n)])]
    e.start()
    completer = e._completer
    slots = e._slots
    assert completer is not None and slots is not None
    if offer != "as it is":
        monkeypatch.setattr(completer, "has_room", lambda: True)
    busy = {"topic": "t"}
    wait_for(
        lambda: (
            slots.free == 0
            and len(completer._buf) >= 1000
            and e.registry.get_sample_value("brooq_worker_busy", busy) == 0
        ),
        what="the buffer full, every slot taken by a handler that returned",
    )
    stalled = len(loop_beats)
    time.sleep(0.3)
    try:
        assert len(loop_beats) == stalled  # no new claim while the returns wait for room
    finally:
        writes.set()
    wait_for(lambda: all(repo.row(i).state is State.DONE for i in ids), what="all done", timeout=60)
    wait_for(lambda: slots.free == 40 and not e.inflight.held(), what="every slot free")
    assert all(repo.row(i).history == [State.PROCESSING, State.DONE] for i in ids)
    assert e.registry.get_sample_value("brooq_settle_total", {"topic": "t", "outcome": "done"}) == n
    assert e.registry.get_sample_value("brooq_worker_busy", busy) == 0
    assert e.registry.get_sample_value("brooq_attempt_duration_seconds_count", {"topic": "t"}) == n
    e.stop(timeout=5)
    assert slots.free == 40


@pytest.mark.parametrize("cause", ["cancel", "attempt_timeout", "last attempt"])
def test_x2_c4_l2_an_async_return_after_its_ctx_was_cancelled_settles_once_and_frees_its_slot_once(
    repo: FakeRepo, make_engine: Callable[..., Engine], cause: str
) -> None:
    """An async handler returns on the loop (the non-blocking settle) after its ctx was cancelled:
    by a cancel seen as a lost lease (X2: nothing written, the row stays canceled), by its
    attempt_timeout (C4: a return is done), or on its last attempt (done): one outcome at most,
    its slot freed exactly once, the busy gauge back to zero."""
    e = make_engine(workers=1, lease=0.6)
    opts = KindOptions(attempt_timeout=0.2 if cause == "attempt_timeout" else 30, max_attempts=1, **FAST)
    cancelled = threading.Event()
    started = threading.Event()

    async def handler(ctx: Context, claim: Claim) -> None:
        started.set()
        while not ctx.done():
            await asyncio.sleep(0.01)
        cancelled.set()

    e.register_kind("t", handler, opts)
    jid = e.enqueue(Job("t")).id
    e.start()
    assert started.wait(10)  # running (a job canceled before its handler starts never starts)
    if cause == "cancel":
        assert e.cancel(jid)
    elif cause == "last attempt":
        e.stop(timeout=0.05)  # the stop's cancel: a return is done all the same (C11)
    assert cancelled.wait(10)
    slots = e._slots
    assert slots is not None
    wait_for(lambda: not e.inflight.held() and slots.free == 1, what="settled, its slot free")
    want = State.CANCELED if cause == "cancel" else State.DONE
    assert repo.row(jid).history == [State.PROCESSING, want]
    assert e.registry.get_sample_value("brooq_worker_busy", {"topic": "t"}) == 0
    done = e.registry.get_sample_value("brooq_settle_total", {"topic": "t", "outcome": "done"}) or 0
    assert done == (0 if cause == "cancel" else 1)
    time.sleep(0.2)
    assert slots.free == 1


def test_o1_l6_an_outcome_batch_written_but_answered_with_a_lost_connection_is_counted_once(
    repo: FakeRepo, make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outcome batch commits and its answer is lost (connection broken after the COMMIT): the
    completer retries (L6), the job is done exactly once (P3), and the done is counted once (O1)."""
    e = make_engine()
    settle = repo.settle_many
    lost: list[int] = []

    def answer_lost_once(outcomes: list[Outcome]) -> set[str]:
        written = settle(outcomes)
        if not lost:
            lost.append(len(written))
            raise StoreUnavailable("connection lost after COMMIT")
        return written

    monkeypatch.setattr(repo, "settle_many", answer_lost_once)
    e.register_kind("t", lambda ctx, claim: None)
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.DONE and not e.inflight.held(), what="done and settled")
    assert lost == [1] and repo.row(jid).history == [State.PROCESSING, State.DONE]
    assert e.registry.get_sample_value("brooq_settle_total", {"topic": "t", "outcome": "done"}) == 1


@pytest.mark.parametrize(
    ("given", "wait"),
    [
        (None, None),
        (5, 5.0),
        (timedelta(seconds=2), 2.0),
        (-3, 0.0),
        (-(10**400), 0.0),
        (float("-inf"), 0.0),
        (float("inf"), 1e8),
        (10**400, 1e8),
    ],
)
def test_stop_reads_its_timeout_as_seconds_to_wait(given: object, wait: float | None) -> None:
    """math.inf waits as long as the handlers run (within threading's bounds), a negative one not at all."""
    assert _stop_wait(given) == wait


@pytest.mark.parametrize("given", ["abc", True, [1], float("nan")])
def test_stop_refuses_a_timeout_that_is_no_number_before_anything_stops(given: object) -> None:
    with pytest.raises((TypeError, ValueError), match="timeout"):
        _stop_wait(given)
