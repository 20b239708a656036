"""The README's "Enqueue inside your own transaction" snippets (their asyncio forms in
docs/enqueueing.md) are complete programs: each runs
against real PostgreSQL and its order commits with its job (SPEC E3, A1). So do the complete
programs (``<!-- program: name -->``) and test modules (``<!-- pytest-module: name -->``) of the
README and of every page in docs/."""

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

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARK = re.compile(r"<!-- readme-snippet: ([\w-]+) -->\n```python\n(.*?)```", re.S)
MARKED = re.compile(r"<!-- (program|pytest-module): ([\w-]+) -->\n```python\n(.*?)```", re.S)


def marked(kind: str) -> dict[str, str]:
    """Every block marked *kind* in the README and docs/*.md, by ``page:name``.

    A test module may import the programs of its own page by name (``first-app`` as ``first_app``).
    """
    found: dict[str, str] = {}
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for k, name, body in MARKED.findall(page.read_text(encoding="utf-8")):
            if k == kind:
                found[f"{page.stem}:{name}"] = body
    return found


def snippets() -> dict[str, str]:
    """The README's programs, and their asyncio forms in docs/enqueueing.md."""
    pages = (README, ROOT / "docs" / "enqueueing.md")
    return {k: v for page in pages for k, v in MARK.findall(page.read_text(encoding="utf-8"))}


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


def test_the_docs_have_their_examples() -> None:
    assert "testing:testing-example" in marked("pytest-module")
    assert {"testing:own-tables", "testing:async-tests"} <= set(marked("pytest-module"))
    assert "README:test-first-app" in marked("pytest-module")
    assert "README:first-app" in marked("program")
    assert {"durable:durable-order", "durable:durable-async"} <= set(marked("program"))


@pytest.mark.parametrize("name", sorted(marked("program")))
def test_a_documented_program_runs(name: str, dsn: str, schema: str, tmp_path: Path) -> None:
    body = marked("program")[name]
    script = tmp_path / f"program_{name.split(':')[1].replace('-', '_')}.py"
    script.write_text(body, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "DATABASE_URL": dsn, "BROOQ_SCHEMA": schema},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if name == "README:first-app":
        assert done.stdout.split()[-1] == "done", done.stdout


@pytest.mark.parametrize("name", sorted(marked("pytest-module")))
def test_a_documented_test_module_passes(name: str, dsn: str, tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["brooq_py.testing"]\n', encoding="utf-8")
    page, short = name.split(":")
    for program, body in marked("program").items():
        if program.startswith(page + ":"):
            (tmp_path / f"{program.split(':')[1].replace('-', '_')}.py").write_text(body, encoding="utf-8")
    module = tmp_path / f"test_{short.replace('-', '_').removeprefix('test_')}.py"
    module.write_text(marked("pytest-module")[name], encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "DATABASE_URL": dsn, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout
