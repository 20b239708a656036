"""Review of fc50b1e: the worker command's wait for SIGTERM/SIGINT (brooq_py/cli/worker.py, _Signals on
signal.set_wakeup_fd) and terminal history's overdue rule (SPEC B2/T1, sql/history_tables.sql). Each
test here failed on fc50b1e; the review's fourth (the wakeup pipe left open by an in-process run)
is tests/unit/test_worker_signals.py's test of _Signals.close."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.conftest import q
from tests.integration.history import app_role, days, ended, run_sql, store_as, where
from tests.integration.test_cli import Worker, cli_env
from tests.polling import wait_for

SLOW_FACTORY = """
    import os
    import sys
    import time
    from pathlib import Path

    from psycopg_pool import ConnectionPool

    from brooq_py import Config, Engine
    from brooq_py.postgres import Store


    def handler(ctx, claim):
        Path(os.environ["RAN"]).joinpath(claim.id).write_text("ran")
        time.sleep(0.2)


    def make_engine():
        Path(os.environ["MARK"]).write_text("factory running")
        time.sleep(float(os.environ["FACTORY_SECONDS"]))  # e.g. waiting for a dependency to answer
        pool = ConnectionPool(os.environ["DATABASE_URL"], min_size=1, max_size=6, open=True)
        store = Store(pool, schema=os.environ["APP_SCHEMA"])
        engine = Engine(store, Config(workers=4, poll_interval=0.2))
        engine.register_kind("slowapp.t", handler)
        return engine
    """


def _slow_worker(dsn: str, schema: str, tmp_path: Path, seconds: float) -> tuple[Worker, Path, Path]:
    (tmp_path / "slowfactory.py").write_text(textwrap.dedent(SLOW_FACTORY))
    mark, ran = tmp_path / "mark", tmp_path / "ran"
    ran.mkdir()
    env = cli_env(
        dsn,
        BROOQ_HTTP_ADDR="127.0.0.1:0",
        APP_SCHEMA=schema,
        MARK=str(mark),
        RAN=str(ran),
        FACTORY_SECONDS=str(seconds),
    )
    worker = Worker(["worker", "--app", "slowfactory:make_engine", "--stop-timeout", "5s"], env, tmp_path)
    wait_for(lambda: mark.exists() or worker.proc.poll() is not None, "the factory to run", 90)
    return worker, mark, ran


def test_worker_sigterm_while_the_app_factory_runs_is_ignored_until_it_returns(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """Rule: the worker command stops gracefully on SIGTERM within its stop timeout, in every state.
    _Signals.install() runs before the --app factory, and its handler only sets a flag that nothing
    reads until the engine has started: a factory that takes long (waiting for a dependency, a slow
    import) keeps the process running after SIGTERM for as long as it takes (here 40 s against a
    --stop-timeout of 5 s; an orchestrator's grace period ends with a SIGKILL). Before the handler
    was installed, SIGTERM ended the process at once."""
    worker, _, _ = _slow_worker(dsn, schema, tmp_path, 40)
    try:
        late = worker.stopped_within(15)
        assert late is None, f"--stop-timeout 5s, its --app factory running: {late}"
    finally:
        worker.kill()


def test_t1_b2_a_dml_engine_alone_keeps_a_day_more_than_a_day_past_the_ttl(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    engines: Callable[..., Engine],
) -> None:
    """Rule: SPEC T1 (final rows older than the ttl are deleted), B2 (a day's table goes once all of it
    is older than the ttl) and docs/operating.md, Terminal history: "a day's rows outlive the ttl by
    up to a day" (the reason the history is off under a 7-day ttl). A fleet of engines running as a
    role with DML grants only (the supported switch away from the owner: docs/operating.md), with
    ALTER DEFAULT PRIVILEGES on the days, no owner's engine: a day past the ttl is left alone until
    it is `overdue` (history_tables.sql: the day of now - ttl - 1 day), so its first jobs outlive the
    ttl by up to two days: here a job that ended yesterday just after midnight UTC was still found by
    `SELECT … FROM job` with a 60 s ttl, more than ttl + 1 day after it ended, by an engine that
    passed over its day at every pass, without a word. (Now a day is overdue an hour after it
    passed the ttl.)"""
    ((since_midnight,),) = q(
        pool,
        schema,
        "SELECT extract(epoch FROM (now() AT TIME ZONE 'UTC') - date_trunc('day', now() AT TIME ZONE 'UTC'))",
    )
    if float(since_midnight) < 60 + 3600 + 60:  # the day before is overdue an hour after it passed the ttl
        pytest.skip("within the hour after midnight UTC: yesterday's day is not overdue yet")
    with app_role(dsn, schema) as role:
        run_sql(
            dsn,
            sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA {} GRANT ALL ON TABLES TO {}").format(
                sql.Identifier(schema), sql.Identifier(role)
            ),
        )
        old = store.enqueue(Job("h", {})).id
        # ended yesterday (UTC), 1 s after midnight: moved into yesterday's day by the owner's engine
        q(
            pool,
            schema,
            "UPDATE {job} SET state = 'done', updated_at ="
            " (date_trunc('day', now() AT TIME ZONE 'UTC') - interval '1 day' + interval '1 second')"
            " AT TIME ZONE 'UTC' WHERE id = %s",
            old,
        )
        assert [i for i, _ in store.move_terminal(timedelta(seconds=0.5), timedelta(days=400), 10)] == [old]
        assert len(days(pool, schema)) == 1
        ttl = 60.0
        with store_as(dsn, schema, role) as app:
            e = engines(app, history_after=0.5, retention_ttl=ttl, retention_period=0.2)
            e.register_kind("x", lambda ctx, claim: None)
            e.start()
            try:
                fresh = store.enqueue(Job("h", {})).id
                ended(dsn, schema, [fresh], "done", days_ago=1 / 86400)
                wait_for(
                    lambda: where(pool, schema, old) is None, "the DML engine to empty the overdue day", 30
                )
                assert e.health().ok
            finally:
                e.stop(timeout=2)
        assert where(pool, schema, old) is None  # within ttl + a day + an hour: docs/operating.md


def test_b2_an_engine_running_as_the_owner_of_job_is_told_to_run_as_the_owner_of_job(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: logs say what is true. An engine whose role owns job but may not create in its schema
    (the schema is another role's: migrations ran as an admin, then `ALTER TABLE job OWNER TO app`,
    as docs/operating.md tells operators to run the engines as the owner of job) makes no day:
    history_tables.sql's `creatable` is ownership AND CREATE on the schema. The one warning it gets
    (and every per-day warning is silenced behind it, "only from roles that may make days") names
    the wrong cause and the wrong fix: "a day's table is made and dropped by the owner of job: run
    the engines as that role", which it already is; what it lacks (CREATE on the schema) is never
    said."""
    with app_role(dsn, schema, owner=True, create=False) as role, store_as(dsn, schema, role) as app:
        j = app.enqueue(Job("h", {})).id
        ended(dsn, schema, [j], "done", days_ago=1 / 86400)
        caplog.set_level(logging.INFO, logger="brooq_py.history")
        assert app.move_terminal(timedelta(seconds=0.5), timedelta(days=30), 10) == []
        ((owns,),) = q(
            pool,
            schema,
            "SELECT pg_get_userbyid(relowner) = %s FROM pg_class WHERE oid = %s::regclass",
            role,
            f'"{schema}".job',
        )
        assert owns
    said = [
        r.getMessage()
        for r in caplog.records
        if r.name == "brooq_py.history" and r.levelno >= logging.WARNING
    ]
    assert len(said) == 1, said
    assert "CREATE" in said[0] and "run the engines as that role" not in said[0], said[0]
