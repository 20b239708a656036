"""Terminal history (SPEC B2): ended jobs leave the job table for a table of their day, dropped whole.

A day's table (``job_history_YYYYMMDD``, UTC) inherits ``job``: ``SELECT … FROM job`` reads every job
wherever it is (SPEC B3; ``store.get``, ``wait``, ``result``, ``parent_results``, the dashboard and the
CLI read through it), while the statements of the hot path name the job table alone (``{live}``), so
claims, settles and heartbeats cost the same whatever the history holds.

- ``move``: retention's mover takes a batch of terminal rows that ended more than ``after`` ago, as
  retention would delete them (``sql/history_lock.sql`` says which it leaves), and moves them in one
  statement (``sql/history_move.sql``): a DELETE from ``job`` and an INSERT into the day's table.
  Each row is written once more, off the hot path, where retention deleted it before.
- ``drop``: a day's table whose every row is older than the ttl is dropped whole (no dead row version
  per job); first its rows that retention would keep go back to ``job`` and the rows naming its jobs
  (edges, steps, signals) are deleted; then the table's lock, asked for without waiting (a waiting
  ACCESS EXCLUSIVE lock would hold up every reader of job behind it), a last look for rows to keep,
  and the DROP.

A day's table is made and dropped by the engine, which PostgreSQL allows the owner of ``job`` alone
(``CREATE TABLE … INHERITS``, ``DROP TABLE``); a day made by a member of that role is given to the
role (``sql/history_own.sql``). What the engine's role may do with each day is read from the catalog
at every pass (``sql/history_tables.sql``), never remembered: the mover takes no row of a day it may
not make, write or later remove (a table of the day's name that is no day of ours, made by hand or
by another role, is never touched), and those rows stay in ``job``, deleted at the ttl as with the
history off; a day past the ttl that it may not drop but may delete from (made while the engines ran
as the owner), or that a view keeps, is emptied row by row. A grant, an owner or a table changed by
an operator counts from the next pass; what stands in the way is logged once, and again if it comes
back. A job id a day's table holds already (copied back to ``job`` by hand) stays in ``job``; the
rest of its batch moves. Every transaction here starts with
``sql/history_scope.sql``: pg_catalog's functions and operators alone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from brooq_py.postgres.session.connections import Session
from brooq_py.postgres.session.statements import HISTORY, history_table, uuid_array
from brooq_py.postgres.session.tx import on_connection

log = logging.getLogger("brooq_py.history")

CANNOT = (
    "history: %s: its ended jobs stay in job until retention deletes them at the ttl (a day's table "
    "is made and dropped by the owner of job: run the engines as that role, or set history_after to 0)"
)
NO_CREATE = (
    "history: this role owns job but may not create tables in its schema, so it makes no day: ended "
    "jobs stay in job until retention deletes them at the ttl (grant it CREATE on the schema, or set "
    "history_after to 0)"
)
STRANGER = (
    "history: %s exists and is no day of history (a child of job as the engine makes them: its "
    "constraints, job's columns in job's order, no trigger, rule nor row-level security): the jobs of "
    "that day stay in job until the ttl; drop or rename it (or drop what was added to it)"
)
MOVE_FAILED = "history: moving jobs into %s failed (%s); they stay in job until the ttl"
LOCKED = "history: a table of history is locked by another transaction; the move waits for the next pass"
KEPT = "history: %s could not be dropped (%s); its rows are deleted one by one instead"
STUCK = (
    "history: %s is older than the ttl and this role may neither drop it nor delete its rows: its jobs "
    "stay until its owner drops it (an engine running as that role, or by hand), or gives it to the "
    "owner of job (docs/operating.md, Terminal history, gives the statement)"
)

# A day's drop asks for its table's lock without waiting, this many times, this many seconds apart.
LOCK_TRIES = 20
LOCK_PAUSE = 0.05


@dataclass(frozen=True)
class Day:
    """A table of a day's name and what this engine's role may do with it (sql/history_tables.sql)."""

    day: str  # YYYYMMDD
    ours: bool
    writable: bool
    owned: bool
    emptiable: bool
    past: bool
    overdue: bool


@dataclass(frozen=True)
class Dropped:
    """A day of history dropped (or emptied): its day (YYYYMMDD), the jobs it held by topic, how many
    went back to job."""

    day: str
    jobs: dict[str, int]
    kept: int


class _Lost(Exception):
    """A move put fewer rows into the day than it took from job: rolled back."""


class History:
    """The mover and the drop of one Store (module docstring)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._q = session.q
        self._said: set[tuple[str, str]] = set()  # what stands in the way, logged once while it lasts
        # The mover's mark: the end of the newest row it locked. Rows that ended before it and were
        # left (see history_lock.sql) are not read again, unless a day opens (below); retention
        # deletes them at the ttl.
        self._since: datetime | None = None
        # What the last look found: the days open to the mover, every day's name, whether it may make one.
        self._open: tuple[frozenset[str], frozenset[str], bool] = (frozenset(), frozenset(), False)

    def move(self, after: timedelta, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        """Move at most *batch* terminal rows that ended between *ttl* and *after* ago into their
        days' tables, making those first; (id, topic) of each row moved. The rows of a day this role
        may not make, write or later remove stay in job (the module's docstring)."""
        if after <= timedelta(0) or batch < 1:
            return []
        for _ in range(4):  # a day without its table: make it outside the batch's transaction, look again
            params = self._params(after, ttl, batch)
            moved: list[tuple[str, str]] = []
            try:
                with self.session.autocommit("moving terminal jobs to history") as conn, conn.transaction():
                    run = on_connection(conn)
                    run(self._q["history_scope"], {})
                    # The batch's rows stay locked while a day's table is waited for, and an enqueue
                    # naming one as a parent waits for them: a day an operator holds is waited for
                    # a second, then the batch goes back whole (the mark unmoved) to the next pass.
                    run(self._q["history_lock_wait"], {})
                    locked = run(self._q["history_lock"], params)
                    if not locked:
                        return []
                    days = sorted({str(r[1]) for r in locked})
                    missing = [d for d in days if d not in params["made"]]
                    for day in days if not missing else []:
                        moved.extend(self._move_day(conn, day, [str(r[0]) for r in locked if r[1] == day]))
            except psycopg.errors.LockNotAvailable:
                self._say(("locked", ""), True, logging.INFO, LOCKED)
                return []
            self._said.discard(("locked", ""))
            if not missing:
                self._since = max(r[2] for r in locked)  # once committed: a failed commit passes nothing
                return moved
            if not self.create(missing):
                return []
        return []

    def _params(self, after: timedelta, ttl: timedelta, batch: int) -> dict[str, Any]:
        """history_lock's parameters from a look at the catalog: the days open to the mover (ours, it
        may write them and later drop or empty them), every day's name, whether it may make a day. A
        day that opened since the last look (an operator's grant or fix, a table gone) resets the
        mark: the rows it passed are read again."""
        days, owner, create = self._look(timedelta(0))
        creatable = owner and create
        self._say(("create", ""), not owner, logging.WARNING, CANNOT, "this role may not make a day's table")
        self._say(("schema", ""), owner and not create, logging.WARNING, NO_CREATE)
        made = frozenset(d.day for d in days)
        writable = frozenset(d.day for d in days if d.ours and d.writable and (d.owned or d.emptiable))
        was_writable, was_made, could_create = self._open
        if writable - was_writable or was_made - made or (creatable and not could_create):
            self._since = None
        self._open = (writable, made, creatable)
        return {
            "after": after,
            "ttl": ttl,
            "since": self._since or "-infinity",
            "batch": batch,
            "open": sorted(writable),
            "made": sorted(made),
            "creatable": creatable,
        }

    def _move_day(self, conn: psycopg.Connection[Any], day: str, ids: list[str]) -> list[tuple[str, str]]:
        """Move one day's part of the batch, in a savepoint: when the day's table refuses it for a
        reason the catalog does not show, those rows stay in job, passed by the mark (retention
        deletes them at the ttl), said once while it lasts; the other days move."""
        try:
            moved = self._move_rows(conn, day, ids)
        except psycopg.OperationalError:
            raise
        except (psycopg.Error, _Lost) as exc:  # UndefinedTable: gone since the look; the next resets the mark
            self._say(("move", day), True, logging.WARNING, MOVE_FAILED, history_table(day), exc)
            return []
        self._said.discard(("move", day))
        return moved

    def _move_rows(self, conn: psycopg.Connection[Any], day: str, ids: list[str]) -> list[tuple[str, str]]:
        """history_move in a savepoint, rolled back when it put fewer rows than it took."""
        with conn.transaction():
            ((took, put, topics),) = on_connection(conn)(
                self._q["history_move" + HISTORY + day], {"ids": uuid_array(ids)}
            )
            if took != len(put or []):
                raise _Lost(f"{took} rows taken from job, {len(put or [])} put into the day")
        return list(zip(put or [], topics or [], strict=True))

    def create(self, days: list[str]) -> bool:
        """Make the tables of history of *days* (YYYYMMDD), each given to the owner of job; False when
        one could not be made now (its lock on job, shared with VACUUM and ANALYZE, not had within a
        second): the rows wait for the next pass. A table or a type of the name made meanwhile, by
        another engine or anyone, is left as it is."""
        for day in days:
            try:
                with self.session.autocommit("creating a table of history") as conn, conn.transaction():
                    run = on_connection(conn)
                    run(self._q["history_scope"], {})
                    run(self._q["history_lock_wait"], {})
                    run(self._q["history_create" + HISTORY + day], {})
                    run(self._q["history_own" + HISTORY + day], {})
                    run(self._q["history_index" + HISTORY + day], {})
            except (
                psycopg.errors.UniqueViolation,
                psycopg.errors.DuplicateTable,
                psycopg.errors.DuplicateObject,
            ):
                continue  # the next look says whether it is a day
            except psycopg.errors.LockNotAvailable:
                log.info("history: the table of %s could not be created now (job is locked); next pass", day)
                return False
            log.info("history: created the table of %s", day)
        return True

    def drop(self, ttl: timedelta) -> list[Dropped]:
        """Drop every day's table whose rows all ended more than *ttl* ago (empty it, when this role
        may delete its rows but not drop it, a day later: an owner's engine drops it whole meanwhile,
        if one runs): under the table's lock, asked for without waiting
        (LOCK_TRIES times, LOCK_PAUSE apart), its rows that retention keeps go back to job, what names
        its other jobs is deleted, and the table goes. A table in use (a long reader of job) is left
        for the next pass."""
        if ttl <= timedelta(0):
            return []
        dropped = []
        for day in self._look(ttl)[0]:
            if not (day.ours and day.past):
                continue
            stuck = not (day.owned or day.emptiable)
            self._say(("drop", day.day), stuck, logging.WARNING, STUCK, history_table(day.day))
            if stuck or not (day.owned or day.overdue):  # a day for an owner's engine to drop it whole
                continue
            try:
                done = self._remove(day)
            except psycopg.Error as exc:  # this day's alone: the later days still go, it at the next pass
                log.warning("history: dropping the table of %s failed (%s); next pass", day.day, exc)
                continue
            if done is None:
                log.info("history: the table of %s is in use; dropping it at the next pass", day.day)
            elif done.jobs or done.kept:
                dropped.append(done)
        return dropped

    def _remove(self, day: Day) -> Dropped | None:
        """Drop *day*'s table, or empty it while it holds rows when this role may not drop it or
        something an operator made on it (a view) keeps it (said once while it lasts); None when its
        table was never locked."""
        if day.owned:
            try:
                done = self._drop(day.day, "history_drop")
            except psycopg.errors.DependentObjectsStillExist as exc:
                self._say(("kept", day.day), True, logging.WARNING, KEPT, history_table(day.day), exc)
                if not day.emptiable:
                    return None
            else:
                self._said.discard(("kept", day.day))
                return done
        rows = self.session.run("reading a day of history", self._q["history_any" + HISTORY + day.day], {})
        return self._drop(day.day, "history_empty") if rows[0][0] else Dropped(day.day, {}, 0)

    def _look(self, ttl: timedelta) -> tuple[list[Day], bool, bool]:
        """The tables of days, whether this role owns job, whether it may create in its schema
        (sql/history_tables.sql); what stands in the way of a day is logged once while it lasts."""
        with self.session.autocommit("reading the tables of history") as conn, conn.transaction():
            run = on_connection(conn)
            run(self._q["history_scope"], {})
            rows = run(self._q["history_tables"], {"ttl": ttl})
        days = [Day(str(r[0]), *(bool(v) for v in r[1:7])) for r in rows if r[0] is not None]
        names = {d.day for d in days}
        owner, create = (bool(rows[0][7]), bool(rows[0][8])) if rows else (False, False)
        self._said = {w for w in self._said if w[0] in ("create", "schema", "move") or w[1] in names}
        for d in days:
            self._say(("stranger", d.day), not d.ours, logging.ERROR, STRANGER, history_table(d.day))
            # an anomaly only for an owner's engine: a role with DML grants alone was told once that
            # it makes no day
            cannot = owner and d.ours and not (d.writable and (d.owned or d.emptiable))
            self._say(("write", d.day), cannot, logging.WARNING, CANNOT, f"this role may not write {d.day}")
        return days, owner, create

    def _say(self, what: tuple[str, str], stands: bool, level: int, msg: str, *args: object) -> None:
        """Log *msg* once while *stands* holds; again if it holds again after it did not."""
        if not stands:
            self._said.discard(what)
        elif what not in self._said:
            self._said.add(what)
            log.log(level, msg, *args)

    def _drop(self, day: str, statement: str) -> Dropped | None:
        """One day's drop (``drop``), by *statement* (history_drop, or history_empty); None when its
        table was never locked."""
        for attempt in range(LOCK_TRIES):
            if attempt:
                time.sleep(LOCK_PAUSE)
            try:
                with self.session.autocommit("dropping a day of history") as conn, conn.transaction():
                    run = on_connection(conn)
                    run(self._q["history_scope"], {})
                    run(self._q["history_lock_table" + HISTORY + day], {})
                    # Everything after the lock: an enqueue naming one of its rows as a parent, a retry
                    # of one, has committed (it held the table), and nothing reads the day meanwhile.
                    kept = len(run(self._q["history_keep" + HISTORY + day], {}))
                    jobs = {str(t): int(n) for t, n in run(self._q["history_forget" + HISTORY + day], {})}
                    run(self._q[statement + HISTORY + day], {})
                return Dropped(day, jobs, kept)
            except psycopg.errors.LockNotAvailable:
                continue
            except psycopg.errors.UndefinedTable:  # another engine dropped it meanwhile
                return Dropped(day, {}, 0)
        return None
