"""The command line on a schema an earlier release migrated (0.2: revision 0009, 0.3: 0014): a
command that needs a newer table, column or function says, in one line, the schema's revision
and the fix (`brooq-py migrate up --schema S`); no traceback, no "database error: column ...",
no "no job table" (the job table is there, with the user's jobs)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from brooq_py.postgres import migrations
from tests.conftest import drop_schema
from tests.integration.test_cli import run_cli

JOB_ID = "00000000-0000-0000-0000-000000000001"

# One mechanism answers them all (cli/common.py, translate_db_error): a sample of commands that
# fail on each release's schema, a missing table, column or function behind each.
CASES = [
    ("0009", ["stats"]),
    ("0009", ["get", JOB_ID]),
    ("0009", ["rate", "t", "5/1s"]),
    ("0009", ["depth", "t", "3"]),
    ("0009", ["tenants", "t"]),
    ("0014", ["retry", JOB_ID]),
    ("0014", ["depth", "t", "3", "--park"]),
    ("0014", ["sequence-resume", "t", "s"]),
    ("0014", ["tenant-limit", "t", "1"]),
    ("0014", ["jobs"]),
    ("0014", ["topics"]),
]
RELEASE = {"0009": "schema-of-0.2", "0014": "schema-of-0.3"}


@pytest.fixture(scope="module", params=list(RELEASE), ids=list(RELEASE.values()))
def older_schema(dsn: str, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """A schema migrated to an earlier release's last revision: (name, revision)."""
    name = "cli_old_" + uuid.uuid4().hex
    migrations.upgrade(dsn, schema=name, revision=request.param)
    try:
        yield name, request.param
    finally:
        drop_schema(dsn, name)


def assert_names_revision_and_fix(p: subprocess.CompletedProcess[str], schema: str, revision: str) -> None:
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr[-600:]
    assert p.stderr.count("\n") == 1, p.stderr  # one line
    assert f"at revision {revision}" in p.stderr, p.stderr
    assert f"migrate up --schema {schema}`" in p.stderr, p.stderr
    assert "no job table" not in p.stderr, p.stderr
    assert "database error" not in p.stderr, p.stderr


def test_cli_enqueue_on_a_schema_of_0_2_is_one_line_not_a_traceback(dsn: str, tmp_path: Path) -> None:
    # Was: a traceback ending in the store's BrooqError (chained from UndefinedColumn "meta").
    name = "cli_old_" + uuid.uuid4().hex
    migrations.upgrade(dsn, schema=name, revision="0009")
    try:
        p = run_cli("enqueue", "t", "{}", "--schema", name, dsn=dsn, cwd=tmp_path)
    finally:
        drop_schema(dsn, name)
    assert_names_revision_and_fix(p, name, "0009")


@pytest.mark.parametrize(
    ("older_schema", "args"),
    CASES,
    indirect=["older_schema"],
    ids=[f"{RELEASE[revision]}-{' '.join(args)}" for revision, args in CASES],
)
def test_cli_commands_on_an_older_schema_name_its_revision_and_the_fix(
    dsn: str, older_schema: tuple[str, str], tmp_path: Path, args: list[str]
) -> None:
    # Was: "database error: column "tenant_limit" of relation "topic_setting" does not exist" (or
    # "function ...job_sequence_resume(...) does not exist"), or "no job table in schema 'S'".
    schema, revision = older_schema
    p = run_cli(*args, "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert_names_revision_and_fix(p, schema, revision)


@pytest.mark.parametrize("args", [["stats"], ["enqueue", "t", "{}"]], ids=" ".join)
def test_cli_on_an_unmigrated_schema_still_says_there_is_no_job_table(
    dsn: str, tmp_path: Path, args: list[str]
) -> None:
    name = "cli_old_" + uuid.uuid4().hex  # never created: nothing migrated
    p = run_cli(*args, "--schema", name, dsn=dsn, cwd=tmp_path)
    assert p.returncode == 1
    assert (
        p.stderr == f"brooq-py: no job table in schema {name!r}: run `brooq-py migrate up --schema {name}`\n"
    )
