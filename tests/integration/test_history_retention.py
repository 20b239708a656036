"""SPEC B2 with T1: what a retention tick does when the mover or the drop meets another
session's lock: a maintenance lock on `job` (VACUUM, ANALYZE, CREATE INDEX CONCURRENTLY hold SHARE
UPDATE EXCLUSIVE, which CREATE TABLE ... INHERITS job needs), another engine's drop of the same day."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine.services.cleanup import Retention
from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.history import TTL, days, ended, move, where
from tests.integration.marks import blocked_by, in_thread
from tests.polling import wait_for

log = logging.getLogger("test_attack_history_retention")


def _retention(store: Store, ttl: timedelta = TTL) -> Retention:
    return Retention(
        timedelta(seconds=60),
        ttl,
        100,
        store.delete_terminal,
        lambda topic, n: None,
        log,
        pause=lambda s: None,
        history=timedelta(seconds=0.5),
        move=store.move_terminal,
        drop=store.drop_history,
    )


def test_b2_a_maintenance_lock_on_job_holds_off_the_moves_not_the_deletes(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """A job ended a second ago needs today's table, which does not exist yet; another session
    holds SHARE UPDATE EXCLUSIVE on job (as VACUUM / ANALYZE / CREATE INDEX CONCURRENTLY do).
    The tick moves nothing (the table waits for the next pass) and still deletes the row past the
    ttl: rows past the ttl never wait for the moves."""
    expired = store.enqueue(Job("h", {"n": "old"})).id
    fresh = store.enqueue(Job("h", {"n": "new"})).id
    ended(dsn, schema, [expired], "done", days_ago=40)
    ended(dsn, schema, [fresh], "done")
    retention = _retention(store)
    with psycopg.connect(dsn) as maint:
        maint.execute(
            sql.SQL("LOCK TABLE ONLY {} IN SHARE UPDATE EXCLUSIVE MODE").format(sql.Identifier(schema, "job"))
        )
        error: BaseException | None = None
        try:
            retention.run_once()
        except BaseException as exc:
            error = exc
        maint.rollback()
    assert store.get(expired) is None, f"the expired row survived the tick (the tick raised {error!r})"
    assert error is None, f"the tick raised {error!r}"


def test_b2_a_drop_that_waited_for_another_engines_drop_of_the_same_day_finds_nothing(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """Two engines' retention ticks meet on one day older than the ttl: the first holds the day's
    lock while it keeps/forgets/drops (simulated by hand: LOCK + DROP in an open transaction), the
    second waits, then the table is gone: the second finds nothing to do, and the rest of its
    tick (the row-by-row delete) is done."""
    old = store.enqueue(Job("h", {})).id
    expired = store.enqueue(Job("h", {"n": "x"})).id
    ended(dsn, schema, [old], "done", days_ago=15)
    assert move(store)
    ended(dsn, schema, [expired], "done", days_ago=12)  # in job, past the 10-day ttl below
    (table,) = days(pool, schema)
    with psycopg.connect(dsn) as other:
        other.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.SQL(table)))
        other.execute(sql.SQL("DROP TABLE {}").format(sql.SQL(table)))
        retention = _retention(store, timedelta(days=10))
        t, _, errors = in_thread(retention.run_once)
        wait_for(lambda: blocked_by(dsn, other.info.backend_pid) > 0, "the second drop to wait", 30)
        other.commit()
        t.join(30)
    assert not errors, errors
    assert store.get(expired) is None


def test_b2_store_drop_history_alone_after_a_concurrent_drop(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """As above, through store.drop_history directly (the second engine's call, which asks for the
    lock without waiting while the first holds it, then finds the table gone, or no longer listed)."""
    old = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [old], "done", days_ago=15)
    assert move(store)
    (table,) = days(pool, schema)
    with psycopg.connect(dsn) as other:
        other.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.SQL(table)))
        t, _, errors = in_thread(lambda: store.drop_history(timedelta(days=10)))
        other.execute(sql.SQL("DROP TABLE {}").format(sql.SQL(table)))
        other.commit()
        t.join(30)
    assert not errors, errors
    assert where(pool, schema, old) is None
