"""The operator's commands against a real PostgreSQL: retry (SPEC Q1), pause/resume (Q2),
limit (Q3) and topics, with their error cases and exit statuses."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.test_cli import cli_env, run_cli


def cli(dsn: str, schema: str, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    p = run_cli(*args, "--schema", schema, dsn=dsn, cwd=tmp_path)
    return p.returncode, p.stdout, p.stderr


def set_state(dsn: str, schema: str, job_id: str, state: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET state = %s, attempts = 5, last_error = 'boom' WHERE id = %s").format(
                sql.Identifier(schema, "job")
            ),
            (state, job_id),
        )


def test_q1_cli_retry_puts_a_dead_job_back_and_explains_every_refusal(
    store: Store, dsn: str, schema: str, tmp_path: Path
) -> None:
    dead = store.enqueue(Job("t", {})).id
    set_state(dsn, schema, dead, "dead")
    code, out, _ = cli(dsn, schema, tmp_path, "retry", dead)
    assert code == 0 and json.loads(out) == {"retried": True, "id": dead}
    row = store.get(dead)
    assert row is not None and row.state is State.PENDING and row.attempts == 0 and row.last_error == "boom"

    code, _, err = cli(dsn, schema, tmp_path, "retry", dead)  # pending now: wrong state
    assert code == 1 and "is pending: only dead or canceled jobs can be retried" in err
    code, _, err = cli(dsn, schema, tmp_path, "retry", str(uuid.uuid4()))
    assert code == 1 and "no job with id" in err
    code, _, err = cli(dsn, schema, tmp_path, "retry", "not-a-uuid")
    assert code == 2 and "malformed job id" in err


def test_q2_cli_pause_and_resume_a_topic_and_refuse_an_empty_one(
    store: Store, dsn: str, schema: str, tmp_path: Path
) -> None:
    code, out, _ = cli(dsn, schema, tmp_path, "pause", "mail")
    assert code == 0 and json.loads(out) == {"topic": "mail", "paused": True}
    assert store.paused() == {"mail"}
    code, out, _ = cli(dsn, schema, tmp_path, "pause", "mail")  # twice: still paused, still fine
    assert code == 0 and store.paused() == {"mail"}
    code, out, _ = cli(dsn, schema, tmp_path, "resume", "mail")
    assert code == 0 and json.loads(out) == {"topic": "mail", "paused": False}
    assert store.paused() == set()
    code, _, err = cli(dsn, schema, tmp_path, "pause", "")
    assert code == 2 and "invalid topic" in err


def test_q2_q3_cli_a_topic_of_undecodable_bytes_is_bad_input_not_a_traceback(
    store: Store, dsn: str, schema: str, tmp_path: Path
) -> None:
    """Scenario: a topic argument that is not UTF-8 (b"\\xff" in argv, a lone surrogate to Python)
    reached the database driver and crashed with a UnicodeEncodeError traceback."""
    for args in (("pause", "\udcff"), ("resume", "\udcff"), ("limit", "\udcff", "3")):
        code, _, err = cli(dsn, schema, tmp_path, *args)
        assert code == 2 and "not valid UTF-8" in err and "Traceback" not in err, err
    assert store.topic_settings() == []


@pytest.mark.parametrize("bad", ["x", "-1", "2147483648", "1.5"])
def test_q3_cli_limit_refuses_anything_but_a_number_or_none(
    store: Store, dsn: str, schema: str, tmp_path: Path, bad: str
) -> None:
    code, _, err = cli(dsn, schema, tmp_path, "limit", "api", bad)
    assert code == 2 and "invalid limit" in err
    assert store.topic_settings() == []


def test_q3_cli_limit_sets_and_removes_a_topics_global_limit(
    store: Store, dsn: str, schema: str, tmp_path: Path
) -> None:
    code, out, _ = cli(dsn, schema, tmp_path, "limit", "api", "4")
    assert code == 0 and json.loads(out) == {"topic": "api", "limit": 4}
    assert [(s.topic, s.limit) for s in store.topic_settings()] == [("api", 4)]
    code, out, _ = cli(dsn, schema, tmp_path, "limit", "api", "none")
    assert code == 0 and json.loads(out) == {"topic": "api", "limit": None}
    assert [(s.topic, s.limit) for s in store.topic_settings()] == [("api", None)]


def test_cli_topics_lists_counts_per_state_oldest_ready_paused_and_limit(
    store: Store, dsn: str, schema: str, tmp_path: Path
) -> None:
    ids = [r.id for r in store.enqueue_many([Job("a", {"n": n}) for n in range(3)])]
    set_state(dsn, schema, ids[0], "dead")
    store.pause("a")
    store.set_limit("b", 2)  # a topic with a setting and no jobs is listed too
    code, out, _ = cli(dsn, schema, tmp_path, "topics", "--json")
    assert code == 0
    by_topic = {t["topic"]: t for t in json.loads(out)}
    assert by_topic["a"]["counts"] == {"pending": 2, "dead": 1}
    assert by_topic["a"]["paused"] is True and by_topic["a"]["limit"] is None
    assert by_topic["a"]["oldest_ready_seconds"] >= 0
    assert by_topic["b"] == {
        "topic": "b",
        "counts": {},
        "oldest_ready_seconds": 0.0,
        "paused": False,
        "limit": 2,
        "rate": None,
        "tokens": None,
        "max_depth": None,
        "tenants_waiting": None,
    }
    code, out, _ = cli(dsn, schema, tmp_path, "topics")
    assert code == 0
    header, line_a, line_b = out.strip().splitlines()
    assert header.split()[:8] == [
        "topic",
        "pending",
        "scheduled",
        "processing",
        "failed",
        "done",
        "dead",
        "canceled",
    ]
    assert line_a.split()[:8] == ["a", "2", "0", "0", "0", "0", "1", "0"] and line_a.split()[-6:] == [
        "yes",
        "-",
        "-",
        "-",
        "-",
        "-",
    ]
    assert line_b.split()[-6:] == ["no", "2", "-", "-", "-", "-"]


def test_cli_operator_commands_on_an_unmigrated_schema_or_an_unreachable_database_fail_clearly(
    dsn: str, tmp_path: Path
) -> None:
    empty = "nothing_" + uuid.uuid4().hex
    for args in (["topics"], ["pause", "x"], ["limit", "x", "1"], ["retry", str(uuid.uuid4())]):
        p = run_cli(*args, "--schema", empty, dsn=dsn, cwd=tmp_path)
        assert p.returncode == 1 and "migrate up" in p.stderr, (args, p.stderr)
    down = "postgresql://root@127.0.0.1:1/test"
    p = run_cli("pause", "x", dsn=down, cwd=tmp_path, env=cli_env(down))
    assert p.returncode == 1 and "cannot connect" in p.stderr
