"""The docs' SQL and examples run against a migrated schema.

The psql queries of docs/operating.md, docs/operator-controls.md, docs/handlers.md and
docs/metrics.md run on a migrated schema, and the Python blocks of docs/workflows.md,
docs/batches.md, docs/handlers.md and docs/operator-controls.md that no other test runs are
executed as written against it (only the outside services they call are stubbed)."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

import brooq_py
from brooq_py import Config, Engine, Job, KindOptions
from brooq_py.postgres import Store, WrapTx, as_psycopg
from brooq_py.testing import drain, jobs

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"```(python|sql)\n(.*?)```", re.S)


def block(page: str, needle: str, lang: str = "python") -> str:
    """The one fenced block of *page* in *lang* that contains *needle*."""
    found = [
        body
        for kind, body in BLOCK.findall((DOCS / page).read_text(encoding="utf-8"))
        if kind == lang and needle in body
    ]
    assert len(found) == 1, f"{page}: {len(found)} {lang} blocks contain {needle!r}"
    return str(found[0])


def run_block(code: str, **names: Any) -> dict[str, Any]:
    """Execute a doc block with *names* predefined (what the page's prose says is in scope)."""
    scope: dict[str, Any] = {"__name__": "doc_block", **names}
    exec(compile(code, "<doc block>", "exec"), scope)
    return scope


def states(store: Store, topic: str) -> list[str]:
    return [str(j.state) for j in jobs(store, topic)]


def test_workflows_diamond_runs_in_order(store: Store) -> None:
    run_block(block("workflows.md", "# a diamond"), store=store, Job=Job, WrapTx=WrapTx)
    engine = Engine(store, Config(workers=4))
    for topic in ("order.charge", "order.email", "order.ship", "order.close"):
        engine.register_kind(topic, lambda ctx, claim: None)
    report = drain(engine)
    assert (report.done, report.dead, report.canceled) == (4, 0, 0)
    [close] = jobs(store, "order.close")
    assert len(close.parents) == 2 and str(close.state) == "done"


def test_workflows_split_fans_out_in_on_succeeded(store: Store) -> None:
    scope = run_block(block("workflows.md", "def split"), store=store, Job=Job)
    engine = Engine(store)
    engine.register_kind("album.split", scope["split"])
    engine.register_kind("resize", lambda ctx, claim: claim.payload["image"])
    # A (ctx, claim) handler's return value is the job's result (docs/results.md).
    engine.register_kind("album.publish", lambda ctx, claim: claim.parent_results(by="name"))
    store.enqueue(Job("album.split", {"images": [1, 2, 3]}))
    report = drain(engine)
    assert (report.done, report.dead) == (5, 0)
    [publish] = jobs(store, "album.publish")
    assert publish.result == {"image-1": 1, "image-2": 2, "image-3": 3}


def test_handlers_chain_and_on_succeeded(store: Store, pool: ConnectionPool[Any], schema: str) -> None:
    with pool.connection() as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, paid bool NOT NULL DEFAULT false)").format(
                sql.Identifier(schema, "orders")
            )
        )
        conn.execute(sql.SQL("INSERT INTO {} (id) VALUES (7)").format(sql.Identifier(schema, "orders")))
    gateway = types.SimpleNamespace(
        charge=lambda order, idempotency_key: f"pay-{order}-{idempotency_key[:4]}"
    )
    code = block("handlers.md", "def charge(").replace("UPDATE orders", f"UPDATE {schema}.orders")
    scope = run_block(
        code, gateway=gateway, Job=Job, as_psycopg=as_psycopg, Context=brooq_py.Context, Claim=brooq_py.Claim
    )
    engine = Engine(store)
    engine.register_kind("order.charge", scope["charge"])
    engine.register_kind("receipt.send", lambda ctx, claim: None)
    store.enqueue(Job("order.charge", {"order": 7}))
    report = drain(engine)
    assert (report.done, report.dead) == (2, 0)
    with pool.connection() as conn:
        row = conn.execute(
            sql.SQL("SELECT paid FROM {} WHERE id = 7").format(sql.Identifier(schema, "orders"))
        ).fetchone()
    assert row == (True,)


def test_batches_typed_batch_task(store: Store) -> None:
    model = types.SimpleNamespace(embed=lambda items: [[float(len(i))] for i in items])
    code = block("batches.md", "@tasks.batch_task")
    engine = Engine(store, Config(workers=4))
    run_block(code, store=store, engine=engine, model=model, texts=["a", "bb", "ccc"])
    report = drain(engine)
    assert (report.done, report.dead) == (3, 0)
    assert sorted(j.result for j in jobs(store, "docs.embed")) == [[1.0], [2.0], [3.0]]


def test_batches_register_batch_example(store: Store) -> None:
    def bulk_index(docs: list[Any]) -> list[Any]:
        return [types.SimpleNamespace(ok=d["ok"], error=None if d["ok"] else "rejected") for d in docs]

    engine = Engine(store, Config(workers=4))
    run_block(
        block("batches.md", "register_batch"),
        store=store,
        engine=engine,
        search=types.SimpleNamespace(bulk_index=bulk_index),
        docs=[{"ok": True}, {"ok": False}],
    )
    drain(engine, retries="never")
    assert sorted(states(store, "docs.index")) == ["done", "failed"]


def test_operator_controls_schedules_and_limits(store: Store) -> None:
    engine = Engine(store)
    run_block(
        block("operator-controls.md", 'engine.schedule("cache.warm"').replace("engine.start()", ""),
        engine=engine,
    )
    run_block(
        block("operator-controls.md", "KindOptions(concurrency=2)"),
        engine=engine,
        store=store,
        KindOptions=KindOptions,
        render=lambda ctx, claim: None,
    )
    assert store.topic_settings()  # payments.api now has a limit
    engine.close()


SQL_PAGES = [
    ("operating.md", "A job's fate in one query"),
    ("operating.md", "how long each has been silent"),
    ("operating.md", "most crashes first"),
    ("operator-controls.md", "-- pause"),
    ("operator-controls.md", "concurrency_limit"),
    ("handlers.md", "SET state = 'canceled'"),
    ("metrics.md", "pg_stat_activity"),
]


@pytest.mark.parametrize(("page", "needle"), SQL_PAGES)
def test_psql_queries_run_on_a_migrated_schema(page: str, needle: str, dsn: str, schema: str) -> None:
    body = block(page, needle, "sql").replace("'7c1e...'", "'01890000-0000-7000-8000-000000000000'")
    body = body.replace("'...'", "'01890000-0000-7000-8000-000000000000'")
    statements = [s for s in re.split(r";[^\n]*\n", body) if re.sub(r"--[^\n]*", "", s).strip()]
    assert statements
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        for statement in statements:
            conn.execute(statement.replace('"brooq.public"', f'"brooq.{schema}"'))
        conn.rollback()
