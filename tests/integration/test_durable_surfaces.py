"""The row tells the story (SPEC DS5): the CLI's ``get`` and ``signal``, and HTTP's signal endpoint."""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome
from brooq_py.service import Server, serve
from tests.integration.test_cli import cli_env
from tests.integration.test_cli import run_cli as _run_cli
from tests.integration.test_service_operator import TOKEN

VIEWER = "view-" + uuid.uuid4().hex
ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, dsn: str, cwd: Path) -> Any:
    """The CLI of this checkout (its code first on the path, whatever is installed)."""
    return _run_cli(*args, dsn=dsn, cwd=cwd, env=cli_env(dsn, PYTHONPATH=str(ROOT)))


def waiting_job(store: Store, topic: str = "surf") -> str:
    """A job that recorded a step and waits for the signal "approval", as its handler leaves it."""
    jid = store.enqueue(Job(topic, {})).id
    (claim,) = store.worker.claim([topic], 1, "w", timedelta(seconds=30))
    store.worker.step_record(jid, claim.claim_token, 0, "charge", "step", result='{"ok": true}')
    store.worker.step_record(jid, claim.claim_token, 1, "approval", "wait", delay=timedelta(hours=1))
    wait = Outcome(jid, claim.claim_token, State.SCHEDULED, timedelta(hours=1), True, waiting_for="approval")
    assert jid in store.worker.settle_many([wait])
    return jid


def test_ds5_cli_get_shows_steps_and_waiting_for_and_signal_sends_one(
    dsn: str, schema: str, tmp_path: Path, store: Store
) -> None:
    jid = waiting_job(store)
    got = run_cli("get", jid, "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    assert doc["waiting_for"] == "approval" and doc["state"] == "scheduled"
    assert [(s["name"], s["kind"]) for s in doc["steps"]] == [("charge", "step"), ("approval", "wait")]
    sent = run_cli("signal", jid, "approval", '{"by": "ann"}', "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert sent.returncode == 0 and json.loads(sent.stdout) == {"signaled": True}, sent.stderr
    again = run_cli("signal", jid, "approval", "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert again.returncode == 1 and json.loads(again.stdout) == {"signaled": False}
    bad = run_cli("signal", jid, "x", "{nope", "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert bad.returncode == 2 and "JSON" in bad.stderr
    unknown = run_cli("signal", str(uuid.uuid4()), "x", "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert unknown.returncode == 2 and "no such job" in unknown.stderr
    with store.session.pool.connection() as conn:  # type: ignore[union-attr]
        rows = conn.execute(f'SELECT name, payload FROM "{schema}".job_signal').fetchall()
    assert rows == [("approval", {"by": "ann"})]


def call(server: Server, method: str, path: str, body: bytes = b"", token: str = TOKEN) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


@pytest.fixture
def engine(store: Store) -> Iterator[Engine]:
    eng = Engine(store, Config(workers=1, poll_interval=0.2))
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture(params=[True, False], ids=["starlette", "wsgi"])
def server(engine: Engine, request: pytest.FixtureRequest) -> Iterator[Server]:
    with serve(engine, port=0, token=TOKEN, viewer_token=VIEWER, dashboard=request.param) as srv:
        yield srv


def test_ds5_http_signal_endpoint_and_the_job_json(server: Server, store: Store) -> None:
    jid = waiting_job(store)
    status, doc = call(server, "GET", f"/jobs/{jid}")
    assert status == 200 and doc["waiting_for"] == "approval"
    assert [s["name"] for s in doc["steps"]] == ["charge", "approval"]
    assert call(server, "POST", f"/jobs/{jid}/signals/approval", b"{}", token=VIEWER)[0] == 403
    assert call(server, "POST", f"/jobs/{jid}/signals/approval", b"{nope")[0] == 400
    assert call(server, "POST", f"/jobs/{jid}/signals/approval", b'{"by": "http"}') == (
        200,
        {"signaled": True},
    )
    assert call(server, "POST", f"/jobs/{jid}/signals/approval", b"") == (200, {"signaled": False})
    assert call(server, "POST", f"/jobs/{jid}/signals/other%20one") == (200, {"signaled": True})
    assert call(server, "POST", f"/jobs/{uuid.uuid4()}/signals/x")[0] == 404
    assert call(server, "GET", f"/jobs/{jid}/signals/x")[0] == 405
    with store.session.pool.connection() as conn:  # type: ignore[union-attr]
        rows = conn.execute(f'SELECT name, payload FROM "{store.schema}".job_signal ORDER BY name').fetchall()
    assert rows == [("approval", {"by": "http"}), ("other one", None)]
