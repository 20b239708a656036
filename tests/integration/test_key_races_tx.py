"""keyed and unique enqueues racing another transaction on the same key."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.pq import TransactionStatus

from brooq_py.postgres import Store
from brooq_py.queue import EnqueueResult, Job


def _count(dsn: str, schema: str, where: str = "true") -> int:
    with psycopg.connect(dsn) as c:
        return c.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE " + where).format(sql.Identifier(schema, "job"))
        ).fetchone()[0]


def _blocked(dsn: str, pid: int) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        return bool(
            c.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()[0]
        )


def _race(
    store: Store, dsn: str, first: Callable[[Any], Any], second: Callable[[Any], Any], commit_first: bool
):
    """first() in T1 (left open), second() in T2 from a thread; T1 then commits or rolls back."""
    from tests.polling import wait_for

    out: dict[str, Any] = {}
    with psycopg.connect(dsn) as t1:
        out["first"] = first(t1)
        with psycopg.connect(dsn) as t2:
            pid = t2.info.backend_pid

            def run() -> None:
                try:
                    out["second"] = second(t2)
                    out["status"] = t2.info.transaction_status
                    t2.commit()
                except BaseException as exc:
                    out["error"] = exc

            th = threading.Thread(target=run)
            th.start()
            wait_for(lambda: _blocked(dsn, pid) or not th.is_alive(), "T2 waits on T1's key", timeout=30)
            out["waited"] = th.is_alive()
            if commit_first:
                t1.commit()
            else:
                t1.rollback()
            th.join(60)
            assert not th.is_alive()
    return out


@pytest.mark.parametrize("commit_first", [True, False])
@pytest.mark.parametrize(
    "make",
    [
        lambda n: Job("t", n, idempotency_key="K"),
        lambda n: Job("t", n, unique_key="U"),
        lambda n: Job("t", n, unique_key="U", on_duplicate="replace"),
        lambda n: Job("t", n, unique_key="U", on_duplicate="merge"),
        lambda n: Job("t", n, idempotency_key=f"K{n}", unique_key="U"),
    ],
    ids=["key", "unique-keep", "unique-replace", "unique-merge", "key+unique"],
)
def test_single_enqueue_races_an_open_transaction(
    store: Store, dsn: str, schema: str, make: Callable[[int], Job], commit_first: bool
) -> None:
    out = _race(
        store,
        dsn,
        lambda c: store.enqueue_tx(c, make(1)),
        lambda c: store.enqueue_tx(c, make(2)),
        commit_first,
    )
    assert "error" not in out, out.get("error")
    first: EnqueueResult = out["first"]
    second: EnqueueResult = out["second"]
    assert out["status"] == TransactionStatus.INTRANS
    if commit_first:
        assert (second.id, second.created) == (first.id, False)
        assert _count(dsn, schema) == 1
    else:
        assert second.created and second.id != first.id
        assert _count(dsn, schema) == 1
        assert store.get(second.id) is not None


@pytest.mark.parametrize("commit_first", [True, False])
def test_enqueue_many_races_an_open_transaction(
    store: Store, dsn: str, schema: str, commit_first: bool
) -> None:
    out = _race(
        store,
        dsn,
        lambda c: store.enqueue_many([Job("t", 1, idempotency_key="A"), Job("t", 1, unique_key="B")], tx=c),
        lambda c: store.enqueue_many([Job("t", 2, unique_key="B"), Job("t", 2, idempotency_key="A")], tx=c),
        commit_first,
    )
    assert "error" not in out, out.get("error")
    f, s = out["first"], out["second"]
    if commit_first:
        assert [(r.id, r.created) for r in s] == [(f[1].id, False), (f[0].id, False)]
    else:
        assert all(r.created for r in s)
    assert _count(dsn, schema) == 2


def test_two_batches_of_the_same_keys_never_deadlock(store: Store, dsn: str, schema: str) -> None:
    """job_enqueue_many_unique promises: two batches of the same keys, given in other orders, never
    deadlock (each writes its rows in unique-key order). Not promised, documented in
    docs/unique-jobs.md: a job without a unique key sharing an idempotency key with another batch's
    unique job (those can meet in two orders; PostgreSQL aborts one transaction)."""

    b1 = [
        Job("t", 1, idempotency_key="a", unique_key="u1"),
        Job("t", 2, idempotency_key="b", unique_key="u2"),
    ]
    b2 = [
        Job("t", 3, idempotency_key="b", unique_key="u2"),
        Job("t", 4, idempotency_key="a", unique_key="u1"),
    ]
    barrier = threading.Barrier(2)
    results: dict[int, Any] = {}

    def run(n: int, batch: list[Job]) -> None:
        with psycopg.connect(dsn) as c:
            try:
                # each takes its first row's keys, then both go on
                store.enqueue_tx(c, batch[0].__class__(batch[0].topic, 0, unique_key=f"lock{n}"))
                barrier.wait(10)
                results[n] = store.enqueue_many(batch, tx=c)
                c.commit()
            except BaseException as exc:
                results[n] = exc

    ts = [threading.Thread(target=run, args=(n, b)) for n, b in ((1, b1), (2, b2))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    errors = [r for r in results.values() if isinstance(r, BaseException)]
    assert not errors, errors


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_snapshot_isolation_duplicate_committed_after_snapshot_then_retry(
    store: Store, dsn: str, level: str
) -> None:
    """E2: under RR/SERIALIZABLE a concurrent committed duplicate raises a serialization failure (as
    documented); the retry in a new transaction answers the holder's id, created=False."""
    with psycopg.connect(dsn) as conn:
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        conn.execute("SELECT 1")
        holder = store.enqueue(Job("t", 0, idempotency_key="dup")).id
        with pytest.raises(psycopg.errors.SerializationFailure):
            store.enqueue_tx(conn, Job("t", 1, idempotency_key="dup"))
        conn.rollback()
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        again = store.enqueue_tx(conn, Job("t", 1, idempotency_key="dup"))
        conn.commit()
    assert (again.id, again.created) == (holder, False)
