"""The worker command stops on SIGTERM within its stop timeout in every state (SPEC C11''), here while
``engine.start()`` waits on the database: its check of the schema's version waits for a lock an
operator holds on the version table (a migration running in another session holds it so), or for a
server that stopped answering on the pool's connection. And the check, bounded, still refuses a
schema that is not there."""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py import Config
from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import BrooqError, Job
from tests.integration.marks import lock_waiter
from tests.integration.test_cli import Worker, cli_env
from tests.integration.test_review_session17 import _slow_worker
from tests.polling import wait_for


def test_worker_starts_with_its_version_table_locked_says_so_and_runs_jobs(
    dsn: str, schema: str, store: Store, tmp_path: Path
) -> None:
    """The check waits at most SETTLE_LOCK_WAIT (250 ms) for the lock: the engine starts anyway, as it
    does when the database does not answer, with a warning naming why."""
    version = f'"{schema}".brooq_alembic_version'
    with psycopg.connect(dsn) as operator:
        operator.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.SQL(version)))
        worker, _, ran = _slow_worker(dsn, schema, tmp_path, 0)
        try:
            job = store.enqueue(Job("slowapp.t", {})).id
            wait_for(lambda: (ran / job).exists() or worker.proc.poll() is not None, "the job to run", 90)
            assert (ran / job).exists(), worker.output
            assert "cannot check schema" in worker.output and "LockNotAvailable" in worker.output, (
                worker.output
            )
            worker.proc.send_signal(signal.SIGTERM)
            assert worker.proc.wait(timeout=60) == 0, worker.output
        finally:
            worker.kill()
            operator.rollback()


def test_worker_sigterm_while_engine_start_waits_for_a_lock_stops_within_the_stop_timeout(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """The SIGTERM comes while the check waits for the lock when the poll below sees the wait in its
    250 ms, otherwise during or just after the start (where the test above shows the check gives up on
    the lock): the process ends within its stop timeout."""
    version = f'"{schema}".brooq_alembic_version'
    with psycopg.connect(dsn) as operator:
        operator.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.SQL(version)))
        worker, _, _ = _slow_worker(dsn, schema, tmp_path, 0)
        try:
            with contextlib.suppress(AssertionError):  # seen or not, the signal goes now
                wait_for(
                    lambda: lock_waiter(dsn, version), "engine.start() to wait for the version table", 10
                )
            late = worker.stopped_within(20)
            assert late is None, f"--stop-timeout 5s, engine.start() waiting for the lock: {late}"
            assert worker.proc.returncode == 0, worker.output
        finally:
            worker.kill()
            operator.rollback()


SILENT_FACTORY = """
    import os
    import signal
    from pathlib import Path

    from psycopg_pool import ConnectionPool

    from brooq_py import Config, Engine
    from brooq_py.postgres import Store


    def make_engine():
        pool = ConnectionPool(os.environ["DATABASE_URL"], min_size=1, max_size=1, open=True)
        pool.wait(30)
        with pool.connection() as conn:
            pid = conn.info.backend_pid
        Path(os.environ["PID"]).write_text(str(pid))
        # The server stops answering after the pool opened (a SIGSTOPped postgres, a path that drops
        # packets): here only the backend of the pool's one connection, so no other session is touched.
        os.kill(pid, signal.SIGSTOP)
        engine = Engine(Store(pool, schema=os.environ["APP_SCHEMA"]), Config(workers=2, poll_interval=0.2, lease=5))
        engine.register_kind("silent.t", lambda ctx, claim: None)
        return engine
    """


def test_worker_sigterm_while_engine_start_waits_on_a_silent_server_stops_within_the_stop_timeout(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """A server's own timeouts (statement, lock) are set by a statement that a silent server never
    answers: the check shuts its socket down after SCHEMA_CHECK_WAIT and the engine starts. (The stop that follows, its last writes unanswered, takes its timeout + the watchdog's grace (the
    lease, 5 s here) + 4 s at most.)"""
    (tmp_path / "silentfactory.py").write_text(textwrap.dedent(SILENT_FACTORY))
    pid_file = tmp_path / "pid"
    env = cli_env(dsn, BROOQ_HTTP_ADDR="127.0.0.1:0", APP_SCHEMA=schema, PID=str(pid_file))
    worker = Worker(["worker", "--app", "silentfactory:make_engine", "--stop-timeout", "5s"], env, tmp_path)
    backend: int | None = None
    try:
        # the file is made, then written: wait for its number, not its name (read empty on a busy CI)
        wait_for(
            lambda: (pid_file.exists() and pid_file.read_text().strip()) or worker.proc.poll() is not None,
            "the factory to run",
            90,
        )
        backend = int(pid_file.read_text())
        wait_for(lambda: "dashboard at" in worker.output or worker.proc.poll() is not None, "the surface", 30)
        time.sleep(1)  # within the check's wait (or just past it on a busy machine)
        late = worker.stopped_within(30)
        assert late is None, f"--stop-timeout 5s, the server silent: {late}"
        assert "cannot check schema" in worker.output, worker.output
    finally:
        if backend is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(backend, signal.SIGCONT)
        worker.kill()


def test_the_bounded_check_still_refuses_a_schema_that_is_not_there(pool: ConnectionPool[Any]) -> None:
    """SELECT from a schema that does not exist is 42P01 (UndefinedTable) in the check's transaction too."""
    engine = Engine(Store(pool, schema="no_such_schema_here"), Config(workers=1))
    try:
        with pytest.raises(BrooqError, match="migrate up --schema no_such_schema_here"):
            engine.start()
    finally:
        engine.close()
