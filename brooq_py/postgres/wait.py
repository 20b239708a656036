"""Waiting for jobs to end (``wait``, ``result``): one LISTEN connection per store, shared by every waiter (SPEC V2).

A ``Watch`` (threads) or ``AsyncWatch`` (asyncio) is started by the first wait
and closed by the store's ``close()``; its connection is still read while no one
waits, and closed after ``IDLE_CLOSE`` seconds without a waiter. It LISTENs on the results channel, which
the outcome statements notify once per batch that ended jobs (and a cancel
once), with an empty payload. On each wake-up, and every ``poll`` seconds in
case a notification was lost (or LISTEN is unavailable), it runs ONE statement
for every id waited on (``job_wait_check``) and wakes the waiters whose job
ended or no longer exists; each then reads its own row. A waiter registers
before it first reads its row, so an outcome committed in between is never
missed: the next check includes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Protocol

import psycopg

from brooq_py.postgres.session.statements import Queries, parse_id, uuid_array
from brooq_py.postgres.session.tx import Rows
from brooq_py.queue import (
    TERMINAL_STATES,
    BrooqError,
    JobCanceled,
    JobFailed,
    JobNotFound,
    JobRow,
    State,
    WaitTimeout,
    to_timedelta,
)

log = logging.getLogger("brooq_py.postgres")

# Seconds between checks when no notification comes (SPEC V2's polling fallback).
DEFAULT_POLL = 1.0
# Seconds without a waiter after which the LISTEN connection is closed (the next wait opens it
# again). Until then it is still read: a listener whose notifications go unread blocks its
# server process once the socket is full, and with it the cluster's NOTIFY queue, which then
# grows until every NOTIFY (every outcome write and enqueue) fails.
IDLE_CLOSE = 30.0
_ENDED = frozenset(str(s) for s in TERMINAL_STATES)


def seconds(timeout: float | timedelta | None) -> float | None:
    """Return *timeout* in seconds (None: no limit); raise ValueError for a negative one."""
    if timeout is None:
        return None
    s = to_timedelta(timeout, "timeout").total_seconds()
    if s < 0:
        raise ValueError(f"timeout must not be negative, got {s:g}s")
    return s


def _ready(ids: list[str], rows: Rows) -> set[str]:
    """The ids whose job ended or is gone, from ``job_wait_check``'s answer."""
    states = {str(r[0]): r[1] for r in rows}
    return {i for i in ids if states.get(i) is None or states[i] in _ENDED}


class Watch:
    """The sync store's watcher: a daemon thread and its own LISTEN connection.

    *connect* opens an autocommit connection (the store's own); *check* runs
    ``job_wait_check`` through the pool; *poll* says how often to check without
    a notification.
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        check: Callable[[dict[str, Any]], Rows],
        queries: Queries,
        poll: Callable[[], float],
    ) -> None:
        self._connect = connect
        self._check = check
        self._listen = queries["listen_settled"].composed
        self._poll = poll
        self._cond = threading.Condition()
        self._waiting: dict[str, dict[int, threading.Event]] = {}
        self._conn: psycopg.Connection[Any] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # Bumped by close(): a waiter registered before it raises instead of waiting on.
        self.generation = 0

    def register(self, job_id: str) -> threading.Event:
        """Add a waiter for *job_id*; its Event is set when a check finds the job ended or gone."""
        event = threading.Event()
        with self._cond:
            self._closed = False  # a store used again after close() opens a new watch
            self._waiting.setdefault(job_id, {})[id(event)] = event
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="brooq-wait", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return event

    def unregister(self, job_id: str, event: threading.Event) -> None:
        with self._cond:
            waiters = self._waiting.get(job_id)
            if waiters is not None:
                waiters.pop(id(event), None)
                if not waiters:
                    del self._waiting[job_id]

    def _loop(self) -> None:
        idle_since: float | None = None
        while True:
            with self._cond:
                while not self._waiting and not self._closed and self._conn is None:
                    self._cond.wait()
                if self._closed:
                    return
                idle = not self._waiting
            if not idle:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= IDLE_CLOSE:
                self._drop_conn()
                idle_since = None
                continue
            self._listen_for(self._poll())  # read even with no waiter: see IDLE_CLOSE
            with contextlib.suppress(Exception):  # logged inside; the next round tries again
                self.check_once()

    def _listen_for(self, timeout: float) -> None:
        """Return after a notification arrived (draining what came with it), or after *timeout*."""
        try:
            conn = self._conn
            if conn is None or conn.closed:
                conn = self._conn = self._connect()
                conn.execute(self._listen)
                return  # check at once: an outcome committed before LISTEN sent no notification here
            for _ in conn.notifies(timeout=timeout, stop_after=1):
                pass
        except Exception as exc:
            if self._closed:
                return  # close() closed the connection under us
            log.warning("wait: the LISTEN connection failed (%s); checking every %.1fs", exc, timeout)
            self._drop_conn()
            with self._cond:
                if not self._closed:
                    self._cond.wait(timeout)

    def check_once(self) -> None:
        """Run one check of every id waited on and wake the waiters whose job ended or is gone."""
        with self._cond:
            ids = list(self._waiting)
        if not ids:
            return
        try:
            rows = self._check({"ids": uuid_array(ids)})
        except Exception as exc:
            log.warning("wait: checking %d job(s) failed (%s)", len(ids), exc)
            raise
        ready = _ready(ids, rows)
        with self._cond:
            for i in ready:
                for event in self._waiting.get(i, {}).values():
                    event.set()

    def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Stop the thread and close the LISTEN connection; waiters left fall back to nothing. Safe to repeat."""
        with self._cond:
            self._closed = True
            self.generation += 1
            thread, self._thread = self._thread, None
            for waiters in self._waiting.values():
                for event in waiters.values():
                    event.set()  # a waiter still waiting sees the generation change and raises
            self._cond.notify_all()
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()  # ends a notifies() in progress
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        self._drop_conn()


class AsyncWatch:
    """The AsyncStore's watcher: one task on the event loop of the first wait, one LISTEN connection."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        check: Callable[[dict[str, Any]], Awaitable[Rows]],
        queries: Queries,
        poll: Callable[[], float],
    ) -> None:
        self._connect = connect
        self._check = check
        self._listen = queries["listen_settled"].composed
        self._poll = poll
        self._waiting: dict[str, dict[int, asyncio.Event]] = {}
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.generation = 0

    def register(self, job_id: str) -> asyncio.Event:
        """Add a waiter for *job_id* (on the running loop); its Event is set when its job ended or is gone."""
        event = asyncio.Event()
        self._waiting.setdefault(job_id, {})[id(event)] = event
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="brooq-wait")
        self._wake.set()
        return event

    def unregister(self, job_id: str, event: asyncio.Event) -> None:
        waiters = self._waiting.get(job_id)
        if waiters is not None:
            waiters.pop(id(event), None)
            if not waiters:
                del self._waiting[job_id]

    async def _loop(self) -> None:
        idle_since: float | None = None
        while True:
            if not self._waiting and self._conn is None:
                self._wake.clear()
                await self._wake.wait()
            if self._waiting:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= IDLE_CLOSE:
                await self._drop_conn()
                idle_since = None
                continue
            await self._listen_for(self._poll())  # read even with no waiter: see IDLE_CLOSE
            with contextlib.suppress(Exception):
                await self.check_once()

    async def _listen_for(self, timeout: float) -> None:
        try:
            conn = self._conn
            if conn is None or conn.closed:
                conn = self._conn = await self._connect()
                await conn.execute(self._listen)
                return  # check at once: an outcome committed before LISTEN sent no notification here
            async for _ in conn.notifies(timeout=timeout, stop_after=1):
                pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("wait: the LISTEN connection failed (%s); checking every %.1fs", exc, timeout)
            await self._drop_conn()
            await asyncio.sleep(timeout)

    async def check_once(self) -> None:
        """Run one check of every id waited on and wake the waiters whose job ended or is gone."""
        ids = list(self._waiting)
        if not ids:
            return
        try:
            rows = await self._check({"ids": uuid_array(ids)})
        except Exception as exc:
            log.warning("wait: checking %d job(s) failed (%s)", len(ids), exc)
            raise
        for i in _ready(ids, rows):
            for event in self._waiting.get(i, {}).values():
                event.set()

    async def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        """Cancel the task and close the LISTEN connection. Safe to repeat."""
        task, self._task = self._task, None
        self.generation += 1
        for waiters in self._waiting.values():
            for event in waiters.values():
                event.set()
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await self._drop_conn()


def deadline_of(timeout: float | None) -> float | None:
    """The monotonic time *timeout* seconds from now (None: never)."""
    return None if timeout is None else time.monotonic() + timeout


def left(deadline: float | None) -> float | None:
    """Seconds until *deadline* (None: no limit), never negative."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


# --- wait and result for Store and AsyncStore -----------------------------------------------------


def outcome_of(row: JobRow) -> Any:
    """Return a terminal row's result; raise JobFailed (dead) or JobCanceled (canceled)."""
    if row.state is State.DEAD:
        raise JobFailed(row)
    if row.state is State.CANCELED:
        raise JobCanceled(row)
    return row.result


def _closed(job_id: str) -> BrooqError:
    return BrooqError(f"the store was closed while waiting for job {job_id}")


class _Waiting:
    """One wait's bookkeeping, shared by the sync and the async loop: the id, the deadline."""

    def __init__(self, job_id: str, timeout: float | timedelta | None) -> None:
        self.limit = seconds(timeout)
        job = parse_id(job_id)
        if job is None:
            raise JobNotFound(f"no job {job_id!r}")
        self.key = str(job)
        self.until = deadline_of(self.limit)

    def ended(self, row: JobRow | None) -> float | None:
        """Seconds left to wait while *row* runs on; raise JobNotFound for no row, WaitTimeout
        past the deadline. None: no limit. A terminal row is the caller's to return (see ``done``)."""
        if row is None:
            raise JobNotFound(f"no job {self.key}")
        remaining = left(self.until)
        if remaining == 0:
            raise WaitTimeout(f"job {self.key} is still {row.state} after {self.limit:g}s")
        return remaining


def _done(row: JobRow | None) -> bool:
    return row is not None and row.state.terminal


class _Waited(Protocol):
    """What ``WaitSide`` needs of the Store it is mixed into."""

    def _watch(self) -> Watch: ...
    def get(self, job_id: str) -> JobRow | None: ...
    def wait(self, job_id: str, timeout: float | timedelta | None = None) -> JobRow: ...


class _AsyncWaited(Protocol):
    """What ``AsyncWaitSide`` needs of the AsyncStore it is mixed into."""

    def _watch(self) -> AsyncWatch: ...
    async def get(self, job_id: str) -> JobRow | None: ...
    async def wait(self, job_id: str, timeout: float | timedelta | None = None) -> JobRow: ...


class WaitSide:
    """Mixin of Store: block until a job ends."""

    # Seconds between checks when no notification arrives (a lost one only delays by this).
    wait_poll_interval: float = DEFAULT_POLL

    def wait(self: _Waited, job_id: str, timeout: float | timedelta | None = None) -> JobRow:
        """Block until the job is terminal (done, dead, canceled) and return its row.

        Woken by the outcome's commit through the store's one LISTEN connection,
        checked every ``wait_poll_interval`` seconds besides. Wait up to *timeout*
        (seconds or a timedelta; None: no limit) and raise WaitTimeout; raise
        JobNotFound for an unknown or malformed id, and for a job deleted while
        waited on (retention): it has no row left to return.
        """
        w = _Waiting(job_id, timeout)
        watch = self._watch()
        event = watch.register(w.key)
        generation = watch.generation
        try:
            while True:
                event.clear()
                row = self.get(w.key)
                if _done(row):
                    assert row is not None
                    return row
                event.wait(w.ended(row))
                if watch.generation != generation:
                    raise _closed(w.key)
        finally:
            watch.unregister(w.key, event)

    def result(self: _Waited, job_id: str, timeout: float | timedelta | None = None) -> Any:
        """``wait()``, then return the result of a done job; raise JobFailed for a dead one,
        JobCanceled for a canceled one (each carries the row), WaitTimeout and JobNotFound as wait does."""
        return outcome_of(self.wait(job_id, timeout))


class AsyncWaitSide:
    """Mixin of AsyncStore: await until a job ends."""

    wait_poll_interval: float = DEFAULT_POLL

    async def wait(self: _AsyncWaited, job_id: str, timeout: float | timedelta | None = None) -> JobRow:
        """Await until the job is terminal and return its row; as ``Store.wait`` (one LISTEN
        connection per AsyncStore, on the event loop of its first wait)."""
        w = _Waiting(job_id, timeout)
        watch = self._watch()
        event = watch.register(w.key)
        generation = watch.generation
        try:
            while True:
                event.clear()
                row = await self.get(w.key)
                if _done(row):
                    assert row is not None
                    return row
                remaining = w.ended(row)  # raises WaitTimeout: outside the suppress below
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
                if watch.generation != generation:
                    raise _closed(w.key)
        finally:
            watch.unregister(w.key, event)

    async def result(self: _AsyncWaited, job_id: str, timeout: float | timedelta | None = None) -> Any:
        """``await wait()``, then the result, or JobFailed / JobCanceled as ``Store.result``."""
        return outcome_of(await self.wait(job_id, timeout))
