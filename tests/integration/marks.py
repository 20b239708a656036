"""Helpers of the tests of tenant marks and of a caller's open transaction (test_tenant_mark*.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from brooq_py.postgres import Store


def marked(store: Store) -> set[str]:
    """The topics the engine's view calls tenant topics (SPEC T1)."""
    return {s.topic for s in store.worker.topic_settings() if s.tenants}


def blocked_by(dsn: str, pid: int) -> int:
    """How many backends wait on a lock *pid* holds."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))", (pid,)
        ).fetchone()
        assert row is not None
        return int(row[0])


def lock_waiter(dsn: str, table: str) -> int | None:
    """A backend waiting for a lock on *table* (a relation's name), if one is."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT pid FROM pg_locks WHERE NOT granted AND relation = %s::regclass LIMIT 1", (table,)
        ).fetchone()
    return None if row is None else int(row[0])


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any], list[BaseException]]:
    """Run *fn* on a thread of its own: the thread, what it returned, what it raised."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out, errors


def done(dsn: str, schema: str, topic: str) -> int:
    """How many jobs of *topic* are done."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE topic = %s AND state = 'done'").format(
                sql.Identifier(schema, "job")
            ),
            (topic,),
        ).fetchone()
        assert row is not None
        return int(row[0])
