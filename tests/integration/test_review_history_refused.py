"""Review of "History: a day refused is refused alone, said once; drops before moves" (SPEC B2, T1).
Each test here failed on the change as reviewed."""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine.services.cleanup import Retention
from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.conftest import q
from tests.integration.history import (
    AFTER,
    TTL,
    app_role,
    day_ago,
    days,
    ended,
    move,
    run_sql,
    short,
    store_as,
    stranger,
    where,
)

# -- helpers ------------------------------------------------------------------------------------


def _end_at_noon(dsn: str, schema: str, ids: list[str], days_ago: int, apart: bool) -> None:
    """End *ids* (done) at noon UTC *days_ago* days ago: all at the same instant (one settle of a
    batch, one bulk cancel: the statement's now()), or *apart*, a second from each other."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i, job_id in enumerate(ids):
            conn.execute(
                sql.SQL(
                    "UPDATE ONLY {} SET state = 'done', updated_at ="
                    " (date_trunc('day', now() AT TIME ZONE 'UTC') - make_interval(days => %s)"
                    "  + interval '12 hours' + make_interval(secs => %s)) AT TIME ZONE 'UTC'"
                    " WHERE id = %s"
                ).format(sql.Identifier(schema, "job")),
                (days_ago, i if apart else 0, job_id),
            )


def _hand_made_child(dsn: str, schema: str, day: str) -> None:
    """A day made by hand, a child of job unlike ours (the commit's own example: a column of its own)."""
    run_sql(
        dsn,
        sql.SQL("CREATE TABLE {} (note text NOT NULL) INHERITS ({})").format(
            sql.Identifier(schema, f"job_history_{day}"), sql.Identifier(schema, "job")
        ),
    )


def _retention(store: Store, batch: int = 10) -> Retention:
    """Retention as the engine wires it (engine.py), the history after AFTER, no pause."""
    return Retention(
        timedelta(hours=1),  # the default period for the default ttl (ttl/100 clamped to an hour)
        TTL,
        batch,
        store.delete_terminal,
        lambda topic, n: None,
        logging.getLogger("test.retention"),
        pause=lambda s: None,
        history=AFTER,
        move=store.move_terminal,
        drop=store.drop_history,
    )


def _tick(r: Retention) -> None:
    """One pass, as the Ticker runs it: a failure is logged and the next pass comes."""
    with contextlib.suppress(Exception):
        r.tick()


# -- B2: a refused day still holds back the later days -----------------------------------------


def test_b2_a_refused_day_with_a_batch_of_jobs_ended_at_one_instant_holds_back_every_later_day(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """The mark is "updated_at >= since". Once a day is refused, a batch of only its rows moves
    nothing and sets the mark to their newest end; when more rows of the refused day than a batch
    share that end (one settle of a batch, a bulk cancel: one now()), the next lock takes the same
    rows again, and again: the mark never passes them and no later day moves until they pass the
    ttl (30 days with the default): the very hold-back the commit says it fixed."""
    refused = day_ago(pool, schema, 2)
    stranger(dsn, schema, refused)
    old = [store.enqueue(Job("h", {"n": i})).id for i in range(15)]
    _end_at_noon(dsn, schema, old, days_ago=2, apart=False)
    z = store.enqueue(Job("h", {"n": "z"})).id
    ended(dsn, schema, [z], "done")  # a second ago: today's
    for _ in range(20):  # twenty passes of the mover, batch 10
        move(store)
    assert all(where(pool, schema, i) == "job" for i in old)  # as documented
    assert where(pool, schema, z) != "job", "today's job is held back by the refused day for ever"


def test_b2_the_rows_of_a_refused_day_are_passed_a_batch_a_retention_period(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """A batch of a refused day's rows moves nothing, so move() answers [] and retention takes
    the pass as the end of the backlog (not "behind"): it waits a whole period (an hour with the
    default ttl) before the next batch. The later days wait refused rows / batch periods: with the
    default 1,000 a batch, a refused day of 24,000 jobs holds every later day back a day, one of
    720,000 (8 a second) past the ttl, so that no later job ever moves (SPEC B2)."""
    refused = day_ago(pool, schema, 2)
    stranger(dsn, schema, refused)
    old = [store.enqueue(Job("h", {"n": i})).id for i in range(30)]
    _end_at_noon(dsn, schema, old, days_ago=2, apart=True)
    z = store.enqueue(Job("h", {"n": "z"})).id
    ended(dsn, schema, [z], "done")
    r = _retention(store, batch=10)
    for _ in range(20):  # the passes retention runs back to back (a backlog: no period's wait)
        _tick(r)
        if r.next_delay() > 0:
            break
    assert where(pool, schema, z) != "job", (
        f"today's job waits behind the refused day's rows: next pass in {r.next_delay()} s"
    )


def test_b2_one_row_already_in_a_days_table_does_not_refuse_the_whole_day(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """One id in both job and the day's table (psql: a job copied back by hand) makes a
    UniqueViolation of the day's move; the duplicate now stays in job (history_move.sql leaves an id
    the day holds), the other jobs of the batch move, and the pass does not fail."""
    a = store.enqueue(Job("h", {"n": "a"})).id
    ended(dsn, schema, [a], "done")
    assert [i for i, _ in move(store)] == [a]
    (table,) = days(pool, schema)
    run_sql(
        dsn,
        sql.SQL("INSERT INTO {} SELECT * FROM {} WHERE id = %s").format(
            sql.Identifier(schema, "job"), sql.SQL(table)
        ),
        (a,),
    )
    others = [store.enqueue(Job("h", {"n": i})).id for i in range(3)]
    for o in others:  # one after another: no end shared with the batch's newest (the mark)
        ended(dsn, schema, [o], "done")
    for _ in range(3):
        with contextlib.suppress(psycopg.Error):
            move(store)
    assert [where(pool, schema, i) for i in others] == [short(table)] * 3, "the whole day was refused"


def test_b2_a_strangers_table_dropped_as_the_error_says_lets_its_day_move(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], caplog: Any
) -> None:
    """The error says "drop or rename it"; once the operator has, the day moves at the next pass,
    without a restart: what the role may do with a day is read from the catalog at every pass."""
    j = store.enqueue(Job("h", {"n": "j"})).id
    ended(dsn, schema, [j], "done")
    day = str(
        q(
            pool,
            schema,
            "SELECT to_char(updated_at AT TIME ZONE 'UTC', 'YYYYMMDD') FROM {job} WHERE id = %s",
            j,
        )[0][0]
    )
    stranger(dsn, schema, day)
    with caplog.at_level(logging.INFO, logger="brooq_py.history"):
        assert move(store) == []
    assert any("drop or rename it" in r.getMessage() for r in caplog.records)
    run_sql(dsn, sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, f"job_history_{day}")))
    k = store.enqueue(Job("h", {"n": "k"})).id
    ended(dsn, schema, [k], "done")
    for _ in range(3):
        move(store)
    assert where(pool, schema, k) == f"job_history_{day}", "the day stays refused after the fix"


# -- T1, B2: a drop that fails -------------------------------------------------------------------


def test_t1_a_day_whose_drop_fails_does_not_keep_the_later_days_past_the_ttl(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """drop() refuses a day on InsufficientPrivilege only: any other error of one day's drop
    raises out of the loop, and the days after it are never tried. The commit's own "hand-made
    child unlike ours" (a column of its own) cannot be dropped: history_keep's INSERT INTO job
    SELECT * has more expressions than job has columns. Once it is past the ttl, every day after
    it, the engine's own, stays for ever (SPEC T1)."""
    _hand_made_child(dsn, schema, day_ago(pool, schema, 40))
    b = store.enqueue(Job("h", {"n": "b"})).id
    ended(dsn, schema, [b], "done", days_ago=35)
    assert [i for i, _ in store.move_terminal(AFTER, timedelta(days=100), 10)] == [b]
    own = f"job_history_{day_ago(pool, schema, 35)}"
    assert own in [short(t) for t in days(pool, schema)]
    for _ in range(3):  # three passes of retention's drop, ttl 30 days
        with contextlib.suppress(psycopg.Error):
            store.drop_history(TTL)
    assert own not in [short(t) for t in days(pool, schema)], "its own day past the ttl was kept"
    assert store.get(b) is None


def test_b2_a_drop_that_fails_does_not_stop_every_move(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """Retention.tick now drops before it moves, in the same pass: a drop that raises (the day
    above, past the ttl) skips the moves of every day, pass after pass; before the change the moves
    ran first. No job leaves job again (SPEC B2) until that table is gone by hand."""
    _hand_made_child(dsn, schema, day_ago(pool, schema, 40))
    y = store.enqueue(Job("h", {"n": "y"})).id
    ended(dsn, schema, [y], "done", days_ago=2)
    r = _retention(store)
    for _ in range(3):  # three passes of retention
        _tick(r)
    assert where(pool, schema, y) != "job", "a failing drop stopped the moves"


# -- said once ---------------------------------------------------------------------------------


def test_b2_a_refusal_of_the_batchs_lock_is_said_once_and_names_a_day(
    dsn: str, schema: str, store: Store, caplog: Any
) -> None:
    """An InsufficientPrivilege of history_lock itself (here an application role granted before a
    later migration's table, job_sequence_halt, that terminal_kept reads) is refused as day "":
    nothing is refused, the batch is locked again, and the warning "the table of : ..." comes four
    times a pass, every pass (docs/operating.md: "said once", "a warning naming the day")."""
    j = store.enqueue(Job("h", {"n": 1})).id
    ended(dsn, schema, [j], "done")
    with app_role(dsn, schema) as role:
        run_sql(
            dsn,
            sql.SQL("REVOKE ALL ON {} FROM {}").format(
                sql.Identifier(schema, "job_sequence_halt"), sql.Identifier(role)
            ),
        )
        with store_as(dsn, schema, role) as app, caplog.at_level(logging.WARNING, logger="brooq_py.history"):
            for _ in range(5):  # five passes of the mover
                with contextlib.suppress(psycopg.Error):
                    app.move_terminal(AFTER, TTL, 10)
    warnings = [r.getMessage() for r in caplog.records if r.name == "brooq_py.history"]
    assert len(warnings) <= 1, f"{len(warnings)} warnings in 5 passes: {warnings[:2]}"
