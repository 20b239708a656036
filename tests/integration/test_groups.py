"""Groups: named parents, ``finally_`` and ``parent_states`` (SPEC BD2, BD3)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store
from brooq_py.queue import Claim, Context, InvalidJob, Job, KindOptions, State
from tests.polling import wait_for


class Seen:
    """What each fan-in saw of its parents when it ran."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, int] = {}

    def handler(self, ctx: Context, claim: Claim) -> None:
        seen = {
            "id": claim.parent_results(),
            "name": claim.parent_results(by="name"),
            "order": claim.parent_results(by="order"),
            "states": claim.parent_states(),
        }
        with self.lock:
            self.by[claim.id] = seen
            self.runs[claim.id] = self.runs.get(claim.id, 0) + 1


def state_of(store: Store, job_id: str) -> State | None:
    row = store.get(job_id)
    return None if row is None else row.state


def ends(store: Store, job_id: str, state: State) -> Callable[[], bool]:
    return lambda: state_of(store, job_id) is state


def echo(ctx: Context, claim: Claim) -> Any:
    if claim.payload == "fail":
        raise RuntimeError("this parent fails")
    return claim.payload


def test_bd3_named_parents_give_results_by_name_order_and_id(
    store: Store, engines: Callable[..., Engine]
) -> None:
    seen = Seen()
    e = engines(poll_interval=0.05)
    e.register_kind("g.step", echo)
    e.register_kind("g.join", seen.handler)
    e.start()
    group = store.enqueue_group(
        {"fetch": Job("g.step", {"n": 1}), "parse": Job("g.step", [2]), "store": Job("g.step", "three")},
        then=Job("g.join"),
    )
    assert group.then_id is not None and group.finally_id is None
    wait_for(ends(store, group.then_id, State.DONE), "the join")
    got = seen.by[group.then_id]
    assert got["name"] == {"fetch": {"n": 1}, "parse": [2], "store": "three"}
    assert got["order"] == [{"n": 1}, [2], "three"]
    assert got["id"] == dict(zip(group.ids, [{"n": 1}, [2], "three"], strict=True))
    assert got["states"] == dict.fromkeys(group.ids, State.DONE)
    row = store.get(group.then_id)
    assert row is not None and list(row.parents) == group.ids  # group order is the row's order


def test_bd3_a_then_with_parents_of_its_own_keys_those_by_id_and_lists_them_first(
    store: Store, engines: Callable[..., Engine]
) -> None:
    seen = Seen()
    e = engines(poll_interval=0.05)
    e.register_kind("g.step", echo)
    e.register_kind("g.join", seen.handler)
    own = store.enqueue(Job("g.step", "own")).id
    group = store.enqueue_group(
        {"b": Job("g.step", "B"), "a": Job("g.step", "A")}, then=Job("g.join", after=[own])
    )
    e.start()
    assert group.then_id is not None
    wait_for(ends(store, group.then_id, State.DONE), "the join")
    got = seen.by[group.then_id]
    assert got["name"] == {own: "own", "b": "B", "a": "A"}
    assert got["order"] == ["own", "B", "A"]  # its own after first, then the group in the mapping's order


def test_bd3_a_list_group_and_an_older_producers_row_key_by_id(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """Rows without names (a list group, a plain Job.after, a producer that predates the column):
    by="name" keys every parent by its id, by="order" still follows the parents array."""
    seen = Seen()
    e = engines(poll_interval=0.05)
    e.register_kind("g.step", echo)
    e.register_kind("g.join", seen.handler)
    group = store.enqueue_group([Job("g.step", 1), Job("g.step", 2)], then=Job("g.join"))
    plain = store.enqueue(Job("g.join", after=group.ids)).id
    e.start()
    assert group.then_id is not None
    wait_for(
        lambda: state_of(store, plain) is State.DONE and state_of(store, str(group.then_id)) is State.DONE,
        "joins",
    )
    for job_id in (group.then_id, plain):
        assert seen.by[job_id]["name"] == dict(zip(group.ids, [1, 2], strict=True))
        assert seen.by[job_id]["order"] == [1, 2]


def test_bd3_named_results_after_a_parent_that_was_retried(
    store: Store, engines: Callable[..., Engine]
) -> None:
    seen = Seen()
    tries: dict[str, int] = {}

    def flaky(ctx: Context, claim: Claim) -> Any:
        tries[claim.id] = tries.get(claim.id, 0) + 1
        if tries[claim.id] < 3:
            raise RuntimeError("not yet")
        return {"try": tries[claim.id]}

    e = engines(poll_interval=0.05)
    e.register_kind("g.flaky", flaky, KindOptions(max_attempts=5, backoff_base=0.01, backoff_max=0.02))
    e.register_kind("g.step", echo)
    e.register_kind("g.join", seen.handler)
    e.start()
    group = store.enqueue_group({"flaky": Job("g.flaky"), "steady": Job("g.step", "s")}, then=Job("g.join"))
    assert group.then_id is not None
    wait_for(ends(store, group.then_id, State.DONE), "the join")
    assert seen.by[group.then_id]["name"] == {"flaky": {"try": 3}, "steady": "s"}


def test_bd3_an_operator_retry_of_a_dead_parent_then_of_its_canceled_then(
    store: Store, engines: Callable[..., Engine], dsn: str
) -> None:
    """A dead parent cancels its then; the then runs again only once its parents are done (the retry
    refuses it before), and then finds the retried parent's result under its name."""
    seen = Seen()
    e = engines(poll_interval=0.05)
    e.register_kind("g.step", echo, KindOptions(max_attempts=1))
    e.register_kind("g.join", seen.handler)
    e.start()
    group = store.enqueue_group(
        {"bad": Job("g.step", "fail"), "good": Job("g.step", "G")}, then=Job("g.join")
    )
    assert group.then_id is not None
    wait_for(ends(store, group.then_id, State.CANCELED), "the then canceled by the dead parent")
    bad = group.ids[0]
    assert not store.retry(group.then_id)  # its parent is dead: refused
    with psycopg.connect(dsn) as conn:  # the parent succeeds on its second run
        conn.execute(
            sql.SQL("UPDATE {} SET payload = '\"B\"' WHERE id = %s").format(
                sql.Identifier(store.schema, "job")
            ),
            (bad,),
        )
    assert store.retry(bad)
    wait_for(ends(store, bad, State.DONE), "the retried parent")
    assert store.retry(group.then_id)
    wait_for(ends(store, group.then_id, State.DONE), "the retried then")
    assert seen.by[group.then_id]["name"] == {"bad": "B", "good": "G"}


def test_bd2_finally_runs_after_a_dead_parent_and_sees_each_state(
    store: Store, engines: Callable[..., Engine]
) -> None:
    seen = Seen()
    e = engines(poll_interval=0.05)
    e.register_kind("g.step", echo, KindOptions(max_attempts=1))
    e.register_kind("g.join", seen.handler)
    e.start()
    group = store.enqueue_group(
        {"ok": Job("g.step", "fine"), "bad": Job("g.step", "fail")},
        then=Job("g.join", "then"),
        finally_=Job("g.join", "finally"),
    )
    assert group.then_id is not None and group.finally_id is not None
    wait_for(ends(store, group.finally_id, State.DONE), "the finally")
    assert state_of(store, group.then_id) is State.CANCELED  # a failure cancels the then, not the finally
    got = seen.by[group.finally_id]
    ok, bad = group.ids
    assert got["states"] == {ok: State.DONE, bad: State.DEAD}
    assert got["name"] == {"ok": "fine", "bad": None}
    assert seen.runs == {group.finally_id: 1}
    row = store.get(group.finally_id)
    assert row is not None and row.attempts == 1 and row.last_error is None


def test_bd2_finally_waits_for_every_end_and_a_cancel_counts_as_one(
    store: Store, engines: Callable[..., Engine], dsn: str
) -> None:
    """An operator's cancel of a group job (blocked behind a dead parent of its own, or pending) is an
    end: the finally runs once the last job ended, never before."""
    seen = Seen()
    release = threading.Event()

    def slow(ctx: Context, claim: Claim) -> str:
        assert release.wait(30)
        return "slow"

    e = engines(poll_interval=0.05)
    e.register_kind("g.slow", slow)
    e.register_kind("g.join", seen.handler)
    dead = store.enqueue(Job("g.nobody")).id
    with psycopg.connect(dsn) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET state = 'dead' WHERE id = %s").format(sql.Identifier(store.schema, "job")),
            (dead,),
        )
    group = store.enqueue_group(
        {"orphan": Job("g.slow", after=[dead]), "slow": Job("g.slow"), "idle": Job("g.idle")},
        finally_=Job("g.join"),
    )
    orphan, slow_id, idle = group.ids
    assert group.then_id is None and group.finally_id is not None
    assert state_of(store, orphan) is State.CANCELED  # canceled at birth by its dead parent
    e.start()
    wait_for(ends(store, slow_id, State.PROCESSING), "the slow job running")
    assert store.cancel(idle)
    assert state_of(store, group.finally_id) is State.BLOCKED  # the slow one has not ended yet
    release.set()
    wait_for(ends(store, group.finally_id, State.DONE), "the finally")
    assert seen.by[group.finally_id]["states"] == {
        orphan: State.CANCELED,
        slow_id: State.DONE,
        idle: State.CANCELED,
    }


def test_bd2_a_finally_whose_row_is_held_when_a_parent_dies_is_released_by_the_sweep(
    store: Store, engines: Callable[..., Engine], dsn: str
) -> None:
    """The parent's end cannot touch a child locked elsewhere (an operator's lock): the stager's sweep
    applies it later, and for a finally it releases, never cancels."""
    seen = Seen()
    e = engines(poll_interval=0.05)
    e.register_kind("g.step", echo, KindOptions(max_attempts=1))
    e.register_kind("g.join", seen.handler)
    group = store.enqueue_group([Job("g.step", "fail")], finally_=Job("g.join"))
    assert group.finally_id is not None
    table = sql.Identifier(store.schema, "job")
    with psycopg.connect(dsn) as holder:
        holder.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(table), (group.finally_id,)
        )
        e.start()
        wait_for(ends(store, group.ids[0], State.DEAD), "the parent dead")
        assert state_of(store, group.finally_id) is State.BLOCKED
        holder.rollback()
    wait_for(ends(store, group.finally_id, State.DONE), "the finally, released by the sweep")
    assert seen.by[group.finally_id]["states"] == {group.ids[0]: State.DEAD}


def test_bd2_a_dead_finally_can_be_retried_though_its_parents_failed(
    store: Store, engines: Callable[..., Engine]
) -> None:
    runs: list[str] = []

    def cleanup(ctx: Context, claim: Claim) -> None:
        runs.append(claim.id)
        if len(runs) == 1:
            raise RuntimeError("cleanup failed once")

    e = engines(poll_interval=0.05)
    e.register_kind("g.step", echo, KindOptions(max_attempts=1))
    e.register_kind("g.clean", cleanup, KindOptions(max_attempts=1))
    e.start()
    group = store.enqueue_group([Job("g.step", "fail")], finally_=Job("g.clean"))
    assert group.finally_id is not None
    wait_for(ends(store, group.finally_id, State.DEAD), "the finally dead")
    assert store.retry(group.finally_id)  # its parent is dead, yet ended: the finally may run again
    wait_for(ends(store, group.finally_id, State.DONE), "the retried finally")


def test_bd2_two_engines_run_a_wide_finally_exactly_once(
    store: Store, engines: Callable[..., Engine], pool: Any
) -> None:
    seen = Seen()
    second = Store(pool, schema=store.schema)
    made = [engines(poll_interval=0.02), engines(repo=second, poll_interval=0.02)]
    for e in made:
        e.register_kind("g.step", echo, KindOptions(max_attempts=1))
        e.register_kind("g.join", seen.handler)
    payloads = ["fail" if i % 7 == 0 else i for i in range(120)]
    group = store.enqueue_group(
        {f"p{i}": Job("g.step", p) for i, p in enumerate(payloads)},
        then=Job("g.join", "then"),
        finally_=Job("g.join", "finally"),
    )
    for e in made:
        e.start()
    assert group.finally_id is not None and group.then_id is not None
    wait_for(ends(store, group.finally_id, State.DONE), "the finally", timeout=60)
    assert seen.runs == {group.finally_id: 1}
    states = seen.by[group.finally_id]["states"]
    assert len(states) == 120
    assert sum(s is State.DEAD for s in states.values()) == sum(p == "fail" for p in payloads)
    assert state_of(store, group.then_id) is State.CANCELED


def test_bd2_bd3_bad_input_writes_nothing_and_leaves_the_transaction_usable(store: Store) -> None:
    with store.begin() as tx:
        kept = store.enqueue_tx(tx, Job("g.kept")).id
        with pytest.raises(InvalidJob, match="name"):
            store.enqueue_group({"": Job("g.a")}, then=Job("g.b"), tx=tx)
        with pytest.raises(InvalidJob, match="finally_"):
            store.enqueue_group({"a": Job("g.a")}, finally_="nope", tx=tx)  # type: ignore[arg-type]
        with pytest.raises(InvalidJob, match="finally_"):
            store.enqueue_group([Job("g.a")], finally_=Job("g.b", unique_key="u"), tx=tx)
        with pytest.raises(InvalidJob):
            store.enqueue_group("abc", tx=tx)  # type: ignore[arg-type]
        last = store.enqueue_tx(tx, Job("g.kept")).id  # still usable
    assert state_of(store, kept) is State.PENDING and state_of(store, last) is State.PENDING
    assert [r.topic for r in store.list_jobs(limit=10)] == ["g.kept", "g.kept"]


def test_bd2_finally_alone_without_then_and_an_empty_group(store: Store) -> None:
    empty = store.enqueue_group({}, finally_=Job("g.join"))
    assert empty.ids == [] and empty.then_id is None and empty.finally_id is not None
    assert state_of(store, empty.finally_id) is State.PENDING  # nothing to wait for


def test_s1_the_psql_insert_still_enqueues_after_0020(store: Store, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {} (topic, payload) VALUES ('g.psql', '{{}}')").format(
                sql.Identifier(store.schema, "job")
            )
        )
    (row,) = store.list_jobs(topic="g.psql")
    assert row.state is State.PENDING


def test_bd2_bd3_asyncstore_enqueues_a_named_group_with_a_finally(
    dsn: str, schema: str, store: Store, engines: Callable[..., Engine]
) -> None:
    seen = Seen()

    async def enqueue() -> Any:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await pool.open()
        try:
            astore = AsyncStore(pool, schema=schema)
            async with astore.begin() as tx:
                return await astore.enqueue_group(
                    {"x": Job("g.step", "X"), "y": Job("g.step", "fail")},
                    then=Job("g.join"),
                    tx=tx,
                    finally_=Job("g.join"),
                )
        finally:
            await pool.close()

    group = asyncio.run(enqueue())
    e = engines(poll_interval=0.05)
    e.register_kind("g.step", echo, KindOptions(max_attempts=1))
    e.register_kind("g.join", seen.handler)
    e.start()
    wait_for(ends(store, group.finally_id, State.DONE), "the finally")
    assert state_of(store, group.then_id) is State.CANCELED
    x, y = group.ids
    assert seen.by[group.finally_id]["name"] == {"x": "X", "y": None}
    assert seen.by[group.finally_id]["order"] == ["X", None]
    assert seen.by[group.finally_id]["states"] == {x: State.DONE, y: State.DEAD}
