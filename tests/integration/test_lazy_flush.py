"""The claim and the heartbeat wait for their WAL flush (SPEC P1, C1, C3).

A claim committed with ``synchronous_commit = off`` is acknowledged before its WAL is written:
the worker starts the handler, a crash of the server loses the claim, recovery shows the job
pending, and a second worker claims and runs it while the first still does (two workers at
once: P1 broken). tests/chaos/test_immediate_stop.py shows it with an immediate-mode stop;
this test keeps the claim's and the renewal's transactions synchronous.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.postgres import Store
from brooq_py.postgres.worker.repo import WorkerRepo
from brooq_py.queue import Job
from brooq_py.queue.port import HeldLease

LEASE = timedelta(seconds=60)


@pytest.fixture
def tx(dsn: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection in a transaction (not autocommit), search_path on the test schema."""
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.commit()
        yield conn


def sync_commit(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
    assert row is not None
    return str(row[0])


def test_p1_claim_and_renewal_commit_synchronously(store: Store, tx: psycopg.Connection[Any]) -> None:
    store.enqueue(Job("a", 1))
    assert sync_commit(tx) == "on"
    claimed = tx.execute(
        store.session.q["job_claim"].composed,
        {
            "topics": ["a"],
            "priority": [None],
            "after": [None],
            "slack": "2 seconds",
            "limit": 1,
            "worker": "w",
            "lease": LEASE,
        },
    ).fetchall()
    assert len(claimed) == 1
    assert sync_commit(tx) == "on"
    tx.commit()
    _id, token = claimed[0][0], claimed[0][5]
    params = WorkerRepo._renew_params([HeldLease(str(_id), str(token))])  # as the heartbeat sends them
    beat = {
        **params,
        "engine": "w",
        "host": "h",
        "pid": 1,
        "lease": LEASE,
        "margin": LEASE / 3,
        "orphans": True,
        "instance": None,
    }
    renewed = tx.execute(store.session.q["engine_beat"].composed, beat).fetchall()
    assert [(r[0], r[1]) for r in renewed] == [(str(token), "held")]
    assert sync_commit(tx) == "on"
    tx.commit()
