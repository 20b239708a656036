"""The demo (``make demo``): the whole story of a job against a real PostgreSQL, in a schema of its own."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from brooq_py import devdb
from brooq_py.cli.common import first_line
from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store, WrapTx, migrations
from brooq_py.postgres.operator import stats as ops
from brooq_py.queue import Claim, Context, Job, KindOptions

SCHEMA = os.environ.get("BROOQ_DEMO_SCHEMA") or "brooq_demo"  # reset by every run
AUDIT_DONE = {"topic": "email.audit", "outcome": "done"}


def say(text: str = "") -> None:
    print(text, flush=True)


def step(n: int, title: str) -> None:
    say(f"\n== {n}. {title}")


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def show(pool: ConnectionPool[Any], title: str, name: str, **params: Any) -> None:
    """Print one of the README's SQL queries and its result, as psql would."""
    say(f"-- {title}")
    for line in ops.pasteable(name, {k: str(v) for k, v in params.items()}).splitlines():
        say("   " + line)
    with pool.connection() as conn:
        names, rows = ops.run(conn, name, SCHEMA, params or None)
    say("   " + " | ".join(names))
    for row in rows:
        say("   " + " | ".join("" if v is None else str(v) for v in row))
    say(f"   ({len(rows)} rows)")


class _NoTraceback(logging.Formatter):
    """The demo shows the engine's log lines without their stacks, to keep the story readable."""

    def format(self, record: logging.LogRecord) -> str:
        record.exc_text = ""
        saved, record.exc_info = record.exc_info, None
        try:
            return super().format(record)
        finally:
            record.exc_info = saved


def main() -> int:
    handler = logging.StreamHandler()
    handler.setFormatter(_NoTraceback("   log %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    try:
        db = devdb.acquire()
    except devdb.DevDatabaseError as exc:
        print(f"demo: no database: {first_line(exc)}", file=sys.stderr)
        return 1
    try:
        with psycopg.connect(db.dsn, connect_timeout=5):  # one clear line, as the CLI gives, not a traceback
            pass
    except psycopg.Error as exc:
        db.close()
        print(
            f"demo: cannot connect to {devdb.mask_dsn(db.dsn)} ({db.how}): {first_line(exc)}", file=sys.stderr
        )
        return 1
    try:
        return run(db)
    finally:
        db.close()


def run(db: devdb.DevDatabase) -> int:
    say(f"database: {db.how} ({devdb.mask_dsn(db.dsn)})")
    step(1, f"migrate the schema {SCHEMA!r} (reset first)")
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        ops.run(conn, "schema_drop", SCHEMA)
    migrations.upgrade(db.dsn, schema=SCHEMA)
    say(f"   revision: {migrations.current(db.dsn, schema=SCHEMA)}")

    with ConnectionPool(db.dsn, min_size=2, max_size=8, open=True) as pool:
        with pool.connection() as conn:
            ops.run(conn, "orders_create", SCHEMA)
        store = Store(pool, schema=SCHEMA)
        first_id = producer_side(pool, store)
        engine_side(pool, store, first_id)
        store.close()
    say()
    say("demo finished: every step above ran against a real PostgreSQL.")
    return 0


def producer_side(pool: ConnectionPool[Any], store: Store) -> str:
    order = {"id": 1, "email": "a@example.com"}
    step(2, "enqueue inside your own transaction: rollback leaves no job")
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        ops.run(conn, "order_insert", SCHEMA, order)
        r = store.enqueue_tx(WrapTx(conn), Job("email.send", {"order": 1}, idempotency_key="order-1"))
        say(f"   enqueued {r.id} (created={r.created}) ... then the transaction rolls back")
    say(f"   store.get({r.id[:8]}...) -> {store.get(r.id)}")

    step(3, "the same, committed: the order and its job become visible together")
    with pool.connection() as conn, conn.transaction():
        ops.run(conn, "order_insert", SCHEMA, order)
        first = store.enqueue_tx(WrapTx(conn), Job("email.send", {"order": 1}, idempotency_key="order-1"))
    row = store.get(first.id)
    say(f"   {first.id} created={first.created} state={row.state if row else None}")

    step(4, "an idempotent repeat returns the same id and changes nothing")
    again = store.enqueue(Job("email.send", {"order": 1, "ignored": True}, idempotency_key="order-1"))
    say(f"   {again.id} created={again.created} same_id={again.id == first.id}")

    step(5, "cancel a pending job")
    doomed = store.enqueue(Job("email.send", {"order": 99}))
    say(f"   cancel({doomed.id[:8]}...) -> {store.cancel(doomed.id)}; again -> {store.cancel(doomed.id)}")
    return first.id


def engine_side(pool: ConnectionPool[Any], store: Store, first_id: str) -> None:
    step(6, "start an engine: a worker claims, runs and completes; a chained job follows")
    cfg = Config(workers=4, poll_interval=1, lease=3, reaper_period=1)
    engine = Engine(store, cfg)
    slow_started = threading.Event()
    slow_stopped = threading.Event()

    def send_email(ctx: Context, claim: Claim) -> None:
        say(f"   handler: email.send order={claim.payload['order']} attempt={claim.attempt}")
        claim.chain(Job("email.audit", {"sent_for": claim.id}))

    def audit(ctx: Context, claim: Claim) -> None:
        say(f"   handler: email.audit (chained by {claim.payload['sent_for'][:8]}...)")

    def flaky(ctx: Context, claim: Claim) -> None:
        say(f"   handler: flaky attempt {claim.attempt}/{claim.max_attempts} raises")
        raise ConnectionError("smtp timeout")

    def slow(ctx: Context, claim: Claim) -> None:
        slow_started.set()
        ctx.wait(60)  # stops as soon as the lease is lost (a cancel from SQL)
        say(f"   handler: slow job stopped: {type(ctx.cause).__name__}")
        slow_stopped.set()

    engine.register_kind("email.send", send_email)
    engine.register_kind("email.audit", audit)
    engine.register_kind("flaky", flaky, KindOptions(max_attempts=3, backoff_base=0.2, backoff_max=1))
    engine.register_kind("slow", slow)
    with engine:
        first = store.get(first_id)
        assert first is not None
        wait_for(lambda: engine.registry.get_sample_value("brooq_settle_total", AUDIT_DONE) == 1.0)
        show(pool, "a job's fate is one SELECT", "fate", id=first_id)

        step(7, "a failing job retries with backoff and dies on its last attempt")
        flaky_id = engine.enqueue(Job("flaky", {"n": 1})).id
        wait_for(lambda: getattr(store.get(flaky_id), "state", None) == "dead")
        show(pool, "dead jobs", "dead")

        step(8, "a cancel from SQL stops a running job (its handler told within a second)")
        slow_id = engine.enqueue(Job("slow")).id
        slow_started.wait(10)
        show(pool, "in flight", "in_flight")
        say(f"-- cancel it as an operator would from psql (SET search_path = {SCHEMA}; first):")
        for line in (ops.pasteable("cancel", {"id": slow_id}) + ";").splitlines():
            say("   " + line)
        with pool.connection() as conn:
            ops.run(conn, "cancel", SCHEMA, {"id": slow_id})
        canceled = {"topic": "slow", "outcome": "canceled"}
        wait_for(lambda: engine.registry.get_sample_value("brooq_settle_total", canceled) == 1.0)
        wait_for(lambda: slow_stopped.is_set())
        show(pool, "the slow job", "fate", id=slow_id)

        step(9, "the useful queries of docs/operating.md")
        show(pool, "depth by topic", "depth")
        show(pool, "oldest ready age (lag)", "oldest_ready")
        settled = engine.registry.get_sample_value(
            "brooq_settle_total", {"topic": "email.send", "outcome": "done"}
        )
        say(f"\n   metric brooq_settle_total{{topic=email.send,outcome=done}} = {settled}")
    say("   engine stopped: nothing of ours is left in processing")


if __name__ == "__main__":
    sys.exit(main())
