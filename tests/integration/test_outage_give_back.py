"""Where a durable call's outage (docs/durable.md: taken back as a crash) ends: a handler's own Snooze
chained from another database's outage, and a step's fn that raises StoreUnavailable from another
store, keep their usual rules (DS3: given back, never a crash; DS1: a failed attempt)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, Snooze, State, StoreUnavailable, Tx
from tests.integration.test_durable_steps import ended


@pytest.fixture
def down_store(dsn: str, schema: str) -> Iterator[Store]:
    """A second brooq Store whose database is away (its pool closed): every call raises
    StoreUnavailable, as an unreachable second database's Store does."""
    pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=0, max_size=1, open=True)
    pool.close()
    s = Store(pool, schema=schema)
    with pytest.raises(StoreUnavailable):
        s.enqueue(Job("audit", {}))
    yield s


# --- a handler's own Snooze, chained from an outage ----------------------------------------------


def test_a_users_snooze_chained_from_an_outage_never_makes_the_job_dead(
    store: Store, down_store: Store, engines: Callable[..., Engine]
) -> None:
    """DS3 / docs/durable.md: ``raise Snooze(delay)`` moves the job back to scheduled, the attempt
    given back, nothing recorded; it never makes a job dead. A handler that meets another database's
    outage and snoozes, chaining the cause as Python style asks (``raise Snooze(d) from exc``), is now
    taken for a durable call's outage (outcome.decide keys on ``snooze.__cause__``): each snooze counts
    a crash, and at max_crashes (3) the job ends dead, "3 engines stopped while running it", though no
    engine stopped and no durable call ran (as it was, keyed on ``__cause__``)."""
    runs: list[int] = []

    def handler(ctx: Context, claim: Claim) -> Any:
        runs.append(1)
        if len(runs) <= 3:  # the other database comes back after three tries
            try:
                down_store.enqueue(Job("audit", {"job": claim.id}))
            except StoreUnavailable as exc:
                raise Snooze(0.05) from exc
        return "ok"

    e = engines(workers=1)
    e.register_kind("rv.snooze", handler, KindOptions(max_attempts=5, max_crashes=3))
    jid = store.enqueue(Job("rv.snooze")).id
    e.start()
    row = ended(store, jid)
    assert row.state is State.DONE, (row.state, row.crashes, row.attempts, row.last_error, len(runs))
    assert row.crashes == 0


# --- a step's fn that raises StoreUnavailable of another store ----------------------------------


@pytest.mark.parametrize("how", ["step", "transaction_step"])
def test_a_steps_fn_raising_store_unavailable_fails_the_attempt_by_the_usual_rules(
    store: Store, down_store: Store, engines: Callable[..., Engine], how: str
) -> None:
    """DS1 / docs/durable.md: "A step that raises records nothing; the attempt fails by the usual rules
    (retried with backoff, dead after max_attempts)". fn itself raises StoreUnavailable (it calls
    another database's Store, which is down; the step's own transaction is healthy): both ``ctx.step``
    and ``ctx.transaction_step`` fail the attempt (4 failed attempts, errors kept). Only the
    transaction's own lost connection is an outage (it gave the attempt back, a crash each run)."""
    runs: list[int] = []

    def fn_tx(tx: Tx) -> str:
        runs.append(1)
        tx.execute("SELECT 1")
        down_store.enqueue(Job("audit", {}))
        return "never"

    def fn() -> str:
        runs.append(1)
        down_store.enqueue(Job("audit", {}))
        return "never"

    def handler(ctx: Context, claim: Claim) -> Any:
        if how == "step":
            return ctx.step("audit", fn)
        return ctx.transaction_step("audit", fn_tx)

    e = engines(workers=1)
    e.register_kind("rv.fn", handler, KindOptions(max_attempts=4, max_crashes=3))
    jid = store.enqueue(Job("rv.fn")).id
    e.start()
    row = ended(store, jid)
    assert row.state is State.DEAD
    assert (row.crashes, row.attempts, len(row.errors)) == (0, 4, 4), (
        how,
        row.crashes,
        row.attempts,
        len(row.errors),
        row.last_error,
        len(runs),
    )
