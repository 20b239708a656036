"""The handler type: a function, an ``async def``, or an object with ``.handle``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from brooq_py.queue.claim import Claim
from brooq_py.queue.context import Context

HandlerFunc = Callable[[Context, Claim], Awaitable[None] | None]


@runtime_checkable
class HandlerObject(Protocol):
    def handle(self, ctx: Context, claim: Claim) -> Awaitable[None] | None: ...


Handler = HandlerFunc | HandlerObject
