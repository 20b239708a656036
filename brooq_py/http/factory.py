"""``dashboard()``: the public way to make the dashboard's ASGI application."""

from __future__ import annotations

from starlette.types import ASGIApp

from brooq_py.http.actions import Operator
from brooq_py.http.api import Gate
from brooq_py.http.dashboard import Gated, build
from brooq_py.postgres.overview import Overview
from brooq_py.postgres.store import Store


def dashboard(
    store: Store,
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
    """
    if not isinstance(store, Store):
        raise TypeError(f"dashboard() needs a brooq_py.postgres.Store, got {type(store).__name__}")
    overview = Overview(store, ttl=cache_seconds)
    board = build(
        Operator(store, store, overview),
        overview,
        token=token,
        read_only=read_only,
        refresh_ms=refresh_ms,
        viewer_token=viewer_token,
    )
    return Gated(board.app, Gate(concurrency))
