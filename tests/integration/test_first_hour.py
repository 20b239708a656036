"""The rough edges of a newcomer's first hour: each one line naming the fix, never a raw traceback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from brooq_py.postgres import AsyncStore, Store, WrapTx
from brooq_py.queue import BrooqError, Job
from tests.conftest import drop_schema
from tests.integration.test_cli import Worker, cli_env, run_cli
from tests.integration.test_migrations import bare_schema as fresh_schema  # noqa: F401 - a fixture
from tests.polling import wait_for


def test_the_readmes_demo_runs_end_to_end(dsn: str, tmp_path: Path) -> None:
    """`make demo` (python -m brooq_py.demo), the README's first command, on the test database:
    every step runs, the operator queries it prints included."""
    schema = "demo_" + uuid.uuid4().hex[:12]  # not brooq_demo: another suite may run its demo beside
    try:
        done = subprocess.run(
            [sys.executable, "-m", "brooq_py.demo"],
            env={**cli_env(dsn), "BROOQ_DEMO_SCHEMA": schema},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        drop_schema(dsn, schema)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "demo finished" in done.stdout and repr(schema) in done.stdout


def test_demo_against_a_dead_database_is_one_line(tmp_path: Path) -> None:
    dead = "postgresql://nobody:Sup3r-Secret@127.0.0.1:1/nothing"
    env = {**cli_env(dead)}
    done = subprocess.run(
        [sys.executable, "-m", "brooq_py.demo"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("demo: cannot connect to postgresql://nobody:***@127.0.0.1:1/nothing")
    assert "Sup3r-Secret" not in done.stderr + done.stdout


def test_enqueue_on_an_unmigrated_schema_names_the_fix(dsn: str, fresh_schema: str) -> None:  # noqa: F811
    fix = f"migrate up --schema {fresh_schema}"
    with ConnectionPool(dsn, min_size=1, max_size=2) as pool:
        store = Store(pool, schema=fresh_schema)
        for enqueue in (
            lambda: store.enqueue(Job("t", {})),
            lambda: store.enqueue(Job("t", {}, idempotency_key="k")),
            lambda: store.enqueue_many([Job("t", {}), Job("t", {})]),
        ):
            with pytest.raises(BrooqError, match=fix) as caught:
                enqueue()
            assert isinstance(
                caught.value.__cause__, psycopg.errors.InvalidSchemaName | psycopg.errors.UndefinedTable
            )
        with pool.connection() as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(fresh_schema)))
            conn.commit()
            with pytest.raises(BrooqError, match=fix):
                store.enqueue_tx(WrapTx(conn), Job("t", {}))
            # Only the statement failed: the transaction is aborted as PostgreSQL aborts it, no more.
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
            conn.rollback()
            assert conn.execute("SELECT 1").fetchone() == (1,)
        store.close()

    async def produce() -> None:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=2) as apool:
            astore = AsyncStore(apool, schema=fresh_schema)
            with pytest.raises(BrooqError, match=fix):
                await astore.enqueue(Job("t", {}))
            async with apool.connection() as conn:
                with pytest.raises(BrooqError, match=fix):
                    await astore.enqueue_tx(conn, Job("t", {}))

    asyncio.run(produce())


def test_a_sqlalchemy_enqueue_on_an_unmigrated_schema_names_the_fix(dsn: str, fresh_schema: str) -> None:  # noqa: F811
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
    store = Store(None, schema=fresh_schema)
    try:
        with (
            Session(engine) as session,
            pytest.raises(BrooqError, match=f"migrate up --schema {fresh_schema}"),
        ):
            store.enqueue_tx(WrapTx.from_sqlalchemy(session), Job("t", {}))
    finally:
        engine.dispose()


def test_pause_of_an_unknown_topic_warns_and_forget_removes_it(dsn: str, schema: str, tmp_path: Path) -> None:
    typo = "emials"
    paused = run_cli("pause", typo, "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert paused.returncode == 0, paused.stderr
    assert f"no job of topic {typo!r} is waiting or running" in paused.stderr
    assert f"topics --forget {typo}" in paused.stderr
    limited = run_cli("limit", "emails", "3", "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert "warning" in limited.stderr

    assert run_cli("enqueue", "known", "{}", "--schema", schema, dsn=dsn, cwd=tmp_path).returncode == 0
    quiet = run_cli("pause", "known", "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert quiet.returncode == 0 and "warning" not in quiet.stderr

    listed = json.loads(run_cli("topics", "--json", "--schema", schema, dsn=dsn, cwd=tmp_path).stdout)
    assert typo in {t["topic"] for t in listed}
    forgot = run_cli("topics", "--forget", typo, "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert forgot.returncode == 0 and json.loads(forgot.stdout) == {"topic": typo, "forgotten": True}
    again = run_cli("topics", "--forget", typo, "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert again.returncode == 1
    listed = json.loads(run_cli("topics", "--json", "--schema", schema, dsn=dsn, cwd=tmp_path).stdout)
    assert typo not in {t["topic"] for t in listed}


def test_store_forget_topic_resumes_its_jobs(store: Store) -> None:
    store.pause("t")
    store.set_limit("t", 2)
    assert store.forget_topic("t") is True
    assert store.topic_settings() == [] and store.forget_topic("t") is False
    assert store.topic_active("t") is False
    store.enqueue(Job("t", {}))
    assert store.topic_active("t") is True


def test_the_worker_warns_once_of_pending_jobs_it_has_no_handler_for(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    with ConnectionPool(dsn, min_size=1, max_size=2) as pool:
        store = Store(pool, schema=schema)
        store.enqueue_many([Job("orphan.topic", {"n": n}) for n in range(3)])
        store.close()
    env = cli_env(
        dsn, BROOQ_HTTP_ADDR="127.0.0.1:0", QUEUE_GAUGES_PERIOD="100ms", QUEUE_POLL_INTERVAL="100ms"
    )
    worker = Worker(["worker", "--demo", "--schema", schema], env, tmp_path)
    try:
        worker.url()
        wait_for(lambda: "'orphan.topic'" in worker.output, "the warning")
        run_cli("enqueue", "second.orphan", "{}", "--schema", schema, dsn=dsn, cwd=tmp_path)
        wait_for(lambda: "'second.orphan'" in worker.output, "a later check's warning")
        assert worker.stop() == 0
    finally:
        worker.kill()
    warnings = [line for line in worker.lines if "'orphan.topic'" in line]
    assert len(warnings) == 1, warnings
    assert "WARNING" in warnings[0] and "no handler" in warnings[0] and "demo" in warnings[0]
