"""Gated: at most a gate's limit of requests inside an ASGI app at once (SPEC Z2)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from brooq_py.http.api import BUSY, Gate


class Gated:
    """At most ``gate.limit`` requests inside *app* at once; the next is answered 503 at once (SPEC Z2)."""

    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.gate.enter():
            await _send_busy(send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.leave()


async def _send_busy(send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in BUSY.all_headers()]
    await send({"type": "http.response.start", "status": BUSY.status, "headers": headers})
    await send({"type": "http.response.body", "body": BUSY.body})
