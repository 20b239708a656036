"""OpenTelemetry: one trace from the span that enqueued a job to each of its attempts (SPEC N2).

An enqueue inside an active span stores its PRODUCER span's ``traceparent`` in ``Job.meta``, and
each attempt runs in a CONSUMER span whose parent that is. OpenTelemetry is looked for in
``sys.modules``, never imported: a process without it pays one dictionary lookup per enqueue and
per attempt. docs/events.md tells the spans' names and attributes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from brooq_py.queue import Job

TRACEPARENT = "traceparent"
SYSTEM = "brooq"
_TRACER = "brooq_py"


def _api() -> Any | None:
    """The ``opentelemetry.trace`` module when the process imported it, else None."""
    return sys.modules.get("opentelemetry.trace")


@contextlib.contextmanager
def enqueue_span(jobs: Sequence[Job]) -> Iterator[list[Job]]:
    """Wrap one enqueue call: yield the jobs to write, with ``traceparent`` in their meta inside a span."""
    trace = _api()
    if trace is None or not jobs or not trace.get_current_span().get_span_context().is_valid:
        yield list(jobs)
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    topics = {j.topic for j in jobs}
    topic = next(iter(topics)) if len(topics) == 1 else None
    attributes: dict[str, Any] = {"messaging.system": SYSTEM, "messaging.operation.type": "send"}
    if topic is not None:
        attributes["messaging.destination.name"] = topic
    if len(jobs) > 1:
        attributes["messaging.batch.message_count"] = len(jobs)
    tracer = trace.get_tracer(_TRACER)
    name = f"brooq.enqueue {topic}" if topic is not None else "brooq.enqueue"
    with tracer.start_as_current_span(name, kind=trace.SpanKind.PRODUCER, attributes=attributes):
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        parent = carrier.get(TRACEPARENT)
        yield list(jobs) if parent is None else [_with_parent(j, parent) for j in jobs]


def _with_parent(job: Job, parent: str) -> Job:
    if job.meta and TRACEPARENT in job.meta:  # the caller chose the parent
        return job
    return dataclasses.replace(job, meta={**(job.meta or {}), TRACEPARENT: parent})


class _Run:
    """The CONSUMER span of one attempt, or nothing when OpenTelemetry is not loaded."""

    def __init__(self, span: Any, trace: Any) -> None:
        self._span = span
        self._trace = trace

    def failed(self, error: BaseException) -> None:
        """Record *error* (the handler's exception) on the span and set its status to ERROR."""
        if self._span is None:
            return
        self._span.record_exception(error)
        self._span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, f"{type(error).__name__}"))


_NO_RUN = _Run(None, None)


@contextlib.contextmanager
def run_span(topic: str, job_id: str, attempt: int, meta: Mapping[str, str] | None) -> Iterator[_Run]:
    """Run one attempt inside a CONSUMER span continuing the enqueue's trace (current while it runs)."""
    trace = _api()
    if trace is None:
        yield _NO_RUN
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = None
    if meta and TRACEPARENT in meta:
        parent = TraceContextTextMapPropagator().extract({TRACEPARENT: meta[TRACEPARENT]})
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": topic,
        "messaging.message.id": job_id,
        "brooq.attempt": attempt,
    }
    tracer = trace.get_tracer(_TRACER)
    with tracer.start_as_current_span(
        f"brooq.run {topic}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        run = _Run(span, trace)
        try:
            yield run
        except BaseException as exc:
            run.failed(exc)
            raise


P = ParamSpec("P")
R = TypeVar("R")


def _jobs_in(value: Any) -> list[Job]:
    if isinstance(value, Job):
        return [value]
    if isinstance(value, list | tuple | Mapping):
        return [j for j in (value.values() if isinstance(value, Mapping) else value) if isinstance(j, Job)]
    return []


@contextlib.contextmanager
def _traced(
    fn: Callable[..., Any], names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Iterator[inspect.BoundArguments]:
    """Bind the call and yield it inside ``enqueue_span``, each Job of *names* replaced by its traced
    copy (named jobs keep their names)."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    for name in names:  # jobs from a generator: read once here, so each is traced and then enqueued
        value = bound.arguments.get(name)
        if isinstance(value, Iterator):
            bound.arguments[name] = list(value)
    values = {name: bound.arguments.get(name) for name in names}
    with enqueue_span([j for v in values.values() for j in _jobs_in(v)]) as traced:
        it = iter(traced)
        for name, value in values.items():
            if isinstance(value, Job):
                bound.arguments[name] = next(it)
            elif isinstance(value, Mapping):
                bound.arguments[name] = {k: next(it) if isinstance(j, Job) else j for k, j in value.items()}
            elif isinstance(value, list | tuple):
                bound.arguments[name] = [next(it) if isinstance(j, Job) else j for j in value]
        yield bound


def traced_enqueue(*names: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a Store method whose parameters *names* hold a Job or Jobs with ``enqueue_span``."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if _api() is None:
                return fn(*args, **kwargs)
            with _traced(fn, names, args, kwargs) as bound:
                return fn(*bound.args, **bound.kwargs)

        return call

    return decorate


def traced_aenqueue(
    *names: str,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """``traced_enqueue`` for an AsyncStore's coroutine methods."""

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        @functools.wraps(fn)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if _api() is None:
                return await fn(*args, **kwargs)
            with _traced(fn, names, args, kwargs) as bound:
                return await fn(*bound.args, **bound.kwargs)

        return call

    return decorate
