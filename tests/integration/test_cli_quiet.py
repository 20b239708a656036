"""The command line keeps quiet where a newcomer expects it: migrate without alembic's INFO
chatter unless -v, help texts without jargon, help(Config.from_env) without the environment."""

from __future__ import annotations

import os
import pydoc
import uuid
from pathlib import Path

import pytest

from brooq_py.engine import Config
from tests.integration.test_cli import run_cli
from tests.integration.test_migrations import bare_schema  # noqa: F401 - the fixture


def test_migrate_up_is_quiet_unless_verbose(dsn: str, bare_schema: str, tmp_path: Path) -> None:  # noqa: F811
    quiet = run_cli("migrate", "up", "--to", "0001", "--schema", bare_schema, dsn=dsn, cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert "alembic" not in quiet.stderr and "Running upgrade" not in quiet.stderr
    loud = run_cli("migrate", "-v", "up", "--schema", bare_schema, dsn=dsn, cwd=tmp_path)
    assert loud.returncode == 0, loud.stderr
    assert "Running upgrade" in loud.stderr


def test_help_says_duration_such_as_30s(dsn: str, tmp_path: Path) -> None:
    for args in (("worker", "--help"), ("enqueue", "--help")):
        out = run_cli(*args, dsn=dsn, cwd=tmp_path)
        assert out.returncode == 0
        text = " ".join(out.stdout.split())
        assert "Go duration" not in text and "duration such as 30s or 1m30s" in text


def test_k3_help_of_config_from_env_does_not_print_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROOQ_TEST_SECRET", "s3cr3t-value-" + uuid.uuid4().hex)
    text = pydoc.render_doc(Config.from_env, renderer=pydoc.plaintext)
    assert os.environ["BROOQ_TEST_SECRET"] not in text
    monkeypatch.setenv("QUEUE_WORKERS", "7")
    assert Config.from_env().workers == 7  # None still means the process environment
