"""Statements go to the server as psycopg caches them: their name line kept (pg_stat_activity shows
which statement runs), every other comment line and the indentation left out, so the engine's
hot statements stay within the length psycopg parses once and reuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from brooq_py.postgres.session.statements import render

SQL_DIR = Path(__file__).resolve().parents[2] / "brooq_py" / "postgres" / "sql"
FRAGMENTS = {
    "depth_room",
    "depth_waiting",
    "depth_waiting_0017",
    "job_row_columns",
    "claim_room",
    "claim_set",
    "topic_tokens",
}
# What an engine or a producer runs for each job (a batch's statements parse once per batch).
HOT = (
    "job_claim",
    "job_settle_many",
    "job_enqueue",
    "job_enqueue_plain",
    "engine_beat",
    "job_step_record",
    "job_steps_load",
    "job_release_due",
)
# psycopg._queries.MAX_CACHED_STATEMENT_LENGTH: a longer query is split into its parameters at every call.
CACHED = 4096
SCHEMA = "t_0123456789abcdef0123456789abcdef"  # as long as a test schema's name


@pytest.mark.parametrize(
    "name",
    sorted(
        p.stem for p in SQL_DIR.glob("*.sql") if p.stem not in FRAGMENTS and not p.stem.startswith("demo_")
    ),
)
def test_a_statement_keeps_its_name_line_and_no_other_comment(name: str) -> None:
    lines = render(name, SCHEMA).composed.decode().splitlines()
    assert lines[0] == f"-- name: {name}"
    assert not [line for line in lines[1:] if line.startswith("--") or line != line.strip()]


@pytest.mark.parametrize("name", HOT)
def test_a_hot_statement_is_short_enough_for_psycopg_to_cache_its_parsing(name: str) -> None:
    assert len(render(name, SCHEMA).composed) <= CACHED
