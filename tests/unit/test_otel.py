"""brooq_py.contrib.otel with the SDK's in-memory exporter, and without OpenTelemetry at all (SPEC N2)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry import trace

from brooq_py.contrib.otel import TRACEPARENT, enqueue_span, run_span
from brooq_py.queue import Job
from tests.otel_support import exporter


def test_outside_a_span_jobs_are_unchanged_and_no_span_is_made() -> None:
    spans = exporter()
    jobs = [Job("t", 1)]
    with enqueue_span(jobs) as out:
        assert out == jobs
    assert spans.get_finished_spans() == ()


def test_enqueue_in_a_span_adds_a_producer_span_and_its_traceparent() -> None:
    spans = exporter()
    tracer = trace.get_tracer("app")
    with (
        tracer.start_as_current_span("POST /orders") as request,
        enqueue_span([Job("mail", 1), Job("mail", 2)]) as out,
    ):
        pass
    finished = {s.name: s for s in spans.get_finished_spans()}
    producer = finished["brooq.enqueue mail"]
    assert producer.kind is trace.SpanKind.PRODUCER
    assert producer.parent is not None and producer.parent.span_id == request.get_span_context().span_id
    assert producer.attributes is not None
    assert producer.attributes["messaging.system"] == "brooq"
    assert producer.attributes["messaging.destination.name"] == "mail"
    assert producer.attributes["messaging.batch.message_count"] == 2
    parents = {j.meta[TRACEPARENT].rsplit("-", 1)[0] for j in out if j.meta}
    assert parents == {f"00-{producer.context.trace_id:032x}-{producer.context.span_id:016x}"}


def test_a_callers_own_traceparent_is_kept() -> None:
    exporter()
    mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with (
        trace.get_tracer("app").start_as_current_span("x"),
        enqueue_span([Job("t", meta={TRACEPARENT: mine, "k": "v"})]) as out,
    ):
        pass
    assert out[0].meta == {TRACEPARENT: mine, "k": "v"}


def test_run_span_continues_the_trace_and_records_a_failure() -> None:
    spans = exporter()
    with trace.get_tracer("app").start_as_current_span("request"), enqueue_span([Job("t")]) as out:
        pass
    meta = out[0].meta
    with pytest.raises(RuntimeError), run_span("t", "job-1", 2, meta) as run:
        assert trace.get_current_span().get_span_context().is_valid  # current while the handler runs
        raise RuntimeError("boom")
    with run_span("t", "job-1", 3, meta) as run:
        run.failed(ValueError("bad"))
    finished = spans.get_finished_spans()
    producer = next(s for s in finished if s.name == "brooq.enqueue t")
    runs = [s for s in finished if s.name == "brooq.run t"]
    assert len(runs) == 2
    for s in runs:
        assert s.kind is trace.SpanKind.CONSUMER
        assert s.context.trace_id == producer.context.trace_id
        assert s.parent is not None and s.parent.span_id == producer.context.span_id
        assert s.status.status_code is trace.StatusCode.ERROR
        assert s.attributes is not None and s.attributes["messaging.message.id"] == "job-1"
        assert [e.name for e in s.events] == ["exception"]
    assert [s.attributes["brooq.attempt"] for s in runs if s.attributes] == [2, 3]


def test_without_meta_a_run_span_starts_its_own_trace() -> None:
    spans = exporter()
    with run_span("t", "j", 1, None):
        pass
    (span,) = spans.get_finished_spans()
    assert span.parent is None


def test_nothing_imports_opentelemetry_unless_the_process_did() -> None:
    code = (
        "import sys\n"
        "from brooq_py.contrib.otel import enqueue_span, run_span\n"
        "from brooq_py.queue import Job\n"
        "import brooq_py.engine, brooq_py.postgres\n"
        "with enqueue_span([Job('t')]) as out: assert out[0].meta is None\n"
        "with run_span('t', 'j', 1, None): pass\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
