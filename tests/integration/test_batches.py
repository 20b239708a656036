"""Batch delivery (SPEC BD1), ``KindOptions.dead_on`` and tasks whose payload does not bind."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, ConfigError, Context, Job, KindOptions, State
from brooq_py.tasks import Tasks
from tests.polling import wait_for


class Calls:
    """The sizes of each batch call and the ids in it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: list[list[str]] = []

    def add(self, claims: Sequence[Claim]) -> None:
        with self.lock:
            self.batches.append([c.id for c in claims])


def rows(store: Store, ids: Sequence[str]) -> dict[str, Any]:
    return {i: store.get(i) for i in ids}


def all_in(store: Store, ids: Sequence[str], state: State) -> Callable[[], bool]:
    return lambda: all((r := store.get(i)) is not None and r.state is state for i in ids)


def test_bd1_a_batch_handler_gets_many_claims_and_each_result_is_stored_with_its_job(
    store: Store, engines: Callable[..., Engine]
) -> None:
    calls = Calls()

    def double(ctx: Context, claims: list[Claim]) -> list[Any]:
        calls.add(claims)
        return [c.payload * 2 for c in claims]

    e = engines(workers=10, poll_interval=0.05)
    e.register_batch("b.double", double, KindOptions(batch_size=8))
    ids = [r.id for r in store.enqueue_many([Job("b.double", i) for i in range(30)])]
    e.start()
    wait_for(all_in(store, ids, State.DONE), "every job of the batches")
    for i, job_id in enumerate(ids):
        row = store.get(job_id)
        assert row is not None and row.result == i * 2 and row.attempts == 1
    assert sorted(j for b in calls.batches for j in b) == sorted(ids)  # each job in exactly one call
    assert max(len(b) for b in calls.batches) == 8  # the backlog came in full batches
    assert all(len(b) <= 8 for b in calls.batches)


def test_bd1_an_exception_in_the_list_fails_that_job_only_and_it_is_retried(
    store: Store, engines: Callable[..., Engine]
) -> None:
    calls = Calls()

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        calls.add(claims)
        return [
            ValueError(f"item {c.payload} is bad") if c.payload == 3 and c.attempt == 1 else c.payload
            for c in claims
        ]

    e = engines(workers=10, poll_interval=0.05)
    e.register_batch("b.one", handler, KindOptions(batch_size=10, max_attempts=3))
    ids = [r.id for r in store.enqueue_many([Job("b.one", i) for i in range(6)])]
    e.start()
    wait_for(all_in(store, ids, State.DONE), "every job")
    got = rows(store, ids)
    assert [got[i].attempts for i in ids] == [1, 1, 1, 2, 1, 1]
    assert got[ids[3]].errors[0].error == "ValueError: item 3 is bad"
    assert [got[i].result for i in ids] == list(range(6))


def test_bd1_a_handler_that_raises_fails_every_job_of_the_batch(
    store: Store, engines: Callable[..., Engine]
) -> None:
    first = threading.Event()

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        if not first.is_set():
            first.set()
            raise RuntimeError("the whole batch failed")
        return [None] * len(claims)

    e = engines(workers=10, poll_interval=0.05)
    e.register_batch("b.raise", handler, KindOptions(batch_size=10, max_attempts=3))
    ids = [r.id for r in store.enqueue_many([Job("b.raise", i) for i in range(5)])]
    e.start()
    wait_for(all_in(store, ids, State.DONE), "every job, on its second attempt")
    got = rows(store, ids)
    assert all(got[i].attempts == 2 for i in ids)
    assert all(got[i].errors[0].error == "RuntimeError: the whole batch failed" for i in ids)


@pytest.mark.parametrize("answer", ["short", "not_a_list"])
def test_bd1_a_wrong_answer_is_an_error_for_every_job(
    store: Store, engines: Callable[..., Engine], answer: str
) -> None:
    def handler(ctx: Context, claims: list[Claim]) -> Any:
        return [1] if answer == "short" else {"a": 1}

    e = engines(workers=10, poll_interval=0.05)
    e.register_batch("b.wrong", handler, KindOptions(batch_size=10, max_attempts=1))
    ids = [r.id for r in store.enqueue_many([Job("b.wrong", i) for i in range(4)])]
    e.start()
    wait_for(all_in(store, ids, State.DEAD), "every job dead")
    for row in rows(store, ids).values():
        assert row.last_error.startswith("BatchAnswerMismatch: ")
        assert ("results for" in row.last_error) == (answer == "short")


def test_bd1_an_async_batch_handler(store: Store, engines: Callable[..., Engine]) -> None:
    calls = Calls()

    async def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        calls.add(claims)
        await asyncio.sleep(0.01)
        return [RuntimeError("odd") if c.payload % 2 else c.payload + 100 for c in claims]

    e = engines(workers=10, poll_interval=0.05)
    e.register_batch("b.async", handler, KindOptions(batch_size=10, max_attempts=1))
    ids = [r.id for r in store.enqueue_many([Job("b.async", i) for i in range(8)])]
    e.start()
    wait_for(
        lambda: all((r := store.get(i)) is not None and r.state in (State.DONE, State.DEAD) for i in ids),
        "all",
    )
    got = rows(store, ids)
    assert [got[i].state for i in ids] == [State.DONE, State.DEAD] * 4
    assert [got[i].result for i in ids[::2]] == [100, 102, 104, 106]
    assert max(len(b) for b in calls.batches) > 1


def test_bd1_batch_task_takes_items_and_returns_results_in_order(
    store: Store, engines: Callable[..., Engine]
) -> None:
    tasks = Tasks(store)
    seen: list[list[int]] = []

    @tasks.batch_task("b.typed", batch_size=4, max_attempts=1)
    def square(items: list[int]) -> list[int | BaseException]:
        seen.append(items)
        return [ValueError("negative") if i < 0 else i * i for i in items]

    @tasks.batch_task("b.typed_ctx", batch_size=4)
    async def with_ctx(ctx: Context, items: list[str]) -> list[str]:
        return [s.upper() for s in items]

    assert square([2, 3]) == [4, 9]  # callable here, as a function
    e = engines(workers=4, poll_interval=0.05)
    e.register_tasks(tasks)
    ids = [r.id for r in store.enqueue_many([square.job(i) for i in (1, 2, -3, 4, 5)])]
    other = with_ctx.enqueue("x").id
    e.start()
    wait_for(
        lambda: all(
            (r := store.get(i)) is not None and r.state in (State.DONE, State.DEAD) for i in [*ids, other]
        ),
        "all",
    )
    got = rows(store, ids)
    assert [got[i].result for i in ids] == [1, 4, None, 16, 25]
    assert got[ids[2]].state is State.DEAD and got[ids[2]].last_error == "ValueError: negative"
    assert all(len(s) <= 4 for s in seen)
    other_row = store.get(other)
    assert other_row is not None and other_row.result == "X"


def test_bd1_batch_wait_gives_a_lone_job_its_call_after_the_wait(
    store: Store, engines: Callable[..., Engine]
) -> None:
    calls = Calls()

    def handler(ctx: Context, claims: list[Claim]) -> list[None]:
        calls.add(claims)
        return [None] * len(claims)

    e = engines(workers=20, poll_interval=0.05)
    e.register_batch("b.wait", handler, KindOptions(batch_size=20, batch_wait=0.3))
    e.start()
    lone = store.enqueue(Job("b.wait")).id
    wait_for(all_in(store, [lone], State.DONE), "the lone job, after the wait")
    assert calls.batches == [[lone]]


def test_bd1_cancel_of_one_job_of_a_running_batch(store: Store, engines: Callable[..., Engine]) -> None:
    started = threading.Event()
    release = threading.Event()

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        started.set()
        assert release.wait(30)
        return [c.payload for c in claims]

    e = engines(workers=10, poll_interval=0.05)
    e.register_batch("b.cancel", handler, KindOptions(batch_size=10))
    ids = [r.id for r in store.enqueue_many([Job("b.cancel", i) for i in range(5)])]
    e.start()
    assert started.wait(30)
    wait_for(all_in(store, ids, State.PROCESSING), "the batch running")
    assert store.cancel(ids[2])
    release.set()
    others = [i for i in ids if i != ids[2]]
    wait_for(all_in(store, others, State.DONE), "the rest of the batch")
    row = store.get(ids[2])
    assert row is not None and row.state is State.CANCELED and row.result is None
    assert [store.get(i).result for i in others] == [0, 1, 3, 4]  # type: ignore[union-attr]


def test_bd1_one_statement_settles_a_batch_and_renewal_is_per_engine(
    store: Store, engines: Callable[..., Engine], dsn: str
) -> None:
    """The outcomes of one call reach the completer together: one settle_many carries them all. The
    heartbeat renews the engine's row, not the jobs': the jobs' rows are not rewritten while the batch
    runs (their xmin stays)."""
    writes: list[int] = []
    real = store.worker.settle_many

    def counting(outcomes: Any) -> Any:
        writes.append(len(outcomes))
        return real(outcomes)

    store.worker.settle_many = counting  # type: ignore[method-assign]
    release = threading.Event()

    def handler(ctx: Context, claims: list[Claim]) -> list[None]:
        assert release.wait(30)
        return [None] * len(claims)

    e = engines(workers=25, poll_interval=0.05, lease=1.5)
    e.register_batch("b.one_write", handler, KindOptions(batch_size=25))
    ids = [r.id for r in store.enqueue_many([Job("b.one_write", i) for i in range(25)])]
    e.start()
    wait_for(all_in(store, ids, State.PROCESSING), "the batch claimed")
    table = sql.Identifier(store.schema, "job")
    query = sql.SQL("SELECT id::text, xmin::text FROM {} WHERE id = ANY(%s::uuid[])").format(table)
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = dict(conn.execute(query, (ids,)).fetchall())
        engine_beat = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(store.schema, "engine"))
        assert conn.execute(engine_beat).fetchone() == (1,)
        threading.Event().wait(2.0)  # more than a lease: several heartbeats
        after = dict(conn.execute(query, (ids,)).fetchall())
    assert before == after  # not one job row rewritten by the renewals
    release.set()
    wait_for(all_in(store, ids, State.DONE), "the batch done")
    assert 25 in writes, writes


def test_bd1_register_batch_checks_its_options(store: Store, engines: Callable[..., Engine]) -> None:
    e = engines()
    with pytest.raises(ConfigError, match="batch_size"):
        e.register_kind("b.plain", lambda ctx, claim: None, KindOptions(batch_size=5))
    with pytest.raises(ConfigError, match="batch_size"):
        KindOptions(batch_size=0)
    with pytest.raises(ConfigError, match="batch_wait"):
        KindOptions(batch_wait=-1)
    e.register_batch("b.default", lambda ctx, claims: [None] * len(claims))
    e.start()
    assert e._kinds["b.default"].options.batch_size == e.config.workers


def test_dead_on_ends_the_job_dead_at_its_first_failure(store: Store, engines: Callable[..., Engine]) -> None:
    class Fatal(Exception):
        pass

    def handler(ctx: Context, claim: Claim) -> None:
        if claim.payload == "fatal":
            raise Fatal("no use retrying")
        if claim.attempt == 1:
            raise RuntimeError("transient")

    e = engines(poll_interval=0.05)
    e.register_kind("d.kind", handler, KindOptions(max_attempts=5, dead_on=(Fatal, KeyError)))
    fatal = store.enqueue(Job("d.kind", "fatal")).id
    transient = store.enqueue(Job("d.kind", "other")).id
    e.start()
    wait_for(all_in(store, [fatal], State.DEAD), "the fatal job dead")
    wait_for(all_in(store, [transient], State.DONE), "the other retried")
    row = store.get(fatal)
    assert row is not None and row.attempts == 1 and row.last_error.endswith("Fatal: no use retrying")
    with pytest.raises(ConfigError, match="dead_on"):
        KindOptions(dead_on=("ValueError",))  # type: ignore[arg-type]


def test_a_task_payload_that_does_not_bind_ends_dead_at_once(
    store: Store, engines: Callable[..., Engine], dsn: str
) -> None:
    tasks = Tasks(store)

    @tasks.task("d.typed", max_attempts=5)
    def add(a: int, b: int = 0) -> int:
        return a + b

    @tasks.task("d.raises_type_error", max_attempts=2)
    def inner(x: int) -> int:
        raise TypeError("a TypeError of the function's own is retried")

    e = engines(poll_interval=0.05)
    e.register_tasks(tasks)
    table = sql.Identifier(store.schema, "job")
    with psycopg.connect(dsn, autocommit=True) as conn:  # as psql or the CLI would write them
        ids = [
            str(r[0])
            for r in (
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (topic, payload) VALUES ('d.typed', %s::jsonb) RETURNING id"
                    ).format(table),
                    (payload,),
                ).fetchone()
                for payload in ('{"b": 1}', '{"a": 1, "c": 2}', "[1, 2]")
            )
            if r is not None
        ]
    good = add.enqueue(2, b=3).id
    own = inner.enqueue(1).id
    e.start()
    wait_for(all_in(store, ids, State.DEAD), "the unbindable jobs dead")
    wait_for(all_in(store, [good], State.DONE), "the good one")
    wait_for(all_in(store, [own], State.DEAD), "the function's own TypeError, retried")
    got = rows(store, ids)
    assert all(got[i].attempts == 1 for i in ids)
    assert "missing a required argument: 'a'" in got[ids[0]].last_error
    assert "unexpected keyword argument 'c'" in got[ids[1]].last_error
    assert "must be a JSON object" in got[ids[2]].last_error
    own_row = store.get(own)
    assert own_row is not None and own_row.attempts == 2


def test_bd1_two_engines_run_each_job_of_a_batch_topic_once(
    store: Store, engines: Callable[..., Engine], pool: Any
) -> None:
    calls = Calls()

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        calls.add(claims)
        return [c.payload for c in claims]

    made = [
        engines(workers=16, poll_interval=0.02),
        engines(Store(pool, schema=store.schema), workers=16, poll_interval=0.02),
    ]
    for e in made:
        e.register_batch("b.two", handler, KindOptions(batch_size=16, batch_wait=0.05))
    ids = [r.id for r in store.enqueue_many([Job("b.two", i) for i in range(300)])]
    for e in made:
        e.start()
    wait_for(all_in(store, ids, State.DONE), "every job", timeout=60)
    ran = [j for b in calls.batches for j in b]
    assert sorted(ran) == sorted(ids)  # each exactly once, over both engines
    got = rows(store, ids)
    assert all(got[i].attempts == 1 and got[i].result == n for n, i in enumerate(ids))


def test_bd1_a_stop_starts_a_batch_still_waiting_for_more_claims(
    store: Store, engines: Callable[..., Engine]
) -> None:
    calls = Calls()

    def handler(ctx: Context, claims: list[Claim]) -> list[None]:
        calls.add(claims)
        return [None] * len(claims)

    e = engines(workers=10, poll_interval=0.05)
    e.register_batch("b.stop", handler, KindOptions(batch_size=10, batch_wait=300))
    job_id = store.enqueue(Job("b.stop")).id
    e.start()
    # Claimed, and in the batcher (a claim still on its way when the stop begins is handed back).
    wait_for(lambda: e.runner.batcher.waiting("b.stop") == 1, "the job claimed, its batch waiting")
    e.stop(timeout=5)
    row = store.get(job_id)
    assert row is not None and row.state is State.DONE and calls.batches == [[job_id]]


def test_bd1_run_once_and_the_testing_kit_call_a_batch_handler_with_a_list(
    store: Store, engines: Callable[..., Engine]
) -> None:
    from brooq_py.testing import drain

    calls = Calls()

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        calls.add(claims)
        return [c.payload + 1 for c in claims]

    e = engines(workers=8)
    e.register_batch("b.once", handler, KindOptions(batch_size=3))
    ids = [r.id for r in store.enqueue_many([Job("b.once", i) for i in range(7)])]
    assert e.run_once() == 7
    assert [len(b) for b in calls.batches] == [3, 3, 1]
    assert [store.get(i).result for i in ids] == list(range(1, 8))  # type: ignore[union-attr]
    more = store.enqueue(Job("b.once", 10)).id
    drain(e)
    assert store.get(more).result == 11  # type: ignore[union-attr]
