"""``dashboard()``: the public way to make the dashboard's ASGI application."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import psycopg_pool
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from brooq_py.http.actions import Operator
from brooq_py.http.api import Gate
from brooq_py.http.dashboard import build
from brooq_py.http.gated import Gated
from brooq_py.postgres.async_store import AsyncStore
from brooq_py.postgres.operator.overview import Overview
from brooq_py.postgres.store import Store

# The sync pool a dashboard of an AsyncStore opens for itself: pages are few and short.
OWN_POOL_MAX = 4


def dashboard(
    store: Store | AsyncStore,
    *,
    token: str | None = None,
    read_only: bool = False,
    concurrency: int = 32,
    refresh_ms: int = 2000,
    cache_seconds: float = 2.0,
    viewer_token: str | None = None,
) -> ASGIApp:
    """Return the dashboard of *store* as an ASGI application.

    Every page and action needs *token* (a login form sets a session cookie;
    ``Authorization: Bearer <token>`` works too). *viewer_token* reads every
    page and is refused every action (403), its pages showing none. Without
    either token it answers only requests it receives on a loopback address
    (403 otherwise). *read_only* hides every action and refuses them (403),
    whatever the token. Raise ``ValueError`` when both tokens are the same. At most
    *concurrency* requests are served at once; the next one gets 503. The
    topic counts are read at most every *cache_seconds* (shared by every
    viewer); pages refresh them every *refresh_ms* milliseconds.

    Given an ``AsyncStore``, the dashboard opens a small sync pool of its own
    (at most 4 connections, none while idle) with the AsyncStore's pool
    settings and schema; it is closed at the application's lifespan shutdown
    (served alone), else at process exit.
    """
    close: Callable[[], None] | None = None
    if isinstance(store, AsyncStore):
        store, close = _sync_twin(store)
    if not isinstance(store, Store):
        raise TypeError(
            f"dashboard() needs a brooq_py.postgres.Store or AsyncStore, got {type(store).__name__}"
        )
    overview = Overview(store, ttl=cache_seconds)
    board = build(
        Operator(store, store, overview),
        overview,
        token=token,
        read_only=read_only,
        refresh_ms=refresh_ms,
        viewer_token=viewer_token,
    )
    app: ASGIApp = Gated(board.app, Gate(concurrency))
    return app if close is None else ClosesAtShutdown(app, close)


def _sync_twin(store: AsyncStore) -> tuple[Store, Callable[[], None]]:
    """A Store on a sync pool of the AsyncStore's settings, and how to close that pool."""
    apool: Any = store.session.pool
    if apool is None:
        raise TypeError("dashboard() needs an AsyncStore with a pool (AsyncStore(pool, schema=...))")
    conninfo = apool.conninfo
    if inspect.iscoroutinefunction(conninfo) or inspect.iscoroutinefunction(apool.kwargs):
        raise TypeError(
            "dashboard() cannot use an AsyncStore whose pool computes its settings with async code"
        )
    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        conninfo, kwargs=apool.kwargs, min_size=0, max_size=OWN_POOL_MAX, open=True, name="brooq-dashboard"
    )
    return Store(pool, schema=store.schema), pool.close


class ClosesAtShutdown:
    """Pass everything to *app*; at the lifespan's shutdown, call *close* (off the event loop) first."""

    def __init__(self, app: ASGIApp, close: Callable[[], None]) -> None:
        self.app = app
        self.close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await run_in_threadpool(self.close)
            return message

        await self.app(scope, receiving, send)
