"""Cancel storms from psql racing with completions (SPEC X1, X2, P3).

Two psql processes and the Store cancel jobs in random order while two worker processes run
them. Every cancel that reported success left the row canceled for good (the terminal trigger
stays silent), no row was canceled twice, and canceled rows never ran on to another outcome.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import threading
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
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
