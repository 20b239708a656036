"""Periodic jobs run exactly once per tick, whatever retention does (SPEC Q4').

The database remembers each schedule's last tick: a tick whose job retention
deleted is never enqueued again by a restarted engine, nor by a new one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.engine import Engine
from brooq_py.engine.clock import SystemClock
from brooq_py.engine.services.scheduler import tick_key
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job
from tests.polling import wait_for

EVERY_30S = "*/30 * * * * *"


class FakeNow(SystemClock):
    """The real monotonic clock, a wall clock the test sets (what the scheduler reads)."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at


def rows(dsn: str, schema: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rendered = sql.SQL(query).format(  # type: ignore[arg-type]
            job=sql.Identifier(schema, "job"), schedule_tick=sql.Identifier(schema, "schedule_tick")
        )
        cur = conn.execute(rendered, params or None)
        return cur.fetchall() if cur.description is not None else []


def scheduled_once(engine: Engine, topic: str, next_tick: datetime) -> bool:
    """Whether the engine's scheduler has handled its first tick (it then names the next)."""
    value = engine.registry.get_sample_value("brooq_schedule_next_tick_timestamp_seconds", {"topic": topic})
    return value == next_tick.timestamp()


def test_q4_a_restart_and_a_new_engine_never_make_up_a_tick_retention_deleted(
    dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """Schedule every 30 s, retention_ttl 2 s: the tick's job runs, retention deletes it, and an
    engine restarted within the period (with a second one starting beside it) makes no second job."""
    real = datetime.now(UTC)
    t0 = real.replace(second=real.second - real.second % 30, microsecond=0)
    clock = FakeNow(t0 + timedelta(seconds=5))
    ran: list[str] = []

    def handler(ctx: Context, claim: Claim) -> None:
        ran.append(claim.id)

    first = engines(clock=clock, retention_ttl=2, retention_period=0.2)
    first.register_kind("tick", handler)
    first.schedule("tick", EVERY_30S, {"n": 1})
    first.start()
    wait_for(lambda: len(ran) == 1, "the tick's job ran")
    wait_for(
        lambda: rows(dsn, schema, "SELECT 1 FROM {job} WHERE topic = 'tick'") == [],
        "retention deleted the done job (ttl 2 s)",
    )
    first.stop(timeout=5)

    clock.at = t0 + timedelta(seconds=29)  # still within the period of the tick at t0
    # Neither runs the topic: a made-up job would stay pending in the table, plain to see.
    restarted, beside = engines(clock=clock), engines(clock=clock)
    for e in (restarted, beside):
        e.schedule("tick", EVERY_30S, {"n": 1})
        e.start()
    for e in (restarted, beside):
        wait_for(lambda e=e: scheduled_once(e, "tick", t0 + timedelta(seconds=30)), "the scheduler ticked")
    assert rows(dsn, schema, "SELECT idempotency_key FROM {job} WHERE topic = 'tick'") == []
    assert len(ran) == 1

    clock.at = t0 + timedelta(seconds=31)  # the next tick goes in, once
    wait_for(
        lambda: (
            rows(dsn, schema, "SELECT idempotency_key FROM {job} WHERE topic = 'tick'")
            == [(tick_key(t0 + timedelta(seconds=30)),)]
        ),
        "the next tick's job",
    )
    for e in (restarted, beside):
        wait_for(lambda e=e: scheduled_once(e, "tick", t0 + timedelta(seconds=60)), "the scheduler ticked")
    assert len(rows(dsn, schema, "SELECT 1 FROM {job} WHERE topic = 'tick'")) == 1


def test_q4_engines_racing_one_tick_enqueue_it_once(store: Store, dsn: str, schema: str) -> None:
    tick = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
    barrier = threading.Barrier(8)
    results: list[Any] = []

    def race() -> None:
        barrier.wait()
        results.append(store.enqueue_tick("tick", tick, Job("tick", 1, idempotency_key=tick_key(tick))))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    created = [r for r in results if r is not None]
    assert len(results) == 8 and len(created) == 1 and created[0].created
    assert rows(dsn, schema, "SELECT id::text FROM {job}") == [(created[0].id,)]
    assert rows(dsn, schema, "SELECT name, last_tick FROM {schedule_tick}") == [("tick", tick)]
    # The row gone (retention), the same tick and an older one stay refused; a later one goes in.
    rows(dsn, schema, "DELETE FROM {job}")
    assert store.enqueue_tick("tick", tick, Job("tick", 1)) is None
    assert store.enqueue_tick("tick", tick - timedelta(seconds=30), Job("tick", 1)) is None
    later = store.enqueue_tick("tick", tick + timedelta(seconds=30), Job("tick", 2))
    assert later is not None and later.created
    assert rows(dsn, schema, "SELECT last_tick FROM {schedule_tick}") == [(tick + timedelta(seconds=30),)]


def test_q4_a_tick_is_never_recorded_without_its_job(store: Store, dsn: str, schema: str) -> None:
    """The job's insert failing (here a constraint refuses it) rolls the tick back: the next try enqueues it."""
    tick = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    rows(dsn, schema, "ALTER TABLE {job} ADD CONSTRAINT no_ticks CHECK (topic <> 'tick') NOT VALID")
    with pytest.raises(psycopg.errors.CheckViolation):
        store.enqueue_tick("tick", tick, Job("tick", 1))
    assert rows(dsn, schema, "SELECT 1 FROM {schedule_tick}") == []
    rows(dsn, schema, "ALTER TABLE {job} DROP CONSTRAINT no_ticks")
    result = store.enqueue_tick("tick", tick, Job("tick", 1))
    assert result is not None and result.created
    assert len(rows(dsn, schema, "SELECT 1 FROM {job}")) == 1


def test_q4_ticks_compare_as_instants_through_a_dst_fall_back(store: Store) -> None:
    """02:00 CET comes after 02:30 CEST on 2026-10-25 in Berlin, though its wall time is earlier."""
    from zoneinfo import ZoneInfo

    berlin = ZoneInfo("Europe/Berlin")
    summer = datetime(2026, 10, 25, 2, 30, tzinfo=berlin)  # fold 0: CEST, 00:30 UTC
    winter = datetime(2026, 10, 25, 2, 0, fold=1, tzinfo=berlin)  # fold 1: CET, 01:00 UTC
    assert store.enqueue_tick("dst", summer, Job("dst", 1)) is not None
    assert store.enqueue_tick("dst", winter, Job("dst", 2)) is not None
    assert store.enqueue_tick("dst", summer, Job("dst", 3)) is None
