"""The surface as a WSGI application for the stdlib server of the core install.

A thin adapter: the routes, the token check and the actions are the shared
ones of ``api`` (the same ones the Starlette application serves when
the ``web`` extra is installed).
"""

from __future__ import annotations

import hmac  # noqa: F401  (tests spy on hmac.compare_digest through this module)
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from brooq_py.http.api import BUSY, MAX_BODY, REASONS, Gate, Reply, Request, Surface, safe

if TYPE_CHECKING:
    from brooq_py.engine import Engine

log = logging.getLogger("brooq_py.service")

StartResponse = Callable[..., Any]
Environ = dict[str, Any]

__all__ = ["MAX_BODY", "Reply", "SurfaceApp"]


def _headers(environ: Environ) -> dict[str, str]:
    headers = {k[5:].replace("_", "-").lower(): str(v) for k, v in environ.items() if k.startswith("HTTP_")}
    if environ.get("CONTENT_LENGTH"):
        headers["content-length"] = str(environ["CONTENT_LENGTH"])
    return headers


class SurfaceApp:
    """The WSGI callable. With neither *token* nor *viewer_token* every /jobs and /topics path is off (404)."""

    def __init__(
        self,
        engine: Engine,
        token: str | None = None,
        gate: Gate | None = None,
        viewer_token: str | None = None,
    ) -> None:
        self.surface = Surface(engine, token, viewer_token=viewer_token)
        self.engine = engine
        self.gate = gate or Gate()

    def __repr__(self) -> str:
        return f"SurfaceApp({self.surface!r})"

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        started = time.monotonic()
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        # PEP 3333 hands the path over as latin-1; the surface reads UTF-8 (topic names).
        path = (
            str(environ.get("PATH_INFO", "")).encode("latin-1", "replace").decode("utf-8", "replace") or "/"
        )
        if self.gate.enter():
            try:
                headers = _headers(environ)
                reply = self.surface.dispatch(Request(method, path, headers))
                _drain(environ, reply)
            finally:
                self.gate.leave()
        else:
            reply = BUSY
        status = f"{reply.status} {REASONS.get(reply.status, '')}".rstrip()
        start_response(status, reply.all_headers())
        log.debug(
            "%s %s -> %d (%.1f ms)", method, safe(path), reply.status, (time.monotonic() - started) * 1000
        )
        return [b""] if method == "HEAD" else [reply.body]


def _drain(environ: Environ, reply: Reply) -> None:
    """Read a small body nobody needs, so the client reads the answer instead of a reset."""
    if reply.status in (400, 411, 413):
        return
    raw = str(environ.get("CONTENT_LENGTH") or "0").strip()
    length = int(raw) if raw.isascii() and raw.isdigit() else 0
    stream = environ.get("wsgi.input")
    if 0 < length <= MAX_BODY and stream is not None:
        stream.read(length)
