"""The command line passes BROOQ_HTTP_VIEWER_TOKEN to the worker's surface and to the dashboard (SPEC K5)."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import httpx

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.test_cli import Worker, cli_env

OPERATOR = "cli-op-" + uuid.uuid4().hex
VIEWER = "cli-view-" + uuid.uuid4().hex


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_k5_worker_surface_takes_the_viewer_token_for_reads_only(
    dsn: str, schema: str, tmp_path: Path, store: Store
) -> None:
    job_id = store.enqueue(Job("cli.roles", {"n": 1})).id
    env = cli_env(
        dsn,
        BROOQ_HTTP_ADDR="127.0.0.1:0",
        BROOQ_HTTP_TOKEN=OPERATOR,
        BROOQ_HTTP_VIEWER_TOKEN=VIEWER,
        QUEUE_POLL_INTERVAL="200ms",
    )
    worker = Worker(["worker", "--demo", "--schema", schema], env, tmp_path)
    try:
        with httpx.Client(base_url=worker.url(), timeout=30) as client:
            assert client.get(f"/jobs/{job_id}", headers=auth(VIEWER)).json()["topic"] == "cli.roles"
            assert client.post(f"/jobs/{job_id}/cancel", headers=auth(VIEWER)).status_code == 403
            assert client.post("/topics/cli.roles/pause", headers=auth(VIEWER)).status_code == 403
            assert store.paused() == set()
            assert client.post(f"/jobs/{job_id}/cancel", headers=auth(OPERATOR)).json() == {"canceled": True}
        assert worker.stop(signal.SIGTERM) == 0, worker.output
    finally:
        worker.kill()
    assert OPERATOR not in worker.output and VIEWER not in worker.output
    assert "operator and viewer tokens" in worker.output


def test_k5_dashboard_command_with_a_viewer_token(
    dsn: str, schema: str, tmp_path: Path, store: Store
) -> None:
    store.enqueue(Job("cli.roles", {"n": 1}))
    env = cli_env(dsn, BROOQ_HTTP_VIEWER_TOKEN=VIEWER, BROOQ_SCHEMA=schema)
    worker = Worker(["dashboard", "--addr", "127.0.0.1:0"], env, tmp_path)
    try:
        with httpx.Client(base_url=worker.url(), timeout=30) as client:
            page = client.get("/", headers=auth(VIEWER))
            assert page.status_code == 200 and 'data-topic="cli.roles"' in page.text
            assert "/action/" not in page.text
            refused = client.post("/action/pause", data={"topic": "cli.roles"}, headers=auth(VIEWER))
            assert refused.status_code == 403 and store.paused() == set()
        assert worker.stop(signal.SIGTERM) == 0
    finally:
        worker.kill()
    assert VIEWER not in worker.output
