"""brooq_py.testing as a user meets it: a conftest naming the plugin, an app, a test module, run by
``python -m pytest`` in a subprocess on a temp dir against the session's database (SPEC K4)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg

APP = """
from brooq_py import Engine, Job, KindOptions
from brooq_py.postgres import Store

calls: list[str] = []


def welcome(ctx, claim):
    calls.append(claim.payload["user"])
    claim.chain(Job("audit", {"user": claim.payload["user"]}))


def flaky(ctx, claim):
    calls.append("flaky")
    if calls.count("flaky") < 2:
        raise RuntimeError("first attempt fails")


def broken(ctx, claim):
    raise ValueError("always")


def build(store: Store) -> Engine:
    engine = Engine(store)
    engine.register_kind("welcome", welcome)
    engine.register_kind("audit", lambda ctx, claim: None)
    engine.register_kind("flaky", flaky, KindOptions(max_attempts=3, backoff_base=30, backoff_max=60))
    engine.register_kind("broken", broken, KindOptions(max_attempts=2, backoff_base=0.2, backoff_max=0.2))
    return engine
"""

TESTS = """
import asyncio
import os

import pytest

import app
from brooq_py import Job
from brooq_py.testing import aassert_enqueued, assert_enqueued, drain, jobs


@pytest.fixture(autouse=True)
def _reset():
    app.calls.clear()


def test_enqueue_then_drain_runs_the_chain(brooq_store):
    engine = app.build(brooq_store)
    brooq_store.enqueue(Job("welcome", {"user": "ada", "lang": "en"}))
    assert_enqueued(brooq_store, "welcome", {"user": "ada"})
    report = drain(engine)
    assert (report.ran, report.done, report.failed) == (2, 2, 0), report
    assert app.calls == ["ada"]
    assert [j.payload for j in jobs(brooq_store, "audit", state="done")] == [{"user": "ada"}]
    with open(os.environ["KIT_SCHEMAS"], "a") as f:
        f.write(brooq_store.schema + "\\n")


def test_retries_now_skips_the_backoff(brooq_store):
    brooq_store.enqueue(Job("flaky", {}))
    report = drain(app.build(brooq_store), retries="now")
    assert (report.failed, report.done) == (1, 1), report


def test_retries_never_leaves_the_failed_job(brooq_store):
    brooq_store.enqueue(Job("flaky", {}))
    report = drain(app.build(brooq_store), retries="never")
    assert (report.ran, report.failed, report.done) == (1, 1, 0), report
    assert [j.state for j in jobs(brooq_store, "flaky")] == ["failed"]


def test_retries_wait_sleeps_out_the_backoff(brooq_store):
    brooq_store.enqueue(Job("broken", {}))
    report = drain(app.build(brooq_store), retries="wait")
    assert (report.failed, report.dead) == (1, 1), report
    (row,) = jobs(brooq_store, state="dead")
    assert row.last_error == "ValueError: always"


def test_assert_enqueued_says_what_it_found(brooq_store):
    brooq_store.enqueue(Job("welcome", {"user": "bob"}))
    with pytest.raises(AssertionError, match="found 0"):
        assert_enqueued(brooq_store, "welcome", {"user": "ada"})
    assert_enqueued(brooq_store, "welcome", count=1)
    assert_enqueued(brooq_store, "welcome", {"user": "bob"}, count=None)


def test_async_store_shares_the_schema(brooq_async_store, brooq_store):
    async def produce():
        await brooq_async_store.enqueue(Job("welcome", {"user": "cy"}))
        await aassert_enqueued(brooq_async_store, "welcome", {"user": "cy"})

    asyncio.run(produce())
    assert drain(app.build(brooq_store)).done == 2
"""


def test_a_user_test_module_passes_with_the_plugin(tmp_path: Path, dsn: str) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["brooq_py.testing"]\n')
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    (tmp_path / "test_app.py").write_text(textwrap.dedent(TESTS))
    schemas = tmp_path / "schemas.txt"
    env = {**os.environ, "DATABASE_URL": dsn, "KIT_SCHEMAS": str(schemas), "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 passed" in proc.stdout, proc.stdout
    (schema,) = schemas.read_text().split()
    with psycopg.connect(dsn) as conn:
        left = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema]).fetchall()
    assert left == [], f"the fixture's schema {schema} was not dropped"


def test_the_core_never_imports_the_kit() -> None:
    code = "import brooq_py, brooq_py.engine, brooq_py.postgres, sys; print('pytest' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"
