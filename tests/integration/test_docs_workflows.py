"""docs/workflows.md: its SQL puts a dead parent's branch back (SPEC D3); its program runs in test_readme_snippets."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome
from tests.integration.test_workflows import LEASE, finish, state

PAGE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"
RETRY = re.compile(r"<!-- docs-sql: retry-branch -->\n```sql\n(.*?)```", re.S)


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def test_d3_the_documented_sql_puts_a_dead_parents_branch_back(store: Store, dsn: str, schema: str) -> None:
    root = store.enqueue(Job("root")).id
    other = store.enqueue(Job("other")).id
    child = store.enqueue(Job("c", after=[root])).id
    grandchild = store.enqueue(Job("g", after=[child, other])).id
    bystander = store.get(store.enqueue(Job("b", after=[other])).id)
    finish(store, "root", State.DEAD)
    assert state(store, grandchild) is State.CANCELED
    assert store.retry(root)
    (text,) = RETRY.findall(page())
    statements = [s.strip() for s in text.replace(":'parent'", "%(parent)s").split(";") if s.strip()]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        for statement in statements:
            body = "\n".join(line for line in statement.splitlines() if not line.startswith("--"))
            params: dict[str, Any] = {"parent": root} if "%(parent)s" in body else {}
            conn.execute(body.replace("%", "%%").replace("%%(parent)s", "%(parent)s"), params or None)
    assert state(store, child) is State.BLOCKED and state(store, grandchild) is State.BLOCKED
    assert bystander is not None
    finish(store, "root")
    assert state(store, child) is State.PENDING and state(store, grandchild) is State.BLOCKED
    finish(store, "c")
    finish(store, "other")
    assert state(store, grandchild) is State.PENDING
    (r,) = store.claim(["g"], 1, "w", LEASE)
    assert store.settle_many([Outcome(r.id, r.claim_token, State.DONE)]) == {grandchild}
