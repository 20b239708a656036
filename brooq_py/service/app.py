"""The service surface as a WSGI application: /healthz, /metrics and the token-guarded /jobs endpoints.

Every answer is short and deliberate: bad input gets a 4xx, an unexpected
error a 500 with a generic body, never a traceback; the token is compared in
constant time and never echoed or logged (SPEC O2, K3).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from brooq_py.queue import StoreUnavailable

if TYPE_CHECKING:
    from brooq_py.engine import Engine

log = logging.getLogger("brooq_py.service")

MAX_BODY = 64 * 1024
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_JOB = re.compile(r"/jobs/([^/]+)")
_JOB_CANCEL = re.compile(r"/jobs/([^/]+)/cancel")
_READ_METHODS = ("GET", "HEAD")

StartResponse = Callable[..., Any]
Environ = dict[str, Any]


class Reply:
    """One response: status, headers and a body, sent by ``SurfaceApp.__call__``."""

    def __init__(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or []

    @classmethod
    def json(cls, status: int, data: Any, headers: list[tuple[str, str]] | None = None) -> Reply:
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        return cls(status, body, "application/json", headers)

    @classmethod
    def error(cls, status: int, message: str, headers: list[tuple[str, str]] | None = None) -> Reply:
        return cls.json(status, {"error": message}, headers)


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Content Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class SurfaceApp:
    """The WSGI callable. *token* None (or empty) turns every /jobs path off (404)."""

    def __init__(self, engine: Engine, token: str | None = None) -> None:
        self.engine = engine
        # An empty token is no token: otherwise "Authorization: Bearer " would open /jobs.
        self._token = token.encode("utf-8") if token else None

    def __repr__(self) -> str:
        return f"SurfaceApp(engine={self.engine!r}, token={'set' if self._token else 'unset'})"

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        started = time.monotonic()
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        path = str(environ.get("PATH_INFO", "")) or "/"
        try:
            reply = self._dispatch(method, path, environ)
        except Exception:
            # The type only: an exception's text may carry what a request must not see.
            log.exception("unexpected error answering %s %s", method, _safe(path))
            reply = Reply.error(500, "internal error")
        status = f"{reply.status} {_REASONS.get(reply.status, '')}".rstrip()
        headers = [
            ("Content-Type", reply.content_type),
            ("Content-Length", str(len(reply.body))),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            *reply.headers,
        ]
        start_response(status, headers)
        log.debug(
            "%s %s -> %d (%.1f ms)", method, _safe(path), reply.status, (time.monotonic() - started) * 1000
        )
        return [b""] if method == "HEAD" else [reply.body]

    # --- routing ------------------------------------------------------------

    def _dispatch(self, method: str, path: str, environ: Environ) -> Reply:
        body_problem = _check_body(environ)
        if path == "/healthz":
            return body_problem or self._only(method, _READ_METHODS) or self._healthz()
        if path == "/metrics":
            return body_problem or self._only(method, _READ_METHODS) or self._metrics()
        if path == "/jobs" or path.startswith("/jobs/"):
            if self._token is None:
                return Reply.error(404, "not found")
            if not self._authorized(environ):
                return Reply.error(401, "unauthorized", [("WWW-Authenticate", 'Bearer realm="brooq"')])
            if body_problem:
                return body_problem
            return self._jobs(method, path)
        return Reply.error(404, "not found")

    @staticmethod
    def _only(method: str, allowed: tuple[str, ...]) -> Reply | None:
        if method in allowed:
            return None
        return Reply.error(405, "method not allowed", [("Allow", ", ".join(allowed))])

    def _authorized(self, environ: Environ) -> bool:
        assert self._token is not None
        scheme, _, given = str(environ.get("HTTP_AUTHORIZATION", "")).strip().partition(" ")
        presented = given.strip().encode("utf-8", "surrogateescape")
        # Compare even when the scheme is wrong, so every refusal takes the same path.
        same = hmac.compare_digest(presented, self._token)
        return same and scheme.lower() == "bearer"

    # --- endpoints ------------------------------------------------------------

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

    def _jobs(self, method: str, path: str) -> Reply:
        match = _JOB_CANCEL.fullmatch(path)
        if match is not None:
            return self._only(method, ("POST",)) or self._with_job(match.group(1), self._cancel)
        match = _JOB.fullmatch(path)
        if match is not None:
            return self._only(method, _READ_METHODS) or self._with_job(match.group(1), self._get)
        return Reply.error(404, "not found")

    def _with_job(self, raw_id: str, action: Callable[[str], Reply]) -> Reply:
        if not _UUID.fullmatch(raw_id):
            return Reply.error(400, "malformed job id: expected a UUID")
        try:
            return action(raw_id.lower())
        except StoreUnavailable:
            log.error("database unavailable")
            return Reply.error(503, "database unavailable")

    def _get(self, job_id: str) -> Reply:
        row = self.engine.get(job_id)
        if row is None:
            return Reply.error(404, "no such job")
        return Reply.json(200, row.to_json())

    def _cancel(self, job_id: str) -> Reply:
        # cancel() alone cannot tell "unknown" from "already terminal": look first.
        if self.engine.get(job_id) is None:
            return Reply.error(404, "no such job")
        canceled = self.engine.cancel(job_id)
        if canceled:
            log.info("job %s canceled through the service surface", job_id)
        return Reply.json(200, {"canceled": canceled})


def _check_body(environ: Environ) -> Reply | None:
    """Refuse bodies the surface never needs: chunked ones, and any longer than ``MAX_BODY``."""
    if environ.get("HTTP_TRANSFER_ENCODING"):
        return Reply.error(411, "length required")
    raw = str(environ.get("CONTENT_LENGTH") or "0").strip()
    if not raw.isascii() or not raw.isdigit():
        return Reply.error(400, "bad Content-Length")
    length = int(raw)
    if length > MAX_BODY:
        return Reply.error(413, f"request body larger than {MAX_BODY} bytes")
    if length:
        stream = environ.get("wsgi.input")
        if stream is not None:
            stream.read(length)  # drained, so the client reads the answer instead of a reset
    return None


def _safe(path: str) -> str:
    """Return *path* fit for one log line (no control characters, bounded length)."""
    cleaned = "".join(ch if ch.isprintable() else "?" for ch in path)
    return cleaned if len(cleaned) <= 200 else cleaned[:200] + "..."
