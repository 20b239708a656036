"""A done written late under its own claim (SPEC L6', P3): ``Store.settle_lost`` on real PostgreSQL.

The engine whose handler returned while the store was unreachable writes that done later, under
the attempt's old claim token. The statement must write it while the row is nobody else's since
(still processing under that claim, returned to pending by the reaper and not claimed since, or,
for a last attempt, held by the poison claim that came next) and never over anything else.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine.repo import ClaimedJob, Outcome
from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.conftest import q

LEASE = timedelta(seconds=30)


def claim(store: Store, worker: str) -> ClaimedJob:
    (row,) = store.claim(["t"], 1, worker, LEASE)
    return row


def expire(pool: ConnectionPool[Any], schema: str, job_id: str) -> None:
    q(pool, schema, "UPDATE {job} SET locked_until = now() - interval '1 second' WHERE id = %s", job_id)


def reaped(store: Store, pool: ConnectionPool[Any], schema: str, job_id: str) -> None:
    expire(pool, schema, job_id)
    assert store.reap_expired() == [(job_id, "t")]


def done(row: ClaimedJob) -> Outcome:
    return Outcome(row.id, row.claim_token, State.DONE, topic="t", result=json.dumps({"by": row.locked_by}))


def look(pool: ConnectionPool[Any], schema: str, job_id: str) -> tuple[Any, ...]:
    (r,) = q(
        pool,
        schema,
        "SELECT state, attempts, claim_token::text, locked_by, result FROM {job} WHERE id = %s",
        job_id,
    )
    return r


def test_l6_written_over_its_own_expired_lease_and_over_a_reaped_row_not_claimed_since(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """Nobody took the row since the write was given up: its lease expired (not reaped yet), or
    the reaper returned it to pending (claim token and attempts kept). Both are the attempt's."""
    first = store.enqueue(Job("t")).id
    a = claim(store, "engine-a")
    expire(pool, schema, first)
    assert store.settle_lost(done(a), 1, "engine-a", last=True)
    assert look(pool, schema, first) == ("done", 1, a.claim_token, "engine-a", {"by": "engine-a"})

    second = store.enqueue(Job("t")).id
    a = claim(store, "engine-a")
    reaped(store, pool, schema, second)
    assert store.settle_lost(done(a), 1, "engine-a", last=False)
    assert look(pool, schema, second) == ("done", 1, a.claim_token, "engine-a", {"by": "engine-a"})
    # Tried again after an answer lost at COMMIT: found written, nothing written twice.
    before = q(pool, schema, "SELECT updated_at FROM {job} WHERE id = %s", second)
    assert store.settle_lost(done(a), 1, "engine-a", last=False)
    assert q(pool, schema, "SELECT updated_at FROM {job} WHERE id = %s", second) == before


def test_l6_l5_a_last_attempts_done_wins_over_the_poison_claim_that_came_next(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """Engine b claimed the reaped row past max_attempts (poison, never run) and holds its verdict:
    engine a's done is written over that claim, the row as if it had come in time, and b's dead
    finds the row no longer its claim's."""
    jid = store.enqueue(Job("t")).id
    a = claim(store, "engine-a")
    reaped(store, pool, schema, jid)
    b = claim(store, "engine-b")
    assert b.attempts == 2
    with store.begin() as tx:  # with closing work, inside its transaction
        assert store.settle_lost(done(a), 1, "engine-a", last=True, tx=tx)
    assert look(pool, schema, jid) == ("done", 1, a.claim_token, "engine-a", {"by": "engine-a"})
    assert store.settle_many([Outcome(jid, b.claim_token, State.DEAD, last_error="poison")]) == set()
    assert look(pool, schema, jid)[0] == "done"


def test_l6_p3_never_written_over_another_attempts_row(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """Claimed again for an attempt that runs (not the last), ended, canceled, or retried by an
    operator (attempts reset, claim token kept): the lost done is not written."""
    # claimed again and running: attempt 1 of several
    running = store.enqueue(Job("t")).id
    a = claim(store, "engine-a")
    reaped(store, pool, schema, running)
    b = claim(store, "engine-b")
    assert not store.settle_lost(done(a), 1, "engine-a", last=False)
    assert look(pool, schema, running)[:4] == ("processing", 2, b.claim_token, "engine-b")

    # the poison claim's dead written first
    dead = store.enqueue(Job("t")).id
    a = claim(store, "engine-a")
    reaped(store, pool, schema, dead)
    b = claim(store, "engine-b")
    assert store.settle_many([Outcome(dead, b.claim_token, State.DEAD, last_error="poison")]) == {dead}
    assert not store.settle_lost(done(a), 1, "engine-a", last=True)
    assert look(pool, schema, dead)[:3] == ("dead", 2, b.claim_token)

    # canceled while pending, then retried: pending under the old token, attempts back to 0
    retried = store.enqueue(Job("t")).id
    a = claim(store, "engine-a")
    reaped(store, pool, schema, retried)
    assert store.cancel(retried) and store.retry(retried)
    assert look(pool, schema, retried)[:3] == ("pending", 0, a.claim_token)
    assert not store.settle_lost(done(a), 1, "engine-a", last=True)
    assert look(pool, schema, retried)[:2] == ("pending", 0)
    c = claim(store, "engine-c")  # and its next run's claim, attempt 1 again
    assert not store.settle_lost(done(a), 1, "engine-a", last=True)
    assert look(pool, schema, retried)[:3] == ("processing", 1, c.claim_token)


def test_l3_a_lost_done_whose_row_is_locked_elsewhere_is_not_waited_for_and_written_after(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """An operator's open transaction holding the row: the late write answers 'locked' (None) at
    once, writes nothing and waits on nobody, on the outcome connection and inside a caller's
    transaction alike; once the lock is gone the same write goes through."""
    jid = store.enqueue(Job("t")).id
    a = claim(store, "engine-a")
    expire(pool, schema, jid)
    with psycopg.connect(dsn) as operator:
        operator.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(schema, "job")), (jid,)
        )
        assert store.settle_lost(done(a), 1, "engine-a", last=True) is None
        with store.begin() as tx:
            assert store.settle_lost(done(a), 1, "engine-a", last=True, tx=tx) is None
        assert look(pool, schema, jid)[0] == "processing"
        operator.rollback()
    assert store.settle_lost(done(a), 1, "engine-a", last=True) is True
    assert look(pool, schema, jid) == ("done", 1, a.claim_token, "engine-a", {"by": "engine-a"})


def test_l6_c9_a_late_done_found_written_by_a_try_whose_answer_was_lost_commits_no_closing_work_again(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """The first try's COMMIT went through, its answer was lost: the next try, with the same
    closing work in its transaction, finds the row already done under that claim. Alone that
    counts as written; inside the closing transaction it is not ours, so that transaction's
    chained jobs and callbacks roll back instead of being committed a second time."""
    jid = store.enqueue(Job("t")).id
    a = claim(store, "engine-a")
    expire(pool, schema, jid)
    with store.begin() as tx:
        store.enqueue_tx(tx, Job("chained"))
        assert store.settle_lost(done(a), 1, "engine-a", last=True, tx=tx) is True
    with pytest.raises(LookupError), store.begin() as tx:  # the try after the lost answer
        store.enqueue_tx(tx, Job("chained"))
        if not store.settle_lost(done(a), 1, "engine-a", last=True, tx=tx):
            raise LookupError("not ours")  # as the late-outcomes service rolls back a row not its own
    assert store.settle_lost(done(a), 1, "engine-a", last=True) is True
    assert q(pool, schema, "SELECT count(*) FROM {job} WHERE topic = 'chained'") == [(1,)]
