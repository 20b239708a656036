"""Waiting for jobs to end (``wait``, ``result``): one LISTEN connection per store, shared by every waiter (SPEC V2).

On each notification of the results channel, and every ``poll`` seconds in case one was lost, ONE
statement checks every id waited on. A waiter registers before it first reads its row, so an outcome
committed in between is never missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any, Generic, TypeVar

import psycopg

from brooq_py.postgres.session.connections import AsyncSession, Session, no_pool
from brooq_py.postgres.session.statements import parse_id, uuid_array
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
# Seconds without a waiter before the LISTEN connection closes; until then it is read, as unread
# notifications block its server process and then the cluster's NOTIFY queue, failing every NOTIFY.
IDLE_CLOSE = 30.0
_ENDED = frozenset(str(s) for s in TERMINAL_STATES)

E = TypeVar("E", threading.Event, asyncio.Event)


class _Waiters(Generic[E]):
    """What both watches keep: the waiters' events by job id, and since when none waited."""

    def __init__(self, poll: Callable[[], float]) -> None:
        self._poll = poll
        self._waiting: dict[str, dict[int, E]] = {}
        self._idle_since: float | None = None
        # Bumped by close(): a waiter registered before it raises instead of waiting on.
        self.generation = 0

    def _add(self, job_id: str, event: E) -> E:
        self._waiting.setdefault(job_id, {})[id(event)] = event
        return event

    def _remove(self, job_id: str, event: E) -> None:
        waiters = self._waiting.get(job_id)
        if waiters is not None:
            waiters.pop(id(event), None)
            if not waiters:
                del self._waiting[job_id]

    def _idle_too_long(self) -> bool:
        """Whether no one has waited for IDLE_CLOSE seconds: the connection is then closed."""
        if self._waiting:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = time.monotonic()
        elif time.monotonic() - self._idle_since >= IDLE_CLOSE:
            self._idle_since = None
            return True
        return False

    def _wake(self, ids: list[str], rows: Rows) -> None:
        """Wake the waiters whose job ended or is gone, by ``job_wait_check``'s answer for *ids*."""
        states = {str(r[0]): r[1] for r in rows}
        for i in ids:
            if states.get(i) is None or states[i] in _ENDED:
                for event in self._waiting.get(i, {}).values():
                    event.set()

    def _wake_all(self) -> None:
        self.generation += 1
        for waiters in self._waiting.values():
            for event in waiters.values():
                event.set()  # a waiter still waiting sees the generation change and raises


class Watch(_Waiters[threading.Event]):
    """A Store's ``wait`` and ``result``: a daemon thread and its own LISTEN connection; *get* reads a
    job's row, *poll* says how often to check without a notification."""

    def __init__(
        self, session: Session, get: Callable[[str], JobRow | None], poll: Callable[[], float]
    ) -> None:
        super().__init__(poll)
        self._session = session
        self._get = get
        self._cond = threading.Condition()
        self._conn: psycopg.Connection[Any] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def wait(self, job_id: str, timeout: float | timedelta | None = None) -> JobRow:
        """Block until the job is terminal (done, dead, canceled) and return its row; woken by the
        outcome's commit, checked every ``wait_poll_interval`` seconds besides. WaitTimeout after
        *timeout* (seconds or a timedelta; None: none); JobNotFound for an unknown id or a job deleted."""
        w = _Waiting(job_id, timeout, self._session.pool, "Store")
        event, generation = self.register(w.key), self.generation
        try:
            while True:
                event.clear()
                row = self._get(w.key)
                if row is not None and row.state.terminal:
                    return row
                event.wait(w.ended(row))
                if self.generation != generation:
                    raise _closed(w.key)
        finally:
            with self._cond:
                self._remove(w.key, event)

    def result(self, job_id: str, timeout: float | timedelta | None = None) -> Any:
        """``wait()``, then return the result of a done job; raise JobFailed for a dead one,
        JobCanceled for a canceled one (each carries the row), WaitTimeout and JobNotFound as wait does."""
        return outcome_of(self.wait(job_id, timeout))

    def register(self, job_id: str) -> threading.Event:
        """Add a waiter for *job_id*; its Event is set when a check finds the job ended or gone."""
        with self._cond:
            self._closed = False  # a store used again after close() opens a new watch
            event = self._add(job_id, threading.Event())
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="brooq-wait", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return event

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed and self._conn is None:
                    self._cond.wait()
                if self._closed:
                    return
                idle_too_long = self._idle_too_long()
            if idle_too_long:
                self._drop_conn()
                continue
            self._listen_for(self._poll())  # read even with no waiter: see IDLE_CLOSE
            with contextlib.suppress(Exception):  # logged inside; the next round tries again
                self.check_once()

    def _listen_for(self, timeout: float) -> None:
        """Return after a notification arrived (draining what came with it), or after *timeout*."""
        try:
            conn = self._conn
            if conn is None or conn.closed:
                conn = self._conn = self._session.connect_own()
                conn.execute(self._session.q["listen_settled"].composed)
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
        with _logged(ids):
            params = {"ids": uuid_array(ids)}
            rows = self._session.run("checking waited jobs", self._session.q["job_wait_check"], params)
        with self._cond:
            self._wake(ids, rows)

    def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Stop the thread and close the LISTEN connection; waiters left fall back to nothing. Safe to repeat."""
        with self._cond:
            self._closed = True
            self._wake_all()
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        self._drop_conn()  # ends a notifies() in progress
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        self._drop_conn()


class AsyncWatch(_Waiters[asyncio.Event]):
    """An AsyncStore's ``wait`` and ``result``: one task on the first wait's loop, one LISTEN connection."""

    def __init__(
        self,
        session: AsyncSession,
        get: Callable[[str], Awaitable[JobRow | None]],
        poll: Callable[[], float],
    ) -> None:
        super().__init__(poll)
        self._session = session
        self._get = get
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake_up = asyncio.Event()

    async def wait(self, job_id: str, timeout: float | timedelta | None = None) -> JobRow:
        """Await until the job is terminal and return its row; as ``Store.wait`` (one LISTEN
        connection per AsyncStore, on the event loop of its first wait)."""
        w = _Waiting(job_id, timeout, self._session.pool, "AsyncStore")
        event, generation = self.register(w.key), self.generation
        try:
            while True:
                event.clear()
                row = await self._get(w.key)
                if row is not None and row.state.terminal:
                    return row
                remaining = w.ended(row)  # raises WaitTimeout: outside the suppress below
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
                if self.generation != generation:
                    raise _closed(w.key)
        finally:
            self._remove(w.key, event)

    async def result(self, job_id: str, timeout: float | timedelta | None = None) -> Any:
        """``await wait()``, then the result, or JobFailed / JobCanceled as ``Store.result``."""
        return outcome_of(await self.wait(job_id, timeout))

    def register(self, job_id: str) -> asyncio.Event:
        """Add a waiter for *job_id* (on the running loop); its Event is set when its job ended or is gone."""
        event = self._add(job_id, asyncio.Event())
        if self._task is None or self._task.done():
            self._wake_up = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="brooq-wait")
        self._wake_up.set()
        return event

    async def _loop(self) -> None:
        while True:
            if not self._waiting and self._conn is None:
                self._wake_up.clear()
                await self._wake_up.wait()
            if self._idle_too_long():
                await self._drop_conn()
                continue
            await self._listen_for(self._poll())  # read even with no waiter: see IDLE_CLOSE
            with contextlib.suppress(Exception):
                await self.check_once()

    async def _listen_for(self, timeout: float) -> None:
        try:
            conn = self._conn
            if conn is None or conn.closed:
                conn = self._conn = await self._session.connect_listen()
                await conn.execute(self._session.q["listen_settled"].composed)
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
        with _logged(ids):
            params = {"ids": uuid_array(ids)}
            rows = await self._session.run("checking waited jobs", self._session.q["job_wait_check"], params)
        self._wake(ids, rows)

    async def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        """Cancel the task and close the LISTEN connection. Safe to repeat."""
        task, self._task = self._task, None
        self._wake_all()
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await self._drop_conn()


@contextlib.contextmanager
def _logged(ids: list[str]) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        log.warning("wait: checking %d job(s) failed (%s)", len(ids), exc)
        raise


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
    """One wait's id and deadline, checked alike for both stores (a *store* without a pool cannot wait)."""

    def __init__(self, job_id: str, timeout: float | timedelta | None, pool: object, store: str) -> None:
        self.limit = None if timeout is None else to_timedelta(timeout, "timeout").total_seconds()
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"timeout must not be negative, got {self.limit:g}s")
        job = parse_id(job_id)
        if job is None:
            raise JobNotFound(f"no job {job_id!r}")
        self.key = str(job)
        if pool is None:
            raise no_pool(store, "waiting for a job")
        self.until = None if self.limit is None else time.monotonic() + self.limit

    def ended(self, row: JobRow | None) -> float | None:
        """Seconds left to wait while *row* runs on; raise JobNotFound for no row, WaitTimeout
        past the deadline. None: no limit. A terminal row is the caller's to return."""
        if row is None:
            raise JobNotFound(f"no job {self.key}")
        if self.until is None:
            return None
        remaining = max(0.0, self.until - time.monotonic())
        if remaining == 0:
            raise WaitTimeout(f"job {self.key} is still {row.state} after {self.limit:g}s")
        return remaining
