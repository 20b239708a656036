"""Store, operator side: retry (SPEC Q1), pause and resume (Q2), global limits (Q3), on real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from brooq_py.postgres import Store
from brooq_py.queue import InvalidJob, Job, State


def force_state(dsn: str, schema: str, job_id: str, state: str, attempts: int, error: str | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET state = %s, attempts = %s, last_error = %s, "
                "available_at = now() + interval '1 day' WHERE id = %s"
            ).format(sql.Identifier(schema, "job")),
            (state, attempts, error, job_id),
        )


@pytest.mark.parametrize("state", ["dead", "canceled"])
def test_retry_puts_a_dead_or_canceled_job_back_to_pending_keeping_last_error_Q1(
    store: Store, dsn: str, schema: str, state: str
) -> None:
    job_id = store.enqueue(Job("t", {"n": 1})).id
    force_state(dsn, schema, job_id, state, 5, "RuntimeError: boom")

    assert store.retry(job_id) is True

    row = store.get(job_id)
    assert row is not None
    assert row.state is State.PENDING
    assert row.attempts == 0
    assert row.last_error == "RuntimeError: boom"
    assert row.locked_by is None and row.locked_until is None
    assert row.available_at <= row.updated_at + timedelta(seconds=1)


@pytest.mark.parametrize("state", ["pending", "scheduled", "failed", "done"])
def test_retry_leaves_other_states_alone_Q1(store: Store, dsn: str, schema: str, state: str) -> None:
    job_id = store.enqueue(Job("t", {"n": 1})).id
    force_state(dsn, schema, job_id, state, 2, None)

    assert store.retry(job_id) is False

    row = store.get(job_id)
    assert row is not None and row.state == state and row.attempts == 2


def test_retry_of_unknown_or_malformed_ids_is_false_Q1(store: Store) -> None:
    assert store.retry("00000000-0000-0000-0000-000000000000") is False
    assert store.retry("not-a-uuid") is False


def test_retry_wakes_listeners_Q1(store: Store, dsn: str, schema: str) -> None:
    job_id = store.enqueue(Job("t", {"n": 1})).id
    force_state(dsn, schema, job_id, "dead", 5, "x")
    sub = store.worker.listen()
    try:
        while sub.wait(0.05):  # drain anything queued before
            pass
        assert store.retry(job_id)
        assert sub.wait(10.0)
    finally:
        sub.close()


def test_pause_and_resume_are_stored_per_topic_Q2(store: Store) -> None:
    assert store.paused() == set()
    store.pause("a")
    store.pause("a")  # twice is fine
    store.pause("b")
    assert store.paused() == {"a", "b"}
    store.resume("a")
    store.resume("never-paused")
    assert store.paused() == {"b"}


def test_set_limit_sets_and_clears_the_global_limit_Q3(store: Store) -> None:
    store.set_limit("api", 4)
    store.pause("api")
    (setting,) = store.topic_settings()
    assert (setting.topic, setting.paused, setting.limit) == ("api", True, 4)
    store.set_limit("api", None)
    (setting,) = store.topic_settings()
    assert (setting.paused, setting.limit) == (True, None)


@pytest.mark.parametrize("limit", [-1, 2**31, 1.5, "4", True])
def test_set_limit_refuses_bad_limits_before_writing(store: Store, limit: object) -> None:
    with pytest.raises(ValueError, match="limit must be"):
        store.set_limit("api", limit)  # type: ignore[arg-type]
    assert store.topic_settings() == []


@pytest.mark.parametrize("topic", ["", "a\x00b", None, "\udcff"])
def test_operator_controls_refuse_bad_topics(store: Store, topic: object) -> None:
    with pytest.raises(InvalidJob):
        store.set_limit(topic, 3)  # type: ignore[arg-type]
    for call in (store.pause, store.resume):
        with pytest.raises(InvalidJob):
            call(topic)  # type: ignore[arg-type]
