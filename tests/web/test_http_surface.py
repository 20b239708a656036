"""The service surface's path parameters (SPEC O2, K3): every route checks them in one place, so a
name no job can carry (a NUL, more than a name may hold) is a 400 with a reason, never a 500; and
a topic is any topic a job may have (up to the queue's MAX_TOPIC_BYTES), on both servers.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from brooq_py import Engine, Job
from brooq_py.postgres import Store
from brooq_py.queue.job import MAX_KEY_BYTES, MAX_TOPIC_BYTES
from brooq_py.service import serve

TOKEN = "surface-t0ken"
JOB = "{job}"  # a real job's id in a path below


@pytest.fixture(params=[False, True], ids=["wsgi", "starlette"])
def surface(store: Store, request: pytest.FixtureRequest) -> Iterator[tuple[int, Store]]:
    engine = Engine(store)
    engine.register_kind("surface.http", lambda ctx, claim: None)
    engine.start()
    try:
        with serve(engine, port=0, token=TOKEN, dashboard=request.param) as server:
            yield server.port, store
    finally:
        engine.close()


def call(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Authorization": f"Bearer {TOKEN}"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read() or b"{}")
    finally:
        conn.close()


def test_a_signal_with_a_nul_in_its_name_is_400_not_500(surface: tuple[int, Store]) -> None:
    port, store = surface
    job_id = store.enqueue(Job("nobody", {})).id
    status, body = call(port, "POST", f"/jobs/{job_id}/signals/a%00b", b"1")
    assert status == 400, (status, body)
    assert "NUL" in str(body["error"]), body


def test_a_signals_name_is_decoded_once(surface: tuple[int, Store]) -> None:
    # %2500 is the three characters "%00" (once decoded), not a NUL: a name as any other.
    port, store = surface
    job_id = store.enqueue(Job("nobody", {})).id
    assert call(port, "POST", f"/jobs/{job_id}/signals/a%2500b") == (200, {"signaled": True})
    assert store.signal(job_id, "a%00b") is False  # that name was signalled already


# Every route with a path parameter, a NUL put in each parameter in turn.
NUL_PATHS = [
    ("GET", "/jobs/%00"),
    ("POST", "/jobs/%00/cancel"),
    ("POST", "/jobs/%00/retry"),
    ("POST", "/jobs/%00/signals/go"),
    ("POST", f"/jobs/{JOB}/signals/%00"),
    ("GET", "/topics/a%00/tenants"),
    ("POST", "/topics/a%00/tenants/t/limit/3"),
    ("POST", "/topics/a/tenants/t%00/limit/3"),
    ("POST", "/topics/a/tenants/t/weight/3%00"),
    ("POST", "/topics/a%00/tenants/rate/5"),
    ("POST", "/topics/a/tenants/limit/3%00"),
    ("POST", "/topics/a%00/sequences/s/resume"),
    ("POST", "/topics/a/sequences/s%00/resume"),
    ("POST", "/topics/a%00/pause"),
    ("POST", "/topics/a%00/resume"),
    ("POST", "/topics/a%00/rate/5"),
    ("POST", "/topics/a/rate/5%00"),
    ("POST", "/topics/a%00/depth/3"),
    ("POST", "/topics/a/depth/3%00"),
]


@pytest.mark.parametrize(("method", "path"), NUL_PATHS, ids=[p for _, p in NUL_PATHS])
def test_a_nul_in_any_path_parameter_is_400(surface: tuple[int, Store], method: str, path: str) -> None:
    port, store = surface
    job_id = store.enqueue(Job("nobody", {})).id
    status, body = call(port, method, path.replace(JOB, job_id))
    assert status == 400, (status, body)
    assert store.topic_settings() == []  # nothing was written


# A name over what any name may hold (a key or sequence's MAX_KEY_BYTES; 2-byte characters: over
# the bytes, not the characters).
LONG = quote("é" * (MAX_KEY_BYTES // 2 + 1))
LONG_PATHS = [
    ("POST", f"/jobs/{JOB}/signals/{LONG}"),
    ("POST", f"/topics/a/sequences/{LONG}/resume"),
    ("POST", f"/topics/a/tenants/{LONG}/limit/3"),
    ("POST", f"/topics/{LONG}/pause"),
]


@pytest.mark.parametrize(("method", "path"), LONG_PATHS, ids=["signal", "sequence", "tenant", "topic"])
def test_an_over_long_path_parameter_is_400(surface: tuple[int, Store], method: str, path: str) -> None:
    port, store = surface
    job_id = store.enqueue(Job("nobody", {})).id
    status, body = call(port, method, path.replace(JOB, job_id))
    assert status == 400, (status, body)
    assert f"at most {MAX_KEY_BYTES}" in str(body["error"]), body


def test_http_can_pause_every_topic_a_job_may_have(surface: tuple[int, Store]) -> None:
    port, store = surface
    for topic in ("t" * 250, "t" * MAX_TOPIC_BYTES, "é" * (MAX_TOPIC_BYTES // 2)):
        store.enqueue(Job(topic, {}))
        path = f"/topics/{quote(topic)}/pause"
        assert call(port, "POST", path) == (200, {"topic": topic, "paused": True}), len(topic)
        assert topic in store.paused()
        assert call(port, "POST", f"/topics/{quote(topic)}/resume")[0] == 200
        assert topic not in store.paused()


@pytest.mark.parametrize("topic", ["t" * (MAX_TOPIC_BYTES + 1), "é" * (MAX_TOPIC_BYTES // 2 + 1)])
def test_a_topic_no_job_may_have_is_400_naming_the_limit(surface: tuple[int, Store], topic: str) -> None:
    port, store = surface
    status, body = call(port, "POST", f"/topics/{quote(topic)}/pause")
    assert status == 400, (status, body)
    assert f"1 to {MAX_TOPIC_BYTES} UTF-8 bytes" in str(body["error"]), body
    assert store.paused() == set()
