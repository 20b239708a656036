"""A day's drop against a long reader of job (SPEC B2): it asks for the table's lock without waiting
and gives way, so no statement queues behind it. A waiting ACCESS EXCLUSIVE lock held up every later
reader of job, and the triggers of a settle (a sequence member's, a parent's with a blocked child)
read job as a whole: those settles failed on their lock timeout behind a drop that waited."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome
from tests.integration.history import ended, move
from tests.integration.marks import in_thread

LEASE = timedelta(seconds=60)


@pytest.fixture
def dropping(dsn: str, schema: str, store: Store) -> Iterator[Callable[[Callable[[], Any]], list[Any]]]:
    """An old day of history and a long REPEATABLE READ reader of job. Calling the fixture with *op*
    starts a drop on a thread and runs *op* over and over while the drop tries, then returns what
    each run of *op* returned; the drop must have given way (dropped nothing)."""
    old = store.enqueue(Job("old", {})).id
    ended(dsn, schema, [old], "done", days_ago=15)
    assert move(store)
    with psycopg.connect(dsn) as reader:
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        reader.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "job")))

        def run(op: Callable[[], Any]) -> list[Any]:
            t, out, errors = in_thread(lambda: store.drop_history(timedelta(days=10)))
            results = [op()]
            while t.is_alive():
                results.append(op())
            t.join(30)
            assert not errors, errors
            assert out == [[]]  # it gave way to the reader
            return results

        yield run
    assert store.get(old) is not None


def test_b2_a_sequence_members_settle_beside_a_drop_that_gives_way(
    store: Store, dropping: Callable[[Callable[[], Any]], list[Any]]
) -> None:
    ids = [store.enqueue(Job("seq", {"n": i}, sequence="s")).id for i in range(200)]
    store.stage(["seq"], 1000)

    def settle_next() -> str | None:
        claimed = store.claim(["seq"], 1, "w", LEASE)
        if not claimed:
            store.stage(["seq"], 1000)
            return None
        (c,) = claimed
        settled = store.worker.settle_many([Outcome(c.id, c.claim_token, State.DONE, topic="seq")])
        assert c.id in settled
        return c.id

    done = [i for i in dropping(settle_next) if i is not None]
    assert done and done == ids[: len(done)]


def test_b2_a_parents_settle_releases_its_child_beside_a_drop_that_gives_way(
    store: Store, dropping: Callable[[Callable[[], Any]], list[Any]]
) -> None:
    def parent_and_child() -> str:
        parent = store.enqueue(Job("p", {})).id
        child = store.enqueue(Job("c", {}, after=[parent])).id
        (c,) = store.claim(["p"], 1, "w", LEASE)
        settled = store.worker.settle_many([Outcome(c.id, c.claim_token, State.DONE, topic="p")])
        assert parent in settled
        return child

    children = dropping(parent_and_child)
    assert all(store.get(c).state is State.PENDING for c in children)  # type: ignore[union-attr]


def test_b2_enqueues_and_the_stager_run_beside_a_drop_that_gives_way(
    store: Store, dropping: Callable[[Callable[[], Any]], list[Any]]
) -> None:
    def each() -> None:
        store.enqueue(Job("plain", {}))
        store.enqueue(Job("plain", {}, unique_key="u"))
        store.enqueue(Job("plain", {}, idempotency_key="k"))
        store.stage(["plain"], 100)

    assert dropping(each)
