"""The worker's surface with the ``web`` extra: one Starlette application, the dashboard at /ui (SPEC O2).

Both faces share the tokens, the Operator (so the overview's cache) and the gate; the surface's
router runs in a worker thread, so a slow database never blocks the event loop.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as StarletteRequest
from starlette.responses import RedirectResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from brooq_py.http.api import MAX_BODY, Gate, Gated, Request, Surface, safe, send_asgi, takes_body
from brooq_py.http.auth import is_loopback
from brooq_py.http.dashboard import Dashboard

if TYPE_CHECKING:
    from brooq_py.engine import Engine

log = logging.getLogger("brooq_py.service")


class SurfaceRoutes:
    """A raw ASGI app handing every request to the shared router (``api.Surface``)."""

    def __init__(self, surface: Surface) -> None:
        self.surface = surface

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        started = time.monotonic()
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        method = str(scope["method"]).upper()
        path = str(scope["path"]) or "/"
        body = await _body(receive) if takes_body(method, path) else b""
        if body is None:
            return  # the client left before its body's end: not a request, no one to answer
        reply = await run_in_threadpool(self.surface.dispatch, Request(method, path, headers, body))
        await send_asgi(send, reply, head=method == "HEAD")
        log.debug(
            "%s %s -> %d (%.1f ms)", method, safe(path), reply.status, (time.monotonic() - started) * 1000
        )


async def _body(receive: Receive) -> bytes | None:
    """A small body the route needs: at most ``MAX_BODY`` bytes (more is cut, and refused by the
    route's Content-Length check); None when the client left before its end."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            return None
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size <= MAX_BODY:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def surface_app(
    engine: Engine,
    token: str | None,
    *,
    host: str,
    gate: Gate,
    read_only: bool = False,
    viewer_token: str | None = None,
) -> ASGIApp:
    """Return the surface's application; /ui is mounted when a token is set or *host* is loopback."""
    surface = Surface(engine, token, viewer_token=viewer_token)
    routes: list[BaseRoute] = []
    overview = surface.operator.overview
    if overview is not None and (surface.roles.configured or is_loopback(host)):
        board = Dashboard(
            surface.operator, overview, token=token, read_only=read_only, viewer_token=viewer_token
        )
        # The mount answers only below /ui/: without this, the catch-all would take /ui itself.
        routes.append(Route("/ui", _to_ui_root, methods=["GET", "HEAD"]))
        routes.append(Mount("/ui", app=board.app))
        log.info(
            "dashboard at /ui (%s%s)",
            "token required" if surface.roles.configured else "no token: loopback only",
            ", read-only" if read_only else "",
        )
    elif overview is not None:
        log.warning("the dashboard at /ui is off: the surface listens on %s without a token", host)
    app = Starlette(routes=routes)
    # Not a Mount(""): its pattern stops at a newline, and would answer 404 before asking for the token.
    app.router.default = SurfaceRoutes(surface)
    app.router.redirect_slashes = False
    return Gated(app, gate)


def _to_ui_root(request: StarletteRequest) -> RedirectResponse:
    """Send ``/ui`` to the dashboard's root ``/ui/``, with its query."""
    query = request.url.query
    return RedirectResponse("/ui/" + (f"?{query}" if query else ""), status_code=308)
