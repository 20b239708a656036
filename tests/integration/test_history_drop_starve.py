"""SPEC B2: the drop's NOWAIT loop (20 tries 50 ms apart, then the next pass) under a
steady stream of short readers of job (each holds every day's table while it reads). Does the day
ever go, and does anything leak (a transaction left open, a pool connection kept)?"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome
from tests.integration.history import days, ended, move
from tests.integration.marks import in_thread

TEN = timedelta(days=10)
LEASE = timedelta(seconds=60)
PASSES = 10


def old_day(dsn: str, schema: str, store: Store) -> str:
    old = store.enqueue(Job("old", {})).id
    ended(dsn, schema, [old], "done", days_ago=15)
    assert move(store)
    return old


def open_transactions(dsn: str, schema: str) -> list[Any]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(
            "SELECT pid, state, query FROM pg_stat_activity WHERE state LIKE 'idle in transaction%%'"
            " AND position(%s in query) > 0",
            (schema,),
        ).fetchall()


def run_beside(readers: int, read: Callable[[], Any], store: Store) -> tuple[list[Any], int]:
    """*readers* threads call *read* in a loop while the drop makes PASSES passes; what each pass
    dropped, and how many reads ran."""
    stop = threading.Event()
    count = [0]
    lock = threading.Lock()

    def loop() -> None:
        while not stop.is_set():
            read()
            with lock:
                count[0] += 1

    threads = [in_thread(loop) for _ in range(readers)]
    passes = []
    try:
        for _ in range(PASSES):
            got = store.drop_history(TEN)
            passes.append(got)
            if got:
                break
    finally:
        stop.set()
        for t, _, errors in threads:
            t.join(60)
            assert not errors, errors
    return passes, count[0]


@pytest.mark.parametrize("readers", [2, 4])
def test_b2_drop_beside_steady_short_gets(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], readers: int
) -> None:
    old = old_day(dsn, schema, store)
    passes, reads = run_beside(readers, lambda: store.get(old), store)
    assert open_transactions(dsn, schema) == []
    stats = pool.get_stats()
    assert stats.get("requests_waiting", 0) == 0
    assert any(passes), f"{len(passes)} passes, none dropped the day beside {readers} readers ({reads} reads)"
    assert days(pool, schema) == []


def test_b2_drop_beside_steady_sequence_settles(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """The engine's own work: sequence members settled one after another (their triggers read
    job with its children), on two threads."""
    old_day(dsn, schema, store)
    for s in ("a", "b"):
        store.enqueue_many([Job("seq", {"n": i}, sequence=s) for i in range(3000)])
    store.stage(["seq"], 10000)
    settlers = [Store(pool, schema=schema) for _ in range(2)]
    free = list(settlers)
    lock = threading.Lock()
    local = threading.local()

    def settle_next() -> None:
        s = getattr(local, "s", None)
        if s is None:
            with lock:
                s = local.s = free.pop()
        claimed = s.claim(["seq"], 1, "w", LEASE)
        if not claimed:
            s.stage(["seq"], 1000)
            return
        (c,) = claimed
        s.worker.settle_many([Outcome(c.id, c.claim_token, State.DONE, topic="seq")])

    try:
        passes, settles = run_beside(2, settle_next, store)
    finally:
        for s in settlers:
            s.close()
    assert open_transactions(dsn, schema) == []
    assert any(passes), f"{len(passes)} passes, none dropped the day beside 2 settlers ({settles} settles)"
