"""Attacks on the engine core's promises against real PostgreSQL (SPEC P1'', F0, L5', O4, W0).

Each test names a way the core might break a promise: a claim sent by an engine whose proof of
life is stale, two engines sharing a worker id, an outcome batch holding two claims of one job,
the row versions a job writes while heartbeats and progress go on.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.postgres import Store
from brooq_py.queue import Job
from brooq_py.queue.port import EngineProof

LEASE = timedelta(seconds=60)


@pytest.fixture
def db(dsn: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A raw autocommit connection with search_path on the test schema (test-side SQL only)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield conn


def test_p1_f0_a_claim_by_an_engine_whose_proof_is_stale_is_never_reapable_at_once(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """An engine that decided it may claim and then stalled (GC, swap, SIGSTOP) past lease +
    margin sends its claim with a proof of life the database already holds for gone. Rows it
    claims then would be the reaper's at once: another engine could run them while this one
    starts them too. The claim must take nothing (or nothing another engine may take)."""
    store.enqueue(Job("a"))
    store.beat(EngineProof("w", "host", 1, LEASE, LEASE / 3), [])
    db.execute("UPDATE engine SET seen_at = now() - interval '1 hour' WHERE id = 'w'")
    claimed = store.claim(["a"], 1, "w", LEASE)
    reaped = store.reap_expired()  # another engine's reaper, the next moment
    assert not (claimed and reaped), "a claim of a stale engine was reaped at once: two runners"


def test_p1_f0_a_claim_just_inside_the_proof_leaves_the_engine_time_to_fence_first(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """A claim sent when the engine's proof is older than lease - margin on the database clock
    (its own fence is due) would be reapable within moments: the claim takes nothing."""
    store.enqueue(Job("a"))
    store.beat(EngineProof("w", "host", 1, LEASE, LEASE / 3), [])
    db.execute("UPDATE engine SET seen_at = now() - interval '41 seconds' WHERE id = 'w'")
    assert store.claim(["a"], 1, "w", LEASE) == []
    db.execute("UPDATE engine SET seen_at = now() - interval '39 seconds' WHERE id = 'w'")
    assert len(store.claim(["a"], 1, "w", LEASE)) == 1  # a young enough proof claims as before


def test_p1_an_engine_with_no_row_yet_claims_under_the_rows_own_lease(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """run_once and testing.drain claim with no engine row: the row's locked_until guards it."""
    store.enqueue(Job("a"))
    [c] = store.claim(["a"], 1, "solo", LEASE)
    assert store.reap_expired() == []
    assert c.locked_by == "solo"


def test_p1_f0_a_limited_topics_claim_by_a_stale_engine_takes_nothing(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """The same for a globally limited topic's claim (its own statement, under the topic's lock)."""
    store.enqueue(Job("a"))
    store.set_limit("a", 5)
    store.beat(EngineProof("w", "host", 1, LEASE, LEASE / 3), [])
    db.execute("UPDATE engine SET seen_at = now() - interval '1 hour' WHERE id = 'w'")
    assert list(store.claim_limited("a", 1, "w", LEASE)) == []
    db.execute("UPDATE engine SET seen_at = now() WHERE id = 'w'")
    assert len(store.claim_limited("a", 1, "w", LEASE)) == 1
