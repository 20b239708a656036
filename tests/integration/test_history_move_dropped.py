"""SPEC B2 at the moment the mover's connection is lost: the server ends the backend while the move's
transaction waits for the day's lock (an operator's pg_terminate_backend, a failover, a network cut).
The move's DELETE from job and its INSERT into the day are one transaction: none of it commits, every
job stays in job exactly once, and the next pass moves them all (the mover's mark passes only what a
committed move took)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.conftest import q
from tests.integration.history import AFTER, TTL, ended, short
from tests.integration.marks import in_thread, lock_waiter
from tests.polling import wait_for


def _places(pool: ConnectionPool[Any], schema: str, ids: list[str]) -> dict[str, list[str]]:
    """Each of *ids*: the tables that hold a row of it (job and the days alike)."""
    rows = q(
        pool, schema, "SELECT id::text, tableoid::regclass::text FROM {job} WHERE id = ANY(%s::uuid[])", ids
    )
    places: dict[str, list[str]] = {i: [] for i in ids}
    for job_id, table in rows:
        places[str(job_id)].append(short(str(table)))
    return places


def test_b2_a_move_whose_connection_is_ended_mid_transaction_loses_and_doubles_nothing(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], day_table: str
) -> None:
    ids = [store.enqueue(Job("h", {"n": i})).id for i in range(20)]
    for i, job_id in enumerate(ids):  # each ended a second apart: the mover's mark falls between them
        ended(dsn, schema, [job_id], "done", days_ago=(i + 1) / 86400)
    mover = Store(pool, schema=schema)  # a mark of its own: the day_table fixture's move passed a later time
    try:
        with psycopg.connect(dsn) as operator:
            operator.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.SQL(day_table)))
            t, _, errors = in_thread(lambda: mover.move_terminal(AFTER, TTL, 100))
            pid = wait_for(
                lambda: lock_waiter(dsn, day_table), timeout=30, what="the move waiting for the day"
            )
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            t.join(30)
            assert not t.is_alive(), "the tick did not come back after its connection was ended"
            operator.rollback()  # the ended backend's transaction is gone: nothing of it can commit now
        places = _places(pool, schema, ids)
        assert all(p == ["job"] for p in places.values()), {i: p for i, p in places.items() if p != ["job"]}
        assert [type(e).__name__ for e in errors] == ["StoreUnavailable"], errors
        assert "moving terminal jobs" in str(errors[0]), errors

        moved = mover.move_terminal(AFTER, TTL, 100)  # the next pass, on a fresh connection
        assert sorted(i for i, _ in moved) == sorted(ids)
        places = _places(pool, schema, ids)
        assert all(len(p) == 1 and p[0].startswith("job_history_") for p in places.values()), places
    finally:
        mover.close()
