"""A PostgreSQL restart during load, on a throwaway server this test starts (SPEC P1-P3, E6).

Never the machine's shared server: ``devdb.start_throwaway()`` gives this test its own.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import psycopg
import pytest

from brooq_py import devdb
from tests.chaos import invariants
from tests.chaos.conftest import Worker, enqueue_parents, make_chaos_schema, settled
from tests.chaos.test_kill import make_payloads
from tests.polling import wait_for


@pytest.fixture
def throwaway() -> Iterator[devdb.DevDatabase]:
    try:
        db = devdb.start_throwaway()
    except devdb.PostgresNotFound as exc:
        pytest.skip(f"no PostgreSQL server binaries to start a throwaway server: {exc}")
    try:
        yield db
    finally:
        db.close()


def done_count(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {schema}.job WHERE state = 'done'").fetchone()
    return int(row[0]) if row else 0


def test_postgres_restart_under_load_P1_P2_P3(
    throwaway: devdb.DevDatabase, spawn: Callable[..., Worker], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = throwaway.dsn
    schema = make_chaos_schema(dsn)
    rng = random.Random(3)
    ids = enqueue_parents(dsn, schema, make_payloads(80, rng, sleep=(0.05, 0.4)))
    workers = [spawn(dsn, schema, check=(i == 0), workers=3) for i in range(2)]
    wait_for(lambda: done_count(dsn, schema) >= 10, "some jobs done before the restart", timeout=60)
    throwaway.restart()
    wait_for(lambda: settled(dsn, schema, ids), "every job to settle after the restart", timeout=120)
    for w in workers:
        assert w.alive, w.log_tail()
        assert w.stop() == 0, w.log_tail()
    report = invariants.check(dsn, schema, ids)
    report.assert_ok()
    assert report.states == {"done": 80}
    with capsys.disabled():
        print(
            f"\n[chaos] restart: jobs={report.jobs} restarts=1 claims={report.claims} reaped={report.reaps}"
        )
