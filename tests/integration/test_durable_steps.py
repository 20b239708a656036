"""Durable steps, sleeps and snoozes against PostgreSQL (SPEC DS1-DS3, DS5)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import (
    Claim,
    Context,
    Job,
    JobRow,
    KindOptions,
    Snooze,
    State,
    Tx,
)
from brooq_py.queue.port import Outcome
from tests.integration.conftest import q
from tests.polling import wait_for

OPTS = KindOptions(max_attempts=5, backoff_base=0.01, backoff_max=0.02)


def ended(store: Store, job_id: str) -> JobRow:
    def check() -> JobRow | None:
        row = store.get(job_id)
        return row if row is not None and row.state.terminal else None

    row: JobRow = wait_for(check, f"job {job_id} to end")
    return row


def in_state(store: Store, job_id: str, state: State) -> JobRow:
    def check() -> JobRow | None:
        row = store.get(job_id)
        return row if row is not None and row.state is state else None

    row: JobRow = wait_for(check, f"job {job_id} to be {state}")
    return row


def step_rows(store: Store, job_id: str) -> list[tuple[Any, ...]]:
    with store.session.pool.connection() as conn:  # type: ignore[union-attr]
        return conn.execute(
            f'SELECT seq, name, kind FROM "{store.schema}".job_step WHERE job_id = %s ORDER BY seq',
            (job_id,),
        ).fetchall()


def test_ds1_a_retry_replays_from_the_top_and_recorded_steps_are_not_called_again(
    store: Store, engines: Callable[..., Engine]
) -> None:
    calls: Counter[str] = Counter()

    def charge(amount: int) -> dict[str, Any]:
        calls["charge"] += 1
        return {"charged": amount, "as": (1, 2)}

    def ship() -> str:
        calls["ship"] += 1
        if calls["ship"] == 1:
            raise RuntimeError("carrier down")
        return "shipped"

    seen: list[Any] = []

    def handler(ctx: Context, claim: Claim) -> Any:
        receipt = ctx.step("charge", charge, claim.payload["amount"])
        seen.append(receipt)
        return [receipt, ctx.step("ship", ship)]

    e = engines()
    e.register_kind("order", handler, OPTS)
    jid = e.enqueue(Job("order", {"amount": 7})).id
    e.start()
    row = ended(store, jid)
    assert row.state is State.DONE
    assert calls == {"charge": 1, "ship": 2}
    # the first run got the JSON round trip too: every run sees the same value
    assert seen == [{"charged": 7, "as": [1, 2]}] * 2
    assert row.result == [{"charged": 7, "as": [1, 2]}, "shipped"]
    assert [s.name for s in row.steps] == ["charge", "ship"]
    assert all(s.kind == "step" and s.until is None for s in row.steps)
    assert row.steps[0].at <= row.steps[1].at
    assert row.attempts == 2


def test_ds1_identity_is_name_and_use_a_step_that_raises_records_nothing(
    store: Store, engines: Callable[..., Engine]
) -> None:
    tries: Counter[str] = Counter()

    def flaky(n: int) -> int:
        tries[f"n{n}"] += 1
        if n == 2 and tries["n2"] == 1:
            raise ValueError("not yet")
        return n * 10

    def handler(ctx: Context, claim: Claim) -> Any:
        return [ctx.step("fetch", flaky, 1), ctx.step("fetch", flaky, 2), ctx.step("fetch", flaky, 3)]

    e = engines()
    e.register_kind("fetch", handler, OPTS)
    jid = e.enqueue(Job("fetch")).id
    e.start()
    row = ended(store, jid)
    assert row.result == [10, 20, 30]
    assert [s.name for s in row.steps] == ["fetch", "fetch#2", "fetch#3"]
    assert tries == {"n1": 1, "n2": 2, "n3": 1}
    assert "ValueError: not yet" in (row.errors[0].error if row.errors else "")


def test_ds1_a_different_sequence_on_replay_raises_naming_the_step_never_another_result(
    store: Store, engines: Callable[..., Engine]
) -> None:
    runs = Counter[str]()
    got: list[Any] = []

    def handler(ctx: Context, claim: Claim) -> Any:
        runs["run"] += 1
        if runs["run"] == 1:
            ctx.step("reserve", lambda: "reserved")
            raise RuntimeError("crash after reserve")
        got.append(ctx.step("refund", lambda: "refunded"))  # the code changed between runs
        return "unreachable"

    e = engines()
    e.register_kind("nondet", handler, KindOptions(max_attempts=2, backoff_base=0.01, backoff_max=0.02))
    jid = e.enqueue(Job("nondet")).id
    e.start()
    row = ended(store, jid)
    assert row.state is State.DEAD
    assert got == []  # never the result of "reserve"
    assert row.last_error is not None and row.last_error.startswith("ReplayMismatch")
    assert "'refund'" in row.last_error and "'reserve'" in row.last_error
    assert [s.name for s in row.steps] == ["reserve"]


def test_ds1_step_names_are_checked_before_anything_runs(
    store: Store, engines: Callable[..., Engine]
) -> None:
    errors: list[BaseException] = []

    def handler(ctx: Context, claim: Claim) -> None:
        for bad in ("", "a#2"):
            try:
                ctx.step(bad, lambda: 1)
            except ValueError as exc:
                errors.append(exc)

    e = engines()
    e.register_kind("names", handler, OPTS)
    jid = e.enqueue(Job("names")).id
    e.start()
    assert ended(store, jid).state is State.DONE
    assert len(errors) == 2 and "#" in str(errors[1])
    assert step_rows(store, jid) == []
    with pytest.raises(Exception, match="no attempt"):
        Context().step("x", lambda: 1)


def ledger(store: Store, columns: str = "job uuid, amount int") -> str:
    """Create the test's ledger table in the job's schema: the writes a transaction step makes."""
    table = f'"{store.schema}".ledger'
    with store.session.pool.connection() as conn:  # type: ignore[union-attr]
        conn.execute(f"CREATE TABLE {table} ({columns})")
    return table


def test_ds2_transaction_step_commits_writes_and_record_together_or_not_at_all(
    store: Store, engines: Callable[..., Engine]
) -> None:
    table = ledger(store)
    runs = Counter[str]()

    def book(tx: Tx, job_id: str, amount: int) -> int:
        runs["book"] += 1
        tx.execute(f"INSERT INTO {table} VALUES (%(j)s, %(a)s)", {"j": job_id, "a": amount})
        if runs["book"] == 1:
            raise RuntimeError("fn fails after its write")  # neither its write nor its record stays
        return amount

    def handler(ctx: Context, claim: Claim) -> int:
        booked = ctx.transaction_step("book", book, claim.id, 5)
        runs["after"] += 1
        if runs["after"] == 1:
            raise RuntimeError("the handler fails after the step")  # the replay must not book again
        return booked

    e = engines()
    e.register_kind("book", handler, OPTS)
    jid = e.enqueue(Job("book")).id
    e.start()
    row = ended(store, jid)
    assert row.state is State.DONE and row.result == 5
    assert runs == {"book": 2, "after": 2}
    with store.session.pool.connection() as conn:  # type: ignore[union-attr]
        assert conn.execute(f"SELECT amount FROM {table} WHERE job = %s", (jid,)).fetchall() == [(5,)]
    assert [s.name for s in row.steps] == ["book"]
    assert row.attempts == 3


def test_ds2_a_record_is_fenced_on_the_claim_token(store: Store) -> None:
    """A stale attempt (its claim no longer the row's) records nothing, in or out of a transaction."""
    jid = store.enqueue(Job("fence")).id
    (claimed,) = store.worker.claim(["fence"], 1, "w", timedelta(seconds=30))
    stale = str(uuid.uuid4())
    assert not store.worker.step_record(jid, stale, 0, "a", "step", result='"x"').ours
    with store.session.begin() as tx:
        assert not store.worker.step_record(jid, stale, 0, "a", "step", result='"x"', tx=tx).ours
    write = store.worker.step_record(jid, claimed.claim_token, 0, "a", "step", result='"x"')
    assert write.ours and write.inserted and write.result == "x"
    again = store.worker.step_record(jid, claimed.claim_token, 0, "a", "step", result='"y"')
    assert again.ours and not again.inserted and again.result == "x"  # the first record stays
    assert store.cancel(jid)
    assert not store.worker.step_record(jid, claimed.claim_token, 1, "b", "step", result="1").ours
    assert step_rows(store, jid) == [(0, "a", "step")]


def test_ds2_a_canceled_attempt_records_no_step_and_calls_no_fn(
    store: Store, engines: Callable[..., Engine]
) -> None:
    started, go = threading.Event(), threading.Event()
    called: list[str] = []
    errors: list[BaseException] = []

    ctxs: list[Context] = []

    def handler(ctx: Context, claim: Claim) -> None:
        ctxs.append(ctx)
        started.set()
        go.wait(30)
        try:
            ctx.step("late", lambda: called.append("late"))
        except BaseException as exc:
            errors.append(exc)
            raise

    e = engines()
    e.register_kind("cancelled", handler, OPTS)
    jid = e.enqueue(Job("cancelled")).id
    e.start()
    assert started.wait(30)
    assert store.cancel(jid)
    wait_for(lambda: ctxs[0].done(), "the handler's context to be cancelled")
    go.set()
    wait_for(lambda: errors, "the step to raise")
    assert called == [] and step_rows(store, jid) == []
    assert ended(store, jid).state is State.CANCELED


def test_ds3_a_sleep_ends_the_attempt_without_spending_it_and_frees_the_slot(
    store: Store, engines: Callable[..., Engine]
) -> None:
    calls: Counter[str] = Counter()
    woke = threading.Event()

    def sleeper(ctx: Context, claim: Claim) -> str:
        calls["before"] += 1
        ctx.step("first", lambda: calls.update(["first"]))
        ctx.sleep(claim.payload)
        calls["after"] += 1
        return "awake"

    e = engines(workers=1)
    e.register_kind("sleeper", sleeper, OPTS)
    e.register_kind("other", lambda ctx, claim: woke.set(), OPTS)
    jid = e.enqueue(Job("sleeper", 1.5)).id
    e.start()
    row = in_state(store, jid, State.SCHEDULED)
    assert row.attempts == 0  # given back
    assert row.locked_by is None and row.waiting_for is None
    assert [(s.name, s.kind) for s in row.steps] == [("first", "step"), ("sleep", "sleep")]
    assert row.steps[1].until is not None and row.steps[1].until > row.steps[1].at
    # the one slot is free while it sleeps
    other = e.enqueue(Job("other")).id
    assert ended(store, other).state is State.DONE
    done = ended(store, jid)
    assert done.state is State.DONE and done.result == "awake"
    assert calls == {"before": 2, "first": 1, "after": 1}
    assert done.attempts == 1
    assert done.available_at >= row.steps[1].until - timedelta(seconds=0.01)


def test_ds3_sleep_until_a_past_time_passes_through_and_records_nothing(
    store: Store, engines: Callable[..., Engine]
) -> None:
    def handler(ctx: Context, claim: Claim) -> str:
        ctx.sleep_until(datetime.now(UTC) - timedelta(seconds=5))
        ctx.sleep(0)
        with pytest.raises(ValueError):
            ctx.sleep_until(datetime(2030, 1, 1))  # naive
        return "through"

    e = engines()
    e.register_kind("past", handler, OPTS)
    jid = e.enqueue(Job("past")).id
    e.start()
    assert ended(store, jid).result == "through"
    assert step_rows(store, jid) == []


def test_ds3_snooze_gives_the_attempt_back_and_records_nothing(
    store: Store, engines: Callable[..., Engine]
) -> None:
    runs = Counter[str]()

    def handler(ctx: Context, claim: Claim) -> int:
        runs["run"] += 1
        if runs["run"] < 3:
            raise Snooze(0.2)
        return runs["run"]

    e = engines()
    e.register_kind("snooze", handler, KindOptions(max_attempts=1))
    jid = e.enqueue(Job("snooze")).id
    e.start()
    row = ended(store, jid)
    assert row.state is State.DONE and row.result == 3
    assert row.attempts == 1 and row.errors == () and row.steps == ()
    with pytest.raises(ValueError):
        Snooze(-1)


def test_ds3_a_caught_sleep_still_ends_the_attempt(store: Store, engines: Callable[..., Engine]) -> None:
    """A handler that swallows the sleep's Snooze (``except Exception``) still sleeps."""
    after: list[str] = []

    def handler(ctx: Context, claim: Claim) -> str:
        try:
            ctx.sleep(60)
        except Exception:
            after.append("swallowed")
        try:
            ctx.step("next", lambda: "x")
        except Snooze:
            after.append("still snoozed")
        return "returned anyway"

    e = engines()
    e.register_kind("swallow", handler, OPTS)
    jid = e.enqueue(Job("swallow")).id
    e.start()
    row = in_state(store, jid, State.SCHEDULED)
    assert after == ["swallowed", "still snoozed"]
    assert row.result is None and [s.name for s in row.steps] == ["sleep"]


def test_ds3_a_late_outcome_of_an_older_claim_never_writes_a_sleep(store: Store) -> None:
    """A retry racing a late outcome: the scheduled outcome of a claim the row no longer has is refused."""
    jid = store.enqueue(Job("late")).id
    (first,) = store.worker.claim(["late"], 1, "w", timedelta(seconds=30))
    q(store.session.pool, store.schema, "UPDATE {job} SET state = 'pending' WHERE id = %s", jid)  # type: ignore[arg-type]
    (second,) = store.worker.claim(["late"], 1, "w", timedelta(seconds=30))
    assert second.claim_token != first.claim_token
    late = Outcome(jid, first.claim_token, State.SCHEDULED, timedelta(hours=1), give_back=True, topic="late")
    assert jid not in store.worker.settle_many([late])
    row = store.get(jid)
    assert row is not None and row.state is State.PROCESSING and row.attempts == 2
    waiting = Outcome(
        jid, second.claim_token, State.SCHEDULED, timedelta(hours=1), True, topic="late", waiting_for="go"
    )
    assert jid in store.worker.settle_many([waiting])
    row = store.get(jid)
    assert row is not None and row.state is State.SCHEDULED and row.waiting_for == "go"
    assert row.attempts == 1 and row.locked_by is None


def test_ds5_retention_keeps_a_sleeping_jobs_steps_and_removes_an_ended_jobs(store: Store) -> None:
    sleeping = store.enqueue(Job("keep")).id
    ended_id = store.enqueue(Job("keep")).id
    claims = {c.id: c for c in store.worker.claim(["keep"], 2, "w", timedelta(seconds=30))}
    for jid in (sleeping, ended_id):
        store.worker.step_record(jid, claims[jid].claim_token, 0, "s", "step", result="1")
        assert store.signal(jid, "go", {"n": 1})
    sleep = Outcome(sleeping, claims[sleeping].claim_token, State.SCHEDULED, timedelta(hours=1), True)
    done = Outcome(ended_id, claims[ended_id].claim_token, State.DONE)
    assert store.worker.settle_many([sleep, done]) == {sleeping, ended_id}
    q(store.session.pool, store.schema, "UPDATE {job} SET updated_at = now() - interval '2 days'")  # type: ignore[arg-type]
    deleted = store.worker.delete_terminal(timedelta(days=1), 100)
    assert [d[0] for d in deleted] == [ended_id]
    assert step_rows(store, ended_id) == [] and step_rows(store, sleeping) == [(0, "s", "step")]
    with store.session.pool.connection() as conn:  # type: ignore[union-attr]
        left = conn.execute(f'SELECT job_id::text FROM "{store.schema}".job_signal').fetchall()
    assert left == [(sleeping,)]
    row = store.get(sleeping)
    assert row is not None and row.state is State.SCHEDULED and [s.name for s in row.steps] == ["s"]
