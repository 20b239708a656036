"""SPEC U2 meets DS1-DS4: a unique key's holder in the middle of a durable run.

A step, sleep or wait a holder recorded was made from its payload: a ``replace`` leaves such a holder
as it was (its id answered, ``created=False``, as for a processing one), or its recorded steps would
replay for another payload and its wait's timeout would move with the new time. A ``merge`` changes
no payload and still applies (a holder woken early goes back to its sleep or wait).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store, WrapTx
from brooq_py.queue import Claim, Context, Job, SignalTimeout, State
from brooq_py.queue.port import Outcome
from tests.integration.conftest import q
from tests.integration.test_durable_steps import OPTS, ended
from tests.integration.test_unique_races import _row, _waiting_on_a_lock, _while_held
from tests.polling import wait_for


def _charging(charged: list[Any]) -> Callable[[Context, Claim], Any]:
    def handler(ctx: Context, claim: Claim) -> Any:
        got = ctx.step("charge", lambda: charged.append(claim.payload) or claim.payload)
        ctx.wait_for("go", 60)
        return {"payload": claim.payload, "charged": got}

    return handler


def _waiting(store: Store, job_id: str) -> Any:
    return wait_for(lambda: (r := store.get(job_id)) and r.waiting_for == "go" and r, "the wait")


@pytest.mark.parametrize("both_keys", [False, True])
def test_u2_replace_leaves_a_holder_that_recorded_a_step_and_waits(
    store: Store, engines: Callable[..., Engine], pool: ConnectionPool[Any], schema: str, both_keys: bool
) -> None:
    charged: list[Any] = []
    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("uqr", _charging(charged), OPTS)
    e.start()
    first = store.enqueue(Job("uqr", 1, unique_key="k", on_duplicate="replace")).id
    _waiting(store, first)
    again = Job("uqr", 2, unique_key="k", on_duplicate="replace", idempotency_key="i" if both_keys else None)
    r = store.enqueue(again)
    assert r == (first, False)
    row = _row(store, first)
    assert row.payload == 1 and row.waiting_for == "go"
    assert store.signal(first, "go")
    done = ended(store, first)
    assert done.state == State.DONE and done.result == {"payload": 1, "charged": 1}
    assert charged == [1]
    assert q(pool, schema, "SELECT count(*) FROM {job}") == [(1,)]  # the replacing job was not made


def test_u2_replace_with_a_later_time_does_not_move_a_waits_timeout(
    store: Store, engines: Callable[..., Engine]
) -> None:
    def handler(ctx: Context, claim: Claim) -> Any:
        try:
            ctx.wait_for("go", 1.0)
        except SignalTimeout:
            return "timed out"
        return "signalled"

    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("uqt", handler, OPTS)
    e.start()
    first = store.enqueue(Job("uqt", 1, unique_key="k", on_duplicate="replace")).id
    row = _waiting(store, first)
    timeout_at = row.steps[0].until
    later = datetime.now(UTC) + timedelta(minutes=5)
    r = store.enqueue(Job("uqt", 2, unique_key="k", on_duplicate="replace", available_at=later))
    assert r == (first, False)
    row = _row(store, first)
    assert row.available_at <= timeout_at + timedelta(seconds=1), (row.available_at, timeout_at)
    done = ended(store, first)
    assert done.result == "timed out" and done.payload == 1


def test_u2_enqueue_many_replace_leaves_a_durable_holder(
    store: Store, engines: Callable[..., Engine]
) -> None:
    charged: list[Any] = []
    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("uqm", _charging(charged), OPTS)
    e.start()
    first = store.enqueue(Job("uqm", 1, unique_key="k")).id
    _waiting(store, first)
    r = store.enqueue_many(
        [Job("uqm", 2, unique_key="k", on_duplicate="replace"), Job("uqm", 3, unique_key="j")]
    )
    assert r[0] == (first, False) and r[1].created
    assert _row(store, first).payload == 1


def test_u2_merge_still_applies_to_a_waiting_holder_whose_wait_goes_on(
    store: Store, engines: Callable[..., Engine]
) -> None:
    charged: list[Any] = []
    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("uqg", _charging(charged), OPTS)
    e.start()
    first = store.enqueue(Job("uqg", 1, unique_key="k", priority=1)).id
    _waiting(store, first)
    r = store.enqueue(Job("uqg", 2, unique_key="k", on_duplicate="merge", priority=7))
    assert r == (first, False)
    # the merge's time (now) is earlier than the wait's end: the job runs and waits again
    row = wait_for(lambda: (x := store.get(first)) and x.priority == 7 and x.waiting_for == "go" and x, "it")
    assert row.payload == 1
    assert store.signal(first, "go")
    done = ended(store, first)
    assert done.result == {"payload": 1, "charged": 1} and charged == [1]


# A claim that records a step and suspends after the replace's snapshot was taken: the replace's
# statement reads job_step in its snapshot (none yet), then meets the row the claim moved. The new
# claim token on that row says a run began during the statement: it is left as a processing one is.
CLAIM_STEP_SUSPEND = (
    "WITH u AS (UPDATE {job} SET state = 'scheduled', available_at = now() + interval '1 hour', "
    "attempts = attempts + 1, claim_token = gen_random_uuid(), locked_by = 'x' WHERE id = %s RETURNING id) "
    "INSERT INTO {job_step} (job_id, seq, name, kind, result) SELECT id, 0, 'charge', 'step', '1' FROM u"
)


@pytest.mark.parametrize("both_keys", [False, True])
def test_u2_replace_meeting_a_run_begun_during_its_statement_leaves_the_holder(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, both_keys: bool
) -> None:
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k", priority=1))
    job = Job(
        "u",
        {"v": 2},
        unique_key="k",
        priority=9,
        on_duplicate="replace",
        idempotency_key="i" if both_keys else None,
    )
    move = CLAIM_STEP_SUSPEND.replace("{job_step}", f'"{schema}".job_step')
    r = _while_held(pool, dsn, schema, move, a.id, lambda: store.enqueue(job))
    assert r == (a.id, False)
    row = _row(store, a.id)
    assert row.state == State.SCHEDULED and row.payload == {"v": 1} and row.priority == 1


def test_u2_replace_still_replaces_a_holder_that_ran_without_a_record(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """A holder back from a failed attempt (claimed before, no step recorded) is replaced as ever."""
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k"))
    q(
        pool,
        schema,
        "UPDATE {job} SET state = 'failed', attempts = 1, claim_token = gen_random_uuid(), "
        "available_at = now() + interval '1 hour' WHERE id = %s",
        a.id,
    )
    r = store.enqueue(Job("u", {"v": 2}, unique_key="k", on_duplicate="replace"))
    assert r == (a.id, False)
    row = _row(store, a.id)
    assert row.payload == {"v": 2} and row.state == State.PENDING


def _with_a_step(pool: ConnectionPool[Any], schema: str, job_id: str) -> None:
    """The holder recorded a step and is back in the queue (as after a crash, a sleep or a wait)."""
    q(
        pool,
        schema,
        f"INSERT INTO \"{schema}\".job_step (job_id, seq, name, kind, result) VALUES (%s, 0, 'charge', 'step', '1')",
        job_id,
    )


@pytest.mark.parametrize("both_keys", [False, True])
def test_u2_a_replace_in_repeatable_read_is_never_answered_by_a_durable_holder_that_ended_since(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, both_keys: bool
) -> None:
    """The caller's snapshot saw the holder active with its record; the holder ended since. The
    replace creates the job, or raises the serialization failure docs/unique-jobs.md documents:
    never created=False for a job that ended (nothing would hold the key: the enqueue lost)."""
    holder = store.enqueue(Job("rr", {"v": 1}, unique_key="k")).id
    _with_a_step(pool, schema, holder)
    key = "i" if both_keys else None
    with psycopg.connect(dsn) as caller:
        caller.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        caller.execute("SELECT 1")  # the snapshot: the holder active, with its step
        (c,) = store.worker.claim(["rr"], 1, "w", timedelta(seconds=30))
        store.worker.settle_many([Outcome(c.id, c.claim_token, State.DONE)])
        try:
            r = store.enqueue_tx(
                WrapTx(caller),
                Job("rr", {"v": 2}, unique_key="k", on_duplicate="replace", idempotency_key=key),
            )
        except psycopg.errors.SerializationFailure:
            return
        caller.commit()
    assert r.created and r.id != holder
    assert q(pool, schema, "SELECT payload FROM {job} WHERE state = 'pending'") == [({"v": 2},)]


def test_u2_a_replace_in_repeatable_read_leaves_a_durable_holder_as_it_was(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    holder = store.enqueue(Job("rr", {"v": 1}, unique_key="k")).id
    _with_a_step(pool, schema, holder)
    with psycopg.connect(dsn) as caller:
        caller.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        caller.execute("SELECT 1")
        r = store.enqueue_tx(WrapTx(caller), Job("rr", {"v": 2}, unique_key="k", on_duplicate="replace"))
        caller.commit()
    assert r == (holder, False)
    assert _row(store, holder).payload == {"v": 1}


def test_u2_two_callers_replacing_a_durable_holder_twice_each_wait_and_never_deadlock(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """Each caller replaces the key twice in its transaction: first with an idempotency key too
    (job_unique_update, which locks the durable holder it answers), then without
    (job_enqueue_unique_update, whose ON CONFLICT locks the row it meets). The first lock is as
    strong as the second: the later caller waits for the earlier's commit (a share lock, upgraded
    by each, made the two deadlock, and one caller's transaction was aborted)."""
    holder = store.enqueue(Job("d", {"v": 1}, unique_key="k")).id
    _with_a_step(pool, schema, holder)
    out: dict[str, Any] = {}

    def caller(name: str, started: threading.Event, go: threading.Event) -> None:
        with psycopg.connect(dsn) as conn:
            try:
                first = store.enqueue_tx(
                    WrapTx(conn),
                    Job("d", {"v": name}, unique_key="k", on_duplicate="replace", idempotency_key=name),
                )
                started.set()
                assert go.wait(30)
                second = store.enqueue_tx(
                    WrapTx(conn), Job("d", {"v": name + "2"}, unique_key="k", on_duplicate="replace")
                )
                conn.commit()
                out[name] = (first, second)
            except psycopg.Error as exc:
                out[name] = exc
            finally:
                started.set()

    events = {n: (threading.Event(), threading.Event()) for n in ("a", "b")}
    threads = {n: threading.Thread(target=caller, args=(n, *events[n])) for n in ("a", "b")}
    threads["a"].start()
    assert events["a"][0].wait(30)  # a holds the holder's lock
    threads["b"].start()
    wait_for(lambda: _waiting_on_a_lock(pool), "b to wait for a")
    events["b"][1].set()
    events["a"][1].set()  # a's second replace, then its commit: b goes on
    for t in threads.values():
        t.join(30)
    assert out == {"a": ((holder, False), (holder, False)), "b": ((holder, False), (holder, False))}, out
    assert _row(store, holder).payload == {"v": 1}
