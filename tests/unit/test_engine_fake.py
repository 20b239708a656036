"""Engine behaviour against an in-memory repo (no database): fast and deterministic."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from brooq_py.engine import Config, Engine
from brooq_py.queue import (
    AttemptTimeout,
    BrooqError,
    Claim,
    ConfigError,
    Context,
    EngineStopping,
    Job,
    KindOptions,
    LeaseLost,
    MustCancelTask,
    MustDelay,
    MustPreserveAttempt,
    State,
    Tx,
)
from tests.polling import wait_for
from tests.unit.conftest import FAST
from tests.unit.fake_repo import FakeRepo


@pytest.fixture
def ignores_ctx() -> Iterator[Callable[[Context, Claim], None]]:
    """A handler that ignores its context and blocks until the test ends (released in teardown)."""
    release = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        release.wait(30)

    yield handler
    release.set()


def test_run_once_done_charges_one_attempt_c1_c6(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    seen: list[Claim] = []
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: seen.append(claim))
    jid = e.enqueue(Job("t", {"n": 1})).id
    assert e.run_once() == 1
    row = repo.row(jid)
    assert row.state is State.DONE and row.attempts == 1
    assert seen[0].attempt == 1 and seen[0].payload == {"n": 1} and seen[0].max_attempts == 5


def test_failure_then_dead_on_last_attempt_c6(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine()

    def boom(ctx: Context, claim: Claim) -> None:
        raise ValueError("boom")

    e.register_kind("t", boom, KindOptions(max_attempts=2, **FAST))
    jid = e.enqueue(Job("t")).id
    e.run_once()
    assert repo.row(jid).state is State.FAILED
    assert repo.row(jid).last_error == "ValueError: boom"
    wait_for(lambda: e.run_once() == 1)
    assert repo.row(jid).state is State.DEAD and repo.row(jid).attempts == 2


def test_signals_c8(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine(workers=3)

    def handler(ctx: Context, claim: Claim) -> None:
        kind = claim.payload["kind"]
        if kind == "cancel":
            raise MustCancelTask("no longer needed")
        if kind == "preserve":
            raise RuntimeError("wrapped") from MustPreserveAttempt()
        if kind == "delay":
            raise ExceptionGroup("g", [MustDelay(3600)])

    e.register_kind("t", handler, KindOptions(max_attempts=1, backoff_base=1, backoff_max=60))
    ids = {k: e.enqueue(Job("t", {"kind": k})).id for k in ("cancel", "preserve", "delay")}
    assert e.run_once() == 3
    assert repo.row(ids["cancel"]).state is State.CANCELED
    pres = repo.row(ids["preserve"])
    assert pres.state is State.FAILED and pres.attempts == 0
    # MustDelay on the last attempt: dead all the same
    assert repo.row(ids["delay"]).state is State.DEAD


def test_preserve_attempt_never_dead_c8(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine()

    def handler(ctx: Context, claim: Claim) -> None:
        raise MustPreserveAttempt()

    e.register_kind("t", handler, KindOptions(max_attempts=1, **FAST))
    jid = e.enqueue(Job("t")).id
    for _ in range(10):
        wait_for(lambda: e.run_once() == 1)
        assert repo.row(jid).state is State.FAILED
    assert repo.row(jid).attempts == 0


def test_chain_commits_with_done_c9(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: claim.chain(Job("next", {"from": claim.id})))
    jid = e.enqueue(Job("t")).id
    e.run_once()
    assert repo.row(jid).state is State.DONE
    children = [r for r in repo.rows.values() if r.topic == "next"]
    assert len(children) == 1 and children[0].payload == {"from": jid}


def test_chain_failure_rolls_back_and_fails_c9(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine()
    repo.fail_enqueue_topics.add("bad")
    e.register_kind("t", lambda ctx, claim: claim.chain(Job("bad")))
    jid = e.enqueue(Job("t")).id
    e.run_once()
    row = repo.row(jid)
    assert row.state is State.FAILED and "refused" in (row.last_error or "")
    assert not [r for r in repo.rows.values() if r.topic == "bad"]


def test_on_succeeded_failure_records_failed_c9(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine()

    def cb(tx: Tx) -> None:
        raise RuntimeError("callback failed")

    def handler(ctx: Context, claim: Claim) -> None:
        claim.chain(Job("child"))
        claim.on_succeeded(cb)

    e.register_kind("t", handler)
    jid = e.enqueue(Job("t")).id
    e.run_once()
    assert repo.row(jid).state is State.FAILED
    assert not [r for r in repo.rows.values() if r.topic == "child"]


def test_nothing_chained_on_failure_c9(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine()

    def handler(ctx: Context, claim: Claim) -> None:
        claim.chain(Job("child"))
        raise ValueError("no")

    e.register_kind("t", handler)
    e.enqueue(Job("t"))
    e.run_once()
    assert not [r for r in repo.rows.values() if r.topic == "child"]


def test_async_and_object_handlers_c2(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine()
    loops: list[str] = []

    async def ahandler(ctx: Context, claim: Claim) -> None:
        await asyncio.sleep(0)
        loops.append(threading.current_thread().name)

    class Obj:
        def handle(self, ctx: Context, claim: Claim) -> None:
            loops.append("obj")

    e.register_kind("a", ahandler)
    e.register_kind("o", Obj())
    a = e.enqueue(Job("a")).id
    o = e.enqueue(Job("o")).id
    assert e.run_once() == 2
    assert repo.row(a).state is State.DONE and repo.row(o).state is State.DONE
    assert "brooq-async" in loops and "obj" in loops
    e.stop()


def test_register_kind_errors(make_engine: Callable[..., Engine]) -> None:
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    with pytest.raises(ConfigError):
        e.register_kind("t", lambda ctx, claim: None)
    with pytest.raises(ConfigError):
        e.register_kind("", lambda ctx, claim: None)
    with pytest.raises(ConfigError):
        e.register_kind("x", object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        e.register_kind("y", lambda ctx, claim: None, {"max_attempts": 1})  # type: ignore[arg-type]
    e.start()
    with pytest.raises(BrooqError):
        e.register_kind("z", lambda ctx, claim: None)


def test_unregistered_topic_not_claimed_c1(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine()
    e.register_kind("mine", lambda ctx, claim: None)
    other = repo.enqueue(Job("theirs")).id
    assert e.run_once() == 0
    assert repo.row(other).state is State.PENDING


def test_started_engine_drains_and_batches_completions_c10(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine(workers=8)
    e.register_kind("t", lambda ctx, claim: None)
    ids = [r.id for r in repo.enqueue_many([Job("t", i) for i in range(500)])]
    e.start()
    wait_for(lambda: all(repo.row(i).state is State.DONE for i in ids))
    assert sum(repo.settle_batches) == 500
    assert len(repo.settle_batches) < 500  # several outcomes per statement
    assert all(repo.row(i).attempts == 1 for i in ids)


def test_notify_wakes_idle_worker_e6(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine(poll_interval=3600)  # only a wake-up can bring the job in
    e.register_kind("t", lambda ctx, claim: None)
    e.start()
    time.sleep(0.05)
    jid = e.enqueue(Job("t")).id
    wait_for(lambda: repo.row(jid).state is State.DONE)


def test_cancel_reaches_running_handler_as_lease_lost_x2(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine(lease=0.3)
    causes: list[BaseException | None] = []
    started = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        started.set()
        ctx.wait(10)
        causes.append(ctx.cause)

    e.register_kind("t", handler)
    jid = e.enqueue(Job("t")).id
    e.start()
    assert started.wait(5)
    assert e.cancel(jid)
    wait_for(lambda: bool(causes))
    assert isinstance(causes[0], LeaseLost)
    e.stop(timeout=1)
    assert repo.row(jid).state is State.CANCELED  # the late return wrote nothing
    assert repo.row(jid).history[-1] is State.CANCELED
    # Counted as the job's outcome, not as a lost lease.
    assert e.registry.get_sample_value("brooq_settle_total", {"topic": "t", "outcome": "canceled"}) == 1.0
    assert not e.registry.get_sample_value("brooq_lease_lost_total", {"topic": "t"})


def test_heartbeat_error_is_not_a_cancel_c3(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    # three failed renewals, a third of a lease: a blip, not yet L4's whole lease
    e = make_engine(lease=1.5)
    release = threading.Event()
    causes: list[BaseException | None] = []

    def handler(ctx: Context, claim: Claim) -> None:
        release.wait(10)
        causes.append(ctx.cause)

    e.register_kind("t", handler)
    repo.fail_renew = 3
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.calls.get("renew", 0) >= 5)
    release.set()
    wait_for(lambda: repo.row(jid).state is State.DONE)
    assert causes == [None]


def test_attempt_timeout_then_failed_c4(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine()
    causes: list[BaseException | None] = []

    def handler(ctx: Context, claim: Claim) -> None:
        ctx.wait(10)
        causes.append(ctx.cause)
        ctx.raise_if_done()

    e.register_kind("t", handler, KindOptions(attempt_timeout=0.1, max_execution_timeout=10, **FAST))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: State.FAILED in repo.row(jid).history)
    assert isinstance(causes[0], AttemptTimeout)
    assert (repo.row(jid).last_error or "").startswith("AttemptTimeout")


def test_hung_handler_is_reported_and_slot_freed_c5(
    repo: FakeRepo, make_engine: Callable[..., Engine], ignores_ctx: Callable[[Context, Claim], None]
) -> None:
    e = make_engine(workers=1, watchdog_grace=0.1)
    e.register_kind("hang", ignores_ctx, KindOptions(attempt_timeout=0.1, max_execution_timeout=30, **FAST))
    e.register_kind("ok", lambda ctx, claim: None)
    hung_id = e.enqueue(Job("hang")).id
    e.start()
    wait_for(lambda: e.inflight.hung_count() == 1)
    # the slot is free again: other work runs with workers=1
    ok_id = e.enqueue(Job("ok")).id
    wait_for(lambda: repo.row(ok_id).state is State.DONE)
    # its lease is no longer renewed: the reaper can hand it out after it expires
    assert hung_id not in {a.id for a in e.inflight.held()}
    hung = e.registry.get_sample_value("brooq_hung_workers_total", {"topic": "hang"})
    assert hung == 1.0


def test_max_execution_gives_up_failed_not_dead_c4(
    repo: FakeRepo, make_engine: Callable[..., Engine], ignores_ctx: Callable[[Context, Claim], None]
) -> None:
    # The failure is written once the given-up handler is declared hung (C4'): a short grace.
    e = make_engine(workers=1, watchdog_grace=0.3)
    e.register_kind(
        "t",
        ignores_ctx,
        KindOptions(max_attempts=1, attempt_timeout=0.05, max_execution_timeout=0.1, **FAST),
    )
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).history[-1:] == [State.FAILED] or repo.row(jid).attempts > 1)
    assert State.DEAD not in repo.row(jid).history
    assert "MaxExecutionExceeded" in (repo.row(jid).last_error or "")


def test_stop_hands_back_attempt_of_raising_handler_c11(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine()
    started = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        started.set()
        ctx.wait(10)
        ctx.raise_if_done()

    e.register_kind("t", handler)
    jid = e.enqueue(Job("t")).id
    e.start()
    assert started.wait(5)
    e.stop(timeout=0.05)
    row = repo.row(jid)
    assert row.state is State.PENDING and row.attempts == 0
    assert "EngineStopping" in (row.last_error or "")


def test_stop_lets_returning_handler_finish_done_c11(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine()
    started = threading.Event()
    causes: list[BaseException | None] = []

    def handler(ctx: Context, claim: Claim) -> None:
        started.set()
        ctx.wait(10)
        causes.append(ctx.cause)

    e.register_kind("t", handler)
    jid = e.enqueue(Job("t")).id
    e.start()
    assert started.wait(5)
    e.stop(timeout=0.05)
    assert isinstance(causes[0], EngineStopping)
    assert repo.row(jid).state is State.DONE


def test_stop_hung_handler_goes_back_to_pending_c11(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    e = make_engine(watchdog_grace=0.1)
    forever = threading.Event()
    started = threading.Event()

    def hang(ctx: Context, claim: Claim) -> None:
        started.set()
        forever.wait(30)

    e.register_kind("t", hang)
    jid = e.enqueue(Job("t")).id
    e.start()
    assert started.wait(5)
    e.stop(timeout=0.05)
    row = repo.row(jid)
    assert row.state is State.PENDING and row.attempts == 0
    forever.set()


def test_completer_retries_failed_flush(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    repo.fail_settle = 2
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(jid).state is State.DONE)


def test_listener_failure_degrades_to_polling_e6(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    repo.listen_broken = True
    e = make_engine(poll_interval=0.05)
    e.register_kind("t", lambda ctx, claim: None)
    e.start()
    jid = e.enqueue(Job("t")).id
    wait_for(lambda: repo.row(jid).state is State.DONE)


def test_metrics_move_o1(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    e.enqueue(Job("t"))
    e.run_once()
    get = e.registry.get_sample_value
    assert get("brooq_enqueued_total", {"topic": "t"}) == 1.0
    assert get("brooq_claimed_total", {"topic": "t"}) == 1.0
    assert get("brooq_settle_total", {"topic": "t", "outcome": "done"}) == 1.0
    assert get("brooq_attempt_duration_seconds_count", {"topic": "t"}) == 1.0
    # a histogram Prometheus can aggregate across engines, the run time inside its buckets
    assert get("brooq_attempt_duration_seconds_bucket", {"topic": "t", "le": "+Inf"}) == 1.0
    assert get("brooq_attempt_duration_seconds_bucket", {"topic": "t", "le": "600.0"}) == 1.0
    assert get("brooq_up") == 0.0  # gauges come from the refresher (SPEC Z2): none read yet
    e.refresher.run_once()
    assert get("brooq_jobs", {"topic": "t", "state": "pending"}) == 0.0
    assert get("brooq_up") == 1.0


def test_stop_and_close_are_safe_to_repeat(repo: FakeRepo, make_engine: Callable[..., Engine]) -> None:
    e = make_engine()
    e.stop()
    e.close()
    e.close()
    assert repo.closed
    logging.getLogger(__name__).debug("closed twice")


def test_ticker_logs_a_failing_tick_once_then_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """Ticker base: errors are logged (the stack once, not every period) and the loop goes on."""
    from brooq_py.engine.services.ticker import Ticker

    calls: list[int] = []

    class Failing(Ticker):
        name = "failing"

        def tick(self) -> None:
            calls.append(1)
            if len(calls) < 10:
                raise RuntimeError("no table")

    t = Failing(0.001, logging.getLogger("test.ticker"))
    t.stop()  # safe before start
    with caplog.at_level(logging.INFO, logger="test.ticker"):
        t.start()
        t.start()  # idempotent
        wait_for(lambda: len(calls) >= 11)
        t.stop()
        t.stop()  # safe twice
    stacks = [r for r in caplog.records if r.exc_info]
    assert len(stacks) == 1
    assert any("works again" in r.getMessage() for r in caplog.records)
    calls.clear()
    with pytest.raises(RuntimeError):  # run_once lets the error through, for tests
        Failing(1, logging.getLogger("x")).run_once()


def test_a_woken_ticker_ticks_once_early_then_keeps_its_period() -> None:
    """Ticker base: one wake() is one early tick. The wake-up used to stay set, so every wait
    after it returned at once and the service ticked without pause until stopped."""
    from brooq_py.engine.services.ticker import Ticker

    ticks: list[float] = []
    woken: list[bool] = []

    class Counting(Ticker):
        name = "counting"

        def tick(self) -> None:
            ticks.append(time.monotonic())
            woken.append(self.take_wake())

    t = Counting(3600, logging.getLogger("test.ticker"))
    t.start()
    try:
        wait_for(lambda: len(ticks) == 1)  # the first tick, at start
        t.wake()
        t.wake()  # once, however many calls come before the tick
        wait_for(lambda: len(ticks) >= 2)
        time.sleep(0.3)
        assert len(ticks) == 2, f"{len(ticks)} ticks after one wake-up"
        assert woken == [False, True]  # the tick after the wake-up can tell it was woken
        t.wake()
        wait_for(lambda: len(ticks) >= 3)
        time.sleep(0.3)
        assert len(ticks) == 3
    finally:
        t.stop()
    assert not t.running


def test_z1_retention_tick_ending_on_its_cap_is_followed_at_once(caplog: pytest.LogCaptureFixture) -> None:
    from datetime import timedelta

    from brooq_py.engine.services.cleanup import MAX_BATCHES_PER_TICK, Retention

    calls: list[int] = []
    deleted: dict[str, int] = {}
    backlog = [3 * MAX_BATCHES_PER_TICK * 2 + 1]  # rows left: two full ticks, then one short

    def delete(ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        calls.append(batch)
        n = min(batch, backlog[0])
        backlog[0] -= n
        return [(f"id{i}", "t") for i in range(n)]

    r = Retention(
        3600, timedelta(days=1), 3, delete, lambda t, n: deleted.__setitem__(t, deleted.get(t, 0) + n),
        logging.getLogger("r"),
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="r"):
        r.run_once()
        assert len(calls) == MAX_BATCHES_PER_TICK and r.behind and r.next_delay() == 0.0
        r.run_once()
        assert r.behind and r.next_delay() == 0.0
        r.run_once()
    assert not r.behind and r.next_delay() == 3600
    assert deleted == {"t": 3 * MAX_BATCHES_PER_TICK * 2 + 1} and backlog == [0]
    lines = [rec.getMessage() for rec in caplog.records]
    assert sum("backlog" in m for m in lines) == 1
    assert sum("deleted 61 terminal jobs" in m for m in lines) == 1


def test_z1_retention_drains_a_backlog_without_waiting_a_period() -> None:
    from datetime import timedelta

    from brooq_py.engine.services.cleanup import Retention

    backlog = [5000]

    def delete(ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        n = min(batch, backlog[0])
        backlog[0] -= n
        return [("id", "t")] * n

    r = Retention(3600, timedelta(days=1), 7, delete, lambda t, n: None, logging.getLogger("r"))
    r.start()
    try:
        wait_for(
            lambda: backlog[0] == 0, "the backlog drained (period 1 h: only ticks at once get there)", 20
        )
    finally:
        r.stop()


@pytest.mark.parametrize(
    ("batch_seconds", "backlog_rows", "expected"),
    [
        # each full batch is followed by PACE x its duration; the short last batch is not
        (0.0625, 3 * 7 + 2, lambda pace, cap: [pace * 0.0625] * 3),
        # a batch slow for any reason (a pool wait, a lock): still PACE x its duration, never cut
        # short (Z1': a cap let big batches keep the connection a third busy)
        (1200.0, 7 + 1, lambda pace, bound: [pace * 1200.0]),
    ],
    ids=["pace", "slow"],
)
def test_z1_retention_pauses_after_each_full_batch(
    batch_seconds: float, backlog_rows: int, expected: Callable[[float, float], list[float]]
) -> None:
    from datetime import timedelta

    from brooq_py.engine.services.cleanup import PACE, PAUSE_BOUND, Retention

    now = [0.0]
    backlog = [backlog_rows]
    pauses: list[float] = []

    def delete(ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        now[0] += batch_seconds  # on the fake clock (both values exact in binary)
        n = min(batch, backlog[0])
        backlog[0] -= n
        return [("id", "t")] * n

    r = Retention(
        3600, timedelta(days=1), 7, delete, lambda t, n: None, logging.getLogger("r"),
        monotonic=lambda: now[0], pause=pauses.append,
    )  # fmt: skip
    r.run_once()
    assert backlog == [0] and pauses == expected(PACE, PAUSE_BOUND) and not r.behind


def test_z1_batches_deleted_before_a_failing_one_are_counted(caplog: pytest.LogCaptureFixture) -> None:
    """The metric and the INFO summary both count the batches committed before a failing one."""
    from datetime import timedelta

    from brooq_py.engine.services.cleanup import Retention

    calls = [0]
    counted: dict[str, int] = {}

    def delete(ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        calls[0] += 1
        if calls[0] == 3:
            raise ConnectionError("down")
        return [("id", "t")] * (batch if calls[0] < 4 else 2)  # the tick after: one short batch

    r = Retention(
        3600, timedelta(days=1), 5, delete, lambda t, n: counted.__setitem__(t, counted.get(t, 0) + n),
        logging.getLogger("r"), pause=lambda s: None,
    )  # fmt: skip
    with pytest.raises(ConnectionError):
        r.run_once()
    assert counted == {"t": 10}
    with caplog.at_level(logging.INFO, logger="r"):
        r.run_once()
    assert counted == {"t": 12}
    assert any("deleted 12 terminal jobs" in rec.getMessage() for rec in caplog.records)


def test_z1_stop_ends_a_retention_pause_at_once() -> None:
    from datetime import timedelta

    from brooq_py.engine.services.cleanup import Retention

    now = [0.0]
    deleted = threading.Event()

    def delete(ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        now[0] += 1000.0  # the pause after this full batch would last hours
        deleted.set()
        return [("id", "t")] * batch

    r = Retention(
        3600,
        timedelta(days=1),
        7,
        delete,
        lambda t, n: None,
        logging.getLogger("r"),
        monotonic=lambda: now[0],
    )
    r.start()
    thread = r._thread
    assert thread is not None and deleted.wait(10)
    r.stop(timeout=10)
    assert not thread.is_alive()  # the pause ended with stop(), not hours later


def test_retention_ttl_zero_starts_no_retention_loop_t3(repo: FakeRepo) -> None:
    from brooq_py.engine.services.cleanup import Retention

    e = Engine(repo, Config(retention_ttl=0, lease=3))
    e.start()
    try:
        assert not [s for s in e._services if isinstance(s, Retention)]
    finally:
        e.close()
    e2 = Engine(FakeRepo(), Config(retention_ttl=3600, lease=3))
    e2.start()
    try:
        assert [s for s in e2._services if isinstance(s, Retention)]
    finally:
        e2.close()


def test_healthz_turns_unhealthy_once_hung_outnumber_workers_c5(
    repo: FakeRepo, make_engine: Callable[..., Engine], ignores_ctx: Callable[[Context, Claim], None]
) -> None:
    e = make_engine(workers=1, watchdog_grace=0.05)
    e.register_kind(
        "hang",
        ignores_ctx,
        KindOptions(attempt_timeout=0.05, max_execution_timeout=30, **FAST),
    )
    e.enqueue(Job("hang"))
    e.start()
    wait_for(lambda: e.inflight.hung_count() == 1)
    health = e.health()
    assert health.ok and health.hung == 1 and health.workers == 1
    e.enqueue(Job("hang"))  # the freed slot takes it; it hangs too
    wait_for(lambda: e.inflight.hung_count() == 2)
    health = e.health()
    assert not health.ok and health.database and health.running


def test_reaper_logs_count_and_topics_at_info_r1(caplog: pytest.LogCaptureFixture) -> None:
    from brooq_py.engine.services.cleanup import Reaper

    reaped: list[str] = []
    rows = [("1", "email"), ("2", "email"), ("3", "sms")]
    r = Reaper(5, lambda: rows, reaped.append, logging.getLogger("reaper-test"))
    with caplog.at_level(logging.INFO, logger="reaper-test"):
        r.run_once()
    assert sorted(reaped) == ["email", "email", "sms"]
    [record] = [rec for rec in caplog.records if rec.name == "reaper-test"]
    assert record.levelno == logging.INFO
    assert (
        "3 jobs of gone engines" in record.getMessage()
        and "email:2" in record.getMessage()
        and "sms:1" in record.getMessage()
    )


def test_run_once_after_stop_writes_outcomes_at_once(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """run_once writes every outcome before returning, also on an engine that was started and stopped."""
    e = make_engine()
    e.register_kind("t", lambda ctx, claim: None)
    e.start()
    e.stop(timeout=1)
    jid = repo.enqueue(Job("t")).id
    assert e.run_once() == 1
    assert repo.row(jid).state is State.DONE


def test_completer_does_not_rewrite_after_a_bookkeeping_error_c10() -> None:
    """A failure after the write (bookkeeping) is logged; the written batch is not sent again."""
    from brooq_py.engine.services.completer import Completer
    from brooq_py.queue.port import Outcome

    writes: list[int] = []

    def write(batch: object) -> set[str]:
        writes.append(len(batch))  # type: ignore[arg-type]
        return set()

    def broken(batch: object, written: set[str]) -> None:
        raise RuntimeError("bookkeeping")

    c = Completer(write, broken, logging.getLogger("completer-test"))
    c.put(Outcome(id="a", claim_token="t", state=State.DONE))
    assert c.flush_once() == 1
    assert c.flush_once() == 0
    assert writes == [1] and c.pending == 0


def test_z1_a_failing_delete_waits_a_period() -> None:
    from datetime import timedelta

    from brooq_py.engine.services.cleanup import MAX_BATCHES_PER_TICK, Retention

    calls = [0]

    def delete(ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        calls[0] += 1
        if calls[0] > MAX_BATCHES_PER_TICK:
            raise ConnectionError("down")
        return [("id", "t")] * batch

    r = Retention(600, timedelta(days=1), 2, delete, lambda t, n: None, logging.getLogger("r"))
    r.run_once()
    assert r.behind and r.next_delay() == 0.0
    with pytest.raises(ConnectionError):
        r.run_once()
    assert not r.behind and r.next_delay() == 600


def test_the_last_attempts_failure_says_the_job_is_now_dead(
    repo: FakeRepo, make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    e = make_engine()

    def broken(ctx: Context, claim: Claim) -> None:
        raise ValueError("nope")

    e.register_kind("t", broken, KindOptions(max_attempts=2, backoff_base=0.001, backoff_max=0.001))
    job_id = e.enqueue(Job("t")).id
    with caplog.at_level(logging.ERROR, logger="brooq_py.engine"):
        e.run_once()
        time.sleep(0.05)  # the 1 ms backoff has passed: run_once stages the row again
        e.run_once()
    lines = [r.getMessage() for r in caplog.records if f"job id={job_id}" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "attempt=1/2 failed: ValueError: nope; retried in" in lines[0]
    assert "now dead" not in lines[0]
    assert lines[1].endswith("ValueError: nope; that was the last attempt: the job is now dead")


def test_q3_a_done_with_closing_work_makes_room_in_its_limited_topic_at_once(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """A topic limited to one processing job whose handler has an on_succeeded callback: its done
    is written by a closing transaction, not the completer, and wakes the claim of the topic's next
    job all the same, not a poll interval later."""
    repo.settings["t"] = (False, 1)
    e = make_engine(poll_interval=30)
    ran: list[str] = []

    def handler(ctx: Context, claim: Claim) -> None:
        ran.append(claim.id)
        claim.on_succeeded(lambda tx: None)

    e.register_kind("t", handler)
    first = e.enqueue(Job("t")).id
    second = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: repo.row(first).state is State.DONE, what="the first job done")
    wait_for(
        lambda: repo.row(second).state is State.DONE, what="the next job of the limited topic", timeout=10
    )
    assert sorted(ran) == sorted([first, second])
