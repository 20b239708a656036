"""Viewer and operator tokens (SPEC K5), over real HTTP (httpx against the running servers).

The viewer's token reads every page and GET endpoint and gets 403 for every
action, on the surface's API as on /ui; the operator's token does both.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from psycopg import sql

from brooq_py.engine import Config, Engine
from brooq_py.http.api import READ_METHODS, ROUTES
from brooq_py.http.server import Server, ThreadedUvicorn, serve
from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from brooq_py.queue.port import TopicSetting
from brooq_py.web import dashboard
from tests.web.test_dashboard_http import kill

OPERATOR = "op-" + uuid.uuid4().hex
VIEWER = "view-" + uuid.uuid4().hex
TOPIC = "roles.t"


def bearer(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


@contextmanager
def surface(store: Store, **kwargs: Any) -> Iterator[Server]:
    """``serve()`` an engine on *store* at a free loopback port, with *kwargs*; closed after."""
    engine = Engine(store, Config(workers=1))
    try:
        with serve(engine, port=0, **kwargs) as server:
            yield server
    finally:
        engine.close()


@pytest.fixture(params=[True, False], ids=["starlette", "wsgi"])
def server(store: Store, request: pytest.FixtureRequest) -> Iterator[Server]:
    with surface(store, token=OPERATOR, viewer_token=VIEWER, dashboard=request.param) as srv:
        yield srv


def jobs(store: Store, pool: Any) -> dict[str, str]:
    """A pending job (cancelable), a dead one (retryable), one to signal and a dead member halting
    its sequence (resumable)."""
    dead = store.enqueue(Job(TOPIC, {"n": 1})).id
    halting = store.enqueue(Job(TOPIC, {"n": 3}, sequence="s1")).id
    store.enqueue(Job(TOPIC, {"n": 4}, sequence="s1"))
    kill(pool, store.schema, [dead, halting])
    return {
        "pending": store.enqueue(Job(TOPIC, {"n": 2})).id,
        "dead": dead,
        "signalled": store.enqueue(Job(TOPIC, {"n": 5})).id,
    }


def count(pool: Any, schema: str, query: str, *args: Any) -> int:
    """One count, *query*'s ``{s}`` being the test's schema."""
    with pool.connection() as conn:
        row = conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), args).fetchone()
    return int(row[0])


# Every action route of the surface, and how to see it took effect: (path, did it act?).
def surface_actions(store: Store, ids: dict[str, str], pool: Any) -> list[tuple[str, Callable[[], bool]]]:
    def state(job_id: str) -> State:
        row = store.get(job_id)
        assert row is not None
        return row.state

    return [
        (f"/jobs/{ids['pending']}/cancel", lambda: state(ids["pending"]) == State.CANCELED),
        (f"/jobs/{ids['dead']}/retry", lambda: state(ids["dead"]) == State.PENDING),
        (f"/topics/{TOPIC}/pause", lambda: TOPIC in store.paused()),
        (f"/topics/{TOPIC}/resume", lambda: TOPIC not in store.paused() and setting(store) is not None),
        (f"/topics/{TOPIC}/rate/10/1s", lambda: getattr(setting(store), "rate_limit", None) == 10),
        (f"/topics/{TOPIC}/depth/5", lambda: getattr(setting(store), "max_depth", None) == 5),
        (
            f"/jobs/{ids['signalled']}/signals/approve",
            lambda: (
                count(
                    pool,
                    store.schema,
                    "SELECT count(*) FROM {s}.job_signal WHERE job_id = %s",
                    ids["signalled"],
                )
                == 1
            ),
        ),
        (
            f"/topics/{TOPIC}/tenants/acme/limit/3",
            lambda: any(t.tenant == "acme" and t.limit == 3 for t in store.flow.tenants(TOPIC)),
        ),
        (
            f"/topics/{TOPIC}/tenants/limit/2",
            lambda: (
                count(
                    pool,
                    store.schema,
                    "SELECT count(*) FROM {s}.topic_setting WHERE topic = %s AND tenant_limit = 2",
                    TOPIC,
                )
                == 1
            ),
        ),
        (
            f"/topics/{TOPIC}/sequences/s1/resume",
            lambda: (
                count(pool, store.schema, "SELECT count(*) FROM {s}.job_sequence_halt WHERE sequence = 's1'")
                == 0
            ),
        ),
    ]


def setting(store: Store) -> TopicSetting | None:
    return next((s for s in store.topic_settings() if s.topic == TOPIC), None)


def test_k5_every_action_route_of_the_surface_is_covered_here() -> None:
    """A route added to the surface that is not a read must be in surface_actions and ui_actions
    (and so tested): this list fails first, as a reminder."""
    actions = [p.pattern for p, methods, _ in ROUTES if set(methods) - set(READ_METHODS)]
    assert actions == [
        r"/jobs/([^/]+)/cancel",
        r"/jobs/([^/]+)/retry",
        r"/jobs/([^/]+)/signals/([^/]+)",
        r"/topics/(.+)/tenants/([^/]+)/(limit|rate|weight)/([^/]+(?:/[^/]+)?)",
        r"/topics/(.+)/tenants/(limit|rate)/([^/]+(?:/[^/]+)?)",
        r"/topics/(.+)/sequences/([^/]+)/resume",
        "/topics/(.+)/pause",
        "/topics/(.+)/resume",
        r"/topics/(.+)/rate/([^/]+(?:/[^/]+)?)",
        r"/topics/(.+)/depth/([^/]+)",
    ]


def test_k5_viewer_reads_the_surface_and_is_refused_every_action(
    server: Server, store: Store, pool: Any
) -> None:
    ids = jobs(store, pool)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for token in (VIEWER, OPERATOR):
            assert client.get(f"/jobs/{ids['pending']}", headers=bearer(token)).json()["state"] == "pending"
            assert client.get("/topics", headers=bearer(token)).status_code == 200
            assert client.head("/topics", headers=bearer(token)).status_code == 200
        for path, acted in surface_actions(store, ids, pool):
            refused = client.post(path, headers=bearer(VIEWER))
            assert refused.status_code == 403, path
            assert "read" in refused.json()["error"]
            assert not acted(), path
            assert client.post(path, headers=bearer(None)).status_code == 401
            assert client.post(path, headers=bearer("wrong")).status_code == 401
            assert client.post(path, headers=bearer(OPERATOR)).status_code == 200, path
            assert acted(), path


def test_k5_a_viewer_alone_opens_the_reads_and_no_action(store: Store, pool: Any) -> None:
    ids = jobs(store, pool)
    with (
        surface(store, viewer_token=VIEWER, dashboard=False) as srv,
        httpx.Client(base_url=srv.url) as c,
    ):
        assert c.get(f"/jobs/{ids['dead']}", headers=bearer(VIEWER)).status_code == 200
        assert c.post(f"/jobs/{ids['dead']}/retry", headers=bearer(VIEWER)).status_code == 403
        assert c.post(f"/jobs/{ids['dead']}/retry", headers=bearer(OPERATOR)).status_code == 401


def test_k5_the_two_tokens_must_differ(store: Store) -> None:
    with pytest.raises(ValueError, match="differ"), surface(store, token=OPERATOR, viewer_token=OPERATOR):
        pass
    with pytest.raises(ValueError, match="differ"):
        dashboard(store, token=OPERATOR, viewer_token=OPERATOR)


# --- the dashboard: /ui on the surface, and dashboard() alone --------------------------------


def ui_actions(ids: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    return [
        ("cancel", {"id": ids["pending"]}),
        ("retry", {"id": ids["dead"]}),
        ("retry-many", {"id": ids["dead"]}),
        ("pause", {"topic": TOPIC}),
        ("resume", {"topic": TOPIC}),
        ("rate", {"topic": TOPIC, "value": "10/1s"}),
        ("depth", {"topic": TOPIC, "value": "5"}),
        ("sequence-resume", {"topic": TOPIC, "sequence": "s1"}),
        ("tenant", {"topic": TOPIC, "tenant": "acme", "what": "limit", "value": "3"}),
        ("tenant", {"topic": TOPIC, "tenant": "acme", "what": "weight", "value": "2"}),
        ("tenant", {"topic": TOPIC, "what": "rate", "value": "4/1s"}),
    ]


def test_k5_every_action_of_the_dashboard_is_covered_here() -> None:
    """An action added to the dashboard must be in ui_actions (and so refused to a viewer here)."""
    from brooq_py.http.dashboard import _ACTIONS

    assert set(_ACTIONS) == {name for name, _ in ui_actions({"pending": "", "dead": ""})}


PAGES = ["/", "/topics.rows", f"/jobs?topic={TOPIC}&state=pending", "/dead", f"/topics/{TOPIC}/tenants"]


def check_dashboard(client: httpx.Client, store: Store, ids: dict[str, str], prefix: str) -> None:
    """With bearer tokens: the viewer sees every page, no action on it, and is refused each action."""
    for page in [*PAGES, f"/jobs/{ids['pending']}"]:
        for token in (VIEWER, OPERATOR):
            assert client.get(prefix + page, headers=bearer(token)).status_code == 200, page
        assert "/action/" not in client.get(prefix + page, headers=bearer(VIEWER)).text, page
    assert "/action/cancel" in client.get(f"{prefix}/jobs/{ids['pending']}", headers=bearer(OPERATOR)).text
    before = {k: store.get(v) for k, v in ids.items()}
    for name, form in ui_actions(ids):
        reply = client.post(f"{prefix}/action/{name}", data={**form, "back": "/"}, headers=bearer(VIEWER))
        assert reply.status_code == 403, name
        assert {k: store.get(v) for k, v in ids.items()} == before and store.topic_settings() == []
    for name, form in ui_actions(ids):
        reply = client.post(f"{prefix}/action/{name}", data={**form, "back": "/"}, headers=bearer(OPERATOR))
        assert reply.status_code == 303, name
    acted = setting(store)
    assert acted is not None and acted.rate_limit == 10 and acted.max_depth == 5
    assert [(t.tenant, t.limit, t.weight) for t in store.flow.tenants(TOPIC)] == [("acme", 3, 2)]
    assert store.flow.tenant_page(TOPIC).default_rate == "4/1s"
    assert store.resume_sequence(TOPIC, "s1") is False  # the dashboard's resume let it go on


def test_k5_ui_on_the_surface_reads_for_the_viewer_and_acts_for_the_operator(store: Store, pool: Any) -> None:
    ids = jobs(store, pool)
    with surface(store, token=OPERATOR, viewer_token=VIEWER) as srv:
        assert srv.dashboard
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            check_dashboard(client, store, ids, "/ui")
    row = store.get(ids["pending"])
    assert row is not None and row.state == State.CANCELED


@pytest.fixture
def board(store: Store) -> Iterator[str]:
    server = ThreadedUvicorn(dashboard(store, token=OPERATOR, viewer_token=VIEWER), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.address[1]}"
    finally:
        server.close()


def test_k5_dashboard_alone_with_bearer_tokens(board: str, store: Store, pool: Any) -> None:
    ids = jobs(store, pool)
    with httpx.Client(base_url=board, timeout=30) as client:
        check_dashboard(client, store, ids, "")


def login(client: httpx.Client, token: str) -> str:
    """Log in through the form; return the CSRF token the pages then carry."""
    reply = client.post("/login", data={"token": token, "next": "/"})
    assert reply.status_code == 303 and "brooq_session" in client.cookies
    page = client.get("/")
    assert page.status_code == 200
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found is not None
    return found.group(1)


def test_k5_dashboard_login_with_the_viewer_token_reads_and_never_acts(
    board: str, store: Store, pool: Any
) -> None:
    ids = jobs(store, pool)
    with httpx.Client(base_url=board, timeout=30) as viewer:
        csrf = login(viewer, VIEWER)
        assert 'id="read-only"' in viewer.get("/").text
        for page in [*PAGES, f"/jobs/{ids['pending']}"]:
            reply = viewer.get(page)
            assert reply.status_code == 200 and "/action/" not in reply.text, page
        for name, form in ui_actions(ids):
            reply = viewer.post(f"/action/{name}", data={**form, "csrf": csrf, "back": "/"})
            assert reply.status_code == 403, name
        assert store.topic_settings() == [] and store.flow.tenants(TOPIC) == []
        row = store.get(ids["pending"])
        assert row is not None and row.state == State.PENDING
        assert viewer.post("/logout", data={"csrf": csrf}).status_code == 303  # a viewer may log out
    with httpx.Client(base_url=board, timeout=30) as operator:
        csrf = login(operator, OPERATOR)
        assert 'id="read-only"' not in operator.get("/").text
        reply = operator.post("/action/cancel", data={"id": ids["pending"], "csrf": csrf, "back": "/"})
        assert reply.status_code == 303
        # The viewer's CSRF token is no key to the operator's session, nor the other way round.
    with httpx.Client(base_url=board, timeout=30) as mixed:
        login(mixed, VIEWER)
        operator_csrf = csrf
        reply = mixed.post("/action/pause", data={"topic": TOPIC, "csrf": operator_csrf, "back": "/"})
        assert reply.status_code == 403 and store.paused() == set()
    with httpx.Client(base_url=board, timeout=30) as wrong:
        assert wrong.post("/login", data={"token": "nope", "next": "/"}).status_code == 401
