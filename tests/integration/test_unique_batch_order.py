"""Concurrent enqueue_many batches in callers' transactions sharing keys in other orders:
is a deadlock (40P01) possible in the common shapes?"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import psycopg

from brooq_py.postgres import Store
from brooq_py.queue import Job

N = 3000
ROUNDS = 6


def _race(store: Store, dsn: str, make: Callable[[int, int], list[Job]]) -> list[str]:
    """ROUNDS rounds of two transactions, each enqueue_many(make(side, round)) then commit, started
    together; the errors, by name."""
    errors: list[str] = []
    for r in range(ROUNDS):
        barrier = threading.Barrier(2)

        def side(n: int, r: int = r, barrier: threading.Barrier = barrier) -> None:
            try:
                with psycopg.connect(dsn) as conn:
                    conn.execute("SELECT 1")
                    jobs = make(n, r)
                    barrier.wait(30)
                    store.enqueue_many(jobs, tx=conn)
                    conn.commit()
            except Exception as exc:
                errors.append(f"round {r} side {n}: {type(exc).__name__}: {str(exc).splitlines()[0]}")

        ts = [threading.Thread(target=side, args=(n,)) for n in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
    return errors


def test_unique_only_batches_in_random_orders(store: Store, dsn: str) -> None:
    def make(n: int, r: int) -> list[Job]:
        keys = [f"r{r}u{i:05}" for i in range(N)]
        random.Random(n * 100 + r).shuffle(keys)
        return [Job("t", i, unique_key=k) for i, k in enumerate(keys)]

    assert _race(store, dsn, make) == []


def test_both_keys_same_pairing_in_random_orders(store: Store, dsn: str) -> None:
    def make(n: int, r: int) -> list[Job]:
        idx = list(range(N))
        random.Random(n * 100 + r).shuffle(idx)
        return [Job("t", i, idempotency_key=f"r{r}k{i:05}", unique_key=f"r{r}u{i:05}") for i in idx]

    assert _race(store, dsn, make) == []


def test_unique_batches_where_some_jobs_also_carry_an_idempotency_key(store: Store, dsn: str) -> None:
    """One batch debounces by unique key alone; the other enqueues the same unique keys, half of them
    also with an idempotency key ("charge once" and "one at a time", docs/unique-jobs.md: a job may
    carry both). Common enough: a retried request adds a request id to some of them."""

    def make(n: int, r: int) -> list[Job]:
        if n == 0:
            return [Job("t", i, unique_key=f"r{r}u{i:05}") for i in range(N)]
        return [
            Job(
                "t",
                i,
                unique_key=f"r{r}u{i:05}",
                idempotency_key=f"r{r}req{N - i:05}" if i >= N // 2 else None,
            )
            for i in range(N)
        ]

    errors = _race(store, dsn, make)
    assert not any("Deadlock" in e for e in errors), errors
