"""Flow control (SPEC Q2, Q3, F1, F2): a topic's settings as the Store checks, shows and writes them."""

from __future__ import annotations

import contextlib
import math
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, TypeGuard

import psycopg

from brooq_py.postgres.flow.caps import TopicCaps
from brooq_py.postgres.session.connections import Session
from brooq_py.postgres.session.tx import Runner, on_connection
from brooq_py.queue import InvalidJob
from brooq_py.queue.durations import parse_go_duration
from brooq_py.queue.job import MAX_TOPIC_BYTES, check_length, check_tenant, check_text
from brooq_py.queue.port import TopicSetting

INT32_MAX = 2**31 - 1
# The finest rate period, the database clock's step: a finer one overflows the bucket's float8 arithmetic.
MIN_PER = 1e-6


def checked_rate(limit: Any, per: Any, burst: Any) -> tuple[int | None, float | None, int | None]:
    """Return (limit, per seconds, burst) for ``set_rate_limit``, or raise ValueError (see there)."""
    if limit is None:
        return None, None, None
    if not _int_from(limit, 1):
        raise ValueError(f"limit must be None or an integer from 1 to {INT32_MAX}, got {limit!r}")
    seconds = per.total_seconds() if isinstance(per, timedelta) else per
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not MIN_PER <= seconds < math.inf:
        raise ValueError(f"per must be seconds (one microsecond or more) or a timedelta, got {per!r}")
    if burst is None:
        burst = limit
    if not _int_from(burst, 1):
        raise ValueError(f"burst must be None or an integer from 1 to {INT32_MAX}, got {burst!r}")
    return limit, float(seconds), burst


def _int_from(value: Any, least: int) -> TypeGuard[int]:
    """Whether *value* is an int (not a bool) from *least* to INT32_MAX."""
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= INT32_MAX


def checked_count(value: Any, what: str) -> int | None:
    """Return *value* (None or an int from 0 to 2**31-1: a limit, a depth), or raise ValueError naming *what*."""
    if value is None:
        return None
    if not _int_from(value, 0):
        raise ValueError(f"{what} must be None or an integer from 0 to {INT32_MAX}, got {value!r}")
    return value


def parse_count(text: str, what: str, least: int = 0) -> int | None:
    """``N|none`` as an int from *least* to 2**31-1 or None; raise ValueError naming *what*."""
    if text.strip().lower() == "none":
        return None
    bad = f"invalid {what} {text!r}: expected a number from {least} to {INT32_MAX}, or none"
    try:
        n = int(text)
    except ValueError:
        raise ValueError(bad) from None
    if not least <= n <= INT32_MAX:
        raise ValueError(bad)
    return n


def parse_rate(text: str) -> tuple[int | None, float]:
    """``N[/DURATION]|none`` as (limit, per seconds): ``10/1s``, ``600/1m``, ``5`` (per second)."""
    count, slash, per = text.partition("/")
    try:
        limit = parse_count(count, "rate", least=1)
    except ValueError:
        raise ValueError(
            f"invalid rate {text!r}: expected N[/DURATION] (N from 1 to {INT32_MAX}) such as 10/1s or 600/1m, or none"
        ) from None
    if limit is None or not slash:
        return limit, 1.0
    try:
        seconds = parse_go_duration(per).total_seconds()
    except ValueError:
        seconds = 0.0
    if not MIN_PER <= seconds < math.inf:
        raise ValueError(f"invalid rate {text!r}: expected N/DURATION such as 10/1s or 600/1m")
    return limit, seconds


def seconds_text(seconds: float) -> str:
    """``1s``, ``0.5s``, ``1m``, ``1h``: the shortest of the CLI's duration words for *seconds*."""
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def rate_text(limit: int | None, per: float | None, burst: int | None) -> str | None:
    """``10/1s`` (``10/1s burst 20`` when the burst differs), or None without a rate limit."""
    if limit is None or per is None:
        return None
    text = f"{limit}/{seconds_text(per)}"
    return text if burst in (None, limit) else f"{text} burst {burst}"


def setting_of(r: tuple[Any, ...]) -> TopicSetting:
    """A row of ``topic_settings`` (TopicSetting's fields, in order) as a TopicSetting."""
    return TopicSetting(*(*r[:7], None if r[7] is None else float(r[7]), r[8], bool(r[9]), bool(r[10])))


# --- a topic's settings, read and written ---------------------------------------------------------


class Flow:
    """The Store's flow part: a topic's settings (pause, global limit, rate limit, depth cap) and
    the QueueFull refusals counted by its producer (*caps*)."""

    def __init__(self, session: Session, caps: TopicCaps) -> None:
        self.session = session
        self._q = session.q
        self._caps = caps

    def topic_settings(self) -> list[TopicSetting]:
        """Return every topic an operator has paused or limited, by name."""
        return [
            setting_of(r) for r in self.session.run("reading topic settings", self._q["topic_settings"], {})
        ]

    def paused(self) -> set[str]:
        """Return the paused topics."""
        return {s.topic for s in self.topic_settings() if s.paused}

    def pause(self, topic: str) -> None:
        """Pause *topic*: no engine claims it from its next claim on; running jobs finish."""
        self.session.run("pausing a topic", self._q["topic_pause"], {"topic": checked_topic(topic)})

    def resume(self, topic: str) -> None:
        """Resume *topic* and wake the engines that run it."""
        self.session.run("resuming a topic", self._q["topic_resume"], {"topic": checked_topic(topic)})

    def forget_topic(self, topic: str) -> bool:
        """Remove *topic*'s settings (pause, limit): it runs as if never touched. True if it had some."""
        params = {"topic": checked_topic(topic)}
        return bool(self.session.run("forgetting a topic's settings", self._q["topic_forget"], params))

    def set_limit(self, topic: str, limit: int | None) -> None:
        """Cap *topic* at *limit* jobs processing at once across every engine; None removes the cap.
        Raise ValueError for a limit that is not None or an integer from 0 to 2**31-1."""
        params = {"topic": checked_topic(topic), "limit": checked_count(limit, "limit")}
        if params["limit"] is None:
            self.session.run("setting a topic's limit", self._q["topic_set_limit"], params)
            return
        # An unlimited claim's rows not yet committed would add on top of a limited claim's count, so
        # a first limit holds the topic at 0 until the writers begun before it end (bounded, pooler-safe).
        with self.session.autocommit("setting a topic's limit") as conn:
            run = on_connection(conn)
            if run(self._q["topic_limit_hold"], params):
                self._after_writers(run)
            run(self._q["topic_set_limit"], params)

    def set_rate_limit(
        self, topic: str, limit: int | None, per: float | timedelta = 1, *, burst: int | None = None
    ) -> None:
        """Let claims of *topic* start at most *limit* per *per* (seconds or a timedelta) on average,
        in bursts of at most *burst* (default: *limit*), across every engine; None removes it. A first
        limit returns once the claims begun before it have ended (at most 10 s), as ``set_limit``.
        Raise ValueError for values out of range (limit and burst from 1, per from a microsecond)."""
        params = rate_params(topic, limit, per, burst)
        with self.session.autocommit("setting a topic's rate limit") as conn:
            run = on_connection(conn)
            with conn.transaction():
                run(self._q["topic_rate_lock"], {"topic": params["topic"]})
                newly = bool(run(self._q["topic_set_rate"], params)[0][0])
            if params["limit"] is not None and newly:
                self._after_writers(run)

    def _after_writers(self, run: Runner) -> None:
        """Wait, at most LIMIT_WAIT, until the job table's writers begun before now have ended."""
        writers = run(self._q["topic_limit_writers"], {"schema": self._q.schema})
        left, deadline = writers_left(writers), time.monotonic() + LIMIT_WAIT
        while writers and run(self._q["topic_limit_writers_left"], left)[0][0] != 0:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)

    def set_max_depth(self, topic: str, depth: int | None, *, park: bool = False) -> None:
        """Refuse enqueues of *topic* (QueueFull) while *depth* or more of its jobs wait; None removes
        the cap. This Store obeys it at once, others within a second. ValueError out of 0..2**31-1.
        *park*: past the cap, write the job ``parked`` instead of refusing it (SPEC F3); the stagers
        release the oldest parked jobs as room appears."""
        params = depth_params(topic, depth, park)
        self.session.run("setting a topic's depth cap", self._q["topic_set_depth"], params)
        with park_column(park):
            self.session.run("setting a topic's depth cap", self._q["topic_set_park"], params)
        self._caps.forget()

    def queue_full_refusals(self) -> dict[str, int]:
        """How many enqueues this Store refused with QueueFull, by topic."""
        return self._caps.refusals()

    def set_tenant_limit(self, topic: str, n: int | None, tenant: str | None = None) -> None:
        """At most *n* processing jobs per tenant of *topic* across every engine (SPEC T2); tenant=None:
        the default of every tenant, a named tenant's own value overrides it; None removes."""
        params = tenant_limit_params(topic, n, tenant)
        if params["limit"] is None:
            self.session.run("setting a tenant limit", self._q["tenant_set_limit"], params)
            return
        # A claim that ran without the topic's lock (nothing limited it in its snapshot) may still be
        # writing: the limit holds at 0 until the writers begun before it end, as a topic's first limit.
        with self.session.autocommit("setting a tenant limit") as conn:
            run = on_connection(conn)
            run(self._q["tenant_set_limit"], {**params, "limit": 0})
            self._after_writers(run)
            run(self._q["tenant_set_limit"], params)

    def set_tenant_rate_limit(
        self,
        topic: str,
        limit: int | None,
        per: float | timedelta = 1,
        *,
        burst: int | None = None,
        tenant: str | None = None,
    ) -> None:
        """A token bucket per tenant of *topic* (SPEC T3): *limit* claims per *per*, *burst* saved up
        (default: *limit*); tenant=None: the default of every tenant; None removes."""
        params = tenant_rate_params(topic, limit, per, burst, tenant)
        with self.session.autocommit("setting a tenant rate limit") as conn:
            run = on_connection(conn)
            run(self._q["tenant_set_rate"], params)
            if params["limit"] is not None:  # as set_tenant_limit: the claims begun unlocked end first
                self._after_writers(run)

    def set_tenant_weight(self, topic: str, tenant: str, weight: int | None) -> None:
        """*tenant*'s share of *topic*'s claims while backlogged (SPEC T1; default 1, None restores it),
        for its jobs enqueued from now on."""
        params = tenant_weight_params(topic, tenant, weight)
        self.session.run("setting a tenant weight", self._q["tenant_set_weight"], params)

    def tenants(self, topic: str, limit: int = 100) -> list[TenantRow]:
        """*topic*'s tenants with jobs waiting or running, or settings of their own (at most *limit*)."""
        params = {"topic": checked_topic(topic), "limit": limit, "cap": TENANT_COUNT_CAP}
        return [tenant_row(r) for r in self.session.run("reading tenants", self._q["tenant_list"], params)]

    def tenant_defaults(self, topic: str) -> tuple[int | None, str | None]:
        """*topic*'s limit and rate of every tenant without its own (``set_tenant_limit`` and
        ``set_tenant_rate_limit`` with no tenant): (None, None) when neither is set."""
        rows = self.session.run(
            "reading tenant defaults", self._q["tenant_defaults"], {"topic": checked_topic(topic), "cap": 1}
        )
        if not rows:
            return None, None
        return rows[0][1], rate_text(rows[0][2], rows[0][3], rows[0][4])

    def tenant_page(self, topic: str, limit: int = 100) -> TenantPage:
        """*topic*'s busiest *limit* tenants, its tenant defaults and its tenant of no name (the
        dashboard's tenants page); bounded: at most TENANT_SCAN tenants with jobs are looked at."""
        checked = checked_topic(topic)
        base = {"topic": checked, "cap": TENANT_COUNT_CAP}
        with self.session.autocommit("reading tenants") as conn, conn.transaction():
            run = on_connection(conn)
            rows = run(self._q["tenant_busiest"], {**base, "limit": limit, "seen": TENANT_SCAN + 1})
            defaults = run(self._q["tenant_defaults"], base)
        return tenant_page(checked, rows, defaults[0] if defaults else None)


# --- tenants (SPEC T1-T3) --------------------------------------------------------------------------

# Each tenant's waiting count reads at most this many index entries.
TENANT_COUNT_CAP = 100_000


@dataclass(frozen=True)
class TenantRow:
    """A tenant of a topic as an operator sees it: its jobs waiting and running, its own settings."""

    tenant: str
    waiting: int
    running: int
    limit: int | None
    rate: str | None
    weight: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# The tenants with jobs the dashboard's tenants page looks at, in name order, before it ranks them.
TENANT_SCAN = 10_000


@dataclass(frozen=True)
class TenantPage:
    """A topic's tenants as the dashboard shows them: the busiest first (``rows``), how many are
    not shown (``hidden``; with ``more`` True, the topic has over TENANT_SCAN tenants with jobs and
    only the first TENANT_SCAN by name were looked at), the defaults of every tenant, and the
    tenant of no name (``unnamed``, None when no job of the topic is without a tenant; its
    ``waiting`` is -1 when the topic has more than TENANT_COUNT_CAP pending jobs, not counted)."""

    topic: str
    tenants: bool
    rows: list[TenantRow]
    hidden: int
    more: bool
    default_limit: int | None
    default_rate: str | None
    unnamed: TenantRow | None


def tenant_page(topic: str, rows: list[tuple[Any, ...]], defaults: tuple[Any, ...] | None) -> TenantPage:
    """A TenantPage from the rows of ``tenant_busiest`` and the row of ``tenant_defaults`` (if any)."""
    listed = int(rows[0][8]) if rows else 0
    more = bool(rows) and int(rows[0][9]) > TENANT_SCAN
    tenants, limit, rate, unnamed = False, None, None, None
    if defaults is not None:
        tenants, limit = bool(defaults[0]), defaults[1]
        rate = rate_text(defaults[2], defaults[3], defaults[4])
        if tenants:
            pending, named, running = int(defaults[5]), int(defaults[6]), int(defaults[7])
            waiting = pending - named if pending < TENANT_COUNT_CAP else -1
            if waiting or running:
                unnamed = TenantRow("", waiting, running, None, None, None)
    return TenantPage(
        topic=topic,
        tenants=tenants,
        rows=[tenant_row(r) for r in rows],
        hidden=listed - len(rows),
        more=more,
        default_limit=limit,
        default_rate=rate,
        unnamed=unnamed,
    )


def tenant_row(r: tuple[Any, ...]) -> TenantRow:
    """A row of ``tenant_list`` as a TenantRow."""
    return TenantRow(r[0], r[1], r[2], r[3], rate_text(r[4], r[5], r[6]), r[7])


def checked_tenant(tenant: Any, default: bool = True) -> str | None:
    """Return *tenant* (None allowed when *default*), or raise InvalidJob as ``Job.tenant`` does."""
    if tenant is None and default:
        return None
    if tenant is None:
        raise InvalidJob("tenant must be a str, got None")
    check_tenant(tenant)
    return str(tenant)


def tenant_limit_params(topic: Any, n: Any, tenant: Any) -> dict[str, Any]:
    """The parameters of ``tenant_set_limit`` (InvalidJob for a bad topic or tenant, ValueError for *n*)."""
    return {"topic": checked_topic(topic), "tenant": checked_tenant(tenant), "limit": checked_count(n, "n")}


def tenant_rate_params(topic: Any, limit: Any, per: Any, burst: Any, tenant: Any) -> dict[str, Any]:
    """The parameters of ``tenant_set_rate`` (raise InvalidJob or ValueError as ``set_rate_limit``)."""
    return {**rate_params(topic, limit, per, burst), "tenant": checked_tenant(tenant)}


def tenant_weight_params(topic: Any, tenant: Any, weight: Any) -> dict[str, Any]:
    """The parameters of ``tenant_set_weight``: a weight from 1 to 2**31-1 or None (ValueError)."""
    checked = {"topic": checked_topic(topic), "tenant": checked_tenant(tenant, default=False)}
    if weight is not None and not _int_from(weight, 1):
        raise ValueError(f"weight must be None or an integer from 1 to {INT32_MAX}, got {weight!r}")
    return {**checked, "weight": weight}


def depth_params(topic: Any, depth: Any, park: Any) -> dict[str, Any]:
    """The parameters of ``topic_set_depth`` and ``topic_set_park`` (InvalidJob or ValueError)."""
    if not isinstance(park, bool):
        raise ValueError(f"park must be a bool, got {type(park).__name__}")
    return {"topic": checked_topic(topic), "depth": checked_count(depth, "depth"), "park": park}


def park_column(park: bool) -> AbstractContextManager[None]:
    """Around ``topic_set_park``: a schema before migration 0018 (no such column) parks nothing, and
    only ``park=True`` is an error there."""
    return contextlib.nullcontext() if park else contextlib.suppress(psycopg.errors.UndefinedColumn)


def rate_params(topic: str, limit: Any, per: Any, burst: Any) -> dict[str, Any]:
    """The parameters of ``topic_set_rate`` (raise InvalidJob or ValueError as ``set_rate_limit``)."""
    rate, seconds, size = checked_rate(limit, per, burst)
    return {"topic": checked_topic(topic), "limit": rate, "per": seconds, "burst": size}


def writers_left(writers: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """The parameters of ``topic_limit_writers_left`` for the rows of ``topic_limit_writers``."""
    return {"pids": [w[0] for w in writers], "starts": [w[1] for w in writers]}


# --- what a topic's settings accept, and the wait of a first limit ---------------------------------

# The longest set_limit waits for the claims begun before a topic's first limit.
LIMIT_WAIT = 10.0


def checked_topic(topic: Any) -> str:
    """Return *topic*, or raise InvalidJob for anything but non-empty text without NUL or lone surrogates."""
    if not isinstance(topic, str) or not topic:
        raise InvalidJob(f"topic must be non-empty text without NUL, got {topic!r}")
    check_text(topic, "topic")  # a lone surrogate (undecodable bytes on a command line) is no text
    check_length(topic, MAX_TOPIC_BYTES, "topic")  # a longer one could not be a job's topic (E4')
    return topic
