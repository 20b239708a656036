"""The complete programs of docs/unique-jobs.md, docs/rate-limits.md and docs/tenants.md run against
real PostgreSQL."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARK = re.compile(r"<!-- docs-snippet: ([\w-]+) -->\n```python\n(.*?)```", re.S)


def snippets() -> dict[str, str]:
    found: dict[str, str] = {}
    for page in ("unique-jobs.md", "rate-limits.md", "tenants.md"):
        found.update(MARK.findall((DOCS / page).read_text(encoding="utf-8")))
    return found


def test_the_pages_have_their_snippets() -> None:
    assert set(snippets()) == {"unique-debounce", "rate-and-depth", "tenants-saas"}


@pytest.mark.parametrize("name", ["unique-debounce", "rate-and-depth", "tenants-saas"])
def test_docs_snippet_runs(name: str, dsn: str, schema: str, tmp_path: Path) -> None:
    script = tmp_path / f"snippet_{name.replace('-', '_')}.py"
    script.write_text(snippets()[name], encoding="utf-8")
    env = {**os.environ, "DATABASE_URL": make_conninfo(dsn), "BROOQ_SCHEMA": schema}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
