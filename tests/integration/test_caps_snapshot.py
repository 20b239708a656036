"""a caller's settings and snapshot vs the Store's shared state."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from brooq_py.postgres import Store
from brooq_py.queue import Job, QueueFull


def test_a_repeatable_read_callers_old_snapshot_does_not_lift_a_depth_cap(
    store: Store, dsn: str, schema: str
) -> None:
    """An RR transaction whose snapshot predates set_max_depth enqueues through the Store: the caps it
    reads (none) must not become the Store's for its other callers (F2: a full topic raises QueueFull)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")  # snapshot before the cap
        store.set_max_depth("capped", 3)
        store.enqueue_tx(conn, Job("other", 1))  # the Store reads the caps in the caller's snapshot
        written, refused = 0, 0
        for i in range(10):
            try:
                store.enqueue(Job("capped", i))
                written += 1
            except QueueFull:
                refused += 1
        conn.rollback()
    with psycopg.connect(dsn) as c:
        n = c.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE topic = 'capped'").format(sql.Identifier(schema, "job"))
        ).fetchone()[0]
    assert n <= 3, f"{n} jobs of a topic capped at 3 ({written} written, {refused} refused)"


def test_enqueue_tx_keeps_the_callers_timeouts(store: Store, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SET statement_timeout = '1234ms'")
        conn.execute("SET lock_timeout = '567ms'")
        store.set_max_depth("capped2", 100)
        for job in (
            Job("t", 1),
            Job("t", 1, idempotency_key="k"),
            Job("t", 1, unique_key="u"),
            Job("capped2", 1),
            Job("s", 1, sequence="q"),
        ):
            store.enqueue_tx(conn, job)
        store.signal(store.enqueue_tx(conn, Job("t", 2)).id, "go", tx=conn)
        got = conn.execute(
            "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
        ).fetchone()
        conn.commit()
    assert got == ("1234ms", "567ms")


def test_callers_lock_timeout_on_a_held_key_aborts_only_as_any_statement_would(
    store: Store, dsn: str
) -> None:
    """Informational: a key held by another open transaction, and the caller's lock_timeout: the wait
    is ended by the caller's own setting (LockNotAvailable), as any conflicting write would be."""
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn) as conn:
        store.enqueue_tx(holder, Job("t", 0, idempotency_key="held"))
        conn.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            store.enqueue_tx(conn, Job("t", 1, idempotency_key="held"))
        holder.rollback()
