"""Workflows under a running engine and from asyncio (SPEC D1-D3, D6)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store
from brooq_py.queue import Claim, Context, InvalidJob, Job, KindOptions, State
from tests.polling import wait_for


class Starts:
    """Records, at each job's start, the states its parents are in (read from the database)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.lock = threading.Lock()
        self.seen: dict[str, dict[str, State]] = {}
        self.results: dict[str, dict[str, Any]] = {}

    def handler(self, ctx: Context, claim: Claim) -> str:
        row = self.store.get(claim.id)
        assert row is not None
        states = {}
        for parent in row.parents:
            parent_row = self.store.get(parent)
            assert parent_row is not None
            states[parent] = parent_row.state
        results = claim.parent_results()
        with self.lock:
            self.seen[claim.id] = states
            self.results[claim.id] = results
        return claim.id

    def started_after_parents(self) -> bool:
        with self.lock:
            return all(s is State.DONE for states in self.seen.values() for s in states.values())


def done(store: Store, *ids: str) -> bool:
    return all((row := store.get(i)) is not None and row.state is State.DONE for i in ids)


def test_d2_a_blocked_child_is_never_claimed_by_idle_workers(
    store: Store, engines: Callable[..., Engine]
) -> None:
    release = threading.Event()
    starts = Starts(store)

    def parent(ctx: Context, claim: Claim) -> None:
        assert release.wait(30)

    e = engines(poll_interval=0.05)
    e.register_kind("wf.parent", parent)
    e.register_kind("wf.child", starts.handler)
    e.start()
    p = store.enqueue(Job("wf.parent")).id
    child = store.enqueue(Job("wf.child", after=[p])).id
    wait_for(lambda: (r := store.get(p)) is not None and r.state is State.PROCESSING, "the parent running")
    # Idle workers take every other job of the child's topic meanwhile, never the blocked one.
    others = [store.enqueue(Job("wf.child")).id for _ in range(20)]
    wait_for(lambda: done(store, *others), "the child topic's other jobs")
    row = store.get(child)
    assert row is not None and row.state is State.BLOCKED and row.attempts == 0
    release.set()
    wait_for(lambda: done(store, p, child), "the parent, then the child")
    assert starts.seen[child] == {p: State.DONE}


def test_d2_a_diamond_runs_its_join_after_both_branches(store: Store, engines: Callable[..., Engine]) -> None:
    starts = Starts(store)
    e = engines(poll_interval=0.05)
    for topic in ("wf.a", "wf.b", "wf.c", "wf.d"):
        e.register_kind(topic, starts.handler)
    e.start()
    with store.begin() as tx:
        a = store.enqueue_tx(tx, Job("wf.a")).id
        b = store.enqueue_tx(tx, Job("wf.b", after=[a])).id
        c = store.enqueue_tx(tx, Job("wf.c", after=[a])).id
        d = store.enqueue_tx(tx, Job("wf.d", after=[b, c])).id
    wait_for(lambda: done(store, a, b, c, d), "the diamond")
    assert starts.seen[d] == {b: State.DONE, c: State.DONE}
    assert set(starts.results[d]) == {b, c}
    assert starts.started_after_parents()


def test_d3_a_dead_root_cancels_its_descendants_under_the_engine(
    store: Store, engines: Callable[..., Engine]
) -> None:
    def boom(ctx: Context, claim: Claim) -> None:
        raise RuntimeError("root failed")

    e = engines(poll_interval=0.05)
    e.register_kind("wf.root", boom, KindOptions(max_attempts=1))
    e.register_kind("wf.leaf", lambda ctx, claim: None)
    e.start()
    with store.begin() as tx:  # the whole graph before the root can run
        root = store.enqueue_tx(tx, Job("wf.root")).id
        child = store.enqueue_tx(tx, Job("wf.leaf", after=[root])).id
        grandchild = store.enqueue_tx(tx, Job("wf.leaf", after=[child])).id
    wait_for(lambda: (r := store.get(grandchild)) is not None and r.state is State.CANCELED, "the cascade")
    for job_id in (child, grandchild):
        row = store.get(job_id)
        assert row is not None and row.last_error == f"canceled: parent {root} ended dead"
        assert row.attempts == 0


def test_d6_a_group_enqueued_from_on_succeeded_commits_with_the_done(
    store: Store, engines: Callable[..., Engine]
) -> None:
    starts = Starts(store)
    made: list[Any] = []

    def fan_out(ctx: Context, claim: Claim) -> None:
        def enqueue(tx: Any) -> None:
            made.append(
                store.enqueue_group([Job("wf.leaf", i) for i in range(5)], then=Job("wf.join"), tx=tx)
            )
            if claim.payload == "fail":
                raise RuntimeError("callback failed after the group was enqueued")

        claim.on_succeeded(enqueue)

    e = engines(poll_interval=0.05)
    e.register_kind("wf.fan", fan_out, KindOptions(max_attempts=1))
    e.register_kind("wf.leaf", starts.handler)
    e.register_kind("wf.join", starts.handler)
    e.start()
    bad = store.enqueue(Job("wf.fan", "fail")).id
    wait_for(lambda: (r := store.get(bad)) is not None and r.state is State.DEAD, "the failed fan-out")
    (rolled_back,) = made
    assert rolled_back.then_id is not None
    assert all(store.get(i) is None for i in [*rolled_back.ids, rolled_back.then_id])  # gone with the done
    good = store.enqueue(Job("wf.fan", "ok")).id
    wait_for(lambda: len(made) == 2 and done(store, good, *made[1].ids, made[1].then_id), "the group")
    group = made[1]
    assert starts.seen[group.then_id] == dict.fromkeys(group.ids, State.DONE)
    assert starts.started_after_parents()


def test_d1_d6_asyncstore_enqueues_parents_and_groups(dsn: str, schema: str, store: Store) -> None:
    async def main() -> None:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False)
        await pool.open()
        try:
            astore = AsyncStore(pool, schema=schema)
            parent = (await astore.enqueue(Job("p"))).id
            child = (await astore.enqueue(Job("c", after=[parent]))).id
            async with astore.begin() as tx:
                inner = (await astore.enqueue_tx(tx, Job("p"))).id
                group = await astore.enqueue_group([Job("g"), Job("g")], then=Job("t", after=[inner]), tx=tx)
                many = await astore.enqueue_many([Job("m", after=[inner, parent])], tx=tx)
            own = await astore.enqueue_group([Job("g")], then=Job("t"))
            with pytest.raises(InvalidJob):
                await astore.enqueue_group([Job("g")], then=Job("t", after=[group.ids[0][:-4] + "ffff"]))
            rows = {
                i: store.get(i) for i in [child, *group.ids, str(group.then_id), many[0].id, str(own.then_id)]
            }
            assert rows[child] is not None and rows[child].parents == (parent,)
            assert {i: r.state if r else None for i, r in rows.items()} == {
                child: State.BLOCKED,
                group.ids[0]: State.PENDING,
                group.ids[1]: State.PENDING,
                str(group.then_id): State.BLOCKED,
                many[0].id: State.BLOCKED,
                str(own.then_id): State.BLOCKED,
            }
            then_row = rows[str(group.then_id)]
            assert then_row is not None and then_row.parents == (inner, *group.ids)
        finally:
            await pool.close()

    asyncio.run(main())


def test_k4_drain_runs_a_workflow_to_its_end(store: Store, engines: Callable[..., Engine]) -> None:
    """The testing kit's drain releases blocked jobs as an engine does: a diamond ends done, in order."""
    from brooq_py.testing import drain

    starts = Starts(store)
    e = engines()
    for topic in ("wf.a", "wf.b", "wf.c", "wf.d"):
        e.register_kind(topic, starts.handler)
    a = store.enqueue(Job("wf.a")).id
    b, c = (r.id for r in store.enqueue_many([Job("wf.b", after=[a]), Job("wf.c", after=[a])]))
    d = store.enqueue(Job("wf.d", after=[b, c])).id
    report = drain(e)
    assert report.done == 4 and done(store, a, b, c, d)
    assert starts.seen[d] == {b: State.DONE, c: State.DONE} and starts.started_after_parents()
