"""Rate limits and depth caps (SPEC F1, F2) and U3's retry refusal over HTTP: the surface's
endpoints and the dashboard's actions, token-guarded like pause."""

from __future__ import annotations

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job
from brooq_py.service import Server
from tests.integration.test_service_operator import call, engine, server

__all__ = ["engine", "server"]  # the fixtures, used by name


def test_f1_f2_rate_and_depth_endpoints(server: Server, store: Store, engine: Engine) -> None:
    assert call(server, "POST", "/topics/api.call/rate/10/1m") == (
        200,
        {"topic": "api.call", "rate": 10, "per_seconds": 60.0},
    )
    assert call(server, "POST", "/topics/api.call/depth/100") == (
        200,
        {"topic": "api.call", "max_depth": 100},
    )
    (s,) = store.topic_settings()
    assert (s.rate_limit, s.rate_per, s.rate_burst, s.max_depth) == (10, 60.0, 10, 100)
    topics = {t["topic"]: t for t in call(server, "GET", "/topics")[1]["topics"]}
    assert topics["api.call"]["rate"] == "10/1m" and topics["api.call"]["max_depth"] == 100
    assert topics["api.call"]["tokens"] == 10.0
    assert call(server, "POST", "/topics/api.call/rate/0")[0] == 400
    assert call(server, "POST", "/topics/api.call/depth/x")[0] == 400
    assert call(server, "POST", "/topics/api.call/rate/5", token=None)[0] == 401
    assert call(server, "GET", "/topics/api.call/rate/5")[0] == 405
    assert call(server, "POST", "/topics/api.call/rate/none")[0] == 200
    assert call(server, "POST", "/topics/api.call/depth/none")[0] == 200
    (s,) = store.topic_settings()
    assert s.rate_limit is None and s.max_depth is None


def test_u3_retry_endpoint_says_why(server: Server, store: Store) -> None:
    old = store.enqueue(Job("u", {}, unique_key="k")).id
    store.cancel(old)
    new = store.enqueue(Job("u", {}, unique_key="k")).id
    status, body = call(server, "POST", f"/jobs/{old}/retry")
    assert status == 200 and body["retried"] is False and new in body["reason"]


def test_t1_t3_tenant_endpoints(server: Server, store: Store, engine: Engine) -> None:
    """SPEC T1-T3 over HTTP: a topic's tenants read, their limit, rate and weight set (token-guarded)."""
    store.enqueue_many([Job("hook", {}, tenant="acme"), Job("hook", {}, tenant="beta")])
    assert call(server, "POST", "/topics/hook/tenants/limit/2") == (
        200,
        {"topic": "hook", "tenant": None, "limit": 2},
    )
    assert call(server, "POST", "/topics/hook/tenants/acme/limit/5")[0] == 200
    assert call(server, "POST", "/topics/hook/tenants/acme/rate/10/1s") == (
        200,
        {"topic": "hook", "tenant": "acme", "rate": 10, "per_seconds": 1.0},
    )
    assert call(server, "POST", "/topics/hook/tenants/acme/weight/3")[0] == 200
    assert call(server, "POST", "/topics/hook/tenants/weight/3")[0] == 404  # a weight names its tenant
    assert call(server, "POST", "/topics/hook/tenants/acme/weight/0")[0] == 400
    assert call(server, "POST", "/topics/hook/tenants/acme/limit/5", token=None)[0] == 401
    status, body = call(server, "GET", "/topics/hook/tenants")
    assert status == 200
    by = {t["tenant"]: t for t in body["tenants"]}
    assert by["acme"] == {
        "tenant": "acme",
        "waiting": 1,
        "running": 0,
        "limit": 5,
        "rate": "10/1s",
        "weight": 3,
    }
    assert by["beta"]["limit"] is None and by["beta"]["waiting"] == 1
    assert (body["default_limit"], body["default_rate"]) == (2, None)  # what beta's None means
    (s,) = store.topic_settings()
    assert s.tenants
