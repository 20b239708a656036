"""Tasks: typed task functions instead of topic strings and hand-built payloads (SPEC V1).

A task's arguments are bound to its signature when the job is built, so a mistake is caught at
the call, and stored by name as a JSON object. Only the vocabulary is imported: a bound store is
used through the methods it has (``Store`` and ``AsyncStore`` alike).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Concatenate, Generic, Literal, ParamSpec, Protocol, TypeVar, cast, overload

from brooq_py.queue import (
    BrooqError,
    Claim,
    ConfigError,
    Context,
    EnqueueResult,
    InvalidJob,
    Job,
    KindOptions,
)
from brooq_py.queue.durations import to_timedelta
from brooq_py.queue.job import encode_payload

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
_T = TypeVar("_T", bound="Task[Any, Any] | BatchTask[Any, Any]")

_UNSET: Any = object()
_KIND_FIELDS = frozenset(f.name for f in dataclasses.fields(KindOptions))


class UnboundPayload(InvalidJob):
    """A claimed job's payload does not bind to its task function's signature: the job is dead at
    once, never retried (every run would fail the same way)."""


class _Store(Protocol):
    """What the bound shortcuts call: Store's methods, or AsyncStore's (awaited)."""

    def enqueue(self, job: Job) -> Any: ...
    def enqueue_tx(self, tx: Any, job: Job) -> Any: ...


@dataclasses.dataclass(frozen=True)
class _JobFields:
    """The per-job fields ``Task.using`` sets (every Job field but topic and payload, and delay)."""

    idempotency_key: str | None = None
    available_at: datetime | None = None
    delay: timedelta | None = None
    priority: int = 0
    meta: Mapping[str, str] | None = None
    unique_key: str | None = None
    on_duplicate: Literal["keep", "merge", "replace"] = "keep"
    after: Sequence[str] = ()
    sequence: str | None = None
    tenant: str | None = None


def _takes_context(fn: Callable[..., Any]) -> bool:
    """Whether *fn*'s first parameter is annotated ``Context`` (string annotations included)."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return False
    annotation = params[0].annotation
    if annotation is Context:
        return True
    if isinstance(annotation, str):
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # an annotation that names something not importable here
            return annotation.rsplit(".", 1)[-1] == "Context"
        return hints.get(params[0].name) is Context
    return False


class _TaskBase:
    """What a Task and a BatchTask share: the function, its topic and options, its registry."""

    def __init__(self, fn: Callable[..., Any], topic: str, options: Mapping[str, Any], tasks: Tasks) -> None:
        self.fn = fn
        self.topic = topic
        self.options: dict[str, Any] = dict(options)
        self.takes_context = _takes_context(fn)
        self.is_async = inspect.iscoroutinefunction(fn)
        self._tasks = tasks
        functools.update_wrapper(cast(Callable[..., Any], self), fn)  # each subclass is callable

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.topic!r})"

    def _arguments(self, claim: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        raise NotImplementedError

    def handler(self) -> Callable[[Context, Any], Any]:
        """Return the kind's handler: the function called with the claim's payload (``**payload``,
        or a batch's payloads as one list), its return value kept."""
        fn, takes_context, arguments = self.fn, self.takes_context, self._arguments
        if self.is_async:

            async def run_async(ctx: Context, claim: Any) -> Any:
                args, kwargs = arguments(claim)
                return await (fn(ctx, *args, **kwargs) if takes_context else fn(*args, **kwargs))

            return run_async

        def run(ctx: Context, claim: Any) -> Any:
            args, kwargs = arguments(claim)
            return fn(ctx, *args, **kwargs) if takes_context else fn(*args, **kwargs)

        return run


def _check_task(topic: str | None, options: Mapping[str, Any], usage: str) -> None:
    """Refuse a decorator used without its parentheses, a bad topic, and unknown or bad options."""
    if callable(topic):
        raise TypeError(f"use {usage} with parentheses")
    if topic is not None and (not isinstance(topic, str) or not topic):
        raise InvalidJob(f"topic must be non-empty text, got {topic!r}")
    unknown = sorted(set(options) - _KIND_FIELDS)
    if unknown:
        raise TypeError(
            f"unknown task option(s) {', '.join(unknown)}; KindOptions has {sorted(_KIND_FIELDS)}"
        )
    KindOptions(**options)  # ConfigError for bad values, at once


def _default_topic(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


class Task(_TaskBase, Generic[P, R]):
    """A task function: call it to run it here, ``.job(...)`` to make its Job.

    Generic in the function's parameters (without a leading ``Context``) and its
    return type, so ``mypy --strict`` checks ``.job(...)`` and the shortcuts.
    """

    fn: Callable[..., R]

    def __init__(
        self,
        fn: Callable[..., R],
        topic: str,
        options: Mapping[str, Any],
        tasks: Tasks,
        fields: _JobFields | None = None,
    ) -> None:
        super().__init__(fn, topic, options, tasks)
        self._fields = fields or _JobFields()
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())[1 if self.takes_context else 0 :]
        for p in params:
            if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
                raise TypeError(
                    f"task {topic!r}: parameter {p.name!r} cannot be passed by name; a task's "
                    "arguments are stored by name"
                )
        self._signature = sig.replace(parameters=params)
        # Most calls bind by these, without Signature.bind: several times slower, on the enqueue path.
        self._names = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)  # by position
        self._name_set = frozenset(p.name for p in params if p.kind is not p.VAR_KEYWORD)
        self._plain = not any(p.kind is p.VAR_KEYWORD for p in params)
        # With **kwargs, an argument named as the Context parameter would reach the function twice.
        self._context_name = next(iter(sig.parameters)) if self.takes_context and not self._plain else None
        self._needed = frozenset(
            p.name for p in params if p.default is p.empty and p.kind is not p.VAR_KEYWORD
        )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here (tests, scripts); a ``Context`` parameter gets a fresh one."""
        if self.takes_context:
            return self.fn(Context(), *args, **kwargs)
        return self.fn(*args, **kwargs)

    def kind_options(self, defaults: KindOptions) -> KindOptions:
        """Return *defaults* with this task's own options over them; a payload that does not bind
        to the function's signature ends its job dead at once (``dead_on``)."""
        options = dataclasses.replace(defaults, **self.options)
        return dataclasses.replace(options, dead_on=(*options.dead_on, UnboundPayload))

    def payload(self, *args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        """Bind the arguments to the signature; return them by name (defaults left to the function).
        Raise InvalidJob for a missing or extra argument or a value JSON cannot hold."""
        payload = self._bind(args, kwargs)
        encode_payload(payload, f"the arguments of task {self.topic!r}")  # InvalidJob now, not at enqueue
        return payload

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The arguments by name; InvalidJob for a missing or extra one (JSON not checked here)."""
        names = self._names
        if self._plain and len(args) <= len(names):
            fast = dict(zip(names, args, strict=False))
            if not kwargs.keys() & fast.keys() and kwargs.keys() <= self._name_set:
                fast.update(kwargs)
                if self._needed <= fast.keys():
                    return fast
        try:  # the slow path, whose error says what is wrong
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidJob(f"task {self.topic!r}: {exc}") from None
        payload: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            if self._signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                payload.update(value)
            else:
                payload[name] = value
        if self._context_name is not None and self._context_name in payload:
            raise InvalidJob(
                f"task {self.topic!r}: argument {self._context_name!r} is the name of its Context "
                "parameter; the engine passes that one"
            )
        return payload

    def job(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Return the Job that runs this task with these arguments (and the fields of ``using``)."""
        return self._job(self.payload(*args, **kwargs))

    def _job(self, payload: dict[str, Any]) -> Job:
        f = self._fields
        available_at = f.available_at
        if f.delay is not None:
            try:
                available_at = datetime.now(UTC) + f.delay
            except OverflowError:
                raise InvalidJob(f"delay: {f.delay} from now is past the last date Python holds") from None
        return Job(
            self.topic,
            payload,
            idempotency_key=f.idempotency_key,
            available_at=available_at,
            priority=f.priority,
            meta=f.meta,
            unique_key=f.unique_key,
            on_duplicate=f.on_duplicate,
            after=f.after,
            sequence=f.sequence,
            tenant=f.tenant,
        )

    def using(
        self,
        *,
        idempotency_key: str | None = _UNSET,
        available_at: datetime | None = _UNSET,
        delay: float | timedelta | None = _UNSET,
        priority: int = _UNSET,
        meta: Mapping[str, str] | None = _UNSET,
        unique_key: str | None = _UNSET,
        on_duplicate: Literal["keep", "merge", "replace"] = _UNSET,
        after: Sequence[str] = _UNSET,
        sequence: str | None = _UNSET,
        tenant: str | None = _UNSET,
    ) -> Task[P, R]:
        """Return this task with per-job fields set (``delay``: seconds or a timedelta from now). A
        ``delay`` or an ``available_at`` given here replaces the other one given earlier; both at once
        raise InvalidJob, as does a delay that is no finite number of seconds."""
        given = {k: v for k, v in locals().items() if k != "self" and v is not _UNSET}
        if given.get("delay") is not None and given.get("available_at") is not None:
            raise InvalidJob("using: give delay or available_at, not both")
        d = given.get("delay")
        if d is not None:
            try:
                given["delay"] = to_timedelta(d, "delay")
            except (TypeError, ValueError) as exc:
                raise InvalidJob(str(exc)) from None
        if "delay" in given and given["delay"] is not None:
            given["available_at"] = None
        elif given.get("available_at") is not None:
            given["delay"] = None
        fields = dataclasses.replace(self._fields, **given)
        return Task(self.fn, self.topic, self.options, self._tasks, fields)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> EnqueueResult:
        """Enqueue the job on the bound Store in its own statement."""
        job = self._job(self._bind(args, kwargs))  # the store refuses what JSON cannot hold, unwritten
        return cast(EnqueueResult, self._tasks._bound(asynchronous=False).enqueue(job))

    def enqueue_tx(self, tx: Any, *args: P.args, **kwargs: P.kwargs) -> EnqueueResult:
        """Enqueue the job on the bound Store inside the caller's transaction *tx*."""
        store = self._tasks._bound(asynchronous=False)
        return cast(EnqueueResult, store.enqueue_tx(tx, self._job(self._bind(args, kwargs))))

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> EnqueueResult:
        """Enqueue the job on the bound AsyncStore in its own statement."""
        job = self._job(self._bind(args, kwargs))
        return cast(EnqueueResult, await self._tasks._bound(asynchronous=True).enqueue(job))

    async def aenqueue_tx(self, tx: Any, *args: P.args, **kwargs: P.kwargs) -> EnqueueResult:
        """Enqueue the job on the bound AsyncStore inside the caller's transaction *tx*."""
        job = self._job(self._bind(args, kwargs))
        return cast(EnqueueResult, await self._tasks._bound(asynchronous=True).enqueue_tx(tx, job))

    def _arguments(self, claim: Claim) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The claim's payload as the function's keyword arguments; UnboundPayload (the job dead at
        once, never retried) for a payload that does not bind: one written by psql or the CLI, or
        by an older version of the function."""
        payload = claim.payload
        if payload is None:
            payload = {}
        if not isinstance(payload, dict):
            raise UnboundPayload(
                f"task {self.topic!r}: payload must be a JSON object, got {type(payload).__name__}"
            )
        keys = payload.keys()
        if not self._needed <= keys or (self._plain and not keys <= self._name_set):
            try:  # the slow bind only for a payload the sets refuse: it says what is wrong
                self._signature.bind(**payload)
            except TypeError as exc:
                raise UnboundPayload(
                    f"task {self.topic!r}: the payload does not bind to the function's signature: {exc}"
                ) from None
        if self._context_name is not None and self._context_name in keys:
            raise UnboundPayload(
                f"task {self.topic!r}: the payload names {self._context_name!r}, the function's Context "
                "parameter"
            )
        return (), payload


class Tasks:
    """A registry of task functions; ``Tasks(store)`` binds a Store or AsyncStore for the shortcuts
    (``task.enqueue(...)``, ``await task.aenqueue(...)``)."""

    def __init__(self, store: _Store | None = None) -> None:
        self.store = store
        self._tasks: dict[str, Task[Any, Any] | BatchTask[Any, Any]] = {}
        self._kind_of: tuple[Any, bool] | None = None

    def task(self, topic: str | None = None, **options: Any) -> _Decorator:
        """Return a decorator making a function a Task of this registry.

        *topic* defaults to ``f"{fn.__module__}.{fn.__qualname__}"``; *options* are
        KindOptions fields (``max_attempts=5``, ``attempt_timeout=60``, ...), checked
        now (ConfigError, TypeError for an unknown name). A topic used twice raises ValueError.
        """
        _check_task(topic, options, "@tasks.task()")
        return _Decorator(self, topic, options)

    def batch_task(
        self, topic: str | None = None, *, batch_size: int, batch_wait: float = 0, **options: Any
    ) -> Callable[[Callable[..., Any]], BatchTask[Any, Any]]:
        """Return a decorator making ``fn(items)`` (or ``fn(ctx, items)``) a BatchTask of this registry
        (SPEC BD1): it gets the payloads of up to *batch_size* jobs at once, waiting at most
        *batch_wait* seconds for a fuller batch, and returns one result or exception per item in
        order. *options* as ``task``."""
        options = {**options, "batch_size": batch_size, "batch_wait": batch_wait}
        _check_task(topic, options, "@tasks.batch_task(batch_size=N)")

        def decorate(fn: Callable[..., Any]) -> BatchTask[Any, Any]:
            return self._add(BatchTask(fn, topic or _default_topic(fn), options, self))

        return decorate

    def register(
        self,
        register_kind: Callable[[str, Any, KindOptions], None],
        defaults: KindOptions,
        *,
        register_batch: Callable[[str, Any, KindOptions], None] | None = None,
    ) -> None:
        """Register every task as a kind with ``register_kind`` (a batch task with ``register_batch``),
        its options over *defaults* (``Engine.register_tasks`` does); raise ConfigError naming the
        task, and as register_kind does."""
        for task in self:
            try:
                options = task.kind_options(defaults)
            except ConfigError as exc:
                raise ConfigError([f"task {task.topic!r}: {p}" for p in exc.problems]) from None
            if isinstance(task, BatchTask):
                if register_batch is None:
                    raise ConfigError([f"task {task.topic!r}: a batch task needs Engine.register_tasks"])
                register_batch(task.topic, task.handler(), options)
            else:
                register_kind(task.topic, task.handler(), options)

    def _add(self, task: _T) -> _T:
        if task.topic in self._tasks:
            raise ValueError(f"a task with topic {task.topic!r} is already registered")
        self._tasks[task.topic] = task
        return task

    def __iter__(self) -> Iterator[Task[Any, Any] | BatchTask[Any, Any]]:
        return iter(list(self._tasks.values()))

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, topic: object) -> bool:
        return topic in self._tasks

    def get(self, topic: str) -> Task[Any, Any] | BatchTask[Any, Any] | None:
        """Return the task of *topic*, or None."""
        return self._tasks.get(topic)

    def _bound(self, *, asynchronous: bool) -> Any:
        store = self.store
        if store is None:
            raise BrooqError(
                "this Tasks is bound to no store: use Tasks(store), or enqueue task.job(...) yourself"
            )
        known = self._kind_of
        if known is None or known[0] is not store:  # asked once per store, not per enqueue
            known = self._kind_of = (store, inspect.iscoroutinefunction(store.enqueue))
        is_async = known[1]
        if is_async != asynchronous:
            if asynchronous:
                raise BrooqError("this Tasks is bound to a sync Store: use enqueue/enqueue_tx")
            raise BrooqError("this Tasks is bound to an AsyncStore: use aenqueue/aenqueue_tx")
        return store


class BatchTask(_TaskBase, Generic[T, R]):
    """A batch task function (SPEC BD1): ``fn(items)`` or ``fn(ctx, items)`` takes the payloads of up
    to ``batch_size`` jobs at once and returns one result or exception per item, in order;
    ``.job(item)`` makes one job whose payload is *item*."""

    def __call__(self, items: list[T]) -> Any:
        """Run the function here on *items* (tests, scripts); a ``Context`` parameter gets a fresh one."""
        return self.fn(Context(), items) if self.takes_context else self.fn(items)

    def kind_options(self, defaults: KindOptions) -> KindOptions:
        """Return *defaults* with this task's own options over them."""
        return dataclasses.replace(defaults, **self.options)

    def job(self, item: T, **fields: Any) -> Job:
        """One job of this task carrying *item* as its payload; *fields* are Job's other fields
        (``idempotency_key``, ``priority``, ``after``, ...). InvalidJob for what JSON cannot hold."""
        job = Job(self.topic, item, **fields)
        job.payload_json()  # InvalidJob now, not at enqueue
        return job

    def enqueue(self, item: T, **fields: Any) -> EnqueueResult:
        """Enqueue ``job(item)`` on the bound Store."""
        return cast(EnqueueResult, self._tasks._bound(asynchronous=False).enqueue(self.job(item, **fields)))

    async def aenqueue(self, item: T, **fields: Any) -> EnqueueResult:
        """Enqueue ``job(item)`` on the bound AsyncStore."""
        store = self._tasks._bound(asynchronous=True)
        return cast(EnqueueResult, await store.enqueue(self.job(item, **fields)))

    def _arguments(self, claims: list[Claim]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return ([c.payload for c in claims],), {}


@dataclasses.dataclass(frozen=True)
class _Decorator:
    """What ``Tasks.task(...)`` returns: turns a function into a Task (a leading Context left out)."""

    _tasks: Tasks
    _topic: str | None
    _options: Mapping[str, Any]

    @overload
    def __call__(self, fn: Callable[Concatenate[Context, P], R]) -> Task[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R]) -> Task[P, R]: ...

    def __call__(self, fn: Callable[..., Any]) -> Task[Any, Any]:
        return self._tasks._add(Task(fn, self._topic or _default_topic(fn), self._options, self._tasks))


__all__ = ["BatchTask", "Task", "Tasks"]
