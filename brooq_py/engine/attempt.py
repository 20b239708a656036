"""Attempt: one claimed job in this engine, from claim to its outcome write."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from brooq_py.engine.repo import ClaimedJob
from brooq_py.queue import Claim, Context, KindOptions, Lease

HandlerCallable = Callable[[Context, Claim], Any]


@dataclass(frozen=True)
class Kind:
    """A registered topic: its handler (resolved to a callable) and options."""

    topic: str
    handler: HandlerCallable
    options: KindOptions
    is_async: bool

    @classmethod
    def build(cls, topic: str, handler: object, options: KindOptions) -> Kind:
        fn: Any = handler
        if not inspect.isroutine(handler) and callable(getattr(handler, "handle", None)):
            fn = handler.handle  # type: ignore[attr-defined]
        if not callable(fn):
            raise TypeError("handler must be a function, an async function or an object with .handle")
        is_async = inspect.iscoroutinefunction(fn) or (
            not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)
        )
        return cls(topic=topic, handler=fn, options=options, is_async=is_async)


class Attempt:
    """The engine's record of one claim while it is ours.

    Flags change under ``lock``: ``finished`` (the handler returned or raised),
    ``abandoned`` (the watchdog or max_execution_timeout gave up on a handler
    still running), ``lost`` (the heartbeat found the row no longer ours).
    """

    __slots__ = (
        "abandoned",
        "cancelled_at",
        "claim",
        "ctx",
        "finished",
        "hard_deadline",
        "hung",
        "kind",
        "lock",
        "lost",
        "row",
        "soft_deadline",
        "started",
        "stopping_hung",
    )

    def __init__(self, row: ClaimedJob, kind: Kind, started: float, ctx: Context) -> None:
        opts = kind.options
        self.row = row
        self.kind = kind
        self.ctx = ctx
        self.claim = Claim(
            id=row.id,
            topic=row.topic,
            payload=row.payload,
            attempt=row.attempts,
            max_attempts=opts.max_attempts,
            lease=Lease(row.locked_by, row.locked_until),
            claim_token=row.claim_token,
            priority=row.priority,
        )
        self.started = started
        self.soft_deadline = started + opts.td("attempt_timeout").total_seconds()
        self.hard_deadline = started + opts.td("max_execution_timeout").total_seconds()
        self.cancelled_at: float | None = None
        self.lock = threading.Lock()
        self.finished = False
        self.abandoned = False
        self.lost = False
        self.stopping_hung = False
        self.hung = False

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def topic(self) -> str:
        return self.row.topic

    def finish(self) -> bool:
        """Mark the handler ended; return False if the engine had already given up on it."""
        with self.lock:
            if self.abandoned:
                return False
            self.finished = True
            return True

    def abandon(self) -> bool:
        """Give up on a handler still running; return False if it already ended."""
        with self.lock:
            if self.finished or self.abandoned:
                return False
            self.abandoned = True
            return True


def is_awaitable(value: object) -> bool:
    return isinstance(value, Awaitable)
