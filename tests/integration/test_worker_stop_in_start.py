"""The worker command stops on SIGTERM within its stop timeout in every state (SPEC C11''), here while
``engine.start()`` waits on the database: its check of the schema's version waits for a lock an
operator holds on the version table (a migration running in another session holds it so)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

import psycopg
from psycopg import sql

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.test_review_session17 import _slow_worker
from tests.polling import wait_for


def _waiting_on(dsn: str, table: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass", (table,)
        ).fetchone()
    return row is not None and int(row[0]) > 0


def test_worker_starts_with_its_version_table_locked_says_so_and_runs_jobs(
    dsn: str, schema: str, store: Store, tmp_path: Path
) -> None:
    """The check waits at most SCHEMA_CHECK_WAIT for the lock: the engine starts anyway, as it does
    when the database does not answer, with a warning naming why."""
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
    """The SIGTERM comes while the check waits for the lock (when the poll below sees the wait in
    time; otherwise just after it): the process ends within its stop timeout, having run nothing."""
    version = f'"{schema}".brooq_alembic_version'
    with psycopg.connect(dsn) as operator:
        operator.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.SQL(version)))
        worker, _, ran = _slow_worker(dsn, schema, tmp_path, 0)
        try:
            with contextlib.suppress(AssertionError):  # seen or not, the signal goes now
                wait_for(
                    lambda: _waiting_on(dsn, version), "engine.start() to wait for the version table", 10
                )
            started = time.monotonic()
            worker.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=20)
            took = time.monotonic() - started
            assert worker.proc.poll() is not None, (
                f"still running {took:.0f} s after SIGTERM (--stop-timeout 5s) while engine.start() waits\n"
                + worker.output
            )
            assert worker.proc.returncode == 0, worker.output
        finally:
            worker.kill()
            operator.rollback()
    assert list(ran.iterdir()) == []
