"""Kind: a registered topic, its handler resolved to a callable, and its options."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from brooq_py.queue import Claim, Context, KindOptions

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


def is_awaitable(value: object) -> bool:
    return isinstance(value, Awaitable)
