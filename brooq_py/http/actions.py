"""The operator's actions on jobs and topics, shared by the surface and the dashboard (SPEC F1, F2).

An ``ActionError`` carries the status both faces answer; a database outage is 503, its details
logged, never shown to the client.
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any, Protocol

from brooq_py.postgres.flow.limits import TenantPage, TenantRow, parse_count, parse_rate
from brooq_py.queue import InvalidJob, JobRow, StoreUnavailable
from brooq_py.queue.job import MAX_KEY_BYTES, MAX_TOPIC_BYTES, check_length, check_tenant, check_text

if TYPE_CHECKING:
    from brooq_py.postgres.operator.overview import Overview, Topics
    from brooq_py.postgres.store import Store

log = logging.getLogger("brooq_py.service")

UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
# The longest name a request's path may carry (UTF-8 bytes): the longest name brooq_py stores (a
# sequence, a unique key). Each name's own limit is checked after (a topic's is MAX_TOPIC_BYTES).
MAX_PATH_NAME = MAX_KEY_BYTES


class ActionError(Exception):
    """An action refused: ``status`` is the HTTP answer, ``message`` safe to show."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Jobs(Protocol):
    def get(self, job_id: str) -> JobRow | None: ...
    def cancel(self, job_id: str) -> bool: ...


def job_id(raw: str) -> str:
    """Return *raw* as a lower-case job id, or raise ActionError(400)."""
    if not UUID.fullmatch(raw):
        raise ActionError(400, "malformed job id: expected a UUID")
    return raw.lower()


def path_name(raw: str) -> str:
    """Return *raw*, a name, id or value a request's path carries (decoded), or raise ActionError(400)
    for what no name brooq_py stores can be: a NUL, broken Unicode, over MAX_PATH_NAME UTF-8 bytes.
    Every route's path parameters pass here before their own checks."""
    try:
        check_text(raw, "a name in the path")
        check_length(raw, MAX_PATH_NAME, "a name in the path")
    except InvalidJob as exc:
        raise ActionError(400, f"malformed path: {exc}") from None
    return raw


def topic_name(raw: str) -> str:
    """Return *raw* as a topic name (as a job's topic may be, and printable), or raise ActionError(400)."""
    bad = f"malformed topic: expected printable text of 1 to {MAX_TOPIC_BYTES} UTF-8 bytes"
    if not raw or not raw.isprintable():
        raise ActionError(400, bad)
    try:
        check_text(raw, "topic")
        check_length(raw, MAX_TOPIC_BYTES, "topic")
    except InvalidJob:
        raise ActionError(400, bad) from None
    return raw


def tenant_name(raw: str) -> str:
    """Return *raw* as a tenant's name (a job's kind of tenant), or raise ActionError(400)."""
    try:
        check_tenant(raw)
    except InvalidJob as exc:
        raise ActionError(400, f"malformed tenant: {exc}") from None
    return raw


class Operator:
    """The actions over *jobs* (engine or store); without *controls* and *overview* (a repo that is
    not a Store) the others answer 404."""

    def __init__(self, jobs: Jobs, controls: Store | None, overview: Overview | None) -> None:
        self.jobs = jobs
        self.controls = controls
        self.overview = overview

    @staticmethod
    def guarded(doing: str, action: Any, *args: Any) -> Any:
        try:
            return action(*args)
        except StoreUnavailable:
            log.error("database unavailable while %s", doing)
            raise ActionError(503, "database unavailable") from None

    def _controls(self) -> Store:
        if self.controls is None:
            raise ActionError(404, "not found")
        return self.controls

    def get(self, raw_id: str) -> JobRow:
        row: JobRow | None = self.guarded("reading a job", self.jobs.get, job_id(raw_id))
        if row is None:
            raise ActionError(404, "no such job")
        return row

    def cancel(self, raw_id: str) -> bool:
        # cancel() alone cannot tell "unknown" from "already terminal": look first.
        row = self.get(raw_id)
        canceled = self.guarded("canceling a job", self.jobs.cancel, row.id)
        return self._acted(canceled, "job %s canceled", row.id)

    def retry(self, raw_id: str) -> bool:
        controls = self._controls()
        row = self.get(raw_id)
        return self._acted(self.guarded("retrying a job", controls.retry, row.id), "job %s retried", row.id)

    def signal(self, raw_id: str, name: str, body: bytes) -> bool:
        """Send the signal *name* (payload: the JSON *body*, empty for null) to the job (SPEC DS4)."""
        controls = self._controls()
        try:
            payload = json.loads(body) if body.strip() else None
        except ValueError as exc:
            raise ActionError(400, f"the body is not JSON: {exc}") from None
        if not name:
            raise ActionError(400, "the signal's name must not be empty")
        row = self.get(raw_id)
        try:
            sent = self.guarded("signalling a job", controls.signal, row.id, name, payload)
        except (InvalidJob, ValueError) as exc:  # a payload or a name (a NUL) the store refuses
            raise ActionError(400, str(exc)) from None
        return self._acted(sent, "job %s signalled %r", row.id, name)

    def retry_refusal(self, raw_id: str) -> str | None:
        """Why a retry of the job changes nothing now (its state, or an active holder of its unique key)."""
        row = self.get(raw_id)
        reason: str | None = self.guarded("reading a job", self._controls().retry_refusal, row.id)
        return reason

    def set_rate(self, raw_topic: str, raw_rate: str) -> tuple[int | None, float]:
        """Set the topic's rate limit from ``N[/DURATION]|none``; return (limit, per seconds)."""
        topic = topic_name(raw_topic)
        try:
            limit, per = parse_rate(raw_rate)
        except ValueError as exc:
            raise ActionError(400, str(exc)) from None
        self.guarded("setting a rate limit", self._controls().set_rate_limit, topic, limit, per)
        log.info("topic %r rate limit set to %s by an operator", topic, raw_rate)
        self._changed()
        return limit, per

    def set_depth(self, raw_topic: str, raw_depth: str) -> int | None:
        """Set the topic's depth cap from ``N|none``; return it."""
        topic = topic_name(raw_topic)
        try:
            depth = parse_count(raw_depth, "depth")
        except ValueError as exc:
            raise ActionError(400, str(exc)) from None
        self.guarded("setting a depth cap", self._controls().set_max_depth, topic, depth)
        log.info("topic %r depth cap set to %s by an operator", topic, depth)
        self._changed()
        return depth

    def resume_sequence(self, raw_topic: str, raw_sequence: str) -> bool:
        """SPEC Q5: let the sequence halted behind a dead job go on; False when it was not halted."""
        topic = topic_name(raw_topic)
        try:  # the sequence checked as a job's (InvalidJob): non-empty, no NUL, at most MAX_KEY_BYTES
            resumed = self.guarded(
                "resuming a sequence", self._controls().resume_sequence, topic, raw_sequence
            )
        except InvalidJob as exc:
            raise ActionError(400, f"malformed sequence: {exc}") from None
        return self._acted(resumed, "topic %r sequence %r resumed", topic, raw_sequence)

    def tenants(self, raw_topic: str) -> tuple[list[TenantRow], tuple[int | None, str | None]]:
        """The topic's tenants and the limit and rate of every tenant without its own (SPEC T1-T3)."""
        topic, flow = topic_name(raw_topic), self._controls().flow
        rows: list[TenantRow] = self.guarded("reading tenants", flow.tenants, topic)
        defaults: tuple[int | None, str | None] = self.guarded("reading tenants", flow.tenant_defaults, topic)
        return rows, defaults

    def tenant_page(self, raw_topic: str, limit: int) -> TenantPage:
        """The topic's busiest *limit* tenants, its tenant defaults and its tenant of no name."""
        topic, flow = topic_name(raw_topic), self._controls().flow
        page: TenantPage = self.guarded("reading tenants", flow.tenant_page, topic, limit)
        return page

    def set_tenant(self, raw_topic: str, raw_tenant: str | None, what: str, raw_value: str) -> Any:
        """Set a tenant's (None: every tenant's) ``limit`` or ``rate`` or (a named one's) ``weight``
        from ``N|none`` (``N[/DURATION]|none`` for a rate); return the value set."""
        topic = topic_name(raw_topic)
        tenant = None if raw_tenant is None else tenant_name(raw_tenant)
        controls = self._controls()
        try:
            if what == "rate":
                limit, per = parse_rate(raw_value)
                self.guarded(
                    "setting a tenant rate",
                    lambda: controls.set_tenant_rate_limit(topic, limit, per, tenant=tenant),
                )
                value: Any = {"rate": limit, "per_seconds": per if limit else None}
            elif what == "weight" and tenant is not None:
                weight = parse_count(raw_value, "weight", least=1)
                self.guarded("setting a tenant weight", controls.set_tenant_weight, topic, tenant, weight)
                value = {"weight": weight}
            elif what == "limit":
                n = parse_count(raw_value, "limit")
                self.guarded("setting a tenant limit", controls.set_tenant_limit, topic, n, tenant)
                value = {"limit": n}
            else:
                raise ActionError(404, "not found")
        except ValueError as exc:
            raise ActionError(400, str(exc)) from None
        log.info("topic %r tenant %r %s set to %s by an operator", topic, tenant, what, raw_value)
        self._changed()
        return value

    def set_paused(self, raw_topic: str, paused: bool) -> None:
        topic, controls = topic_name(raw_topic), self._controls()
        doing, done = ("pausing", "paused") if paused else ("resuming", "resumed")
        self.guarded(f"{doing} a topic", controls.pause if paused else controls.resume, topic)
        log.info("topic %r %s by an operator", topic, done)
        self._changed()

    def topics(self) -> Topics:
        if self.overview is None:
            raise ActionError(404, "not found")
        topics: Topics = self.guarded("reading the topics", self.overview.topics)
        return topics

    def _acted(self, done: Any, what: str, *args: Any) -> bool:
        """Log an action on a job or sequence that changed something; the counts are stale either way."""
        if done:
            log.info(what + " by an operator", *args)
        self._changed(activity=True)
        return bool(done)

    def _changed(self, activity: bool = False) -> None:
        if self.overview is not None:
            self.overview.forget(activity)


def for_repo(jobs: Jobs, repo: Any) -> Operator:
    """The Operator of *jobs*, with full controls only when *repo* (the engine's) is a postgres Store."""
    from brooq_py.postgres.operator.overview import Overview
    from brooq_py.postgres.store import Store

    if isinstance(repo, Store):
        return Operator(jobs, repo, Overview(repo))
    return Operator(jobs, None, None)
