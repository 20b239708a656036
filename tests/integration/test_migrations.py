"""The migrations: schema, downgrades, idempotence and concurrency (SPEC S1-S4, E6)."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.postgres import channel_for, migrations
from tests.conftest import drop_schema

REVISIONS = [
    "0001",
    "0002",
    "0003",
    "0004",
    "0005",
    "0006",
    "0007",
    "0008",
    "0009",
    "0010",
    "0011",
    "0012",
    "0013",
    "0014",
    "0015",
    "0016",
    "0017",
    "0018",
    "0019",
    "0020",
    "0021",
    "0022",
    "0023",
    "0024",
    "0025",
]


@pytest.fixture
def bare_schema(dsn: str) -> Iterator[str]:
    """A schema name with nothing in it yet (created by the first upgrade), dropped after."""
    name = "t_" + uuid.uuid4().hex
    try:
        yield name
    finally:
        drop_schema(dsn, name)


def snapshot(dsn: str, schema: str) -> dict[str, Any]:
    """Everything a migration may change, as comparable data."""
    with psycopg.connect(dsn, autocommit=True) as conn:

        def rows(query: str) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in conn.execute(query, {"s": schema}).fetchall()]

        return {
            "tables": rows(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %(s)s ORDER BY 1"
            ),
            "columns": rows(
                "SELECT table_name, column_name, data_type, is_nullable, column_default "
                "FROM information_schema.columns WHERE table_schema = %(s)s ORDER BY 1, 2"
            ),
            "indexes": rows("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %(s)s ORDER BY 1"),
            "constraints": rows(
                "SELECT c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
                "JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = %(s)s ORDER BY 1"
            ),
            "reloptions": rows(
                "SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %(s)s AND c.relkind = 'r' ORDER BY 1"
            ),
            "triggers": rows(
                "SELECT t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %(s)s AND NOT t.tgisinternal "
                "ORDER BY 1"
            ),
            "sequences": rows(
                "SELECT sequence_name, data_type FROM information_schema.sequences WHERE sequence_schema = %(s)s "
                "ORDER BY 1"
            ),
            "functions": rows(
                # each function's text, its spaces as one (a downgrade may lay a text out anew)
                "SELECT p.proname, regexp_replace(pg_get_functiondef(p.oid), '\\s+', ' ', 'g') "
                "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %(s)s ORDER BY 1"
            ),
        }


def test_current_is_none_before_first_upgrade_and_for_missing_schema(dsn: str, bare_schema: str) -> None:
    assert migrations.current(dsn, schema=bare_schema) is None
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(bare_schema)))
    assert migrations.current(dsn, schema=bare_schema) is None
    migrations.upgrade(dsn, schema=bare_schema)
    assert migrations.current(dsn, schema=bare_schema) == REVISIONS[-1]
    assert migrations.heads() == [REVISIONS[-1]]


def test_s3_each_downgrade_restores_the_previous_schema(dsn: str, bare_schema: str) -> None:
    """S3: upgrade step by step, and each downgrade step gives back exactly the schema before it."""
    before = {None: snapshot(dsn, bare_schema)}
    for rev in REVISIONS:
        migrations.upgrade(dsn, schema=bare_schema, revision=rev)
        assert migrations.current(dsn, schema=bare_schema) == rev
        before[rev] = snapshot(dsn, bare_schema)
    previous: list[str | None] = [None, *REVISIONS[:-1]]
    for rev, prev in reversed(list(zip(REVISIONS, previous, strict=True))):
        migrations.downgrade(dsn, schema=bare_schema, revision=prev or "base")
        assert migrations.current(dsn, schema=bare_schema) == prev
        after = snapshot(dsn, bare_schema)
        if prev is None:  # only the (empty) version table remains
            after["tables"] = [t for t in after["tables"] if t != ("brooq_alembic_version",)]
            after["columns"] = [c for c in after["columns"] if c[0] != "brooq_alembic_version"]
            after["indexes"] = [i for i in after["indexes"] if not i[0].startswith("brooq_alembic_version")]
            after["constraints"] = [c for c in after["constraints"] if not c[0].startswith("brooq_alembic")]
            after["reloptions"] = [r for r in after["reloptions"] if r[0] != "brooq_alembic_version"]
        assert after == before[prev], f"downgrade of {rev} did not restore {prev}"
    # and up again on the clean schema
    migrations.upgrade(dsn, schema=bare_schema)
    assert snapshot(dsn, bare_schema) == before[REVISIONS[-1]]


def test_s3_upgrade_twice_is_a_no_op(dsn: str, schema: str) -> None:
    first = snapshot(dsn, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {} (topic, payload) VALUES ('a', '1')").format(sql.Identifier(schema, "job"))
        )
    migrations.upgrade(dsn, schema=schema)
    assert snapshot(dsn, schema) == first
    with psycopg.connect(dsn, autocommit=True) as conn:
        n = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "job"))).fetchone()
    assert n == (1,)


def test_s3_concurrent_upgrades_apply_each_revision_once(dsn: str, bare_schema: str) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def up() -> None:
        try:
            barrier.wait()
            migrations.upgrade(dsn, schema=bare_schema)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=up) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert migrations.current(dsn, schema=bare_schema) == REVISIONS[-1]
    with psycopg.connect(dsn, autocommit=True) as conn:
        versions = conn.execute(
            sql.SQL("SELECT version_num FROM {}").format(sql.Identifier(bare_schema, "brooq_alembic_version"))
        ).fetchall()
    assert versions == [(REVISIONS[-1],)]


def test_b2_no_function_reads_the_tables_of_history(dsn: str, schema: str) -> None:
    """B2: every function a trigger calls names ``ONLY job``; ``job`` alone would read (and probe the
    indexes of) every day's table of history, which inherit it, while they touch active rows only."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        defs = conn.execute(
            "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.prokind = 'f'",
            (schema,),
        ).fetchall()
    whole = re.compile(r"\b(FROM|JOIN|UPDATE)\s+job\b(?!_)", re.IGNORECASE)
    reading = {name: whole.findall(text) for name, text in defs if whole.search(text)}
    assert reading == {}, f"functions that read job with its tables of history: {sorted(reading)}"
    assert sum(text.count("ONLY job") for _name, text in defs) >= 26


def test_version_table_lives_in_the_target_schema_only(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        where = conn.execute(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'brooq_alembic_version' "
            "AND table_schema = %s",
            (schema,),
        ).fetchall()
    assert where == [(schema,)]


def test_s1_psql_insert_is_a_valid_enqueue_with_ready_defaults(dsn: str, schema: str) -> None:
    """S1: the documented psql line enqueues a job that is pending and ready now."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute(
            "INSERT INTO job (id, topic, payload, idempotency_key) "
            """VALUES (gen_random_uuid(), 'demo', '{"msg":"hi"}', 'demo-1');"""
        )
        row = conn.execute(
            "SELECT state, attempts, available_at <= now(), priority, claim_token, locked_by, payload "
            "FROM job WHERE idempotency_key = 'demo-1'"
        ).fetchone()
    assert row == ("pending", 0, True, 0, None, None, {"msg": "hi"})


def test_s2_processing_requires_a_lease(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO job (topic, payload, state) VALUES ('a', '1', 'processing')")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO job (topic, payload, state, locked_by) VALUES ('a', '1', 'processing', 'w')"
            )
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO job (topic, payload, state) VALUES ('a', '1', 'running')")
        conn.execute(
            "INSERT INTO job (topic, payload, state, locked_by, locked_until) "
            "VALUES ('a', '1', 'processing', 'w', now())"
        )


def test_s3_autovacuum_settings(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        opts = conn.execute(
            "SELECT c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = 'job'",
            (schema,),
        ).fetchone()
    assert opts is not None
    assert sorted(opts[0]) == ["autovacuum_vacuum_scale_factor=0.02", "autovacuum_vacuum_threshold=100"]


def test_channel_for_follows_the_trigger_rule(dsn: str) -> None:
    """E6: the Python rule and the trigger's agree, short and long (63 bytes and past) names alike."""
    assert channel_for("public") == "brooq.public"
    run = uuid.uuid4().hex  # names of this run only: another suite may run beside it on the server
    exact = ("s" + run * 2)[: 63 - len("brooq.")]
    assert channel_for(exact) == "brooq." + exact
    long = "".join(
        "éèêëàâîïôûùç"[int(c, 16) % 12] for c in (run * 2)[:31]
    )  # 62 bytes: fits as an identifier, not with the prefix
    assert channel_for(long).startswith("brooq.") and len(channel_for(long)) == 6 + 32
    for name in (exact, long, f"Mixed Case {run[:8]}"):
        try:
            migrations.upgrade(dsn, schema=name, revision="0005")
            with (
                psycopg.connect(dsn, autocommit=True) as listener,
                psycopg.connect(dsn, autocommit=True) as w,
            ):
                listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel_for(name))))
                w.execute(
                    sql.SQL("INSERT INTO {} (topic, payload) VALUES ('a', '1')").format(
                        sql.Identifier(name, "job")
                    )
                )
                got = [n.channel for n in listener.notifies(timeout=5, stop_after=1)]
            assert got == [channel_for(name)]
        finally:
            drop_schema(dsn, name)


def test_s3_upgrade_waits_for_the_schema_advisory_lock(dsn: str, bare_schema: str) -> None:
    """S3: the advisory lock is taken first, before the schema is even created."""
    done = threading.Event()
    errors: list[BaseException] = []

    def up() -> None:
        try:
            migrations.upgrade(dsn, schema=bare_schema)
        except BaseException as exc:  # asserted below
            errors.append(exc)
        finally:
            done.set()

    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (migrations.lock_key(bare_schema),))
        t = threading.Thread(target=up)
        t.start()
        assert not done.wait(1.0), "upgrade did not wait for the advisory lock"
        assert migrations.current(dsn, schema=bare_schema) is None
        holder.rollback()
    t.join(60)
    assert errors == []
    assert migrations.current(dsn, schema=bare_schema) == REVISIONS[-1]


def test_s3_concurrent_upgrades_in_processes_apply_once(dsn: str, bare_schema: str) -> None:
    import subprocess
    import sys

    code = "import sys; from brooq_py.postgres import migrations; migrations.upgrade(sys.argv[1], schema=sys.argv[2])"
    procs = [subprocess.Popen([sys.executable, "-c", code, dsn, bare_schema]) for _ in range(3)]
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    assert migrations.current(dsn, schema=bare_schema) == REVISIONS[-1]


def test_a_test_schema_is_the_schema_the_migrations_build(dsn: str, schema: str, bare_schema: str) -> None:
    """The suite's schemas are a pg_dump of one migrated schema replayed (tests/conftest.py): each
    must equal, object for object, the schema the migrations build, function bodies included."""
    migrations.upgrade(dsn, schema=bare_schema)

    def shape(name: str) -> dict[str, Any]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            bodies = conn.execute(
                "SELECT p.proname, p.prosrc, p.proconfig::text, pg_get_function_arguments(p.oid) "
                "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s "
                "ORDER BY 1",
                (name,),
            ).fetchall()
            version = conn.execute(
                sql.SQL("SELECT version_num FROM {}").format(sql.Identifier(name, migrations.VERSION_TABLE))
            ).fetchall()
        found = {**snapshot(dsn, name), "bodies": bodies, "version": version}
        return json.loads(json.dumps(found, default=str).replace(name, "<schema>"))

    assert shape(schema) == shape(bare_schema)
