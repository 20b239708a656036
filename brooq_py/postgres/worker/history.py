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
(``CREATE TABLE … INHERITS``, ``DROP TABLE``). What the engine's role may do with each day is read
from the catalog at every pass (``sql/history_tables.sql``), never remembered: the mover takes no
row of a day it may not make or write (a table of the day's name that is no child of ``job``, made
by hand or by another role, is never touched), and those rows stay in ``job``, deleted at the ttl as
with the history off; a day past the ttl that it may not drop but may delete from (made while the
engines ran as the owner) is emptied row by row. A grant, an owner or a table changed by an operator
counts from the next pass; what stands in the way is logged once, and again if it comes back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg

from brooq_py.postgres.session.connections import Session
from brooq_py.postgres.session.statements import HISTORY, history_table, uuid_array
from brooq_py.postgres.session.tx import on_connection

log = logging.getLogger("brooq_py.history")

CANNOT = (
    "history: %s: its ended jobs stay in job until retention deletes them at the ttl (a day's table "
    "is made and dropped by the owner of job: run the engines as that role, or set history_after to 0)"
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


@dataclass(frozen=True)
class Dropped:
    """A day of history dropped (or emptied): its day (YYYYMMDD), the jobs it held by topic, how many
    went back to job."""

    day: str
    jobs: dict[str, int]
    kept: int


class History:
    """The mover and the drop of one Store (module docstring)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._q = session.q
        self._said: set[tuple[str, str]] = set()  # what stands in the way, logged once while it lasts
        # The mover's mark: the end of the newest row it locked. Rows that ended before it and were
        # left (see history_lock.sql) are not read again; retention deletes them at the ttl.
        self._since: datetime | None = None

    def move(self, after: timedelta, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        """Move at most *batch* terminal rows that ended between *ttl* and *after* ago into their
        days' tables, making those first; (id, topic) of each row moved. The rows of a day this role
        may not make or write stay in job (the module's docstring)."""
        if after <= timedelta(0) or batch < 1:
            return []
        for _ in range(4):  # a day without its table: make it outside the batch's transaction, look again
            days, creatable = self._look(timedelta(0))
            self._say(
                ("create", ""), not creatable, logging.WARNING, CANNOT, "this role may not make a day's table"
            )
            made = {d.day for d in days}
            params = {
                "after": after,
                "ttl": ttl,
                "since": self._since or "-infinity",
                "batch": batch,
                "open": [d.day for d in days if d.ours and d.writable],
                "made": sorted(made),
                "creatable": creatable,
            }
            try:
                with self.session.autocommit("moving terminal jobs to history") as conn, conn.transaction():
                    run = on_connection(conn)
                    locked = run(self._q["history_lock"], params)
                    if not locked:
                        return []
                    missing = sorted({str(r[1]) for r in locked} - made)
                    if not missing:
                        moved: list[tuple[str, str]] = []
                        for day in sorted({str(r[1]) for r in locked}):
                            ids = uuid_array([str(r[0]) for r in locked if r[1] == day])
                            rows = run(self._q["history_move" + HISTORY + day], {"ids": ids})
                            moved.extend((str(r[0]), str(r[1])) for r in rows)
                        self._since = max(r[2] for r in locked)
                        return moved
            except psycopg.errors.UndefinedTable:  # dropped since it was seen (a downgrade, an operator):
                self._since = None  # the rows left before the mark are read again
                continue
            if not self.create(missing):
                return []
            self._since = None  # a day without its table may hold rows put back before the mark (a downgrade)
        return []

    def create(self, days: list[str]) -> bool:
        """Make the tables of history of *days* (YYYYMMDD); False when one could not be made now (its
        lock on job, shared with VACUUM and ANALYZE, not had within a second): the rows wait for the
        next pass. A table of the name made meanwhile, by another engine or anyone, is left as it is."""
        for day in days:
            try:
                with self.session.autocommit("creating a table of history") as conn, conn.transaction():
                    run = on_connection(conn)
                    run(self._q["history_lock_wait"], {})
                    run(self._q["history_create" + HISTORY + day], {})
                    run(self._q["history_index" + HISTORY + day], {})
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                continue  # the next look says whether it is a day
            except psycopg.errors.LockNotAvailable:
                log.info("history: the table of %s could not be created now (job is locked); next pass", day)
                return False
            log.info("history: created the table of %s", day)
        return True

    def drop(self, ttl: timedelta) -> list[Dropped]:
        """Drop every day's table whose rows all ended more than *ttl* ago (empty it, when this role
        may delete its rows but not drop it): under the table's lock, asked for without waiting
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
            self._say(("drop", day.day), stuck, logging.WARNING, CANNOT, f"this role may not drop {day.day}")
            if stuck:
                continue
            try:
                done = self._drop(day.day, "history_drop" if day.owned else "history_empty")
            except psycopg.Error as exc:  # this day's alone: the later days still go, it at the next pass
                log.warning("history: dropping the table of %s failed (%s); next pass", day.day, exc)
                continue
            if done is None:
                log.info("history: the table of %s is in use; dropping it at the next pass", day.day)
            elif done.jobs or done.kept:
                dropped.append(done)
        return dropped

    def _look(self, ttl: timedelta) -> tuple[list[Day], bool]:
        """The tables of days and whether this role may make one (sql/history_tables.sql); what stands
        in the way of a day is logged once while it lasts."""
        rows = self.session.run("reading the tables of history", self._q["history_tables"], {"ttl": ttl})
        days = [Day(str(r[0]), *(bool(v) for v in r[1:6])) for r in rows if r[0] is not None]
        for d in days:
            self._say(
                ("stranger", d.day),
                not d.ours,
                logging.ERROR,
                "history: a table named %s exists that is not a day of history (no child of job as the "
                "engine makes them): the jobs of that day stay in job until the ttl; drop or rename it",
                history_table(d.day),
            )
            self._say(
                ("write", d.day),
                d.ours and not d.writable,
                logging.WARNING,
                CANNOT,
                f"this role may not write {d.day}",
            )
        return days, bool(rows and rows[0][6])

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
