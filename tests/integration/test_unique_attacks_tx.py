"""Unique and idempotency keys (U1-U3, E1, E2) in the caller's transaction, around retries,
cancels, the dead, depth caps, batches and retention."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store, WrapTx
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome
from tests.integration.conftest import q
from tests.polling import wait_for

LEASE = timedelta(seconds=30)
ACTIVE = "('scheduled', 'pending', 'processing', 'failed', 'blocked')"


def active(pool: ConnectionPool[Any], schema: str, topic: str, key: str) -> list[tuple[Any, ...]]:
    return q(
        pool,
        schema,
        "SELECT id::text, state FROM {job} WHERE topic = %s AND unique_key = %s AND state IN " + ACTIVE,
        topic,
        key,
    )


def blocked_by(pool: ConnectionPool[Any], schema: str, pid: int) -> bool:
    rows = q(
        pool, schema, "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))", pid
    )
    return bool(rows[0][0])


def make_dead(store: Store, topic: str, key: str) -> str:
    jid = store.enqueue(Job(topic, {"v": "old"}, unique_key=key)).id
    (c,) = store.worker.claim([topic], 1, "w", LEASE)
    store.worker.settle_many([Outcome(c.id, c.claim_token, State.DEAD, last_error="boom")])
    assert store.get(jid).state == State.DEAD  # type: ignore[union-attr]
    return jid


def test_u3_a_retry_waiting_on_a_new_holder_that_rolls_back_retries(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """A dead job of key k; a caller's transaction enqueues k anew (not committed); an operator's retry
    of the dead job meanwhile; the caller rolls back. The retry must answer without raising, and k
    must end with exactly one active job (the retried one, if the retry said True)."""
    topic = "lm.u.rb"
    dead = make_dead(store, topic, "k")
    out: dict[str, Any] = {}
    with psycopg.connect(dsn) as caller:
        r = store.enqueue_tx(WrapTx(caller), Job(topic, {"v": "new"}, unique_key="k"))
        assert r.created

        def retry() -> None:
            try:
                out["v"] = store.retry(dead)
            except BaseException as exc:
                out["e"] = exc

        t = threading.Thread(target=retry)
        t.start()
        wait_for(lambda: blocked_by(pool, schema, caller.info.backend_pid) or not t.is_alive(), "retry waits")
        caller.rollback()
        t.join(20)
    assert "e" not in out, out
    holders = active(pool, schema, topic, "k")
    assert out["v"] is True and holders == [(dead, "pending")], (out, holders)


def test_u3_a_retry_waiting_on_a_new_holder_that_commits_answers_false(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    topic = "lm.u.cm"
    dead = make_dead(store, topic, "k")
    out: dict[str, Any] = {}
    with psycopg.connect(dsn) as caller:
        r = store.enqueue_tx(WrapTx(caller), Job(topic, {"v": "new"}, unique_key="k"))

        def retry() -> None:
            try:
                out["v"] = store.retry(dead)
            except BaseException as exc:
                out["e"] = exc

        t = threading.Thread(target=retry)
        t.start()
        wait_for(lambda: blocked_by(pool, schema, caller.info.backend_pid) or not t.is_alive(), "retry waits")
        caller.commit()
        t.join(20)
    assert out == {"v": False}, out
    assert active(pool, schema, topic, "k") == [(r.id, "pending")]


def test_u1_cancel_and_reenqueue_in_the_callers_transaction_then_rollback(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """The documented psql cancel UPDATE of a processing holder and an enqueue of its key in one
    caller's transaction that rolls back: the holder is still processing under its claim, its done is
    written, and the key is free afterwards."""
    topic = "lm.u.cx"
    holder = store.enqueue(Job(topic, {"v": 1}, unique_key="k")).id
    (c,) = store.worker.claim([topic], 1, "w", LEASE)
    with psycopg.connect(dsn) as caller:
        caller.execute(
            f"UPDATE \"{schema}\".job SET state = 'canceled', updated_at = now() WHERE id = %s AND state = 'processing'",
            (holder,),
        )
        r = store.enqueue_tx(WrapTx(caller), Job(topic, {"v": 2}, unique_key="k"))
        assert r.created
        caller.rollback()
    assert active(pool, schema, topic, "k") == [(holder, "processing")]
    assert store.worker.settle_many([Outcome(c.id, c.claim_token, State.DONE)]) == {holder}
    assert store.enqueue(Job(topic, {"v": 3}, unique_key="k")).created


@pytest.mark.xfail(strict=True, reason="known: docs/unique-jobs.md, a parked first job of a repeated key")
def test_u1_enqueue_many_with_duplicate_keys_on_a_parking_topic_answers_as_one_after_another(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """docs/unique-jobs.md: in enqueue_many a repeated key's later jobs are answered "as the same
    enqueues one after another would answer it". On a parking topic at its cap, the same six jobs as
    a batch (topic A) and one by one (topic B) give the same created flags and the same rows."""

    def batch(topic: str) -> list[Job]:
        return [
            Job(topic, {"i": 0}, unique_key="a"),
            Job(topic, {"i": 1}, unique_key="a"),
            Job(topic, {"i": 2}, idempotency_key="x"),
            Job(topic, {"i": 3}, idempotency_key="x", unique_key="b"),
            Job(topic, {"i": 4}, unique_key="b"),
            Job(topic, {"i": 5}, unique_key="a", on_duplicate="replace"),
        ]

    for topic in ("lm.u.parkA", "lm.u.parkB"):
        store.set_max_depth(topic, 1, park=True)
        store.enqueue(Job(topic, {"fill": 1}))
    many = store.enqueue_many(batch("lm.u.parkA"))
    ones = [store.enqueue(j) for j in batch("lm.u.parkB")]

    def rows(topic: str) -> list[Any]:
        return q(
            pool,
            schema,
            "SELECT payload, unique_key, idempotency_key, state FROM {job} WHERE topic = %s ORDER BY id",
            topic,
        )

    assert [x.created for x in many] == [x.created for x in ones], (many, ones)
    assert rows("lm.u.parkA") == rows("lm.u.parkB")


def test_e2_an_idempotency_key_whose_job_retention_deleted_creates_a_new_job(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """Documented: the key holds until retention deletes the row. After the delete, a repeat creates
    a job (and never raises)."""
    topic = "lm.u.ret"
    first = store.enqueue(Job(topic, {"v": 1}, idempotency_key="once"))
    (c,) = store.worker.claim([topic], 1, "w", LEASE)
    store.worker.settle_many([Outcome(c.id, c.claim_token, State.DONE)])
    q(pool, schema, "UPDATE {job} SET updated_at = now() - interval '60 days' WHERE id = %s", first.id)
    deleted = (
        store.worker.delete_terminal(timedelta(days=30), 100)
        if hasattr(store.worker, "delete_terminal")
        else None
    )
    if deleted is None:
        q(pool, schema, "DELETE FROM {job} WHERE id = %s", first.id)
    again = store.enqueue(Job(topic, {"v": 2}, idempotency_key="once"))
    assert again.created and again.id != first.id


@pytest.mark.parametrize("key", ["unique", "idempotency"])
def test_u2_a_duplicate_in_a_repeatable_read_transaction_after_the_engine_claimed_the_holder(
    store: Store, dsn: str, key: str
) -> None:
    """A caller's REPEATABLE READ transaction has its snapshot; the engine then claims the holder of
    key k; the caller enqueues a duplicate of k. As docs/enqueueing.md and unique-jobs.md say, that
    is a serialization failure, as any write conflicting with a row written after the snapshot;
    the transaction tried again answers with the holder."""
    topic = "lm.u.rr"
    kw = {"unique_key": "k"} if key == "unique" else {"idempotency_key": "k"}
    holder = store.enqueue(Job(topic, {"v": 1}, **kw)).id
    with psycopg.connect(dsn) as caller:
        caller.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        caller.execute("SELECT 1")  # the snapshot
        (c,) = store.worker.claim([topic], 1, "w", LEASE)  # the engine claims the holder
        with pytest.raises(psycopg.errors.SerializationFailure):
            store.enqueue_tx(WrapTx(caller), Job(topic, {"v": 2}, **kw))
        caller.rollback()
        r = store.enqueue_tx(WrapTx(caller), Job(topic, {"v": 2}, **kw))  # the transaction again
        caller.commit()
    assert (r.id, r.created) == (holder, False)
    store.worker.settle_many([Outcome(c.id, c.claim_token, State.DONE)])
