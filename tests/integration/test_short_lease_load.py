"""Many engines with a short lease (5 s) under load: every job runs once, none is given back or
counted a crash (SPEC P1'', L5')."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job
from tests.integration.conftest import q
from tests.polling import wait_for


def test_short_lease_under_load_every_job_once_no_crash(
    store: Store, engines: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="brooq_py.engine")
    topics = [f"short.load{i}" for i in range(6)]
    ran: dict[str, int] = {}

    def handler(ctx: Context, claim: Claim) -> None:
        ran[claim.id] = ran.get(claim.id, 0) + 1

    es = [engines(workers=8, lease=5, poll_interval=0.05) for _ in range(3)]
    for e in es:
        for t in topics:
            e.register_kind(t, handler)
        e.start()
    n = 3000
    store.enqueue_many(
        [Job(topics[i % len(topics)], {"i": i}, tenant=f"t{i % 7}" if i % 2 else None) for i in range(n)]
    )
    pool, schema = store.session.pool, store.schema
    wait_for(
        lambda: q(pool, schema, "SELECT count(*) FROM {job} WHERE state = 'done'")[0][0] == n, "all done", 300
    )
    handed = [
        r for r in caplog.records if "not run here" in r.getMessage() or "never run here" in r.getMessage()
    ]
    assert handed == [], [r.getMessage() for r in handed[:5]]
    bad = q(pool, schema, "SELECT count(*) FROM {job} WHERE attempts <> 1 OR crashes <> 0")[0][0]
    assert bad == 0, bad
    assert len(ran) == n and max(ran.values()) == 1
