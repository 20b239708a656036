"""Bad HTTP requests against the service surface: each a 4xx, never a 500 (SPEC O2, API service).

Bad ids, bad methods, oversized bodies, wrong or missing tokens, odd paths, property-based.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from brooq_py import Engine, Job
from brooq_py.postgres import Store
from brooq_py.service import MAX_BODY, serve
from tests.polling import wait_for

TOKEN = "s3cret-token"


@pytest.fixture(params=[True, False], ids=["starlette", "wsgi"])
def surface(store: Store, request: pytest.FixtureRequest) -> Iterator[tuple[int, str]]:
    engine = Engine(store)
    engine.register_kind("chaos", lambda ctx, claim: None)
    job_id = store.enqueue(Job("other", {"x": 1})).id  # a real id, never claimed (no handler)
    engine.start()
    try:
        with serve(engine, port=0, token=TOKEN, dashboard=request.param) as server:
            yield server.port, job_id
    finally:
        engine.close()


ids = st.one_of(
    st.text(max_size=60),
    st.uuids().map(str),
    st.just("00000000-0000-0000-0000-000000000000"),
    st.text(alphabet="0123456789abcdef-", min_size=30, max_size=40),
    st.just("../../etc/passwd"),
    st.just("%00"),
    st.just("x" * 5000),
)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "BREW"])
tokens = st.one_of(
    st.none(),
    st.just(f"Bearer {TOKEN}"),
    st.just(f"Bearer {TOKEN}x"),
    st.just(f"bearer {TOKEN}"),
    st.just(TOKEN),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=80),
)
bodies = st.one_of(st.none(), st.binary(max_size=200), st.just(b"x" * (MAX_BODY + 1)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=methods,
    shape=st.sampled_from(
        [
            "/jobs/{}",
            "/jobs/{}/cancel",
            "/jobs/{}/retry",
            "/jobs/{}/x",
            "/{}",
            "/jobs/",
            "/metrics/{}",
            "/topics/{}/pause",
            "/topics/{}/resume",
            "/topics",
            "/ui/jobs/{}",
            "/ui/jobs?topic={}&state=pending",
        ]
    ),
    job=ids,
    real=st.booleans(),
    auth=tokens,
    body=bodies,
)
# Once found by chance on Starlette: a newline in a /jobs path missed the Mount and was a 404 before the
# token was asked; a NUL in the dashboard's topic filter reached PostgreSQL (a 500).
@example(method="GET", shape="/jobs/{}", job="\n0", real=False, auth=None, body=None)
@example(
    method="GET",
    shape="/ui/jobs?topic={}&state=pending",
    job="\x00",
    real=False,
    auth=f"Bearer {TOKEN}",
    body=None,
)
def test_http_bad_requests_are_4xx_never_5xx(
    surface: tuple[int, str],
    method: str,
    shape: str,
    job: str,
    real: bool,
    auth: str | None,
    body: bytes | None,
) -> None:
    port, real_id = surface
    path = shape.format(quote(real_id if real else job, safe=""))
    headers: dict[str, Any] = {}
    if auth is not None:
        headers["Authorization"] = auth
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
    except (ConnectionResetError, BrokenPipeError):
        return  # the server may close on an oversized body before reading it: not a 5xx
    finally:
        conn.close()
    assert resp.status < 500, (method, path, auth, resp.status)
    good_auth = auth in (f"Bearer {TOKEN}", f"bearer {TOKEN}")  # the scheme is case-insensitive (RFC 7235)
    if path.startswith(("/jobs/", "/topics")) and not good_auth:
        assert resp.status == 401, (method, path, resp.status)


def test_a_request_cut_off_in_its_headers_by_a_client_that_left_does_nothing(
    surface: tuple[int, str], store: Store
) -> None:
    """A cancel whose header section never ended (no blank line: the client closed the socket) is
    not a request: the job stays pending, on either backend; the same cancel sent whole cancels it."""

    port, job_id = surface
    head = f"POST /jobs/{job_id}/cancel HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode())
        s.shutdown(socket.SHUT_WR)  # the end of the stream, where the blank line should be
        s.recv(4096)  # whatever the server says (or nothing), it has read the request by then

    def status(method: str, path: str, headers: dict[str, str]) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request(method, path, headers=headers)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    assert status("GET", "/metrics", {}) == 200  # a request after it is answered: the cut one was dealt with
    row = store.get(job_id)
    assert row is not None and row.state.value == "pending", row
    assert status("POST", f"/jobs/{job_id}/cancel", {"Authorization": f"Bearer {TOKEN}"}) == 200
    wait_for(lambda: (r := store.get(job_id)) is not None and r.state.value == "canceled", "the cancel")


def test_a_signal_whose_body_was_cut_off_by_a_client_that_left_is_not_sent(
    surface: tuple[int, str], store: Store
) -> None:
    """A signal's payload shorter than its Content-Length (the client closed mid-body) is not a
    request: no signal is recorded (a first signal of a name would win for good with a cut payload)."""
    port, job_id = surface
    head = (
        f"POST /jobs/{job_id}/signals/go HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\nContent-Length: 5\r\n\r\n12"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode())
        s.shutdown(socket.SHUT_WR)
        s.recv(4096)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")  # answered after the cut one was dealt with
        response = conn.getresponse()
        response.read()
        assert response.status == 200
    finally:
        conn.close()
    with store.session.pool.connection() as c:  # type: ignore[union-attr]
        sent = c.execute(f'SELECT payload FROM "{store.schema}".job_signal WHERE job_id = %s', (job_id,))
        assert sent.fetchall() == []
    time.sleep(2)  # an absence: the asynchronous backend's late write would show by then
    with store.session.pool.connection() as c:  # type: ignore[union-attr]
        later = c.execute(f'SELECT payload FROM "{store.schema}".job_signal WHERE job_id = %s', (job_id,))
        assert later.fetchall() == []
    assert store.signal(job_id, "go", 12345)  # the name is still free
