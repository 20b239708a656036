"""``wait`` and ``result`` for Store and AsyncStore (SPEC V2), on the store's one Watch."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from brooq_py.postgres.plans import parse_id
from brooq_py.postgres.waiting import DEFAULT_POLL, AsyncWatch, Watch, deadline_of, left, seconds
from brooq_py.queue import BrooqError, JobCanceled, JobFailed, JobNotFound, JobRow, State, WaitTimeout


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


class WaitSide:
    """Mixin of Store: block until a job ends."""

    # Seconds between checks when no notification arrives (a lost one only delays by this).
    wait_poll_interval: float = DEFAULT_POLL

    def _watch(self) -> Watch:  # pragma: no cover - Store's
        raise NotImplementedError

    def get(self, job_id: str) -> JobRow | None:  # pragma: no cover - Store's
        raise NotImplementedError

    def wait(self, job_id: str, timeout: float | timedelta | None = None) -> JobRow:
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

    def result(self, job_id: str, timeout: float | timedelta | None = None) -> Any:
        """``wait()``, then return the result of a done job; raise JobFailed for a dead one,
        JobCanceled for a canceled one (each carries the row), WaitTimeout and JobNotFound as wait does."""
        return outcome_of(self.wait(job_id, timeout))


class AsyncWaitSide:
    """Mixin of AsyncStore: await until a job ends."""

    wait_poll_interval: float = DEFAULT_POLL

    def _watch(self) -> AsyncWatch:  # pragma: no cover - AsyncStore's
        raise NotImplementedError

    async def get(self, job_id: str) -> JobRow | None:  # pragma: no cover - AsyncStore's
        raise NotImplementedError

    async def wait(self, job_id: str, timeout: float | timedelta | None = None) -> JobRow:
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

    async def result(self, job_id: str, timeout: float | timedelta | None = None) -> Any:
        """``await wait()``, then the result, or JobFailed / JobCanceled as ``Store.result``."""
        return outcome_of(await self.wait(job_id, timeout))
