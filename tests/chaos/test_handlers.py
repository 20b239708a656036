"""Handlers that misbehave: hang ignoring ctx, raise oddly, run longer than the lease (SPEC C3-C6, P2, P3)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from brooq_py import Config, Engine, Job, KindOptions
from brooq_py.postgres import Store
from brooq_py.queue import State
from tests.chaos import invariants
from tests.polling import wait_for


class OddBase(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception raises")


@pytest.fixture
def chaos_store(dsn: str, chaos_schema: str) -> Iterator[Store]:
    pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=8, open=True)
    store = Store(pool, schema=chaos_schema)
    try:
        yield store
    finally:
        store.close()
        pool.close()


def test_misbehaving_handlers_C4_C5_C6_P3(dsn: str, chaos_schema: str, chaos_store: Store) -> None:
    release = threading.Event()
    opts = KindOptions(
        max_attempts=3, attempt_timeout=0.5, max_execution_timeout=30, backoff_base=0.05, backoff_max=0.1
    )

    hung: list[str] = []

    def hang_once(ctx: Any, claim: Any) -> None:
        if not hung:
            hung.append(claim.claim_token)
            release.wait(30)  # ignores ctx entirely
            return

    def odd_base(ctx: Any, claim: Any) -> None:
        if claim.attempt == 1:
            raise OddBase("not an Exception")

    def unprintable(ctx: Any, claim: Any) -> None:
        if claim.attempt == 1:
            raise UnprintableError()

    def huge(ctx: Any, claim: Any) -> None:
        raise ValueError("x" * 1_000_000)

    def long_heartbeating(ctx: Any, claim: Any) -> None:
        assert not ctx.wait(5.0), ctx.cause  # 2.5 leases: the heartbeat keeps the lease

    handlers = {
        "chaos": long_heartbeating,
        "h.hang": hang_once,
        "h.odd": odd_base,
        "h.unprintable": unprintable,
        "h.huge": huge,
    }
    config = Config(
        workers=6, lease=2, reaper_period=0.5, poll_interval=0.2, watchdog_grace=0.5, retention_ttl=0
    )
    engine = Engine(chaos_store, config)
    for topic, fn in handlers.items():
        engine.register_kind(topic, fn, opts if topic != "chaos" else KindOptions(attempt_timeout=30))
    ids = {t: chaos_store.enqueue(Job(t, {"t": t})).id for t in handlers}
    engine.start()
    try:

        def all_terminal() -> bool:
            rows = [chaos_store.get(i) for i in ids.values()]
            return all(r is not None and r.state in (State.DONE, State.DEAD) for r in rows)

        wait_for(all_terminal, "every misbehaving job to end", timeout=60)
    finally:
        release.set()
        engine.close()
    rows = {t: chaos_store.get(i) for t, i in ids.items()}
    assert all(r is not None for r in rows.values())
    hang, odd, unp, big, long = (rows[t] for t in ("h.hang", "h.odd", "h.unprintable", "h.huge", "chaos"))
    assert (
        hang and hang.state == State.DONE and hang.attempts == 1 and hang.crashes == 1
    )  # hung once: taken back as a crash, its attempt given back (L5')
    assert odd and odd.state == State.DONE and odd.attempts == 2 and "OddBase" in (odd.last_error or "")
    assert (
        unp and unp.state == State.DONE and unp.attempts == 2 and "UnprintableError" in (unp.last_error or "")
    )
    assert big and big.state == State.DEAD and big.attempts == 3
    assert (
        big.last_error is not None
        and big.last_error.startswith("ValueError: xxx")
        and len(big.last_error) < 10_000
    )
    assert long and long.state == State.DONE and long.attempts == 1
    report = invariants.check(dsn, chaos_schema, set(ids.values()))
    report.assert_ok()
    assert report.reaps == 1  # the hung handler's claim, and only it
