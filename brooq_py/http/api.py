"""The surface's routes and its concurrency gate, whichever server carries them (SPEC O2, K3, K5, Z2)."""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from brooq_py.http.actions import ActionError, Operator, for_repo, path_name
from brooq_py.http.auth import Roles

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from brooq_py.engine import Engine

log = logging.getLogger("brooq_py.service")

MAX_BODY = 64 * 1024
DEFAULT_CONCURRENCY = 32  # requests served at once; one more is answered 503 at once
READ_METHODS = ("GET", "HEAD")
GUARDED = re.compile(r"/(jobs|topics)(/.*)?", re.DOTALL)
DASHBOARD = re.compile(r"/ui(/.*)?", re.DOTALL)
NO_DASHBOARD = (
    "no dashboard here: /ui needs the web extra (pip install 'brooq-py[web]') "
    "and a token, or a loopback address"
)


@dataclass
class Reply:
    """One response: status, body, content type and extra headers."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(cls, status: int, data: Any, headers: list[tuple[str, str]] | None = None) -> Reply:
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        return cls(status, body, "application/json", headers or [])

    @classmethod
    def error(cls, status: int, message: str, headers: list[tuple[str, str]] | None = None) -> Reply:
        return cls.json(status, {"error": message}, headers)

    def all_headers(self) -> list[tuple[str, str]]:
        """Return every header to send, the safety ones included."""
        return [
            ("Content-Type", self.content_type),
            ("Content-Length", str(len(self.body))),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            *self.headers,
        ]


BUSY = Reply.error(503, "busy: too many requests at once", [("Retry-After", "1")])


class Gate:
    """At most *limit* requests inside at once; ``enter()`` never waits."""

    def __init__(self, limit: int = DEFAULT_CONCURRENCY) -> None:
        if limit < 1:
            raise ValueError(f"concurrency must be at least 1, got {limit}")
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)

    def enter(self) -> bool:
        return self._slots.acquire(blocking=False)

    def leave(self) -> None:
        self._slots.release()


class Gated:
    """The gate around an ASGI *app*: the request past ``gate.limit`` is answered 503 at once."""

    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.gate.enter():
            await send_asgi(send, BUSY)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.leave()


async def send_asgi(send: Send, reply: Reply, head: bool = False) -> None:
    """Send *reply* through an ASGI *send*, its body left out for a HEAD request."""
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.all_headers()]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else reply.body})


def takes_body(method: str, path: str) -> bool:
    """Whether the request's body is read for its route (a signal's payload)."""
    return method == "POST" and SIGNAL.fullmatch(path) is not None


SIGNAL = re.compile(r"/jobs/[^/]+/signals/[^/]+")


def check_body(content_length: str | None, transfer_encoding: str | None) -> Reply | None:
    """Refuse bodies the surface never needs: chunked ones, and any longer than ``MAX_BODY``."""
    if transfer_encoding:
        return Reply.error(411, "length required")
    raw = (content_length or "0").strip()
    if not raw.isascii() or not raw.isdigit():
        return Reply.error(400, "bad Content-Length")
    if int(raw) > MAX_BODY:
        return Reply.error(413, f"request body larger than {MAX_BODY} bytes")
    return None


def only(method: str, allowed: tuple[str, ...]) -> Reply | None:
    if method in allowed:
        return None
    return Reply.error(405, "method not allowed", [("Allow", ", ".join(allowed))])


def safe(path: str) -> str:
    """Return *path* fit for one log line (no control characters, bounded length)."""
    cleaned = "".join(ch if ch.isprintable() else "?" for ch in path)
    return cleaned if len(cleaned) <= 200 else cleaned[:200] + "..."


Action = Callable[..., Reply]  # (operator, *the route's groups)


def _get(op: Operator, raw: str) -> Reply:
    return Reply.json(200, op.get(raw).to_json())


def _cancel(op: Operator, raw: str) -> Reply:
    return Reply.json(200, {"canceled": op.cancel(raw)})


def _signal(op: Operator, raw: str, name: str, body: bytes) -> Reply:
    return Reply.json(200, {"signaled": op.signal(raw, name, body)})


def _retry(op: Operator, raw: str) -> Reply:
    if op.retry(raw):
        return Reply.json(200, {"retried": True})
    return Reply.json(200, {"retried": False, "reason": op.retry_refusal(raw)})


def _rate(op: Operator, raw: str, value: str) -> Reply:
    limit, per = op.set_rate(raw, value)
    return Reply.json(200, {"topic": raw, "rate": limit, "per_seconds": per if limit else None})


def _depth(op: Operator, raw: str, value: str) -> Reply:
    return Reply.json(200, {"topic": raw, "max_depth": op.set_depth(raw, value)})


def _sequence_resume(op: Operator, raw: str, sequence: str) -> Reply:
    return Reply.json(200, {"topic": raw, "sequence": sequence, "resumed": op.resume_sequence(raw, sequence)})


def _pause(op: Operator, raw: str, paused: bool = True) -> Reply:
    op.set_paused(raw, paused)
    return Reply.json(200, {"topic": raw, "paused": paused})


def _topics(op: Operator, _raw: str) -> Reply:
    topics = op.topics()
    return Reply.json(
        200,
        {
            "cap": topics.cap,
            "read_at": topics.read_at.isoformat(),
            "topics": [t.to_json() for t in topics.topics],
        },
    )


def _tenants(op: Operator, raw: str) -> Reply:
    rows, (limit, rate) = op.tenants(raw)
    shown = {
        "topic": raw,
        "default_limit": limit,
        "default_rate": rate,
        "tenants": [t.to_json() for t in rows],
    }
    return Reply.json(200, shown)


def _tenant_default(op: Operator, raw: str, what: str, value: str) -> Reply:
    return Reply.json(200, {"topic": raw, "tenant": None, **op.set_tenant(raw, None, what, value)})


def _tenant_own(op: Operator, raw: str, tenant: str, what: str, value: str) -> Reply:
    return Reply.json(200, {"topic": raw, "tenant": tenant, **op.set_tenant(raw, tenant, what, value)})


# The token-guarded routes: (pattern, allowed methods, action). The first match wins.
ROUTES: tuple[tuple[re.Pattern[str], tuple[str, ...], Action], ...] = (
    (re.compile(r"/jobs/([^/]+)/cancel"), ("POST",), _cancel),
    (re.compile(r"/jobs/([^/]+)/retry"), ("POST",), _retry),
    (re.compile(r"/jobs/([^/]+)/signals/([^/]+)"), ("POST",), _signal),
    (re.compile(r"/jobs/([^/]+)"), READ_METHODS, _get),
    (re.compile(r"/topics()"), READ_METHODS, _topics),
    # before the topic's own routes: a topic's name may hold slashes, which their (.+) would take
    (re.compile(r"/topics/(.+)/tenants", re.DOTALL), READ_METHODS, _tenants),
    (
        re.compile(r"/topics/(.+)/tenants/([^/]+)/(limit|rate|weight)/([^/]+(?:/[^/]+)?)", re.DOTALL),
        ("POST",),
        _tenant_own,
    ),
    (
        re.compile(r"/topics/(.+)/tenants/(limit|rate)/([^/]+(?:/[^/]+)?)", re.DOTALL),
        ("POST",),
        _tenant_default,
    ),
    (re.compile(r"/topics/(.+)/sequences/([^/]+)/resume", re.DOTALL), ("POST",), _sequence_resume),
    (re.compile(r"/topics/(.+)/pause", re.DOTALL), ("POST",), _pause),
    (re.compile(r"/topics/(.+)/resume", re.DOTALL), ("POST",), functools.partial(_pause, paused=False)),
    (re.compile(r"/topics/(.+)/rate/([^/]+(?:/[^/]+)?)", re.DOTALL), ("POST",), _rate),
    (re.compile(r"/topics/(.+)/depth/([^/]+)", re.DOTALL), ("POST",), _depth),
)


@dataclass(frozen=True)
class Request:
    """What the router needs of a request; ``headers`` has lower-case names."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes = b""  # read for the routes that take one (a signal's payload)


class Surface:
    """The router of /healthz, /metrics, /jobs and /topics; without a token /jobs and /topics are 404.

    *token* reads and acts; *viewer_token* reads, and gets 403 for anything but GET and HEAD.
    """

    def __init__(
        self,
        engine: Engine,
        token: str | None = None,
        operator: Operator | None = None,
        viewer_token: str | None = None,
    ) -> None:
        self.engine = engine
        self.roles = Roles(token, viewer_token)
        self.operator = operator or for_repo(engine, engine.store)

    def __repr__(self) -> str:
        return f"Surface(engine={self.engine!r}, roles={self.roles!r})"

    def dispatch(self, request: Request) -> Reply:
        """Answer *request*; never raise (an unexpected error is a short 500, never a traceback)."""
        try:
            return self._route(request)
        except Exception:
            # The type only: an exception's text may carry what a request must not see.
            log.exception("unexpected error answering %s %s", request.method, safe(request.path))
            return Reply.error(500, "internal error")

    def _route(self, request: Request) -> Reply:
        method, path = request.method, request.path
        body_problem = check_body(
            request.headers.get("content-length"), request.headers.get("transfer-encoding")
        )
        if path == "/healthz":
            return body_problem or only(method, READ_METHODS) or self._healthz()
        if path == "/metrics":
            return body_problem or only(method, READ_METHODS) or self._metrics()
        if DASHBOARD.fullmatch(path) is not None:
            # Served by the web extra's application when it is on; say why it is not, not just 404.
            return Reply.error(404, NO_DASHBOARD)
        if GUARDED.fullmatch(path) is None:
            return Reply.error(404, "not found")
        if not self.roles.configured:
            return Reply.error(404, "not found")
        role = self.roles.bearer(request.headers.get("authorization"))
        if role is None:
            return Reply.error(401, "unauthorized", [("WWW-Authenticate", 'Bearer realm="brooq"')])
        if body_problem:
            return body_problem
        for pattern, methods, action in ROUTES:
            match = pattern.fullmatch(path)
            if match is not None:
                refused = only(method, methods)
                if refused:
                    return refused
                if role != "operator" and method not in READ_METHODS:
                    return Reply.error(403, "forbidden: this token may read, not act")
                try:
                    # The path arrives decoded (%00 is a NUL): every parameter is checked here, once.
                    params = [path_name(p) for p in match.groups()]
                    if action is _signal:
                        raw, name = params
                        return _signal(self.operator, raw, name, request.body)
                    return action(self.operator, *params)
                except ActionError as exc:
                    return Reply.error(exc.status, exc.message)
        return Reply.error(404, "not found")

    def _healthz(self) -> Reply:
        try:
            health = self.engine.health()
            body = health.to_json()
            ok = bool(health.ok)
        except Exception as exc:
            log.error("health check failed: %s", type(exc).__name__)
            return Reply.json(503, {"ok": False, "error": "health check failed"})
        return Reply.json(200 if ok else 503, body)

    def _metrics(self) -> Reply:
        try:
            text = generate_latest(self.engine.registry)
        except Exception as exc:
            log.error("metrics generation failed: %s", type(exc).__name__)
            return Reply(503, b"metrics unavailable\n", "text/plain; charset=utf-8")
        return Reply(200, text, CONTENT_TYPE_LATEST)
