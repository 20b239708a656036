"""The documented branch recipe (docs/workflows.md, "Retrying the dead parent"): a group's finally_
waits for the members it puts back, retention keeps their parents meanwhile, and a job whose parent
retention deleted stays canceled (SPEC D3, D4, BD2, Q1)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.test_docs_workflows import RETRY, page, run_documented
from tests.integration.test_flows_history import settle, states_of
from tests.integration.test_workflows import state


def _recipe_statements(parent: str) -> list[tuple[str, dict[str, Any] | None]]:
    (text,) = RETRY.findall(page())
    text = text.replace(":'parent'", "%(parent)s")
    out = []
    for statement in (s.strip() for s in text.split(";") if s.strip()):
        lines = [line.split("--")[0] if "--" in line else line for line in statement.splitlines()]
        body = "\n".join(line for line in lines if line.strip())
        params = {"parent": parent} if "%(parent)s" in body else None
        out.append((body.replace("%", "%%").replace("%%(parent)s", "%(parent)s"), params))
    return out


# --- BD2: a member put back by the documented branch recipe is not waited for by its finally_ ------


def test_bd2_a_member_put_back_by_the_branch_recipe_is_waited_for_by_its_finally(
    store: Store, dsn: str, schema: str
) -> None:
    """docs/workflows.md: "A member retried before the group ended is waited for again: the finally_
    runs once it has ended too" (BD2: finally_ runs once every job of the group has ended). A member
    canceled by the death of its own parent is run again the documented way (retry the parent, then
    the branch recipe), before the group ended: the finally_ did not wait for it and was released by
    the other member's end while the put-back member was still pending."""
    root = store.enqueue(Job("pr")).id
    group = store.enqueue_group({"a": Job("pa", after=[root]), "b": Job("pb")}, finally_=Job("pf"))
    a, _b = group.ids
    f = group.finally_id
    assert f is not None
    settle(store, "pr", State.DEAD)
    assert state(store, a) is State.CANCELED and state(store, f) is State.BLOCKED
    assert store.retry(root)
    (text,) = RETRY.findall(page())
    run_documented(text, dsn, schema, root)
    assert state(store, a) is State.BLOCKED  # put back, waiting for root
    settle(store, "pr", State.DONE, 1)
    assert state(store, a) is State.PENDING
    settle(store, "pb", State.DONE, 2)  # the group has not ended: a runs again
    seen = {k: v.value for k, v in states_of(store, f).items()}
    assert state(store, f) is State.BLOCKED, (
        f"the finally_ is {state(store, f).value} while member a is {state(store, a).value}: "
        f"parent_states() = {seen}"
    )


# --- D4: the branch recipe puts back a job whose done parent retention deletes ---------------------


def test_d4_the_branch_recipe_keeps_the_parents_from_retention(
    store: Store, dsn: str, schema: str, pool: ConnectionPool[Any]
) -> None:
    """D4: "Retention deletes a done parent only after every child naming it is terminal, so
    parent_results() always finds them". The retry locks the done parents (FOR KEY SHARE) for
    exactly this; the documented branch recipe did not: retention running while the recipe's
    transaction was open deleted the done parent x of the canceled child c, which then ran without
    it. The recipe now locks the parents as the retry does."""
    root = store.enqueue(Job("pr")).id
    x = store.enqueue(Job("px")).id
    settle(store, "px", State.DONE, {"x": 1})
    c = store.enqueue(Job("pc", after=[root, x])).id
    settle(store, "pr", State.DEAD)
    assert state(store, c) is State.CANCELED
    assert store.retry(root)
    with psycopg.connect(dsn) as db:
        db.execute(
            sql.SQL("UPDATE {} SET updated_at = now() - interval '2 days' WHERE id = %s").format(
                sql.Identifier(schema, "job")
            ),
            (x,),
        )
        db.commit()
    with psycopg.connect(dsn) as op:  # the operator's psql session: BEGIN; the recipe ...
        op.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        for body, params in _recipe_statements(root):
            if body.upper() in ("BEGIN", "COMMIT"):
                continue
            op.execute(body, params)
        # the recipe holds x as an enqueue naming it would: retention passes it by
        assert x not in {d[0] for d in store.worker.delete_terminal(timedelta(days=1), 100)}
        op.commit()  # ... COMMIT
    assert store.get(x) is not None
    settle(store, "pr", State.DONE, 1)
    assert state(store, c) is State.PENDING
    assert {p.id: p.state for p in store.producer.parents(c)}[x] is State.DONE


def test_d4_the_branch_recipe_leaves_canceled_a_child_whose_parent_retention_deleted(
    store: Store, dsn: str, schema: str
) -> None:
    """A job of the branch whose parent retention deleted: the recipe wrote no job_wait row for the
    missing parent, so the retried parent's done made it pending and it ran without that parent (the
    docs said it would wait forever). The recipe now leaves it canceled."""
    root = store.enqueue(Job("pr")).id
    x = store.enqueue(Job("px")).id
    settle(store, "px", State.DONE, {"x": 1})
    c = store.enqueue(Job("pc", after=[root, x])).id
    settle(store, "pr", State.DEAD)
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(
            sql.SQL("UPDATE {} SET updated_at = now() - interval '2 days' WHERE id = %s").format(
                sql.Identifier(schema, "job")
            ),
            (x,),
        )
    assert x in {d[0] for d in store.worker.delete_terminal(timedelta(days=1), 100)}
    assert store.retry(root)
    (text,) = RETRY.findall(page())
    run_documented(text, dsn, schema, root)
    settle(store, "pr", State.DONE, 1)
    assert state(store, c) is State.CANCELED
