"""SQL lives only in brooq_py/postgres/sql/*.sql, one used statement per file."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "brooq_py"
SQL_DIR = PACKAGE / "postgres" / "sql"

SQL_STATEMENT = re.compile(
    r"\b(SELECT\b[\s\S]*\bFROM|INSERT\s+INTO|UPDATE\b[\s\S]*\bSET|DELETE\s+FROM|CREATE\s+(TABLE|INDEX|SCHEMA)|"
    r"ALTER\s+TABLE|DROP\s+(TABLE|INDEX|SCHEMA))\b",
    re.IGNORECASE,
)


# devdb provisions a development database (pg_database lookups, CREATE DATABASE): tooling
# around the server, not statements of the job store.
ALLOWED = {"devdb/find.py", "devdb/server.py"}


def python_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if str(p.relative_to(PACKAGE)) not in ALLOWED)


def string_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def test_every_sql_file_is_used_by_the_code() -> None:
    code = "\n".join(p.read_text(encoding="utf-8") for p in (PACKAGE / "postgres").rglob("*.py"))
    names = sorted(p.stem for p in SQL_DIR.glob("*.sql"))
    assert "job_claim" in names
    unused = [n for n in names if f'"{n}"' not in code]
    assert unused == []


def test_each_sql_file_holds_one_statement() -> None:
    for path in SQL_DIR.glob("*.sql"):
        body = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("--"))
        body = re.sub(r"\$\$.*?\$\$", "$$ $$", body, flags=re.S)  # a DO block's body is its one statement's
        assert body.strip() and ";" not in body, path.name


def test_the_detector_detects() -> None:
    assert SQL_STATEMENT.search("select id from job")
    assert SQL_STATEMENT.search("UPDATE job j SET state = 'done'")
    assert not SQL_STATEMENT.search("the job is done")


def test_no_python_module_holds_sql_text() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}: {text[:60]!r}"
        for path in python_files()
        for text in string_literals(path)
        if SQL_STATEMENT.search(text)
    ]
    assert offenders == []
