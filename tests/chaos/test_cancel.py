"""Cancel storms from psql racing with completions (SPEC X1, X2, P3), and a cancel sent while
the engine's LISTEN connection is cut (X2').

Two psql processes and the Store cancel jobs in random order while two worker processes run
them. Every cancel that reported success left the row canceled for good (the terminal trigger
stays silent), no row was canceled twice, and canceled rows never ran on to another outcome.
A cancel whose notification was lost with the LISTEN connection still reaches the running
handler as soon as the listener is back, not at the next renewal.
"""

from __future__ import annotations

import logging
import random
import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.engine.services.wakeups import WakeListener
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, JobCanceledByOperator, LeaseLost, State
from tests.chaos import invariants
from tests.chaos.conftest import Worker, enqueue_parents, settled
from tests.chaos.test_kill import make_payloads
from tests.chaos.test_restart import done_count
from tests.polling import wait_for

CANCEL = (
    "UPDATE {schema}.job SET state = 'canceled', updated_at = now() "
    "WHERE id = '{id}' AND state IN ('pending', 'failed', 'processing') RETURNING id;"
)


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")
def test_cancel_storm_from_psql_races_completions_X1_P3(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker], capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(5)
    ids = enqueue_parents(dsn, chaos_schema, make_payloads(150, rng, sleep=(0.0, 0.3)))
    order = sorted(ids)
    workers = [spawn(dsn, chaos_schema, workers=4) for _ in range(2)]
    wait_for(lambda: done_count(dsn, chaos_schema) >= 40, "completions under way", timeout=60)
    scripts = []
    for _ in range(2):
        rng.shuffle(order)
        scripts.append("\n".join(CANCEL.format(schema=chaos_schema, id=i) for i in order[:100]))
    procs = [
        subprocess.Popen(
            ["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", dsn],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in scripts
    ]
    store_hits: list[str] = []

    def store_cancels() -> None:
        with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
            store = Store(pool, schema=chaos_schema)
            for i in random.Random(6).sample(sorted(ids), 60):
                if store.cancel(i):
                    store_hits.append(i)

    t = threading.Thread(target=store_cancels)
    t.start()
    outs = [p.communicate(s, timeout=60) for p, s in zip(procs, scripts, strict=True)]
    t.join(60)
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    psql_hits = [line for out, _ in outs for line in out.split() if line]
    hits = psql_hits + store_hits
    assert len(hits) == len(set(hits)), "a row was canceled twice"
    wait_for(lambda: settled(dsn, chaos_schema, ids), "every job to settle after the storm", timeout=90)
    for w in workers:
        assert w.stop() == 0, w.log_tail()
    with psycopg.connect(dsn, autocommit=True) as conn:
        canceled = {
            str(r[0])
            for r in conn.execute(
                sql.SQL("SELECT id FROM {}.job WHERE state = 'canceled'").format(sql.Identifier(chaos_schema))
            )
        }
    assert canceled == set(hits), "canceled rows differ from the cancels that reported success"
    report = invariants.check(dsn, chaos_schema, ids)
    report.assert_ok()
    assert report.states.get("canceled", 0) >= 1 and report.states.get("done", 0) >= 1
    with capsys.disabled():
        print(
            f"\n[chaos] cancel storm: jobs={report.jobs} cancels sent=260 canceled={len(hits)} states={report.states}"
        )


def listener_backends(dsn: str, app: str) -> list[tuple[int, Any]]:
    """The (pid, backend_start) of the LISTEN sessions of the connections named *app*."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT pid, backend_start FROM pg_stat_activity"
            " WHERE application_name = %s AND query ~ '^(--[^\\n]*\\n)*LISTEN '",
            [app],
        ).fetchall()


def test_a_cancel_sent_while_the_listener_is_cut_reaches_the_handler_at_its_reconnect_X2(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Lease 60 s (a heartbeat every 20 s). The engine's LISTEN connection is terminated and the
    running job canceled before it reconnects, so the cancel's NOTIFY reaches nobody. Once the
    listener is back the engine must look at its held claims at once: the handler's ctx is
    cancelled with JobCanceledByOperator within seconds, not at the next renewal."""
    # A reconnect 2 s after the cut: the cancel below surely falls into the gap.
    monkeypatch.setattr(WakeListener, "backoff_base", 2.0)
    app = f"cut-cancel-{uuid.uuid4().hex[:12]}"
    pool: ConnectionPool[Any] = ConnectionPool(
        make_conninfo(dsn, application_name=app), min_size=1, max_size=4, open=True
    )
    store = Store(pool, schema=schema)
    engine = Engine(
        store, Config(workers=2, poll_interval=0.2, lease=60, backoff_base=0.01, backoff_max=0.02)
    )
    started = threading.Event()
    seen: list[BaseException | None] = []

    def handler(ctx: Context, claim: Claim) -> None:
        started.set()
        ctx.wait(60)
        seen.append(ctx.cause)

    engine.register_kind("t", handler)
    try:
        jid = engine.enqueue(Job("t")).id
        engine.start()
        assert started.wait(30)
        caplog.set_level(logging.INFO, logger="brooq_py.engine")
        [(pid, _)] = wait_for(lambda: listener_backends(dsn, app), "the engine's LISTEN session")
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)
            wait_for(
                lambda: not conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone(),
                "the LISTEN session gone",
            )
            assert store.cancel(jid)
            row = conn.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            canceled_before = row[0]
        # The NOTIFY was missed: the LISTEN session that comes back was opened after the cancel.
        [(_, back_since)] = wait_for(lambda: listener_backends(dsn, app), "LISTEN again", timeout=15)
        assert back_since > canceled_before, "the listener came back before the cancel: nothing was missed"
        # Well under lease/3 (20 s), when only the heartbeat would tell.
        wait_for(lambda: seen, what="the handler told of the cancel after the reconnect", timeout=10)
        assert len(seen) == 1
        assert isinstance(seen[0], JobCanceledByOperator) and isinstance(seen[0], LeaseLost)
        wait_for(lambda: not engine.inflight.held(), what="the attempt settled")
        r = store.get(jid)
        assert r is not None and r.state is State.CANCELED and r.attempts == 1
        messages = [rec.getMessage() for rec in caplog.records]
        assert sum("canceled by an operator" in m for m in messages) == 1
        assert not any("lease lost" in m for m in messages)
    finally:
        engine.stop(timeout=2)
        engine.close()
        store.close()
        pool.close()
