"""Review of terminal history (SPEC B2, T1) in ordinary operation: real Engines, two Engines on one
schema, a day one member of the owning group kept. Each test here failed on 7a9097c."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.conftest import q
from tests.integration.history import app_role, days, ended, owner_group, run_sql, short, store_as, where
from tests.polling import wait_for

OPERATING = Path(__file__).resolve().parents[2] / "docs" / "operating.md"


def history_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "brooq_py.history" and r.levelno >= logging.WARNING
    ]


def test_t1_a_day_one_members_engine_kept_is_named_with_what_to_do(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    engines: Callable[..., Engine],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Per-instance credentials (members of the group that owns job). A day that member m0 owns
    alone (made by m0's engine before days went to the owner of job; m0's instance is gone since)
    may be neither dropped nor emptied by the engine of member m1: its jobs stay past the ttl until
    an operator gives the day to the owner of job (docs/operating.md). The review found the warning
    saying they "stay in job until retention deletes them at the ttl", which nothing does: it now
    names the day and what to do, once."""
    with owner_group(dsn, schema, 2) as (m0, m1):
        old = store.enqueue(Job("old", {})).id
        ended(dsn, schema, [old], "done", days_ago=40)
        assert [i for i, _ in store.move_terminal(timedelta(seconds=0.5), timedelta(days=400), 10)] == [old]
        table = short(str(where(pool, schema, old)))
        run_sql(
            dsn,
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.Identifier(schema, table), sql.Identifier(m0)),
        )
        with store_as(dsn, schema, m1) as new:
            e = engines(new, history_after=0.5, retention_period=0.2)
            e.register_kind("x", lambda ctx, claim: None)
            caplog.set_level(logging.INFO, logger="brooq_py.history")
            e.start()
            try:
                today = store.enqueue(Job("h", {})).id
                ended(dsn, schema, [today], "done", days_ago=1 / 86400)
                wait_for(lambda: where(pool, schema, today) != "job", "the engine to move today's job", 30)
                wait_for(
                    lambda: any(table in w for w in history_warnings(caplog)),
                    "the warning naming the day",
                    30,
                )
                assert e.health().ok
            finally:
                e.stop(timeout=2)
        said = [w for w in history_warnings(caplog) if table in w]
        assert len(said) == 1 and "docs/operating.md" in said[0] and "stay in job" not in said[0], said
        assert store.get(old) is not None  # kept until the operator acts: documented
        # the operator's psql of docs/operating.md (\gexec: each row it answers, run), then m1's pass
        (query,) = re.findall(
            r"```sql\n  (SELECT format\('ALTER TABLE.*?) \\gexec\n", OPERATING.read_text(), re.S
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            for (statement,) in conn.execute(query.replace("\n  ", "\n")).fetchall():
                conn.execute(statement)
        with store_as(dsn, schema, m1) as new:
            new.drop_history(timedelta(days=30))
        assert store.get(old) is None


def test_b2_a_dml_engine_beside_the_owners_warns_about_every_day_it_has_nothing_to_move_into(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    engines: Callable[..., Engine],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rule: logs not noisy; docs/operating.md: "what stands in the way is logged once (a warning
    naming the day)". Engines of the owner and engines of a DML-only role on one schema (a supported
    fleet: "engines running as a role with DML grants only ... make no day, stay healthy"). The
    release before warned when a move was refused; now _look warns "this role may not write D: its
    ended jobs stay in job until retention deletes them at the ttl" for EVERY day in the catalog,
    whether or not a single job of that day is in job. With the default 30-day ttl that is ~30
    warnings at each start of each DML engine, then one more every day (the owner's new day) for
    ever, each saying something false: no job of those days stays in job, nothing stands in the way."""
    with app_role(dsn, schema) as role:  # DML on what exists now; the days come later, the owner's
        ids = []
        for d in range(1, 11):  # ten days of history, made by the owner's engine (the test's Store)
            i = store.enqueue(Job("h", {"d": d})).id
            q(
                pool,
                schema,
                "UPDATE {job} SET state = 'done', updated_at = now() - make_interval(days => %s) WHERE id = %s",
                d,
                i,
            )
            ids.append(i)
        while store.move_terminal(timedelta(seconds=0.5), timedelta(days=30), 100):
            pass
        assert len(days(pool, schema)) == 10 and all(where(pool, schema, i) != "job" for i in ids)
        with store_as(dsn, schema, role) as app:
            e = engines(app, history_after=0.5, retention_period=0.2)
            e.register_kind("x", lambda ctx, claim: None)
            caplog.set_level(logging.INFO, logger="brooq_py.history")
            e.start()
            try:
                # the mover's first pass: its look (the days it would warn about) comes before this
                wait_for(
                    lambda: any("may not make" in w for w in history_warnings(caplog)),
                    "the mover's first pass",
                    30,
                )
                assert e.health().ok
            finally:
                e.stop(timeout=2)
        in_job = q(
            pool, schema, "SELECT count(*) FROM ONLY {job} WHERE state IN ('done', 'dead', 'canceled')"
        )[0][0]
        assert in_job == 0
        naming_days = [w for w in history_warnings(caplog) if "may not write" in w]
        assert naming_days == [], (
            f"{len(naming_days)} warnings about days with no job of theirs in job, e.g. {naming_days[0]!r}"
        )


def test_t1_b2_beside_an_owners_engine_a_dml_engine_empties_a_day_row_by_row_that_the_owner_drops_whole(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    engines: Callable[..., Engine],
) -> None:
    """Rule: SPEC T1/B2, a day past the ttl goes whole ("no dead row version per job", the reason the
    history exists). A fleet of engines of the owner of job and engines of a DML role, the latter
    granted DML on the days by the usual ALTER DEFAULT PRIVILEGES (so their moves work too), both
    running. When yesterday's day crosses the ttl (here: a ttl that ends it 4 s after the start),
    the first pass to see it wins: a DML engine's finds it ours, not owned but emptiable, and DELETEs
    its rows one by one (a dead tuple and WAL per job: a 1M-job day is 1M deletes), although the
    owner's engine running beside it would have dropped it whole a moment later (it then drops the
    emptied table). With equal periods that is every other day of a mixed fleet; here the DML
    engine's period is the shorter, so it is first. Avoidable: a day the role may not drop could be
    left a grace (a period, a day) past the ttl before it is emptied, so an owner's engine, when
    there is one, comes first."""
    with app_role(dsn, schema) as role:
        run_sql(
            dsn,
            sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA {} GRANT ALL ON TABLES TO {}").format(
                sql.Identifier(schema), sql.Identifier(role)
            ),
        )
        ids = [store.enqueue(Job("h", {"i": i})).id for i in range(200)]
        ended(dsn, schema, ids, "done", days_ago=1)
        while store.move_terminal(timedelta(seconds=0.5), timedelta(days=400), 1000):
            pass
        (day,) = days(pool, schema)
        # a ttl that reaches the start of today (UTC) 4 s from now: yesterday's day crosses it then
        ((since_midnight,),) = q(
            pool,
            schema,
            "SELECT extract(epoch FROM (now() AT TIME ZONE 'UTC') - date_trunc('day', now() AT TIME ZONE 'UTC'))",
        )
        ttl = float(since_midnight) + 4.0
        with store_as(dsn, schema, role) as app:
            dml = engines(app, history_after=0.5, retention_ttl=ttl, retention_period=0.1)
            owner = engines(history_after=0.5, retention_ttl=ttl, retention_period=0.5)
            for e in (dml, owner):
                e.register_kind("x", lambda ctx, claim: None)
            owner.start()
            dml.start()
            try:
                wait_for(lambda: days(pool, schema) == [], "the day past the ttl to go", 30)
                assert all(store.get(i) is None for i in ids)
                assert dml.health().ok and owner.health().ok
            finally:
                dml.stop(timeout=2)
                owner.stop(timeout=2)

            def count(e: Engine) -> float:
                return e.registry.get_sample_value("brooq_retention_deleted_total", {"topic": "h"}) or 0.0

            assert count(dml) + count(owner) == 200  # each job counted once
            assert count(dml) == 0, (
                f"the DML engine deleted {count(dml):g} rows of {short(day)} one by one; the owner's engine"
                f" beside it dropped the emptied table ({count(owner):g} jobs)"
            )
