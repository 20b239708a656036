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
(``CREATE TABLE … INHERITS``, ``DROP TABLE``). A day the engine cannot make, write or drop (its role
does not own ``job``, nor the day; a table of the day's name that is no child of ``job``, made by
hand or by another role, which is never touched) is refused until the engine restarts, said once:
its jobs stay in ``job`` and retention deletes them at the ttl as with the history off; the other
days move and go as before. An engine whose role may not make a day's table at all (DML grants
only) moves nothing from then on.
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

NOT_OWNER = (
    "history: the table of %s: %s; its ended jobs stay in job until retention deletes them at the "
    "ttl (a day's table is made and dropped by the owner of job: run the engines as that role, or "
    "set history_after to 0); said once, until the engine restarts"
)

# A day's drop asks for its table's lock without waiting, this many times, this many seconds apart.
LOCK_TRIES = 20
LOCK_PAUSE = 0.05


@dataclass(frozen=True)
class Dropped:
    """A day of history dropped: its day (YYYYMMDD), the jobs it held by topic, how many went back
    to job."""

    day: str
    jobs: dict[str, int]
    kept: int


class _NotADay(Exception):
    """A table of a day's name that is no child of job."""


class History:
    """The mover and the drop of one Store (module docstring)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._q = session.q
        self._tables: set[str] = set()  # the days whose table is known to exist
        self._refused: set[str] = set()  # days never moved into (the module's docstring)
        self._cannot_create = False  # its role may not make a day's table: it moves nothing
        self._undropped: set[str] = set()  # days this engine may not drop
        # The mover's mark: the end of the newest row it locked. Rows that ended before it and were
        # left (see history_lock.sql) are not read again; retention deletes them at the ttl.
        self._since: datetime | None = None

    def move(self, after: timedelta, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        """Move at most *batch* terminal rows that ended between *ttl* and *after* ago into their
        days' tables, creating those first; (id, topic) of each row moved. The rows of a refused day
        stay in job (the module's docstring)."""
        if after <= timedelta(0) or batch < 1 or self._cannot_create:
            return []
        for _ in range(4):  # a day without its table: create it outside the batch's transaction
            day = ""
            try:
                with self.session.autocommit("moving terminal jobs to history") as conn, conn.transaction():
                    run = on_connection(conn)
                    params = {
                        "after": after,
                        "ttl": ttl,
                        "since": self._since or "-infinity",
                        "batch": batch,
                        "refused": sorted(self._refused),
                    }
                    locked = run(self._q["history_lock"], params)
                    if not locked:
                        return []
                    days = sorted({str(r[1]) for r in locked})
                    missing = [d for d in days if d not in self._tables]
                    if not missing:
                        moved: list[tuple[str, str]] = []
                        for day in days:
                            ids = uuid_array([str(r[0]) for r in locked if r[1] == day])
                            rows = run(self._q["history_move" + HISTORY + day], {"ids": ids})
                            moved.extend((str(r[0]), str(r[1])) for r in rows)
                        self._since = max(r[2] for r in locked)
                        return moved
            except psycopg.errors.UndefinedTable:  # dropped since it was seen (a downgrade, an operator):
                self._tables.clear()  # what was known of the tables and of the rows left is forgotten
                self._since = None
                continue
            except (
                psycopg.errors.InsufficientPrivilege,
                psycopg.errors.NotNullViolation,
                psycopg.errors.CheckViolation,
            ) as exc:
                if not day:  # not a day's: the batch's own statement (a grant missing elsewhere)
                    raise
                self._refuse(day, exc)  # a day this role may not write, or made by hand unlike ours
                continue
            if not self.create(missing):
                return []
        return []

    def _refuse(self, day: str, exc: psycopg.Error) -> None:
        """Never move into *day* again (the module's docstring), said once."""
        self._refused.add(day)
        log.warning(NOT_OWNER, day, exc.diag.message_primary)

    def create(self, days: list[str]) -> bool:
        """Create the tables of history of *days* (YYYYMMDD) that do not exist yet; False when one
        could not be made now (its lock on job, shared with VACUUM and ANALYZE, not had within a
        second): the rows wait for the next pass. A day it may not make is refused."""
        self._tables.update(self.tables())
        for day in days:
            if day in self._tables:
                continue
            try:
                with self.session.autocommit("creating a table of history") as conn, conn.transaction():
                    run = on_connection(conn)
                    run(self._q["history_lock_wait"], {})
                    run(self._q["history_create" + HISTORY + day], {})
                    # the children of job: a table found of its name may be none, and is left as it is
                    if day not in {str(r[0]) for r in run(self._q["history_tables"], {"ttl": "0"})}:
                        raise _NotADay(history_table(day))
                    run(self._q["history_index" + HISTORY + day], {})
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                pass  # another engine created it meanwhile
            except psycopg.errors.LockNotAvailable:
                log.info("history: the table of %s could not be created now (job is locked); next pass", day)
                return False
            except psycopg.errors.InsufficientPrivilege as exc:
                self._cannot_create = True  # no day can be made: nothing moves (said once)
                log.warning(NOT_OWNER, day, exc.diag.message_primary)
                return False
            except _NotADay as exc:
                self._refused.add(day)
                log.error(
                    "history: a table named %s exists that is not a day of history (no child of job): "
                    "the jobs of that day stay in job; drop or rename it, then restart the engines",
                    exc,
                )
                continue
            self._tables.add(day)
            log.info("history: created the table of %s", day)
        return True

    def tables(self) -> list[str]:
        """The days (YYYYMMDD) that have a table of history."""
        rows = self.session.run("reading the tables of history", self._q["history_tables"], {"ttl": "0"})
        return [str(r[0]) for r in rows]

    def drop(self, ttl: timedelta) -> list[Dropped]:
        """Drop every day's table whose rows all ended more than *ttl* ago: under the table's lock,
        asked for without waiting (LOCK_TRIES times, LOCK_PAUSE apart), its rows that retention keeps
        go back to job, what names its other jobs is deleted, and the table goes. A table in use (a
        long reader of job) is left for the next pass."""
        if ttl <= timedelta(0):
            return []
        rows = self.session.run("reading the tables of history", self._q["history_tables"], {"ttl": ttl})
        self._tables = {str(r[0]) for r in rows}
        dropped = []
        for day in (str(r[0]) for r in rows if r[1] and str(r[0]) not in self._undropped):
            try:
                done = self._drop(day)
            except psycopg.errors.InsufficientPrivilege as exc:
                self._undropped.add(day)  # said once; its jobs stay until an engine that may drops it
                log.warning(NOT_OWNER, day, exc.diag.message_primary)
                continue
            except psycopg.Error as exc:  # this day's alone: the later days still go, it at the next pass
                log.warning("history: dropping the table of %s failed (%s); next pass", day, exc)
                continue
            if done is None:
                log.info("history: the table of %s is in use; dropping it at the next pass", day)
                continue
            self._tables.discard(day)
            if done.jobs or done.kept:
                dropped.append(done)
        return dropped

    def _drop(self, day: str) -> Dropped | None:
        """One day's drop (``drop``); None when its table was never locked."""
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
                    run(self._q["history_drop" + HISTORY + day], {})
                return Dropped(day, jobs, kept)
            except psycopg.errors.LockNotAvailable:
                continue
            except psycopg.errors.UndefinedTable:  # another engine dropped it meanwhile
                return Dropped(day, {}, 0)
        return None
