"""The service surface over real HTTP, on a real Store in the test's schema (SPEC O1, O2, K3)."""

from __future__ import annotations

import http.client
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.http import server as service_app
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, State, StoreUnavailable
from brooq_py.service import MAX_BODY, Server, serve
from tests.polling import wait_for

TOKEN = "t0ken-" + uuid.uuid4().hex
TOPIC = "svc.test"
IDLE_TOPIC = "svc.idle"  # nothing handles it, so its jobs stay pending

O1_METRICS = (
    "brooq_jobs",
    "brooq_ready_oldest_age_seconds",
    "brooq_enqueued",
    "brooq_claimed",
    "brooq_settle",
    "brooq_attempt_duration_seconds",
    "brooq_worker_busy",
    "brooq_lease_lost",
    "brooq_reaped",
    "brooq_retention_deleted",
    "brooq_hung_workers",
)


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    server: Server,
    method: str,
    path: str,
    *,
    token: str | None = None,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        all_headers = dict(headers or {})
        if token is not None:
            all_headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=body, headers=all_headers)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def handler(ctx: Context, claim: Claim) -> None:
    return None


@pytest.fixture
def engine(store: Store) -> Iterator[Engine]:
    eng = Engine(store, Config(workers=2, poll_interval=0.2, lease=30))
    eng.register_kind(TOPIC, handler)
    try:
        yield eng
    finally:
        eng.close()


# Both servers that carry the surface's routes: uvicorn with the dashboard (the web extra) and
# the stdlib WSGI server of the core install. Every test of the surface runs on both.
@pytest.fixture(params=[True, False], ids=["starlette", "wsgi"])
def stack(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def server(engine: Engine, stack: bool) -> Iterator[Server]:
    with serve(engine, port=0, token=TOKEN, dashboard=stack) as srv:
        yield srv


@pytest.fixture
def open_server(engine: Engine, stack: bool) -> Iterator[Server]:
    """The surface with no token configured: /jobs is off."""
    with serve(engine, port=0, dashboard=stack) as srv:
        yield srv


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


# --- /healthz ---------------------------------------------------------------------------------


def test_healthz_503_until_the_engine_runs_then_200(engine: Engine, server: Server) -> None:
    """SPEC O2: /healthz answers without auth; 503 while the engine is not running."""
    reply = request(server, "GET", "/healthz")
    assert reply.status == 503
    body = reply.json()
    assert body["running"] is False and body["database"] is True and body["ok"] is False
    assert {"hung", "workers"} <= body.keys()

    engine.start()
    reply = request(server, "GET", "/healthz")
    assert reply.status == 200, reply.body
    body = reply.json()
    assert {k: body[k] for k in ("ok", "database", "running", "hung", "workers")} == {
        "ok": True,
        "database": True,
        "running": True,
        "hung": 0,
        "workers": 2,
    }
    assert reply.headers["content-type"] == "application/json"

    head = request(server, "HEAD", "/healthz")
    assert head.status == 200 and head.body == b""

    engine.stop(5)
    assert request(server, "GET", "/healthz").status == 503


def test_healthz_and_metrics_answer_with_the_database_down(schema: str) -> None:
    """SPEC O2: with the database unreachable /healthz says 503 and /metrics still answers."""
    dead_pool: ConnectionPool[Any] = ConnectionPool(
        "postgresql://root@127.0.0.1:1/test?connect_timeout=1", min_size=1, open=False, timeout=1
    )
    dead_pool.open(wait=False)
    try:
        store = Store(dead_pool, schema=schema)
        eng = Engine(store, Config(workers=1, poll_interval=0.2))
        eng.register_kind(TOPIC, handler)
        eng.start()  # /healthz judges the engine's own statements (SPEC Z2): it runs none itself
        with serve(eng, port=0, dashboard=False) as srv:
            health = wait_for(
                lambda: (r := request(srv, "GET", "/healthz")).json()["database"] is False and r,
                "/healthz to see the failing statements",
            )
            assert health.status == 503
            metrics = request(srv, "GET", "/metrics")
            assert metrics.status in (200, 503)
            assert b"Traceback" not in metrics.body
            if metrics.status == 200:
                assert b"brooq_settle" in metrics.body
        eng.close()
    finally:
        dead_pool.close()


# --- /metrics ----------------------------------------------------------------------------------


def test_metrics_names_labels_and_movement(engine: Engine, server: Server, store: Store) -> None:
    """SPEC O1: every brooq_* metric is served, and settle/claim/enqueue counters move after a job runs."""
    reply = request(server, "GET", "/metrics")
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(reply.body.decode())}
    for name in O1_METRICS:
        assert name in families, f"{name} missing from /metrics"
    before = samples(reply.body.decode())
    done_key = ("brooq_settle_total", (("outcome", "done"), ("topic", TOPIC)))
    done_before = before.get(done_key, 0.0)

    engine.start()
    result = engine.enqueue(Job(TOPIC, {"n": 1}))
    wait_for(
        lambda: (row := store.get(result.id)) is not None and row.state == State.DONE, "the job to be done"
    )

    def moved() -> bool:
        now = samples(request(server, "GET", "/metrics").body.decode())
        return now.get(done_key, 0.0) >= done_before + 1

    wait_for(moved, "brooq_settle_total{outcome=done} to increase")
    after = samples(request(server, "GET", "/metrics").body.decode())
    assert after[("brooq_enqueued_total", (("topic", TOPIC),))] >= 1
    assert after[("brooq_claimed_total", (("topic", TOPIC),))] >= 1
    assert after[("brooq_attempt_duration_seconds_count", (("topic", TOPIC),))] >= 1
    # Gauges read at scrape time, per registered topic and active state.
    for state in ("pending", "processing", "failed"):
        assert ("brooq_jobs", (("state", state), ("topic", TOPIC))) in after
    assert ("brooq_ready_oldest_age_seconds", (("topic", TOPIC),)) in after


def test_metrics_generation_failure_is_a_short_503(engine: Engine, server: Server) -> None:
    """A collector that raises turns into a 503 with a short text, never a 500 with a traceback."""

    class Broken:
        def describe(self) -> list[Any]:
            return []

        def collect(self) -> Any:
            raise RuntimeError("secret internals")

    engine.registry.register(Broken())  # type: ignore[arg-type]
    reply = request(server, "GET", "/metrics")
    assert reply.status == 503
    assert reply.body == b"metrics unavailable\n"


# --- /jobs: auth ------------------------------------------------------------------------------


def test_jobs_need_the_bearer_token_checked_first(server: Server, store: Store) -> None:
    """SPEC O2: 401 without or with a wrong token, before 400 (malformed) and 404 (unknown)."""
    job_id = store.enqueue(Job(IDLE_TOPIC, {"a": 1})).id
    unknown = str(uuid.uuid4())
    for path, method in (
        (f"/jobs/{job_id}", "GET"),
        ("/jobs/not-a-uuid", "GET"),
        (f"/jobs/{unknown}", "GET"),
        (f"/jobs/{job_id}/cancel", "POST"),
        (f"/jobs/{job_id}/cancel", "GET"),  # even the wrong method: auth first
        ("/jobs/nowhere/at/all", "GET"),
        ("/jobs/%0A0", "GET"),  # a newline in the path: the same router on both servers
        ("/topics/a%0Ab/pause", "POST"),
    ):
        assert request(server, method, path).status == 401, path
        wrong = request(server, method, path, token=TOKEN + "x")
        assert wrong.status == 401, path
        assert wrong.headers.get("www-authenticate", "").startswith("Bearer")
        assert request(server, method, path, headers={"Authorization": f"Basic {TOKEN}"}).status == 401
    assert store.get(job_id).state == State.PENDING  # type: ignore[union-attr]


def test_jobs_use_a_constant_time_compare(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC O2: the token is compared with hmac.compare_digest (a spy, not timing)."""
    calls: list[tuple[bytes, bytes]] = []
    real = service_app.hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(service_app.hmac, "compare_digest", spy)
    assert request(server, "GET", f"/jobs/{uuid.uuid4()}", token=TOKEN).status == 404
    assert calls == [(TOKEN.encode(), TOKEN.encode())]
    assert request(server, "GET", f"/jobs/{uuid.uuid4()}", token="wrong").status == 401
    assert calls[-1] == (b"wrong", TOKEN.encode())


def test_get_job(server: Server, store: Store) -> None:
    job_id = store.enqueue(Job(IDLE_TOPIC, {"msg": "hi"}, idempotency_key="k1", priority=3)).id
    reply = request(server, "GET", f"/jobs/{job_id}", token=TOKEN)
    assert reply.status == 200
    body = reply.json()
    assert body["id"] == job_id and body["topic"] == IDLE_TOPIC and body["state"] == "pending"
    assert body["payload"] == {"msg": "hi"} and body["idempotency_key"] == "k1" and body["priority"] == 3
    # Upper-case ids are the same job.
    assert request(server, "GET", f"/jobs/{job_id.upper()}", token=TOKEN).json()["id"] == job_id


@pytest.mark.parametrize(
    "bad", ["not-a-uuid", "1234", "%00", "x" * 300, "00000000-0000-0000-0000-00000000000g"]
)
def test_malformed_id_is_400(server: Server, bad: str) -> None:
    assert request(server, "GET", f"/jobs/{bad}", token=TOKEN).status == 400
    assert request(server, "POST", f"/jobs/{bad}/cancel", token=TOKEN).status == 400


def test_unknown_id_is_404(server: Server) -> None:
    unknown = str(uuid.uuid4())
    assert request(server, "GET", f"/jobs/{unknown}", token=TOKEN).status == 404
    assert request(server, "POST", f"/jobs/{unknown}/cancel", token=TOKEN).status == 404


def test_jobs_are_off_without_a_configured_token(open_server: Server, store: Store) -> None:
    """SPEC O2: without a token every /jobs path is 404, whatever is presented."""
    job_id = store.enqueue(Job(IDLE_TOPIC, None)).id
    for method, path in (
        ("GET", f"/jobs/{job_id}"),
        ("POST", f"/jobs/{job_id}/cancel"),
        ("GET", "/jobs"),
        ("GET", "/jobs/not-a-uuid"),
    ):
        assert request(open_server, method, path).status == 404
        assert request(open_server, method, path, token="anything").status == 404
    assert store.get(job_id).state == State.PENDING  # type: ignore[union-attr]
    assert request(open_server, "GET", "/healthz").status in (200, 503)


def test_o2_listens_on_loopback_by_default(engine: Engine, stack: bool) -> None:
    """O2: without a host the surface binds 127.0.0.1 only."""
    with serve(engine, port=0, dashboard=stack) as srv:
        assert srv.address[0] == "127.0.0.1"  # the bound socket, not the argument
        assert srv.url.startswith("http://127.0.0.1:")
        assert request(srv, "GET", "/healthz").status in (200, 503)


def test_an_empty_token_is_no_token(engine: Engine, store: Store, stack: bool) -> None:
    """SPEC O2: serve(token="") keeps /jobs off; "Authorization: Bearer " must not open it."""
    job_id = store.enqueue(Job(IDLE_TOPIC, None)).id
    with serve(engine, port=0, token="", dashboard=stack) as srv:
        assert request(srv, "GET", f"/jobs/{job_id}", token="").status == 404
        assert request(srv, "GET", f"/jobs/{job_id}", headers={"Authorization": "Bearer "}).status == 404
        assert request(srv, "POST", f"/jobs/{job_id}/cancel", token="").status == 404
    assert store.get(job_id).state == State.PENDING  # type: ignore[union-attr]


def test_cancel_then_get(server: Server, store: Store) -> None:
    """SPEC X1 through the surface: the first cancel changes the row, the second does not."""
    job_id = store.enqueue(Job(IDLE_TOPIC, {"x": 1})).id
    first = request(server, "POST", f"/jobs/{job_id}/cancel", token=TOKEN)
    assert first.status == 200 and first.json() == {"canceled": True}
    second = request(server, "POST", f"/jobs/{job_id}/cancel", token=TOKEN)
    assert second.status == 200 and second.json() == {"canceled": False}
    assert request(server, "GET", f"/jobs/{job_id}", token=TOKEN).json()["state"] == "canceled"


# --- methods, paths, bodies -------------------------------------------------------------------------


def test_wrong_method_is_405_with_allow(server: Server, store: Store) -> None:
    job_id = store.enqueue(Job(IDLE_TOPIC, None)).id
    cases = [
        ("POST", "/healthz", None, "GET, HEAD"),
        ("DELETE", "/metrics", None, "GET, HEAD"),
        ("GET", f"/jobs/{job_id}/cancel", TOKEN, "POST"),
        ("POST", f"/jobs/{job_id}", TOKEN, "GET, HEAD"),
        ("PUT", f"/jobs/{job_id}", TOKEN, "GET, HEAD"),
    ]
    for method, path, token, allow in cases:
        reply = request(server, method, path, token=token)
        assert reply.status == 405, (method, path)
        assert reply.headers["allow"] == allow
    assert store.get(job_id).state == State.PENDING  # type: ignore[union-attr]


@pytest.mark.parametrize("path", ["/", "/healthz/", "/metrics/x", "/admin", "/jobs-x", "/favicon.ico"])
def test_unknown_path_is_404(server: Server, path: str) -> None:
    assert request(server, "GET", path).status == 404


def test_large_body_is_413_and_small_body_is_ignored(server: Server, store: Store) -> None:
    job_id = store.enqueue(Job(IDLE_TOPIC, None)).id
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.putrequest("POST", f"/jobs/{job_id}/cancel")
        conn.putheader("Authorization", f"Bearer {TOKEN}")
        conn.putheader("Content-Length", str(10 * 1024 * 1024))
        conn.endheaders()  # the body is never sent: the answer must not wait for it
        resp = conn.getresponse()
        assert resp.status == 413
        resp.read()
    finally:
        conn.close()
    assert store.get(job_id).state == State.PENDING  # type: ignore[union-attr]
    assert request(server, "GET", "/healthz", headers={"Content-Length": str(MAX_BODY + 1)}).status == 413
    ok = request(server, "POST", f"/jobs/{job_id}/cancel", token=TOKEN, body=b"x" * 1000)
    assert ok.status == 200 and ok.json() == {"canceled": True}
    assert request(server, "GET", "/healthz", headers={"Content-Length": "abc"}).status == 400


def test_garbage_requests_never_500(server: Server) -> None:
    for path in ("/jobs/%ff%fe", "/%00", "/jobs/" + "a" * 5000):
        reply = request(server, "GET", path, token=TOKEN)
        assert reply.status in (400, 404), path
        assert b"Traceback" not in reply.body


def test_token_never_reaches_logs_or_responses(
    server: Server, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """SPEC K3: the token appears in no log line and no response."""
    job_id = store.enqueue(Job(IDLE_TOPIC, None)).id
    caplog.set_level(logging.DEBUG, logger="brooq_py")
    bodies = [
        request(server, "GET", f"/jobs/{job_id}", token=TOKEN).body,
        request(server, "GET", f"/jobs/{job_id}", token=TOKEN[:-1]).body,
        request(server, "POST", f"/jobs/{job_id}/cancel", token=TOKEN).body,
        request(server, "GET", "/metrics").body,
        request(server, "GET", "/healthz").body,
    ]
    assert not any(TOKEN.encode() in b for b in bodies)
    assert TOKEN not in caplog.text
    assert TOKEN not in repr(server) and TOKEN not in repr(server._backend)
    assert any("/jobs/" in r.getMessage() for r in caplog.records)  # requests are logged at DEBUG


def test_server_binds_port_zero_and_closes_twice(engine: Engine, stack: bool) -> None:
    srv = serve(engine, host="127.0.0.1", port=0, dashboard=stack)
    assert srv.port != 0 and srv.url == f"http://127.0.0.1:{srv.port}"
    assert request(srv, "GET", "/healthz").status == 503
    srv.close()
    srv.close()
    with pytest.raises(OSError):
        request(srv, "GET", "/healthz")


def test_store_errors_are_short_answers_without_details(
    engine: Engine, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unreachable database is a 503, any other failure a generic 500; neither carries details."""
    job_id = str(uuid.uuid4())

    def unavailable(_id: str) -> None:
        raise StoreUnavailable("connection to the secret host failed")

    monkeypatch.setattr(engine, "get", unavailable)
    reply = request(server, "GET", f"/jobs/{job_id}", token=TOKEN)
    assert reply.status == 503 and reply.json() == {"error": "database unavailable"}

    def broken(_id: str) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(engine, "get", broken)
    reply = request(server, "GET", f"/jobs/{job_id}", token=TOKEN)
    assert reply.status == 500 and reply.json() == {"error": "internal error"}
    assert b"secret" not in reply.body and b"Traceback" not in reply.body
