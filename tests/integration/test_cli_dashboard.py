"""``brooq-py dashboard``: refuses to listen beyond loopback without a token, serves, stops on SIGTERM."""

from __future__ import annotations

import http.client
import signal
from pathlib import Path
from urllib.parse import urlsplit

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.test_cli import Worker, cli_env, run_cli

TOKEN = "cli-dash-token-7d1"


def get(url: str, path: str, token: str | None = None) -> tuple[int, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_o2_dashboard_refuses_a_public_address_without_a_token(dsn: str, schema: str, tmp_path: Path) -> None:
    done = run_cli("dashboard", "--addr", "0.0.0.0:0", "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert done.returncode == 2
    assert "without a token" in done.stderr and "BROOQ_HTTP_TOKEN" in done.stderr
    bad = run_cli("dashboard", "--addr", "nonsense", "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert bad.returncode == 2 and "--addr" in bad.stderr


def test_dashboard_serves_behind_the_token_and_stops_on_sigterm(
    dsn: str, schema: str, tmp_path: Path, store: Store
) -> None:
    store.enqueue(Job("cli.dash", {"n": 1}))
    env = cli_env(dsn, BROOQ_HTTP_TOKEN=TOKEN, BROOQ_SCHEMA=schema)
    worker = Worker(["dashboard", "--addr", "127.0.0.1:0"], env, tmp_path)
    try:
        url = worker.url()
        assert url.startswith("http://127.0.0.1:")
        status, _ = get(url, "/")
        assert status == 303
        status, body = get(url, "/", TOKEN)
        assert status == 200 and 'data-topic="cli.dash"' in body
        assert worker.stop(signal.SIGTERM) == 0
        assert TOKEN not in worker.output
    finally:
        worker.kill()
