"""SPEC B2 with D3: the documented ways to put a dead parent's branch back
(docs/workflows.md, "docs-sql: retry-branch", referenced by SPEC D3) and the documented psql retry
(docs/operator-controls.md, "docs-sql: retry") once the branch ended more than history_after ago."""

from __future__ import annotations

import time
from typing import Any

from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.history import move, where
from tests.integration.test_docs_workflows import OPERATOR_PAGE, PSQL_RETRY, RETRY, page, run_documented
from tests.integration.test_workflows import finish, state


def test_b2_the_documented_branch_sql_after_the_branch_moved_to_history(
    store: Store, dsn: str, schema: str, pool: ConnectionPool[Any]
) -> None:
    """test_d3_the_documented_sql_puts_a_dead_parents_branch_back, with the branch ended more than
    history_after ago (moved): the recipe takes the branch back from the history first, and the
    branch is blocked again, waiting for the retried root."""
    root = store.enqueue(Job("root")).id
    other = store.enqueue(Job("other")).id
    child = store.enqueue(Job("c", after=[root])).id
    grandchild = store.enqueue(Job("g", after=[child, other])).id
    finish(store, "root", State.DEAD)
    assert state(store, grandchild) is State.CANCELED
    time.sleep(0.6)
    moved = {i for i, _ in move(store, 100)}
    assert {root, child, grandchild} <= moved
    assert store.retry(root)  # moves the root back first
    (text,) = RETRY.findall(page())
    run_documented(text, dsn, schema, root)
    assert state(store, child) is State.BLOCKED and state(store, grandchild) is State.BLOCKED
    assert where(pool, schema, child) == "job"


def test_b2_the_documented_psql_retry_of_a_job_in_history(
    store: Store, dsn: str, schema: str, pool: ConnectionPool[Any]
) -> None:
    """docs/operator-controls.md's psql retry of a dead job that moved: the recipe takes it back
    from the history first."""
    (text,) = PSQL_RETRY.findall(OPERATOR_PAGE.read_text(encoding="utf-8"))
    text = text.split("NOTIFY")[0]
    root = store.enqueue(Job("root")).id
    finish(store, "root", State.DEAD)
    time.sleep(0.6)
    assert move(store, 100)
    run_documented(text, dsn, schema, root)
    assert state(store, root) is State.PENDING
