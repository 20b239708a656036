"""``manage.py migrate`` creates the queue's tables in the configured schema and ``migrate brooq_django
zero`` removes them; ``manage.py check`` names the fix while they are missing."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from brooq_py.postgres import migrations
from tests.conftest import drop_schema

HERE = Path(__file__).resolve().parent


@pytest.fixture
def empty_schema(dsn: str) -> Iterator[str]:
    """A schema with nothing in it: where a new project's tables would go."""
    name = "djm_" + uuid.uuid4().hex
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        drop_schema(dsn, name)


def manage(
    dsn: str, schema: str, *args: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "BROOQ_SCHEMA": schema,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        **(extra or {}),
    }
    return subprocess.run(
        [sys.executable, str(HERE / "manage.py"), *args],
        env=env,
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_migrate_creates_the_queue_and_zero_removes_it(dsn: str, empty_schema: str) -> None:
    assert migrations.current(dsn, schema=empty_schema) is None
    done = manage(dsn, empty_schema, "migrate")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "brooq_django.0001_brooq_queue" in done.stdout
    assert migrations.current(dsn, schema=empty_schema) in migrations.heads()
    enqueue = manage(
        dsn, empty_schema, "shell", "-c", "from shop.tasks import record; print(record.enqueue('/x', 'y').id)"
    )
    assert enqueue.returncode == 0, enqueue.stderr

    back = manage(dsn, empty_schema, "migrate", "brooq_django", "zero")
    assert back.returncode == 0, back.stdout + back.stderr
    assert migrations.current(dsn, schema=empty_schema) is None
    with psycopg.connect(dsn) as conn:
        left = conn.execute("SELECT to_regclass(%s)", [f"{empty_schema}.job"]).fetchone()
    assert left == (None,)


def test_check_names_the_fix_until_migrate(dsn: str, empty_schema: str) -> None:
    before = manage(dsn, empty_schema, "check")
    assert before.returncode == 0, before.stderr  # a warning: it must not stop `migrate` itself
    out = before.stdout + before.stderr
    assert "brooq_django.W001" in out and "has no brooq_py tables" in out, out
    assert "manage.py migrate brooq_django" in out

    assert manage(dsn, empty_schema, "migrate").returncode == 0
    after = manage(dsn, empty_schema, "check")
    assert "W001" not in after.stdout + after.stderr
    assert "no issues" in after.stdout


def test_check_says_an_old_schema_is_old(dsn: str, empty_schema: str) -> None:
    migrations.upgrade(dsn, schema=empty_schema, revision="0009")
    out = manage(dsn, empty_schema, "check")
    text = out.stdout + out.stderr
    assert "brooq_django.W001" in text and "is at brooq_py migration 0009" in text, text
    assert f"migrate up --schema {empty_schema}" in text
