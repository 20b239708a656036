"""The README's "Enqueue inside your own transaction" snippets are complete programs: each runs
against real PostgreSQL and its order commits with its job (SPEC E3, A1)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

README = Path(__file__).resolve().parents[2] / "README.md"
MARK = re.compile(r"<!-- readme-snippet: ([\w-]+) -->\n```python\n(.*?)```", re.S)


def snippets() -> dict[str, str]:
    return dict(MARK.findall(README.read_text(encoding="utf-8")))


def counts(dsn: str, schema: str) -> tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        orders = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "orders"))
        ).fetchone()
        jobs = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "job"))
        ).fetchone()
    assert orders is not None and jobs is not None
    return int(orders[0]), int(jobs[0])


@pytest.fixture
def app_env(dsn: str, schema: str) -> dict[str, str]:
    """The environment a snippet expects: DATABASE_URL (on the test schema), the orders table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, email text)").format(
                sql.Identifier(schema, "orders")
            )
        )
    url = make_conninfo(dsn, options=f"-c search_path={schema}")
    return {"DATABASE_URL": url, "BROOQ_SCHEMA": schema}


def test_the_readme_has_every_snippet() -> None:
    assert set(snippets()) == {"psycopg", "psycopg-async", "sqlalchemy", "sqlalchemy-async", "fastapi"}


@pytest.mark.parametrize("name", ["psycopg", "psycopg-async", "sqlalchemy", "sqlalchemy-async"])
def test_e3_readme_snippet_runs(
    name: str, app_env: dict[str, str], dsn: str, schema: str, tmp_path: Path
) -> None:
    script = tmp_path / f"snippet_{name.replace('-', '_')}.py"  # never shadowing a package's name
    script.write_text(snippets()[name], encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, **app_env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert counts(dsn, schema) == (1, 1)


def test_e3_readme_fastapi_snippet_serves_an_order(
    app_env: dict[str, str], dsn: str, schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in app_env.items():
        monkeypatch.setenv(key, value)
    path = tmp_path / "orders_snippet.py"
    path.write_text(snippets()["fastapi"], encoding="utf-8")
    spec = importlib.util.spec_from_file_location("orders_snippet", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = module.app

    async def main() -> httpx.Response:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://example") as client:
                return await client.post("/orders", params={"email": "a@example.com"})

    response = asyncio.run(main())
    assert response.status_code == 200, response.text
    assert counts(dsn, schema) == (1, 1)
