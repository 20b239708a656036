"""Behind a real PgBouncer in transaction mode the producer and the engine work (SPEC Z5, Z3).

The pool goes through the bouncer with ``prepare_threshold=None``; LISTEN and
the heartbeat use a direct ``conninfo``. With the bouncer only, LISTEN is
refused in one log line and polling carries the work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, State
from brooq_py.queue.port import EngineProof, HeldLease
from tests.integration.pgbouncer import pgbouncer, pgbouncer_binary
from tests.polling import wait_for


@pytest.fixture(scope="module")
def bouncer(dsn: str) -> Iterator[str]:
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)")
    with pgbouncer(dsn, binary) as url:
        yield url


@pytest.fixture
def bounced_pool(bouncer: str) -> Iterator[ConnectionPool[Any]]:
    p: ConnectionPool[Any] = ConnectionPool(
        bouncer, min_size=1, max_size=6, open=True, kwargs={"prepare_threshold": None}
    )
    try:
        yield p
    finally:
        p.close()


def run_jobs(
    store: Store, config: Config, n: int, until: tuple[Callable[[], object], str] | None = None
) -> None:
    """Enqueue n ready jobs (one inside a transaction) and 3 scheduled ones; an engine runs them all
    (and runs on until *until*'s condition holds, when given)."""
    done: list[int] = []
    lock = threading.Lock()

    def handler(ctx: Context, claim: Claim) -> None:
        with lock:
            done.append(claim.payload)

    engine = Engine(store, config)
    engine.register_kind("z5", handler)
    engine.start()
    try:
        ids = [r.id for r in store.enqueue_many([Job("z5", i) for i in range(n)])]
        with store.begin() as tx:
            ids.append(store.enqueue_tx(tx, Job("z5", n)).id)
        soon = datetime.now(UTC) + timedelta(seconds=1)
        ids += [store.enqueue(Job("z5", n + 1 + i, available_at=soon)).id for i in range(3)]
        wait_for(lambda: len(done) == n + 4, "every job ran", 60)
        if until is not None:
            wait_for(until[0], until[1], 60)
    finally:
        engine.stop(5)
    for job_id in ids:
        row = store.get(job_id)
        assert row is not None and row.state is State.DONE
    assert sorted(done) == list(range(n + 4))


def test_z5_producer_and_engine_through_pgbouncer_with_direct_listen(
    bounced_pool: ConnectionPool[Any], schema: str, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(bounced_pool, schema=schema, conninfo=dsn)
    try:
        with caplog.at_level(logging.ERROR):
            # poll_interval 1 h: the direct LISTEN and the stager bring every job in
            run_jobs(store, Config(workers=4, poll_interval=3600, lease=6), 40)
        assert not [r for r in caplog.records if "delivers no notifications" in r.getMessage()]
    finally:
        store.close()


def test_z5_z3_listen_through_pgbouncer_is_refused_once_and_polling_carries_on(
    bounced_pool: ConnectionPool[Any], schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(bounced_pool, schema=schema)  # no conninfo: LISTEN would go through the bouncer
    store.worker.listen_probe_timeout = 1.0
    try:
        # WARNING and up, of every logger: a failure shows what the listener met instead
        with caplog.at_level(logging.WARNING):
            # The engine runs on until its LISTEN was refused: on a loaded machine the jobs may all
            # be done before the probe's answer is due.
            refused = (
                lambda: [r for r in caplog.records if "delivers no notifications" in r.getMessage()],
                "the refusal",
            )
            run_jobs(store, Config(workers=4, poll_interval=0.2, lease=6), 40, until=refused)
        refusals = [r for r in caplog.records if "delivers no notifications" in r.getMessage()]
        assert len(refusals) == 1 and refusals[0].levelno == logging.ERROR
    finally:
        store.close()


def test_p1_a_claim_locked_by_an_operator_stays_its_live_engines_through_the_bouncer(
    bounced_pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """Through a transaction-pooling proxy every statement may run on another server connection:
    the proof of life needs no session. An operator holds the running job's row past its lease;
    heartbeats through the bouncer keep the engine's row fresh and the reaper leaves the claim
    alone (SPEC P1'')."""
    store = Store(bounced_pool, schema=schema)
    try:
        store.enqueue(Job("a"))
        [c] = store.worker.claim(["a"], 1, "w", timedelta(seconds=30))
        proof = EngineProof("w", "h", 1, timedelta(seconds=1), timedelta(seconds=0.4))
        with psycopg.connect(dsn) as operator:
            operator.execute(
                sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(schema, "job")),
                (c.id,),
            )
            for _ in range(6):  # three leases
                assert store.worker.beat(proof, [HeldLease(c.id, c.claim_token)]).held == {c.claim_token}
                assert store.worker.reap() == []
                time.sleep(0.5)
            operator.rollback()
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(
                sql.SQL("UPDATE {} SET locked_until = now() - interval '1 minute' WHERE id = %s").format(
                    sql.Identifier(schema, "job")
                ),
                (c.id,),
            )
        store.worker.beat(proof, [HeldLease(c.id, c.claim_token)])
        assert store.worker.reap() == []  # its engine still beats: the row's own lease says nothing
        row = store.get(c.id)
        assert row is not None and row.state.value == "processing"
    finally:
        store.close()
