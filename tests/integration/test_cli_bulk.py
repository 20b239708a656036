"""The command line against a real PostgreSQL: `cancel` of an unknown id, bulk `retry --topic
--state`, and `jobs --payload` (a jsonb containment filter)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.test_cli_operator import cli, set_state


def test_cancel_of_an_unknown_id_says_no_such_job_with_status_2(
    store: Store, dsn: str, schema: str, tmp_path: Path
) -> None:
    unknown = str(uuid.uuid4())
    code, out, err = cli(dsn, schema, tmp_path, "cancel", unknown)
    assert code == 2 and out == "" and f"no such job: {unknown}" in err, (code, out, err)

    # A job that exists but has ended keeps its answer: {"canceled": false}, status 1.
    done = store.enqueue(Job("cli.ended", {})).id
    set_state(dsn, schema, done, "done")
    code, out, err = cli(dsn, schema, tmp_path, "cancel", done)
    assert code == 1 and json.loads(out) == {"canceled": False} and "no such job" not in err


def test_bulk_retry_retries_dead_jobs_of_a_topic_and_says_what_it_skipped_and_why(
    store: Store, dsn: str, schema: str, tmp_path: Path
) -> None:
    plain = [store.enqueue(Job("mail", {"n": n})).id for n in range(3)]
    held = store.enqueue(Job("mail", {"n": 3}, unique_key="u-1")).id
    for job_id in [*plain, held]:
        set_state(dsn, schema, job_id, "dead")
    holder = store.enqueue(Job("mail", {"n": 4}, unique_key="u-1")).id  # active: holds the key now
    other_topic = store.enqueue(Job("sms", {})).id
    set_state(dsn, schema, other_topic, "dead")
    canceled = store.enqueue(Job("mail", {"n": 5})).id
    store.cancel(canceled)

    code, out, err = cli(dsn, schema, tmp_path, "retry", "--topic", "mail", "--state", "dead")
    report = json.loads(out)
    assert code == 1, (code, out, err)  # some were skipped
    assert sorted(report["retried"]) == sorted(plain)
    assert [s["id"] for s in report["skipped"]] == [held]
    assert holder in report["skipped"][0]["why"] and "unique" in report["skipped"][0]["why"]
    assert "3 of 4 dead jobs of topic 'mail' retried; 1 skipped" in err
    for job_id in plain:
        row = store.get(job_id)
        assert row is not None and row.state is State.PENDING and row.attempts == 0
    assert store.get(held).state is State.DEAD  # type: ignore[union-attr]
    assert store.get(other_topic).state is State.DEAD  # type: ignore[union-attr]  # another topic
    assert store.get(canceled).state is State.CANCELED  # type: ignore[union-attr]  # another state

    # The canceled one, with --limit; nothing skipped: status 0.
    code, out, _ = cli(
        dsn, schema, tmp_path, "retry", "--topic", "mail", "--state", "canceled", "--limit", "1"
    )
    assert code == 0 and json.loads(out)["retried"] == [canceled] and json.loads(out)["skipped"] == []

    # Bad usage: an id and a topic, a topic without a state, a state a retry does not take from.
    for args in (
        ("retry", plain[0], "--topic", "mail", "--state", "dead"),
        ("retry", "--topic", "mail"),
        ("retry", "--topic", "mail", "--state", "pending"),
        ("retry",),
    ):
        code, _, err = cli(dsn, schema, tmp_path, *args)
        assert code == 2 and "Traceback" not in err, (args, err)


def test_jobs_payload_filters_by_containment(store: Store, dsn: str, schema: str, tmp_path: Path) -> None:
    seven = store.enqueue(Job("mail", {"user_id": 7, "lang": "fr", "tags": ["a", "b"]})).id
    store.enqueue(Job("mail", {"user_id": 8, "lang": "fr"}))
    store.enqueue(Job("sms", {"user_id": 7}))

    code, out, _ = cli(
        dsn, schema, tmp_path, "jobs", "--topic", "mail", "--payload", '{"user_id": 7}', "--json"
    )
    assert code == 0 and [json.loads(line)["id"] for line in out.splitlines()] == [seven]
    code, out, _ = cli(dsn, schema, tmp_path, "jobs", "--payload", '{"tags": ["b"]}', "--json")
    assert code == 0 and [json.loads(line)["id"] for line in out.splitlines()] == [seven]
    code, out, _ = cli(dsn, schema, tmp_path, "jobs", "--payload", '{"user_id": 7}', "--json")
    assert code == 0 and len(out.splitlines()) == 2  # both topics
    code, out, _ = cli(dsn, schema, tmp_path, "jobs", "--payload", '{"user_id": 9}')
    assert code == 0 and out.strip() == "no jobs"
    code, _, err = cli(dsn, schema, tmp_path, "jobs", "--payload", "{not json")
    assert code == 2 and "--payload is not valid JSON" in err

    assert [r.id for r in store.list_jobs(payload={"lang": "fr", "user_id": 7})] == [seven]
