"""Health: what /healthz reports about an engine, from the record its statements leave, so that a burst
of health checks costs the database nothing (SPEC Z2, C5)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from brooq_py.engine.clock import Clock
from brooq_py.queue.port import Repo

# Not the engine's statements: own backoff, the caller's transaction, teardown, reads of memory.
UNTRACKED = frozenset(
    {"listen", "begin", "close", "ping", "queue_full_refusals", "read_whole", "owed_in", "take_owed"}
)
# Errors that say the caller passed something wrong, not that the database failed.
CALLER_ERRORS = (ValueError, TypeError, LookupError)
# Calls an application makes through the engine: their success says the database answers, but their
# failure or wait may be the caller's own (a transaction it broke, a lock it holds).
CALLER_DRIVEN = frozenset(
    {"enqueue", "enqueue_tx", "enqueue_many", "cancel", "get", "retry", "pause", "resume", "set_limit"}
)


@dataclass(frozen=True)
class Health:
    """ok when the engine's statements succeed (``StatementTracker.status``), the engine runs and hung
    handlers do not outnumber the workers; ages in seconds, error names the statement and its type."""

    ok: bool
    database: bool
    running: bool
    hung: int
    workers: int
    last_success_age: float | None = None
    failing_for: float | None = None
    error: str | None = None

    @classmethod
    def of(
        cls,
        *,
        database: bool,
        running: bool,
        hung: int,
        workers: int,
        last_success_age: float | None = None,
        failing_for: float | None = None,
        error: str | None = None,
    ) -> Health:
        ok = database and running and hung <= workers
        return cls(ok, database, running, hung, workers, last_success_age, failing_for, error)

    def to_json(self) -> dict[str, Any]:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 3)

        return {
            "ok": self.ok,
            "database": self.database,
            "running": self.running,
            "hung": self.hung,
            "workers": self.workers,
            "last_success_age_seconds": rounded(self.last_success_age),
            "failing_for_seconds": rounded(self.failing_for),
            "error": self.error,
        }


@dataclass(frozen=True)
class StatementStatus:
    """What the tracker knows at one moment (seconds on the clock's monotonic scale)."""

    ok: bool
    last_success_age: float | None
    failing_for: float | None
    error: str | None


@dataclass
class _Record:
    """One statement's (one Repo method's) latest streak of failures."""

    succeeded: bool = False
    first_failure: float | None = None  # None: its latest call succeeded
    last_failure: float = 0.0
    error: str = ""


class StatementTracker:
    """Records the start and end of every statement, per Repo method (so that one that keeps
    succeeding cannot hide another that keeps failing); thread-safe, no I/O."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._in_flight: dict[int, tuple[str, float]] = {}
        self._records: dict[str, _Record] = {}
        self._last_success: float | None = None
        self.calls = 0

    def started(self, name: str) -> int:
        with self._lock:
            token = next(self._ids)
            if name not in CALLER_DRIVEN:
                self._in_flight[token] = (name, self._clock.monotonic())
            self.calls += 1
            return token

    def ended(self, token: int, name: str, exc: BaseException | None) -> None:
        now = self._clock.monotonic()
        with self._lock:
            self._in_flight.pop(token, None)
            if exc is not None and not isinstance(exc, Exception):
                return  # KeyboardInterrupt, SystemExit: says nothing about the database
            if name in CALLER_DRIVEN:
                if exc is None:
                    self._last_success = now
                return
            record = self._records.setdefault(name, _Record())
            if exc is None or isinstance(exc, CALLER_ERRORS):
                self._last_success = now
                record.succeeded = True
                record.first_failure = None
                return
            if record.first_failure is None:
                record.first_failure = now
            record.last_failure = now
            record.error = f"{name}: {type(exc).__name__}"

    def status(self, grace: float, stall: float) -> StatementStatus:
        """A statement still tried whose latest call failed fails health after failing for *grace*
        seconds, or at once if it never succeeded; so does one in flight longer than *stall*. A lone
        failure of an hourly statement counts for *grace* at most."""
        now = self._clock.monotonic()
        ok, failing_for, error = True, None, None
        with self._lock:
            trying = {name for name, _ in self._in_flight.values()}
            for name, r in self._records.items():
                if r.first_failure is None or (now - r.last_failure >= grace and name not in trying):
                    continue
                streak = now - r.first_failure
                if failing_for is None or streak > failing_for:
                    failing_for, error = streak, r.error
                if streak >= grace or not r.succeeded:
                    ok = False
            oldest = min((t for _, t in self._in_flight.values()), default=None)
            success = self._last_success
        if oldest is not None and now - oldest > stall:
            ok = False
            error = error or "statement stalled"
        age = None if success is None else now - success
        return StatementStatus(ok, age, failing_for, error)


class TrackedRepo:
    """A Repo that forwards every call to *repo* and reports each statement to *tracker*."""

    def __init__(self, repo: Repo, tracker: StatementTracker) -> None:
        self._repo = repo
        self._tracker = tracker
        self._wrapped: dict[str, Callable[..., Any]] = {}

    @property
    def inner(self) -> Repo:
        return self._repo

    def __getattr__(self, name: str) -> Any:
        repo = self.__dict__.get("_repo")
        if repo is None:  # not initialised (copy, unpickling): no recursion through _repo
            raise AttributeError(name)
        attr = getattr(repo, name)
        if name in UNTRACKED or name.startswith("_") or not callable(attr):
            return attr
        found = self._wrapped.get(name)
        if found is None:
            found = self._wrapped[name] = self._track(name)
        return found

    def _track(self, name: str) -> Callable[..., Any]:
        repo, tracker = self._repo, self._tracker

        def call(*args: Any, **kwargs: Any) -> Any:
            token = tracker.started(name)
            try:
                result = getattr(repo, name)(*args, **kwargs)
            except BaseException as exc:
                tracker.ended(token, name, exc)
                raise
            tracker.ended(token, name, None)
            return result

        call.__name__ = name
        return call

    def __repr__(self) -> str:
        return f"TrackedRepo({self._repo!r})"


def tracked(repo: Repo, tracker: StatementTracker) -> Repo:
    """Wrap *repo* so that *tracker* sees every statement the engine runs through it."""
    return cast(Repo, TrackedRepo(repo, tracker))
