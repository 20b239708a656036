"""The bounds of a limited topic's claim (SET LOCAL in its transaction) leave nothing on the
connection, through a transaction-pooling PgBouncer."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.polling import wait_for


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_limited_claim_bounds_do_not_leak_through_pgbouncer(
    dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    from tests.integration.pgbouncer import pgbouncer, pgbouncer_binary

    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip("no pgbouncer")
    started: list[Any] = []
    with (
        pgbouncer(dsn, binary) as bdsn,
        ConnectionPool(bdsn, min_size=1, max_size=2, open=True, kwargs={"prepare_threshold": None}) as bpool,
    ):
        s = Store(bpool, schema=schema)
        s.set_rate_limit("lim", 1000)
        e = engines(s, workers=2, poll_interval=0.2, lease=30)
        e.register_kind("lim", lambda ctx, claim: started.append(claim.payload))
        e.start()
        for i in range(30):
            s.enqueue(Job("lim", i))
        wait_for(lambda: len(started) == 30, "30 limited jobs run", timeout=60)
        seen = set()
        for _ in range(200):
            with bpool.connection() as c:
                seen.add(
                    tuple(
                        c.execute(
                            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
                        ).fetchone()
                    )
                )
        with psycopg.connect(bdsn, prepare_threshold=None) as c:
            for _ in range(50):
                seen.add(
                    tuple(
                        c.execute(
                            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
                        ).fetchone()
                    )
                )
                c.commit()
        s.close()
    assert seen == {("0", "0")}, seen
