"""What the dashboard and ``GET /topics`` read, a few index-served statements each: counts stop at a
cap, lists at a page with a keyset cursor, and the topic overview is cached briefly for every caller."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from brooq_py.postgres.flow.limits import rate_text, setting_of
from brooq_py.postgres.session.connections import Session
from brooq_py.postgres.session.statements import parse_id
from brooq_py.queue import State

DEFAULT_CAP = 10_000
DEFAULT_TTL = 2.0
# The last hour's outcomes change slowly at a minute's grain and cost the most to read.
ACTIVITY_TTL = 30.0
ACTIVITY_CAP = 100_000
# A read that takes long is reused longer: at most 1/READ_SHARE of the time is spent reading.
READ_SHARE = 5
MAX_TOPICS = 500
# A payload search reads at most this many jobs of a listing, newest (or next to be claimed) first.
SEARCH_SCAN = 1000
MINUTES = 60
WAITING = (State.PENDING, State.SCHEDULED, State.FAILED, State.BLOCKED, State.PARKED)
FINISHED = (State.DONE, State.DEAD, State.CANCELED)
# The order of the topics page's columns.
STATES = (
    State.PENDING,
    State.SCHEDULED,
    State.PROCESSING,
    State.FAILED,
    State.BLOCKED,
    State.PARKED,
    *FINISHED,
)


class BadCursor(ValueError):
    """A page cursor that this module did not write."""


@dataclass(frozen=True)
class TopicView:
    """One topic: counts per state (capped at ``cap``), the active states over the table, done, dead
    and canceled over the last hour (``throughput``: done per minute, oldest first)."""

    topic: str
    counts: dict[str, int | None]
    oldest_ready_seconds: float
    paused: bool
    limit: int | None
    throughput: list[int] = field(default_factory=list)
    rate: str | None = None  # "10/1s", None: no rate limit
    tokens: float | None = None  # rate tokens left when read
    max_depth: int | None = None
    tenants: bool = False  # some job of the topic named a tenant (SPEC T1)

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "counts": dict(self.counts),
            "oldest_ready_seconds": round(self.oldest_ready_seconds, 3),
            "paused": self.paused,
            "limit": self.limit,
            "done_per_minute": list(self.throughput),
            "rate": self.rate,
            "tokens": None if self.tokens is None else round(self.tokens, 3),
            "max_depth": self.max_depth,
        }


@dataclass(frozen=True)
class Topics:
    """The overview at one moment: ``read_at`` is when the database was read."""

    topics: list[TopicView]
    cap: int
    read_at: datetime


@dataclass(frozen=True)
class JobLine:
    """One job of a page: ``preview`` is the payload's first characters, None for a payload of more
    than 2 KiB stored (web_jobs_*.sql do not read it; ``payload_bytes`` says its stored size)."""

    id: str
    topic: str
    state: str
    attempts: int
    priority: int
    available_at: datetime
    locked_until: datetime | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    preview: str | None = None
    payload_bytes: int = 0


@dataclass(frozen=True)
class Relative:
    """A parent or a child of a job (``Job.after``), for the job page."""

    side: str  # "parent" or "child"
    id: str
    topic: str
    state: str


@dataclass(frozen=True)
class JobsPage:
    """One page of jobs; ``next`` is the cursor of the following page, None on the last one."""

    jobs: list[JobLine]
    next: str | None


@dataclass(frozen=True)
class SearchPage:
    """The jobs of a window of ``scanned`` jobs (in the listing's order) whose payload contains
    the filter; ``next`` continues after the last one shown, or after the window, None at the end."""

    jobs: list[JobLine]
    next: str | None
    scanned: int


def _cursor_of(state: str, line: JobLine) -> str:
    if state in WAITING:
        return f"{line.priority}|{line.available_at.isoformat()}|{line.id}"
    at = line.locked_until if state == State.PROCESSING else line.updated_at
    assert at is not None
    return f"{at.isoformat()}|{line.id}"


def _parse_cursor(state: str, cursor: str | None) -> dict[str, Any]:
    empty: dict[str, Any] = {"after_priority": None, "after_at": None, "after_id": None}
    if not cursor:
        return empty
    parts = cursor.split("|")
    waiting = state in WAITING  # priority|available_at|id, else at|id
    try:
        if len(parts) != (3 if waiting else 2):
            raise BadCursor("bad cursor")
        return {
            "after_priority": int(parts[0]) if waiting else None,
            "after_at": datetime.fromisoformat(parts[-2]),
            "after_id": uuid.UUID(parts[-1]),
        }
    except (ValueError, OverflowError) as exc:
        raise BadCursor("bad cursor") from exc


class _OnSession(Protocol):
    session: Session  # a Store's


class Overview:
    """Bounded reads of one Store for people and dashboards; ``topics()`` is cached for *ttl* seconds."""

    def __init__(
        self,
        store: _OnSession,
        *,
        ttl: float = DEFAULT_TTL,
        cap: int = DEFAULT_CAP,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.cap = cap
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: Topics | None = None
        self._cached_at = 0.0
        self._fresh_for = ttl
        self._activity: list[tuple[Any, ...]] | None = None
        self._activity_at = 0.0

    def topics(self) -> Topics:
        """The topic overview, cached for ``ttl`` or ``READ_SHARE`` times the last read (a bounded share
        of the time however large the table); callers on a stale cache wait for one read."""
        with self._lock:
            if self._cached is not None and self._clock() - self._cached_at < self._fresh_for:
                return self._cached
            started = self._clock()
            fresh = self._read_topics()
            self._cached, self._cached_at = fresh, self._clock()
            self._fresh_for = max(self.ttl, READ_SHARE * (self._cached_at - started))
            return fresh

    def forget(self, activity: bool = False) -> None:
        """Drop the cached counts (and the last hour's outcomes too with *activity*), so the next read sees an action."""
        with self._lock:
            self._cached = None
            if activity:
                self._activity = None

    def _read_topics(self) -> Topics:
        q = self.store.session.q
        with (
            self.store.session.autocommit("reading the topic overview") as conn,
            conn.transaction(),
            conn.cursor(row_factory=tuple_row) as cur,
        ):
            cur.execute(q["stats_topics"].composed, {"max_topics": MAX_TOPICS})
            names = {str(r[0]) for r in cur.fetchall()}
            cur.execute(q["topic_settings"].composed, {})
            settings = {str(r[0]): setting_of(r) for r in cur.fetchall()}
            if self._activity is None or self._clock() - self._activity_at >= ACTIVITY_TTL:
                cur.execute(q["web_activity"].composed, {"cap": ACTIVITY_CAP})
                self._activity, self._activity_at = cur.fetchall(), self._clock()
            activity = self._activity
            names |= set(settings) | {str(r[0]) for r in activity}
            topics = sorted(names)[:MAX_TOPICS]
            gauges: dict[str, dict[str, Any]] = {}
            if topics:
                cur.execute(q["gauges_topics"].composed, {"topics": topics, "cap": self.cap})
                columns = [d.name for d in cur.description or ()]
                gauges = {str(r[0]): dict(zip(columns, r, strict=True)) for r in cur.fetchall()}
        recent: dict[str, Counter[str]] = {}
        per_minute: dict[str, list[int]] = {}
        for topic, state, minutes_ago, jobs in activity:
            recent.setdefault(topic, Counter())[state] += int(jobs)
            if state == State.DONE:
                series = per_minute.setdefault(topic, [0] * MINUTES)
                series[MINUTES - 1 - int(minutes_ago)] += int(jobs)
        views = []
        for topic in topics:
            g = gauges.get(topic, {})
            counts: dict[str, int | None] = {}
            for state in STATES:
                if state in FINISHED:
                    counts[state] = recent.get(topic, Counter())[state]
                else:
                    value = g.get(str(state))
                    counts[state] = None if value is None else int(value)
            s = settings.get(topic)
            views.append(
                TopicView(
                    topic=topic,
                    counts=counts,
                    oldest_ready_seconds=float(g.get("oldest_ready_seconds") or 0.0),
                    paused=bool(s and s.paused),
                    limit=s.limit if s else None,
                    throughput=per_minute.get(topic, [0] * MINUTES),
                    rate=rate_text(s.rate_limit, s.rate_per, s.rate_burst) if s else None,
                    tokens=s.tokens if s else None,
                    max_depth=s.max_depth if s else None,
                    tenants=bool(s and s.tenants),
                )
            )
        return Topics(views, self.cap, datetime.now(UTC))

    def relatives(self, job_id: str, limit: int = 100) -> list[Relative]:
        """Return the job's parents and (at most *limit* of) its children, in one statement."""
        parsed = parse_id(job_id)
        if parsed is None:
            return []
        rows = self.store.session.run(
            "reading a job's parents and children",
            self.store.session.q["web_job_relatives"],
            {"id": parsed, "limit": limit},
        )
        return [Relative(str(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows]

    def jobs(self, topic: str | None, state: str, cursor: str | None = None, limit: int = 50) -> JobsPage:
        """Return one page of *topic*'s jobs in *state*, newest first (*topic* None: finished states
        only); ``BadCursor`` for a cursor this module did not write, ValueError for an unknown state."""
        if state in WAITING and topic is not None:
            name = "web_jobs_waiting"
        elif state == State.PROCESSING and topic is not None:
            name = "web_jobs_processing"
        elif state in FINISHED:
            name = "web_jobs_finished"
        else:
            raise ValueError(f"no listing for state {state!r}")
        params = {"topic": topic, "state": str(state), "limit": limit + 1, **_parse_cursor(state, cursor)}
        rows = self.store.session.run("reading a page of jobs", self.store.session.q[name], params)
        # The columns of web_jobs_*.sql are JobLine's fields, in order.
        lines = [JobLine(*(*map(str, r[:3]), int(r[3]), int(r[4]), *r[5:11], int(r[11] or 0))) for r in rows]
        more = len(lines) > limit
        lines = lines[:limit]
        return JobsPage(lines, _cursor_of(state, lines[-1]) if more and lines else None)

    def search(
        self,
        topic: str | None,
        state: str,
        contains: Any,
        cursor: str | None = None,
        scan: int = SEARCH_SCAN,
        limit: int = 50,
    ) -> SearchPage:
        """The jobs among the next *scan* of ``jobs(topic, state, cursor)`` whose payload contains
        *contains* (jsonb ``@>``), at most *limit*: that page, then a primary key probe per row."""
        window = self.jobs(topic, state, cursor, scan)
        if not window.jobs:
            return SearchPage([], None, 0)
        rows = self.store.session.run(
            "searching payloads",
            self.store.session.q["web_jobs_payload"],
            {"ids": [uuid.UUID(j.id) for j in window.jobs], "contains": Jsonb(contains)},
        )
        found = {str(r[0]) for r in rows}
        matches = [j for j in window.jobs if j.id in found]
        if len(matches) > limit:  # continue after the last one shown, inside this window
            shown = matches[:limit]
            scanned = window.jobs.index(shown[-1]) + 1
            return SearchPage(shown, _cursor_of(state, shown[-1]), scanned)
        return SearchPage(matches, window.next, len(window.jobs))
