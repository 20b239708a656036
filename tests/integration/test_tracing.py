"""A trace from a FastAPI request span, through the enqueue, to every attempt's span (SPEC N2)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import FastAPI, Request
from opentelemetry import trace
from psycopg_pool import AsyncConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store
from brooq_py.queue import Claim, Context, Job, KindOptions
from tests.otel_support import exporter
from tests.polling import wait_for


def _app(store: Store) -> FastAPI:
    app = FastAPI()
    tracer = trace.get_tracer("web")

    @app.middleware("http")
    async def server_span(request: Request, call_next: Any) -> Any:  # what an instrumentation does
        name = f"{request.method} {request.url.path}"
        with tracer.start_as_current_span(name, kind=trace.SpanKind.SERVER):
            return await call_next(request)

    @app.post("/orders")
    def create_order() -> dict[str, str]:
        return {"job": store.enqueue(Job("orders.receipt", {"order": 1})).id}

    return app


def test_a_request_span_is_the_root_of_every_attempts_span(
    store: Store, engines: Callable[..., Engine]
) -> None:
    spans = exporter()
    attempts: list[int] = []

    def receipt(ctx: Context, claim: Claim) -> None:
        attempts.append(claim.attempt)
        assert trace.get_current_span().get_span_context().is_valid  # the handler runs inside its span
        if claim.attempt == 1:
            raise RuntimeError("printer jammed")

    e = engines()
    e.register_kind("orders.receipt", receipt, KindOptions(max_attempts=3))
    e.start()

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=_app(store))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/orders")

    response = asyncio.run(post())
    assert response.status_code == 200, response.text
    job_id = response.json()["job"]
    row = store.wait(job_id, timeout=30)
    assert row.state == "done" and attempts == [1, 2]

    def run_spans() -> list[Any]:
        return [s for s in spans.get_finished_spans() if s.name == "brooq.run orders.receipt"]

    runs = wait_for(lambda: len(run_spans()) == 2 and run_spans(), "both attempts' spans")
    finished = spans.get_finished_spans()
    request = next(s for s in finished if s.name == "POST /orders" and s.parent is None)  # the root
    producer = next(s for s in finished if s.name == "brooq.enqueue orders.receipt")
    assert producer.kind is trace.SpanKind.PRODUCER
    assert request.context.span_id in ancestors(producer, finished)  # FastAPI may add spans between
    assert stored_traceparent(store, job_id).split("-")[2] == f"{producer.context.span_id:016x}"
    for run in runs:
        assert run.kind is trace.SpanKind.CONSUMER
        assert run.context.trace_id == request.context.trace_id
        assert run.parent is not None and run.parent.span_id == producer.context.span_id
        assert run.attributes is not None and run.attributes["messaging.message.id"] == job_id
    by_attempt = {r.attributes["brooq.attempt"]: r for r in runs if r.attributes}
    assert by_attempt[1].status.status_code is trace.StatusCode.ERROR
    assert [ev.name for ev in by_attempt[1].events] == ["exception"]
    assert by_attempt[2].status.status_code is not trace.StatusCode.ERROR


def ancestors(span: Any, finished: Any) -> list[int]:
    by_id = {s.context.span_id: s for s in finished}
    found = []
    while span.parent is not None:
        found.append(span.parent.span_id)
        span = by_id.get(span.parent.span_id)
        if span is None:
            break
    return found


def stored_traceparent(store: Store, job_id: str) -> str:
    row = store.get(job_id)
    assert row is not None
    return row.meta["traceparent"]


def test_async_enqueue_and_batches_carry_the_trace(dsn: str, schema: str, store: Store) -> None:
    spans = exporter()

    async def main() -> list[str]:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        async with pool:
            astore = AsyncStore(pool, schema=schema)
            with trace.get_tracer("app").start_as_current_span("batch"):
                one = await astore.enqueue(Job("t", 1))
                many = await astore.enqueue_many([Job("t", 2), Job("u", 3)])
            return [one.id, *[r.id for r in many]]

    ids = asyncio.run(main())
    producers = [s for s in spans.get_finished_spans() if s.kind is trace.SpanKind.PRODUCER]
    assert [s.name for s in producers] == ["brooq.enqueue t", "brooq.enqueue"]
    for jid in ids:
        assert "traceparent" in stored_meta(store, jid)


def stored_meta(store: Store, job_id: str) -> dict[str, str]:
    row = store.get(job_id)
    assert row is not None
    return dict(row.meta)


def test_outside_a_span_nothing_is_added(store: Store) -> None:
    spans = exporter()
    jid = store.enqueue(Job("t", 1)).id
    assert stored_meta(store, jid) == {}
    assert spans.get_finished_spans() == ()
