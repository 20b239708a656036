"""DS1-DS4: a step's record waits for a lock an operator holds on its job's row, and only that job's
record waits: the records of the engine's other jobs go on (each is its own statement)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from brooq_py.postgres import Store
from brooq_py.queue import Job
from brooq_py.queue.port import ClaimedJob
from tests.polling import wait_for

LEASE = timedelta(seconds=60)


def claimed(store: Store, n: int) -> list[ClaimedJob]:
    ids = [store.enqueue(Job("r", {"i": i})).id for i in range(n)]
    rows = store.worker.claim(["r"], n, "w", LEASE)
    by_id = {r.id: r for r in rows}
    return [by_id[i] for i in ids]


def locked_by_operator(dsn: str, schema: str, job_id: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn)
    conn.execute(
        sql.SQL("SELECT id FROM {}.job WHERE id = %s FOR UPDATE").format(sql.Identifier(schema)), [job_id]
    )
    return conn


def test_ds1_a_row_locked_by_an_operator_holds_up_only_its_own_jobs_record(
    store: Store, dsn: str, schema: str
) -> None:
    held, free = claimed(store, 2)
    operator = locked_by_operator(dsn, schema, held.id)
    answers: dict[str, Any] = {}

    def record(job: ClaimedJob) -> None:
        answers[job.id] = store.worker.step_record(job.id, job.claim_token, 0, "s0", "step", result="1")

    blocked = threading.Thread(target=record, args=(held,))
    try:
        blocked.start()
        with psycopg.connect(dsn, autocommit=True) as watch:  # the held job's record waits for the lock
            wait_for(
                lambda: (
                    watch.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE '%%job_step_record%%'"
                    ).fetchone()
                    == (1,)
                ),
                timeout=30,
                what="the held job's record waiting for the operator's lock",
            )
        beside = threading.Thread(target=record, args=(free,))  # comes while the other waits
        beside.start()
        beside.join(30)
        assert not beside.is_alive(), "a record waited for another job's row lock"
        assert answers[free.id].ours and answers[free.id].inserted
        assert blocked.is_alive() and held.id not in answers
    finally:
        operator.close()
    blocked.join(30)
    assert answers[held.id].ours and answers[held.id].inserted
