"""Terminal history in tables of a day each (SPEC B2, B3): ended jobs move out of the job table,
every reader still finds them, retention drops a day whole. On real PostgreSQL, the schema
migrated by the real migrations."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.conftest import q
from tests.integration.history import days, ended, live_count, move, where
from tests.polling import wait_for


def test_b2_b3_ended_jobs_move_to_their_day_and_every_reader_still_finds_them(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    done = [store.enqueue(Job("h", {"n": i})).id for i in range(3)]
    dead = store.enqueue(Job("h", {"n": 9})).id
    active = store.enqueue(Job("h", {"n": 10})).id
    ended(dsn, schema, done, "done")
    ended(dsn, schema, [dead], "dead")
    q(pool, schema, "UPDATE {job} SET result = '\"r\"' WHERE id = ANY(%s::uuid[])", done)

    moved = move(store, 100)

    assert sorted(i for i, _ in moved) == sorted([*done, dead])
    assert where(pool, schema, active) == "job"
    day = q(pool, schema, "SELECT to_char(now() AT TIME ZONE 'UTC' - interval '1 second', 'YYYYMMDD')")[0][0]
    assert {where(pool, schema, i) for i in [*done, dead]} == {f"job_history_{day}"}
    assert live_count(pool, schema) == 1
    # B3: SELECT … FROM job returns every job, active or ended; a job's fate is one SELECT
    assert q(pool, schema, "SELECT count(*) FROM {job}")[0][0] == 5
    assert q(pool, schema, "SELECT state FROM {job} WHERE id = %s", dead)[0][0] == "dead"
    row = store.get(done[0])
    assert row is not None and row.state is State.DONE and row.result == "r"
    assert store.result(done[1]) == "r"
    assert [r.id for r in store.list_jobs(topic="h", state="done")] == sorted(done, reverse=True)
    # moving again moves nothing: the rows are gone from job
    assert move(store, 100) == []


def test_b2_a_table_of_history_holds_ended_jobs_only(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """An operator's UPDATE that would make a moved job active fails instead of leaving it where no
    claim reads; the seed's cancel UPDATE of a moved job changes nothing, without an error."""
    job_id = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [job_id], "dead")
    assert move(store)
    with pytest.raises(psycopg.errors.CheckViolation):
        q(pool, schema, "UPDATE {job} SET state = 'pending' WHERE id = %s", job_id)
    q(
        pool,
        schema,
        "UPDATE {job} SET state = 'canceled' WHERE id = %s AND state IN ('pending', 'scheduled')",
        job_id,
    )
    assert q(pool, schema, "SELECT state FROM {job} WHERE id = %s", job_id)[0][0] == "dead"


def test_b2_e2_a_job_with_an_idempotency_key_stays_and_its_key_holds(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    first = store.enqueue(Job("h", {"n": 1}, idempotency_key="k1"))
    plain = store.enqueue(Job("h", {"n": 2})).id
    ended(dsn, schema, [first.id, plain], "done")
    moved = move(store)
    assert [i for i, _ in moved] == [plain]
    assert where(pool, schema, first.id) == "job"
    again = store.enqueue(Job("h", {"n": 3}, idempotency_key="k1"))
    assert again.id == first.id and not again.created


def test_b2_q1_a_dead_job_in_history_is_retried_and_runs_again(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    job_id = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [job_id], "dead")
    assert move(store)
    assert where(pool, schema, job_id) != "job"

    assert store.retry(job_id)

    assert where(pool, schema, job_id) == "job"
    row = store.get(job_id)
    assert row is not None and row.state is State.PENDING and row.attempts == 0
    assert q(pool, schema, "SELECT count(*) FROM {job} WHERE id = %s", job_id)[0][0] == 1
    claimed = store.claim(["h"], 1, "w", timedelta(seconds=30))
    assert [c.id for c in claimed] == [job_id]
    # a done job in history is not retried, and stays where it is
    other = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [other], "done")
    assert move(store)
    assert not store.retry(other)
    assert where(pool, schema, other) != "job"


def test_b2_d1_a_parent_in_history_is_named_by_a_new_child_which_reads_its_result(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    parent = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [parent], "done")
    q(pool, schema, "UPDATE {job} SET result = '7' WHERE id = %s", parent)
    assert move(store)

    child = store.enqueue(Job("c", {}, after=[parent])).id

    row = store.get(child)
    assert row is not None and row.state is State.PENDING
    assert store.parent_results(child) == {parent: 7}


def test_b2_t1_d4_a_day_older_than_the_ttl_is_dropped_whole_keeping_a_parent_of_an_active_child(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    old = [store.enqueue(Job("h", {"n": i})).id for i in range(5)]
    parent = store.enqueue(Job("h", {"n": "p"})).id
    recent = store.enqueue(Job("h", {"n": "r"})).id
    ended(dsn, schema, [*old, parent], "done", days_ago=15)
    ended(dsn, schema, [recent], "done", days_ago=2)
    assert len(move(store, 100)) == 7
    assert len(days(pool, schema)) == 2
    # a child enqueued after its parent moved (it names an ended parent): its edge and the parent stay
    child = store.enqueue(Job("c", {}, after=[parent])).id
    q(
        pool,
        schema,
        "UPDATE {job} SET state = 'scheduled', available_at = now() + interval '1 hour' WHERE id = %s",
        child,
    )

    dropped = store.drop_history(timedelta(days=10))

    assert len(dropped) == 1 and sum(dropped[0][1].values()) == 5  # the parent went back
    assert [store.get(i) for i in old] == [None] * 5
    assert where(pool, schema, parent) == "job"  # back where retention deletes it once it may
    assert list(store.parent_results(child)) == [parent]
    assert where(pool, schema, recent) is not None
    assert len(days(pool, schema)) == 1
    assert q(pool, schema, "SELECT count(*) FROM {job} WHERE state = 'done'")[0][0] == 2


def test_b2_an_engine_moves_ended_jobs_and_its_retention_drops_nothing_young(
    schema: str, store: Store, pool: ConnectionPool[Any], engines: Any
) -> None:
    e = engines(history_after=0.5, retention_period=0.2)
    e.register_kind("h", lambda ctx, claim: claim.payload["n"] * 2)
    e.start()
    ids = [store.enqueue(Job("h", {"n": i})).id for i in range(20)]
    wait_for(lambda: all(where(pool, schema, i) not in (None, "job") for i in ids), "the jobs to move", 60)
    assert [store.result(i) for i in ids] == [i * 2 for i in range(20)]
    assert live_count(pool, schema) == 0


def test_b2_s3_the_downgrade_puts_the_history_back_into_job_and_the_upgrade_moves_again(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    from brooq_py.postgres import migrations

    ids = [store.enqueue(Job("h", {"n": i})).id for i in range(4)]
    active = store.enqueue(Job("h", {"n": 4})).id
    ended(dsn, schema, ids[:2], "done")
    ended(dsn, schema, ids[2:], "canceled", days_ago=3)
    assert len(move(store)) == 4
    assert len(days(pool, schema)) == 2
    before = q(pool, schema, "SELECT to_jsonb(j) FROM {job} j ORDER BY id")

    migrations.downgrade(dsn, schema=schema, revision="0022")

    assert days(pool, schema) == []
    assert q(pool, schema, "SELECT to_jsonb(j) FROM ONLY {job} j ORDER BY id") == before
    assert where(pool, schema, active) == "job"
    migrations.upgrade(dsn, schema=schema)
    assert len(move(store)) == 4
    assert q(pool, schema, "SELECT to_jsonb(j) FROM {job} j ORDER BY id") == before
    migrations.downgrade(dsn, schema=schema, revision="base")  # nothing of the schema holds it back


def test_b2_t1_retention_deletes_no_row_of_the_history_one_by_one(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """A day's rows pass the ttl one by one before the whole day does: they wait for the day's drop."""
    hot = store.enqueue(Job("h", {"n": 1})).id
    moved = store.enqueue(Job("h", {"n": 2})).id
    ended(dsn, schema, [moved], "done", days_ago=5)
    assert [i for i, _ in move(store)] == [moved]
    ended(dsn, schema, [hot, moved], "done", days_ago=5)  # the moved row's day is still within 4 days
    q(pool, schema, "UPDATE {job} SET updated_at = now() - interval '4 days 1 hour' WHERE id = %s", moved)

    deleted = store.delete_terminal(timedelta(days=4), 100)

    assert [i for i, _ in deleted] == [hot]
    assert where(pool, schema, moved) is not None
