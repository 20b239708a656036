"""Review of "terminal history on by default" (SPEC B2, B3, T1, T3, Q1): what the new default
exposes that the opt-in did not. Each test here failed on the change as reviewed."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.conftest import q
from tests.integration.history import AFTER, TTL, days, ended, move, where
from tests.integration.test_docs_workflows import OPERATOR_PAGE, PSQL_RETRY
from tests.integration.test_workflows import state
from tests.polling import wait_for

# -- Config: a default resolved in __post_init__ meets dataclasses.replace ----------------------


@pytest.mark.parametrize("ttl", [0, 3600, timedelta(days=2)], ids=["retention-off", "ttl-1h", "ttl-2d"])
def test_t3_b2_replace_of_a_default_config_gets_the_history_a_fresh_config_gets(ttl: Any) -> None:
    """``Config()`` stores history_after resolved (1h, from the default ttl), so a
    ``dataclasses.replace`` of it that shortens or turns off retention keeps that hour:
    ``retention_ttl=0`` (T3: retention off) and ``retention_ttl=3600`` raise ConfigError where
    ``Config(retention_ttl=...)`` is fine, and a 2-day ttl keeps the history on where the docs say
    it is off below 7 days. (reaper_period and watchdog_grace keep None and resolve in a property.)"""
    fresh = Config(retention_ttl=ttl)
    replaced = dataclasses.replace(Config(), retention_ttl=ttl)
    assert replaced.effective_history_after == fresh.effective_history_after


# -- T1: the default turns itself off below a 7-day ttl, and with it the drop of the days ------


@pytest.mark.parametrize(
    "cfg",
    [
        {"retention_ttl": timedelta(days=1)},  # history_after unset: resolved to 0 (ttl < 7 days)
        {"retention_ttl": timedelta(days=1), "history_after": 0},  # "Turning it off"
    ],
    ids=["ttl-below-7-days", "history_after-0"],
)
def test_t1_b2_days_made_under_the_default_are_dropped_once_the_history_is_off(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    engines: Callable[..., Engine],
    cfg: dict[str, Any],
) -> None:
    """docs/operating.md: "Turning it off (history_after = 0) leaves the days already made until
    they age out (retention still drops them)". An operator who ran the default (history on) and
    then sets QUEUE_RETENTION_TTL below 7 days turns the history off without saying so; the
    Retention service then never calls drop_history, and the delete reads ONLY job: the rows of
    the days already made outlive the ttl forever (SPEC T1)."""
    old = [store.enqueue(Job("h", {"n": i})).id for i in range(3)]
    ended(dsn, schema, old, "done", days_ago=3)
    assert len(store.move_terminal(AFTER, TTL, 10)) == 3  # the default's mover, before the change
    assert len(days(pool, schema)) == 1
    marker = store.enqueue(Job("h", {"n": "m"})).id
    ended(dsn, schema, [marker], "done", days_ago=3)  # an expired row still in job
    e = engines(retention_period=0.2, **cfg)
    assert e.config.effective_history_after == timedelta(0)
    e.register_kind("x", lambda ctx, claim: None)
    e.start()
    wait_for(lambda: store.get(marker) is None, "retention to delete the expired row of job", 60)
    wait_for(lambda: days(pool, schema) == [], "the day older than the ttl to be dropped", 30)
    assert [store.get(i) for i in old] == [None] * 3


# -- Metrics: with the default, retention's removals are no longer counted ----------------------


def test_b2_metrics_rows_retention_removes_by_dropping_a_day_are_counted(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    engines: Callable[..., Engine],
) -> None:
    """docs/metrics.md: ``brooq_retention_deleted_total{topic}`` counts "terminal rows deleted by
    retention". With the history on by default, retention removes ended jobs by dropping their
    day, which counts nothing (nor do the moves): the counter stays at 0 for the default config."""
    old = [store.enqueue(Job("h", {"n": i})).id for i in range(4)]
    ended(dsn, schema, old, "done", days_ago=9)
    assert len(store.move_terminal(AFTER, TTL, 10)) == 4
    e = engines(retention_ttl=timedelta(days=7), retention_period=0.2)  # history_after: the default
    assert e.config.effective_history_after == timedelta(hours=1)
    e.register_kind("x", lambda ctx, claim: None)
    e.start()
    wait_for(lambda: days(pool, schema) == [], "the day older than the ttl to be dropped", 60)
    assert all(store.get(i) is None for i in old)

    def counted() -> float | None:
        return e.registry.get_sample_value("brooq_retention_deleted_total", {"topic": "h"})

    wait_for(lambda: counted() == 4.0, "the 4 rows retention removed to be counted", 10)


# -- Q1 / docs: the documented psql retry meets the mover ----------------------------------------


def _psql(text: str, dsn: str, schema: str, job_id: str, between: Callable[[], Any]) -> None:
    """Run a documented psql block as psql does (one session, autocommit unless it says BEGIN),
    its '7c1e...' being *job_id*; call *between* right after the statement that brings the job
    back from the history (another session meanwhile)."""
    statements = [st.strip() for st in text.replace("'7c1e...'", "%(id)s").split(";") if st.strip()]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        for statement in statements:
            lines = [line.split("--")[0] for line in statement.splitlines()]
            body = "\n".join(line for line in lines if line.strip())
            conn.execute(
                body.replace("%", "%%").replace("%%(id)s", "%(id)s"),
                {"id": job_id} if "%(id)s" in body else None,
            )
            if "SELECT * FROM back" in body:
                between()


def test_q1_b2_the_documented_psql_retry_survives_a_mover_between_its_statements(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """docs/operator-controls.md's psql retry runs as two statements with no BEGIN (psql
    autocommit). The first brings the moved job back to job with its old end (job_history_back.sql
    sets updated_at = now() for exactly this reason; the recipe does not), so a mover that passes
    before the second statement (another engine's, a restarted one's, or this one's when the job was
    the newest it moved) moves it again, and the recipe's UPDATE then fails with a check violation
    instead of retrying it."""
    (text,) = PSQL_RETRY.findall(OPERATOR_PAGE.read_text(encoding="utf-8"))
    text = text.split("NOTIFY")[0]
    job_id = store.enqueue(Job("r", {})).id
    ended(dsn, schema, [job_id], "dead")
    assert [i for i, _ in move(store)] == [job_id]
    other_engine = Store(pool, schema=schema)
    _psql(text, dsn, schema, job_id, lambda: other_engine.move_terminal(AFTER, TTL, 10))
    assert state(store, job_id) is State.PENDING


# -- Q1: a refused retry of a moved job writes its row ------------------------------------------


def test_q1_b2_a_refused_retry_of_a_moved_job_leaves_its_end_as_it_was(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """Q1: a retry that is refused changes nothing. For a job in the history, job_history_back
    commits the job's return to job with updated_at = now() before job_retry refuses (here: its
    unique key held by an active job), so the refused retry rewrites the job's end: it jumps to the
    top of the documented "Dead jobs, newest first" and its ttl starts again (a retry tried once a
    ttl, by hand or a cron of `brooq-py retry --topic T --state dead`, keeps it forever). The same
    refused retry of a job still in job writes nothing."""
    a = store.enqueue(Job("u", {"n": 1}, unique_key="k")).id
    ended(dsn, schema, [a], "dead", days_ago=2)
    assert [i for i, _ in move(store)] == [a]
    before = q(pool, schema, "SELECT updated_at FROM {job} WHERE id = %s", a)
    assert store.enqueue(Job("u", {"n": 2}, unique_key="k")).created  # holds the key now
    assert not store.retry(a)
    assert store.retry_refusal(a) is not None
    assert q(pool, schema, "SELECT updated_at FROM {job} WHERE id = %s", a) == before


# -- B2 at runtime: the day's table is DDL, which only the owner of job may run ----------------

APP_ROLE = "pg_monitor"  # a role that exists on every server and does not own the test's tables


def _grant_dml(dsn: str, schema: str, role: str) -> None:
    """What an application role gets where migrations run as the owner: DML, never ownership."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        s = sql.Identifier(schema)
        r = sql.Identifier(role)
        for stmt in (
            "GRANT USAGE, CREATE ON SCHEMA {s} TO {r}",
            "GRANT ALL ON ALL TABLES IN SCHEMA {s} TO {r}",
            "GRANT ALL ON ALL SEQUENCES IN SCHEMA {s} TO {r}",
            "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO {r}",
        ):
            conn.execute(sql.SQL(stmt).format(s=s, r=r))


def _revoke(dsn: str, schema: str, role: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        s = sql.Identifier(schema)
        r = sql.Identifier(role)
        for stmt in (
            "REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM {r}",
            "REVOKE ALL ON ALL SEQUENCES IN SCHEMA {s} FROM {r}",
            "REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {s} FROM {r}",
            "REVOKE ALL ON SCHEMA {s} FROM {r}",
        ):
            conn.execute(sql.SQL(stmt).format(s=s, r=r))


def test_b2_an_engine_whose_role_does_not_own_job_stays_healthy_with_the_history_on(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    engines: Callable[..., Engine],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Migrations run as the schema's owner, engines as an application role with every DML grant:
    ``CREATE TABLE job_history_… INHERITS (job)`` is the owner's alone ("must be owner of table
    job"). With the history on by default, every retention pass of such an engine failed after its
    delete and /healthz said the engine was unhealthy (a liveness probe would restart a working
    engine). Now it moves nothing, says why in a warning, stays healthy, and retention deletes at the
    ttl as with the history off."""
    _grant_dml(dsn, schema, APP_ROLE)
    options = conninfo_to_dict(dsn).get("options") or ""
    app_dsn = make_conninfo(dsn, options=f"{options} -c role={APP_ROLE}".strip())
    app_pool: ConnectionPool[Any] = ConnectionPool(app_dsn, min_size=1, max_size=8, open=True)
    app = Store(app_pool, schema=schema)
    e: Engine | None = None
    try:
        expired = store.enqueue(Job("h", {"n": "x"})).id
        ended(dsn, schema, [expired], "done", days_ago=40)  # retention's delete: its first statement
        job_id = store.enqueue(Job("h", {"n": 1})).id
        ended(dsn, schema, [job_id], "done")  # ended a second ago: the mover's
        e = engines(app, history_after=0.5, retention_period=0.2)
        e.register_kind("x", lambda ctx, claim: None)
        e.start()
        wait_for(lambda: store.get(expired) is None, "retention's first pass (its delete)", 60)
        wait_for(lambda: "may not make a day's table" in caplog.text, "the mover's warning", 30)
        deadline = time.monotonic() + 3  # a few more passes: never unhealthy meanwhile
        while time.monotonic() < deadline:
            h = e.health()
            assert h.ok, f"/healthz says unhealthy: {h.error}"
            time.sleep(0.05)
        assert where(pool, schema, job_id) == "job" and days(pool, schema) == []
    finally:
        if e is not None:
            e.stop(timeout=2)
            e.close()
        app.close()
        app_pool.close()
        _revoke(dsn, schema, APP_ROLE)


def test_b3_the_mover_never_moves_jobs_into_a_table_of_a_days_name_that_is_no_child_of_job(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """``CREATE TABLE IF NOT EXISTS`` finds a table of the day's name that someone made beforehand
    (a role with CREATE on the schema; no child of job) and says nothing: the mover then moved the
    day's jobs into it, where ``SELECT … FROM job`` no longer finds them (B3) and that table's owner
    reads their payloads. The day's jobs now stay in job."""
    job_id = store.enqueue(Job("h", {"secret": "s3cr3t"})).id
    ended(dsn, schema, [job_id], "done")
    with psycopg.connect(dsn, autocommit=True) as conn:
        ((day,),) = conn.execute(
            sql.SQL("SELECT to_char(updated_at AT TIME ZONE 'UTC', 'YYYYMMDD') FROM {} WHERE id = %s").format(
                sql.Identifier(schema, "job")
            ),
            (job_id,),
        ).fetchall()
        conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {})").format(
                sql.Identifier(schema, f"job_history_{day}"), sql.Identifier(schema, "job")
            )
        )
        assert move(store) == []
        assert where(pool, schema, job_id) == "job"
        (stolen,) = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, f"job_history_{day}"))
        ).fetchone() or (None,)
    assert stolen == 0
