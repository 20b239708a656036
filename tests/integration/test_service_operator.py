"""The surface's operator endpoints (SPEC Q1, Q2, O2, Z2) and its dashboard at /ui, on both servers."""

from __future__ import annotations

import http.client
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from brooq_py.service import Server, serve
from tests.web.test_dashboard_http import kill

TOKEN = "op-" + uuid.uuid4().hex
TOPIC = "svc.op"


def call(server: Server, method: str, path: str, token: str | None = TOKEN) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        ctype = resp.getheader("content-type", "")
        return resp.status, json.loads(body) if ctype.startswith("application/json") else body
    finally:
        conn.close()


@pytest.fixture
def engine(store: Store) -> Iterator[Engine]:
    eng = Engine(store, Config(workers=1, poll_interval=0.2))
    eng.register_kind("svc.other", lambda ctx, claim: None)
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture(params=[True, False], ids=["starlette", "wsgi"])
def server(engine: Engine, request: pytest.FixtureRequest) -> Iterator[Server]:
    with serve(engine, port=0, token=TOKEN, dashboard=request.param) as srv:
        yield srv


def test_q1_retry_endpoint(server: Server, store: Store, pool: Any) -> None:
    dead = store.enqueue(Job(TOPIC, {"n": 1})).id
    pending = store.enqueue(Job(TOPIC, {"n": 2})).id
    kill(pool, store.schema, [dead])
    assert call(server, "POST", f"/jobs/{dead}/retry") == (200, {"retried": True})
    row = store.get(dead)
    assert row is not None and row.state == State.PENDING and row.attempts == 0
    assert row.last_error == "RuntimeError: boom"  # kept (Q1)
    assert call(server, "POST", f"/jobs/{pending}/retry") == (
        200,
        {"retried": False, "reason": f"job {pending} is pending: only dead or canceled jobs can be retried"},
    )
    assert call(server, "POST", f"/jobs/{uuid.uuid4()}/retry")[0] == 404
    assert call(server, "POST", "/jobs/not-a-uuid/retry")[0] == 400
    assert call(server, "GET", f"/jobs/{dead}/retry")[0] == 405
    assert call(server, "POST", f"/jobs/{dead}/retry", token=None)[0] == 401
    assert call(server, "POST", f"/jobs/{dead}/retry", token="wrong")[0] == 401


def test_q2_pause_resume_and_topics_endpoints(server: Server, store: Store) -> None:
    store.enqueue(Job(TOPIC, {"n": 1}))
    store.enqueue(Job("svc/with slash", None))
    assert call(server, "POST", f"/topics/{TOPIC}/pause") == (200, {"topic": TOPIC, "paused": True})
    assert store.paused() == {TOPIC}
    assert call(server, "POST", "/topics/svc%2Fwith%20slash/pause")[0] == 200
    assert store.paused() == {TOPIC, "svc/with slash"}
    status, body = call(server, "GET", "/topics")
    assert status == 200
    topics = {t["topic"]: t for t in body["topics"]}
    assert topics[TOPIC]["paused"] is True and topics[TOPIC]["counts"]["pending"] == 1
    assert topics[TOPIC]["counts"]["done"] == 0 and len(topics[TOPIC]["done_per_minute"]) == 60
    assert call(server, "POST", f"/topics/{TOPIC}/resume") == (200, {"topic": TOPIC, "paused": False})
    assert store.paused() == {"svc/with slash"}
    # The cache is dropped by an action: the next read shows it at once.
    assert {t["topic"]: t for t in call(server, "GET", "/topics")[1]["topics"]}[TOPIC]["paused"] is False
    assert call(server, "POST", "/topics/%00/pause")[0] == 400
    assert call(server, "GET", f"/topics/{TOPIC}/pause")[0] == 405
    for path, method in (
        ("/topics", "GET"),
        (f"/topics/{TOPIC}/pause", "POST"),
        ("/topics/x/resume", "POST"),
    ):
        assert call(server, method, path, token=None)[0] == 401
        assert call(server, method, path, token=TOKEN + "x")[0] == 401
    assert store.paused() == {"svc/with slash"}


def test_o2_operator_endpoints_are_off_without_a_token(engine: Engine, store: Store) -> None:
    for dashboard in (True, False):
        with serve(engine, port=0, dashboard=dashboard) as srv:
            for method, path in (
                ("GET", "/topics"),
                ("POST", f"/topics/{TOPIC}/pause"),
                ("POST", f"/jobs/{uuid.uuid4()}/retry"),
            ):
                assert call(srv, method, path)[0] == 404
                assert call(srv, method, path, token="anything")[0] == 404
    assert store.paused() == set()


@pytest.mark.parametrize("dashboard", [True, False], ids=["starlette", "wsgi"])
def test_z2_requests_beyond_the_bound_get_503(
    engine: Engine, store: Store, dashboard: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Z2: the surface serves at most `concurrency` requests at once and answers the next 503 at once."""
    inside = threading.Event()
    release = threading.Event()
    real_get = engine.get

    def slow_get(job_id: str) -> Any:
        inside.set()
        release.wait(30)
        return real_get(job_id)

    monkeypatch.setattr(engine, "get", slow_get)
    with serve(engine, port=0, token=TOKEN, dashboard=dashboard, concurrency=1) as srv:
        results: list[int] = []
        held = threading.Thread(target=lambda: results.append(call(srv, "GET", f"/jobs/{uuid.uuid4()}")[0]))
        held.start()
        try:
            assert inside.wait(30)
            status, body = call(srv, "GET", "/healthz")
            assert status == 503 and body == {"error": "busy: too many requests at once"}
        finally:
            release.set()
            held.join(30)
        assert results == [404]
        assert call(srv, "GET", "/metrics")[0] == 200  # the slot is free again


def test_ui_is_the_dashboard_behind_the_same_token(engine: Engine, store: Store) -> None:
    job_id = store.enqueue(Job(TOPIC, {"n": 1})).id
    with serve(engine, port=0, token=TOKEN) as srv:
        assert srv.dashboard
        status, body = call(srv, "GET", f"/ui/jobs/{job_id}")
        assert status == 200 and job_id.encode() in body
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("GET", "/ui/")
        resp = conn.getresponse()
        assert resp.status == 303 and resp.getheader("location", "").startswith("/ui/login")
        conn.close()
        # /ui as docs/operating.md writes it: to the dashboard's root, the query kept.
        for method in ("GET", "HEAD"):
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            conn.request(method, "/ui?next=x")
            resp = conn.getresponse()
            resp.read()
            assert (resp.status, resp.getheader("location")) == (308, "/ui/?next=x"), method
            conn.close()
        assert call(srv, "POST", "/ui/action/pause?x", token=TOKEN)[0] == 400  # no topic field
        assert call(srv, "GET", "/ui/static/app.js", token=None)[0] == 200
    with serve(engine, port=0, token=TOKEN, read_only=True) as srv:
        assert b"/action/" not in call(srv, "GET", f"/ui/jobs/{job_id}")[1]
    with serve(engine, port=0, token=TOKEN, dashboard=False) as srv:
        for path in ("/ui", "/ui/"):
            status, body = call(srv, "GET", path)
            assert status == 404 and "web extra" in body["error"], path  # says why, not just "not found"


def test_q5_sequence_resume_endpoint(server: Server, store: Store) -> None:
    assert call(server, "POST", f"/topics/{TOPIC}/sequences/s1/resume") == (
        200,
        {"topic": TOPIC, "sequence": "s1", "resumed": False},
    )
    assert call(server, "POST", f"/topics/{TOPIC}/sequences/s1/resume", token=None)[0] == 401
    assert call(server, "GET", f"/topics/{TOPIC}/sequences/s1/resume")[0] == 405
