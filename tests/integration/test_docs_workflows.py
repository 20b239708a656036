"""docs/workflows.md: its SQL puts a dead parent's branch back (SPEC D3); its program runs in test_readme_snippets.
docs/operator-controls.md: its psql retry leaves a job whose parents are not all done alone (SPEC D2)."""

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
OPERATOR_PAGE = PAGE.with_name("operator-controls.md")
RETRY = re.compile(r"<!-- docs-sql: retry-branch -->\n```sql\n(.*?)```", re.S)
PSQL_RETRY = re.compile(r"<!-- docs-sql: retry -->\n```sql\n(.*?)```", re.S)


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def run_documented(text: str, dsn: str, schema: str, parent: str) -> None:
    """Run the statements of a documented psql block, its :'parent' (or '7c1e...') being *parent*."""
    text = text.replace(":'parent'", "%(parent)s").replace("'7c1e...'", "%(parent)s")
    statements = [s.strip() for s in text.split(";") if s.strip()]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        for statement in statements:
            lines = [line.split("--")[0] if "--" in line else line for line in statement.splitlines()]
            body = "\n".join(line for line in lines if line.strip())
            params: dict[str, Any] = {"parent": parent} if "%(parent)s" in body else {}
            conn.execute(body.replace("%", "%%").replace("%%(parent)s", "%(parent)s"), params or None)


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
    run_documented(text, dsn, schema, root)
    assert state(store, child) is State.BLOCKED and state(store, grandchild) is State.BLOCKED
    assert bystander is not None
    finish(store, "root")
    assert state(store, child) is State.PENDING and state(store, grandchild) is State.BLOCKED
    finish(store, "c")
    finish(store, "other")
    assert state(store, grandchild) is State.PENDING
    (r,) = store.worker.claim(["g"], 1, "w", LEASE)
    assert store.worker.settle_many([Outcome(r.id, r.claim_token, State.DONE)]) == {grandchild}


def test_d3_the_documented_sql_puts_back_a_child_canceled_at_birth(
    store: Store, dsn: str, schema: str
) -> None:
    """A child enqueued after its parent died waits for nothing (no job_wait row): the branch's SQL
    writes it, so the retried parent's done releases the child put back."""
    root = store.enqueue(Job("root")).id
    finish(store, "root", State.DEAD)
    child = store.enqueue(Job("c", after=[root])).id
    assert state(store, child) is State.CANCELED
    assert store.retry(root)
    (text,) = RETRY.findall(page())
    run_documented(text, dsn, schema, root)
    assert state(store, child) is State.BLOCKED
    finish(store, "root")
    assert state(store, child) is State.PENDING


def test_d2_the_documented_psql_retry_leaves_a_child_of_an_unfinished_parent(
    store: Store, dsn: str, schema: str
) -> None:
    (text,) = PSQL_RETRY.findall(OPERATOR_PAGE.read_text(encoding="utf-8"))
    text = text.split("NOTIFY")[0]  # the optional wake-up names the public schema's channel
    root = store.enqueue(Job("root")).id
    finish(store, "root", State.DEAD)
    child = store.enqueue(Job("c", after=[root])).id
    run_documented(text, dsn, schema, child)
    assert state(store, child) is State.CANCELED  # its parent is dead: not retried
    run_documented(text, dsn, schema, root)
    assert state(store, root) is State.PENDING  # a job without parents is
    finish(store, "root")
    run_documented(text, dsn, schema, child)
    assert state(store, child) is State.PENDING  # and the child once its parent is done
