"""A poison verdict held back (SPEC L5, L6') whose row an operator holds locked, on real PostgreSQL.

Engine a ran the job's last attempt and lost its done with the store; the reaper returned the
row and engine b claimed it past max_attempts: b's verdict is held back for a's late done (L6').
An operator's open transaction holds the row (``SELECT ... FOR UPDATE`` in psql) when b's verdict
comes due. a's late done backs off on that lock, up to LATE_LOCKED_MAX between tries
(services/late.py). Whenever the lock goes, a's done must come first.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.engine.attempt import held
from brooq_py.engine.repo import Outcome
from brooq_py.engine.services import late
from brooq_py.postgres import Store
from brooq_py.queue import Job, KindOptions, State
from tests.integration.conftest import FAST, q
from tests.polling import wait_for


def look(pool: ConnectionPool[Any], schema: str, job_id: str) -> tuple[Any, ...]:
    (r,) = q(
        pool, schema, "SELECT state, attempts, claim_token::text, locked_by FROM {job} WHERE id = %s", job_id
    )
    return r


def test_l6_l5_a_verdict_that_met_a_lock_waits_once_it_goes_for_the_late_done_backing_off_on_it(
    store: Store,
    pool: ConnectionPool[Any],
    schema: str,
    dsn: str,
    engines: Callable[..., Engine],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lock goes just before the verdict's next turn after it met the lock; a's done tries
    again LATE_LOCKED_MAX later (its backoff's cap): written, over b's poison claim, done."""
    cap = 1.0
    monkeypatch.setattr(held, "LATE_LOCKED_MAX", cap)
    monkeypatch.setattr(late, "LOCKED_MAX", cap)
    jid = store.enqueue(Job("t")).id
    (first,) = store.claim(["t"], 1, "engine-a", timedelta(seconds=30))  # a's last attempt
    q(pool, schema, "UPDATE {job} SET locked_until = now() - interval '1 second' WHERE id = %s", jid)
    assert store.reap_expired() == [(jid, "t")]  # a's lease ran out while it could not write

    b = engines(lease=2)
    b.register_kind("t", lambda ctx, claim: None, KindOptions(max_attempts=1, **FAST))
    met = threading.Event()
    real = store.settle_many

    def settle_many(outcomes: Sequence[Outcome]) -> set[str]:
        written = real(outcomes)
        if getattr(written, "locked", None):
            met.set()
        return written

    monkeypatch.setattr(store, "settle_many", settle_many)
    b.start()
    wait_for(lambda: look(pool, schema, jid)[1] == 2, what="b's poison claim")
    with psycopg.connect(dsn, application_name="operator") as operator:
        operator.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(schema, "job")), [jid]
        )
        assert met.wait(10), "b's verdict never met the lock"
        at = time.monotonic()
        assert look(pool, schema, jid)[0] == "processing"
        time.sleep(max(0.0, at + 2 * cap - 0.3 - time.monotonic()))
        operator.commit()  # the lock goes
    time.sleep(cap)  # a's late done, backed off to its cap, tries again
    lost = Outcome(jid, first.claim_token, State.DONE, topic="t", result=json.dumps({"by": "a"}))
    assert store.settle_lost(lost, 1, "engine-a", True), look(pool, schema, jid)
    wait_for(lambda: not b.inflight.held(), what="b to let its poison claim go")
    assert look(pool, schema, jid) == ("done", 1, first.claim_token, "engine-a")
    assert not b.registry.get_sample_value("brooq_settle_total", {"topic": "t", "outcome": "dead"})
