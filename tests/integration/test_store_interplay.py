"""Producer and operator statements meeting the stager and retention on one row (SPEC E5, S5, Q1, T1)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration import test_scheduled
from tests.integration.test_scheduled import later

db = test_scheduled.db  # the raw autocommit connection fixture on the test schema

LEASE = timedelta(seconds=30)


def states(db: psycopg.Connection[Any], ids: list[str]) -> list[str]:
    rows = dict(db.execute("SELECT id::text, state FROM job WHERE id::text = ANY(%s)", (ids,)).fetchall())
    return [rows.get(i, "gone") for i in ids]


def test_e5_s5_a_batch_mixing_due_future_and_repeated_keys(store: Store, db: psycopg.Connection[Any]) -> None:
    """Each job's state follows its own time; a repeat takes the first's id and changes nothing of it."""
    results = store.enqueue_many(
        [
            Job("a", 1, idempotency_key="k1"),  # due now
            Job("a", 2, idempotency_key="k2", available_at=later(3600)),  # scheduled
            Job("a", 3, idempotency_key="k1", available_at=later(3600)),  # repeat of a due job, for later
            Job("a", 4, idempotency_key="k2"),  # repeat of a scheduled job, for now
            Job("a", 5, available_at=later(-60)),  # in the past: pending at once
            Job("b", 6, idempotency_key="k2", available_at=later(3600)),  # same key, other topic
        ]
    )
    assert [r.created for r in results] == [True, True, False, False, True, True]
    assert results[2].id == results[0].id and results[3].id == results[1].id
    ids = [results[i].id for i in (0, 1, 4, 5)]
    assert states(db, ids) == ["pending", "scheduled", "pending", "scheduled"]
    rows = dict(
        db.execute(
            "SELECT idempotency_key, payload FROM job WHERE topic = 'a' AND idempotency_key IS NOT NULL"
        )
    )
    assert rows == {"k1": 1, "k2": 2}  # the repeats wrote nothing
    assert {c.payload for c in store.worker.claim(["a", "b"], 10, "w", LEASE)} == {1, 5}
    # Repeating the whole batch later creates nothing, whatever became of the rows meanwhile.
    store.worker.stage(["a", "b"], 10)
    again = store.enqueue_many([Job("a", 7, idempotency_key="k1"), Job("a", 8, idempotency_key="k2")])
    assert [(r.id, r.created) for r in again] == [(results[0].id, False), (results[1].id, False)]


def test_q1_t1_retention_skips_a_row_whose_retry_is_in_flight(
    store: Store, dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """A psql retry (the documented UPDATE) holds the row: retention neither waits for it nor deletes it."""
    job = store.enqueue(Job("a", 1, idempotency_key="key")).id
    other = store.enqueue(Job("a", 2)).id
    assert store.cancel(job) and store.cancel(other)
    db.execute("UPDATE job SET updated_at = now() - interval '10 days'")
    with psycopg.connect(dsn) as psql:
        psql.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        psql.execute(
            "UPDATE job SET state = 'pending', attempts = 0, available_at = now(), updated_at = now() "
            "WHERE id = %s AND state IN ('dead', 'canceled')",
            (job,),
        )
        deleted = store.worker.delete_terminal(timedelta(days=1), 100)
        assert [i for i, _ in deleted] == [other]
        psql.commit()
    assert states(db, [job]) == ["pending"]
    assert store.worker.delete_terminal(timedelta(days=1), 100) == []
    # Its key is still held: the retried job is the one a repeat finds.
    assert store.enqueue(Job("a", 3, idempotency_key="key")) == (job, False)


def test_q1_retry_of_a_canceled_scheduled_job_is_due_now_and_claimable(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """Retry puts a job that was canceled while scheduled for later straight into the claim index."""
    job = store.enqueue(Job("a", 1, available_at=later(3600))).id
    assert store.cancel(job)
    assert store.retry(job)
    assert states(db, [job]) == ["pending"]
    assert [c.id for c in store.worker.claim(["a"], 5, "w", LEASE)] == [job]
    assert store.worker.stage(["a"], 10).total == 0  # nothing left for the stager


def test_x1_s7_a_cancel_in_flight_on_a_due_scheduled_row_wins_over_the_stager(
    store: Store, dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """The stager skips the row a psql cancel holds (no wait, no spin on its due time); the cancel sticks."""
    job = store.enqueue(Job("a", 1, available_at=later(3600))).id
    db.execute("UPDATE job SET available_at = now() - interval '1 second' WHERE id = %s", (job,))
    with psycopg.connect(dsn) as psql:
        psql.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        psql.execute("UPDATE job SET state = 'canceled', updated_at = now() WHERE id = %s", (job,))
        staged = store.worker.stage(["a"], 10)
        assert staged.total == 0 and staged.next_due_in is None  # not "due now": the stager sleeps
        psql.commit()
    assert store.worker.stage(["a"], 10).total == 0
    assert states(db, [job]) == ["canceled"]
    assert store.worker.claim(["a"], 5, "w", LEASE) == []
