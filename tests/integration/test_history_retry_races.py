"""SPEC B2 with Q1: retry's passes (job_history_back, then job_retry, up to three times) against a
mover that commits between its two statements, and two retries of one job at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

import brooq_py.postgres.session.connections as connections
from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.history import AFTER, TTL, days, ended, move, where
from tests.integration.marks import in_thread
from tests.integration.test_workflows import state


def before_statement(monkeypatch: pytest.MonkeyPatch, name: str, hook: Callable[[], None]) -> list[int]:
    """Run *hook* once, just before the Store's first statement named *name* (between two
    autocommit statements of one plan: what another engine may commit there)."""
    real = connections.on_connection
    fired: list[int] = []

    def wrapped(conn: Any) -> Any:
        run = real(conn)

        def each(query: Any, params: dict[str, Any]) -> Any:
            if query.name == name and not fired:
                fired.append(1)
                hook()
            return run(query, params)

        return each

    monkeypatch.setattr(connections, "on_connection", wrapped)
    return fired


def move_with_fresh_store(pool: ConnectionPool[Any], schema: str) -> list[str]:
    """Another engine's mover (a fresh mark)."""
    other = Store(pool, schema=schema)
    try:
        return [i for i, _ in other.move_terminal(AFTER, TTL, 10)]
    finally:
        other.close()


def test_b2_retry_of_a_job_the_mover_moves_just_before_job_retry(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead job in job; retry's job_history_back finds nothing to move; another engine's mover
    commits the job into its day; job_retry's UPDATE of job (with its children) finds it in the
    day's table and sets it pending there: the table's check refuses it. Expected: True (retry
    looks once more) or False, never an error."""
    job_id = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [job_id], "dead", days_ago=1)
    moved: list[list[str]] = []
    fired = before_statement(
        monkeypatch, "job_retry", lambda: moved.append(move_with_fresh_store(pool, schema))
    )
    try:
        out = store.retry(job_id)
    except Exception as exc:
        pytest.fail(f"retry raised {type(exc).__name__}: {exc} (moved between its statements: {moved})")
    assert fired and moved == [[job_id]]
    assert out is True
    assert state(store, job_id) is State.PENDING


def test_b2_retry_of_a_job_in_history_moved_again_before_job_retry(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same from the history: job_history_back brings the job back to job with its end now, so
    another engine's mover does not take it back before job_retry runs (with its old end it did,
    and the retry answered False or raised)."""
    job_id = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [job_id], "dead", days_ago=1)
    assert move(store)
    assert where(pool, schema, job_id) != "job"
    moved: list[list[str]] = []
    before_statement(monkeypatch, "job_retry", lambda: moved.append(move_with_fresh_store(pool, schema)))
    try:
        out = store.retry(job_id)
    except Exception as exc:
        pytest.fail(f"retry raised {type(exc).__name__}: {exc} (moved between its statements: {moved})")
    assert moved == [[]]
    assert out is True
    assert state(store, job_id) is State.PENDING


def test_b2_two_retries_of_one_job_in_history_at_once(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    ids = [r.id for r in store.enqueue_many([Job("h", {"n": i}) for i in range(15)])]
    ended(dsn, schema, ids, "dead", days_ago=1)
    assert len(move(store, 100)) == 15
    other = Store(pool, schema=schema)
    for job_id in ids:
        go = threading.Barrier(2)

        def one(s: Store, job_id: str = job_id, go: threading.Barrier = go) -> bool:
            go.wait()
            return s.retry(job_id)

        threads = [in_thread(lambda s=s: one(s)) for s in (store, other)]
        outs: list[bool] = []
        for t, out, errors in threads:
            t.join(30)
            assert not errors, errors
            outs.extend(out)
        assert sorted(outs) == [False, True], (job_id, outs)
        assert where(pool, schema, job_id) == "job"
        assert state(store, job_id) is State.PENDING
    other.close()
    assert len(days(pool, schema)) == 1


def test_b2_retries_racing_a_mover_without_any_hook(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """No hook: an operator retries dead jobs one by one while they come of age for the mover
    (history_after 0.5 s) and the mover runs in a loop. Every retry answers True or False."""
    ids = [r.id for r in store.enqueue_many([Job("h", {"n": i}) for i in range(400)])]
    ended(dsn, schema, ids, "dead")
    mover = Store(pool, schema=schema)
    stop = threading.Event()

    def move() -> int:
        n = 0
        while not stop.is_set():
            n += len(mover.move_terminal(AFTER, TTL, 5))
        return n

    t, moved, move_errors = in_thread(move)
    errors: list[str] = []
    answers: list[bool] = []
    for job_id in ids:
        try:
            answers.append(store.retry(job_id))
        except Exception as exc:
            errors.append(type(exc).__name__)
    stop.set()
    t.join(60)
    mover.close()
    assert not move_errors, move_errors
    still_dead = [i for i in ids if state(store, i) is State.DEAD]
    assert not errors and not still_dead, (
        f"{len(errors)} of {len(ids)} retries raised {sorted(set(errors))}, {answers.count(False)} answered"
        f" False, {len(still_dead)} jobs still dead (rows moved: {moved})"
    )


@pytest.mark.parametrize("movers", [1, 2])
def test_b2_retries_racing_movers_distinct_ends(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], movers: int
) -> None:
    """As above, each job with an end of its own (a mover's mark passes each row once), with one
    engine's mover or two."""
    ids = [r.id for r in store.enqueue_many([Job("h", {"n": i}) for i in range(400)])]
    with pool.connection() as conn:
        conn.execute(
            f"UPDATE \"{schema}\".job j SET state = 'dead', updated_at = now() - interval '0.3 s'"
            " + (x.n * interval '1 ms') FROM unnest(%s::uuid[]) WITH ORDINALITY AS x(id, n) WHERE j.id = x.id",
            (ids,),
        )
    stores = [Store(pool, schema=schema) for _ in range(movers)]
    stop = threading.Event()

    def move(s: Store) -> int:
        n = 0
        while not stop.is_set():
            n += len(s.move_terminal(AFTER, TTL, 5))
        return n

    threads = [in_thread(lambda s=s: move(s)) for s in stores]
    errors: list[str] = []
    answers: list[bool] = []
    for job_id in ids:
        try:
            answers.append(store.retry(job_id))
        except Exception as exc:
            errors.append(type(exc).__name__)
    stop.set()
    moved = 0
    for t, out, move_errors in threads:
        t.join(60)
        assert not move_errors, move_errors
        moved += sum(out)
    for s in stores:
        s.close()
    still_dead = [i for i in ids if state(store, i) is State.DEAD]
    assert not errors and not still_dead, (
        f"{len(errors)} of {len(ids)} retries raised {sorted(set(errors))}, {answers.count(False)} answered"
        f" False, {len(still_dead)} jobs still dead (rows moved: {moved})"
    )


def test_b2_retry_from_history_against_an_uncommitted_holder_of_its_unique_key(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    import psycopg

    from tests.integration.marks import blocked_by
    from tests.integration.test_workflows import finish
    from tests.polling import wait_for

    a = store.enqueue(Job("u", {"n": 1}, unique_key="k")).id
    finish(store, "u", State.DEAD)
    ended(dsn, schema, [a], "dead", days_ago=1)
    assert move(store)
    with psycopg.connect(dsn) as holder:
        b = store.enqueue_tx(holder, Job("u", {"n": 2}, unique_key="k")).id
        t, out, errors = in_thread(lambda: store.retry(a))
        wait_for(lambda: blocked_by(dsn, holder.info.backend_pid) > 0, "the retry to wait for the holder", 30)
        holder.commit()
        t.join(30)
    assert not errors, errors
    assert out == [False]
    assert state(store, a) is State.DEAD
    finish(store, "u")
    assert state(store, b) is State.DONE
    assert store.retry(a)
    assert state(store, a) is State.PENDING
