"""200 connections at once on the surface: stalled ones hold nothing the others need (SPEC Z2, O2).

Every request is answered (200, or 503 beyond the concurrency bound) and
none hangs, whatever the listen backlog and however many clients stall
mid-request; /healthz stays reachable for a liveness probe meanwhile.
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.service import serve

CROWD = 200


@pytest.fixture
def engine(store: Store) -> Iterator[Engine]:
    eng = Engine(store, Config(workers=1, poll_interval=0.2, lease=10))
    eng.register_kind("crowd", lambda ctx, claim: None)
    eng.start()
    try:
        yield eng
    finally:
        eng.close()


def get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


@pytest.mark.parametrize("dashboard", [True, False], ids=["starlette", "wsgi"])
def test_z2_200_stalled_and_200_concurrent_connections_are_all_answered(
    engine: Engine, dashboard: bool
) -> None:
    with serve(engine, port=0, dashboard=dashboard, concurrency=8) as srv:
        stalled: list[socket.socket] = []
        try:
            for _ in range(CROWD):
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers never finished
                stalled.append(s)
            assert get(srv.port, "/healthz") in (200, 503)
            barrier = threading.Barrier(CROWD)

            def one(i: int) -> int:
                barrier.wait(60)
                return get(srv.port, "/healthz" if i % 2 else "/metrics")

            with ThreadPoolExecutor(CROWD) as pool:
                statuses = list(pool.map(one, range(CROWD)))
            assert set(statuses) <= {200, 503}, statuses
            assert 200 in statuses
        finally:
            for s in stalled:
                s.close()
        assert get(srv.port, "/metrics") == 200
