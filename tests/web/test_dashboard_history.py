"""The dashboard and the CLI read a job that moved to the terminal history (SPEC B2, B3): its page,
the list of dead jobs, a retry from its page, ``brooq-py get``. Real HTTP, a real CLI process."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.conftest import q
from tests.integration.history import ended, move, where
from tests.integration.test_cli import run_cli
from tests.web.conftest import TOKEN, Board
from tests.web.test_dashboard_http import csrf_of
from tests.web.test_dashboard_pages import facts


def moved_dead(dsn: str, store: Store, pool: Any) -> str:
    job_id = store.enqueue(Job("web.hist", {"a": 1})).id
    ended(dsn, store.schema, [job_id], "dead")
    q(pool, store.schema, "UPDATE {job} SET last_error = 'boom' WHERE id = %s", job_id)
    assert [i for i, _ in move(store)] == [job_id]
    assert where(pool, store.schema, job_id) != "job"
    return job_id


def test_b2_a_moved_job_has_its_page_is_listed_dead_and_is_retried_from_its_page(
    dsn: str, board: Board, store: Store, pool: Any
) -> None:
    job_id = moved_dead(dsn, store, pool)
    page = board.request("GET", f"/jobs/{job_id}", token=TOKEN)
    assert page.status == 200 and facts(page.body)["State"] == "dead"
    assert job_id in board.request("GET", "/dead", token=TOKEN).body
    assert job_id in board.request("GET", "/jobs?topic=web.hist&state=dead", token=TOKEN).body
    session = board.login()
    page = board.request("GET", f"/jobs/{job_id}", cookie=session)
    (back,) = set(re.findall(r'name="back" value="([^"]*)"', page.body))
    done = board.request(
        "POST", "/action/retry", form={"id": job_id, "csrf": csrf_of(page.body), "back": back}, cookie=session
    )
    assert done.status == 303, done.body
    row = store.get(job_id)
    assert row is not None and row.state is State.PENDING
    assert where(pool, store.schema, job_id) == "job"


def test_b2_the_cli_gets_a_moved_job(dsn: str, store: Store, pool: Any, tmp_path: Path) -> None:
    job_id = moved_dead(dsn, store, pool)
    got = run_cli("get", job_id, "--schema", store.schema, dsn=dsn, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["state"] == "dead"
