"""The flow-control commands against a real PostgreSQL: rate (SPEC F1), depth (F2), jobs, and
retry refused for a unique key an active job holds (U3)."""

from __future__ import annotations

import json
from pathlib import Path

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.test_cli_operator import cli


def test_f1_f2_cli_rate_and_depth_set_show_and_remove(
    store: Store, dsn: str, schema: str, tmp_path: Path
) -> None:
    code, out, _ = cli(dsn, schema, tmp_path, "rate", "api.call", "10/1m", "--burst", "3")
    assert code == 0 and json.loads(out) == {"topic": "api.call", "rate": 10, "per_seconds": 60.0, "burst": 3}
    code, out, _ = cli(dsn, schema, tmp_path, "depth", "api.call", "100")
    assert code == 0 and json.loads(out) == {"topic": "api.call", "max_depth": 100, "park": False}
    (s,) = store.topic_settings()
    assert (s.rate_limit, s.rate_per, s.rate_burst, s.max_depth) == (10, 60.0, 3, 100)
    code, out, _ = cli(dsn, schema, tmp_path, "topics")
    assert code == 0 and "10/1m burst 3" in out and "3.0" in out and "100" in out
    code, out, _ = cli(dsn, schema, tmp_path, "topics", "--json")
    (t,) = json.loads(out)
    assert t["rate"] == "10/1m burst 3" and t["tokens"] == 3.0 and t["max_depth"] == 100
    for bad in (
        ("rate", "api.call", "0"),
        ("rate", "api.call", "10/0s"),
        ("rate", "api.call", "x"),
        ("depth", "t", "-1"),
    ):
        code, _, err = cli(dsn, schema, tmp_path, *bad)
        assert code == 2 and "invalid" in err
    assert cli(dsn, schema, tmp_path, "rate", "api.call", "none")[0] == 0
    assert cli(dsn, schema, tmp_path, "depth", "api.call", "none")[0] == 0
    (s,) = store.topic_settings()
    assert s.rate_limit is None and s.max_depth is None and s.tokens is None


def test_cli_jobs_lists_the_newest_first_with_filters(
    store: Store, dsn: str, schema: str, tmp_path: Path
) -> None:
    ids = [store.enqueue(Job("a" if i % 2 else "b", {"i": i})).id for i in range(6)]
    store.cancel(ids[5])
    code, out, _ = cli(dsn, schema, tmp_path, "jobs", "--json")
    assert code == 0 and [json.loads(line)["id"] for line in out.splitlines()] == ids[::-1]
    code, out, _ = cli(dsn, schema, tmp_path, "jobs", "--topic", "a", "--limit", "2", "--json")
    assert [json.loads(line)["id"] for line in out.splitlines()] == [ids[5], ids[3]]
    code, out, _ = cli(dsn, schema, tmp_path, "jobs", "--state", "canceled")
    assert code == 0 and ids[5] in out and ids[3] not in out
    code, out, _ = cli(dsn, schema, tmp_path, "jobs", "--topic", "none-such")
    assert code == 0 and out.strip() == "no jobs"


def test_u3_cli_retry_says_an_active_job_holds_the_unique_key(
    store: Store, dsn: str, schema: str, tmp_path: Path
) -> None:
    old = store.enqueue(Job("t", {}, unique_key="k")).id
    store.cancel(old)
    new = store.enqueue(Job("t", {}, unique_key="k")).id
    code, _, err = cli(dsn, schema, tmp_path, "retry", old)
    assert code == 1 and new in err and "unique key" in err


def test_f3_q5_cli_depth_park_and_sequence_resume(
    store: Store, dsn: str, schema: str, tmp_path: Path
) -> None:
    code, out, _ = cli(dsn, schema, tmp_path, "depth", "cli.park", "1", "--park")
    assert code == 0 and json.loads(out) == {"topic": "cli.park", "max_depth": 1, "park": True}
    store.enqueue(Job("cli.park"))
    parked = store.enqueue(Job("cli.park")).id
    assert str(store.get(parked).state) == "parked"  # type: ignore[union-attr]
    code, out, _ = cli(dsn, schema, tmp_path, "topics", "--json")
    (t,) = json.loads(out)
    assert t["counts"] == {"pending": 1, "parked": 1}
    code, out, _ = cli(dsn, schema, tmp_path, "stats", "--json")
    assert code == 0 and json.loads(out)["topics"][0]["parked"] == 1
    code, out, err = cli(dsn, schema, tmp_path, "sequence-resume", "cli.park", "s1")
    assert code == 1 and json.loads(out)["resumed"] is False
    assert "is not halted" in err  # why nothing was done
    code, _, err = cli(dsn, schema, tmp_path, "sequence-resume", "cli.park", "")
    assert code == 2 and "invalid" in err
