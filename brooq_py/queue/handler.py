"""The handler type: a function, an ``async def``, or an object with ``.handle``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from brooq_py.queue.claim import Claim
from brooq_py.queue.context import Context

HandlerFunc = Callable[[Context, Claim], object]
"""What it returns (an ``async def``'s, once awaited) is the job's result (SPEC V1): JSON, or None."""


@runtime_checkable
class HandlerObject(Protocol):
    def handle(self, ctx: Context, claim: Claim) -> object: ...


Handler = HandlerFunc | HandlerObject
