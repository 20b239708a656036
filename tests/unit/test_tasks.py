"""Tasks: typed task functions, arguments bound by name, per-job fields, shortcuts (no database)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from brooq_py import Task, Tasks
from brooq_py.queue import (
    BrooqError,
    Claim,
    ConfigError,
    Context,
    EnqueueResult,
    InvalidJob,
    Job,
    KindOptions,
    Lease,
)
from brooq_py.tasks import _takes_context

ROOT = Path(__file__).resolve().parents[2]


def claim_of(payload: Any) -> Claim:
    return Claim(
        id="00000000-0000-0000-0000-000000000001",
        topic="t",
        payload=payload,
        attempt=1,
        max_attempts=3,
        lease=Lease("w", datetime.now(UTC)),
    )


def test_job_binds_arguments_by_name_and_leaves_defaults_to_the_function() -> None:
    tasks = Tasks()

    @tasks.task("email.welcome", max_attempts=5)
    def send_welcome(user_id: int, lang: str = "en") -> dict[str, Any]:
        return {"user": user_id, "lang": lang}

    assert isinstance(send_welcome, Task)
    assert send_welcome.job(42, lang="fr") == Job("email.welcome", {"user_id": 42, "lang": "fr"})
    assert send_welcome.job(42).payload == {"user_id": 42}
    assert send_welcome(7) == {"user": 7, "lang": "en"}  # a plain call runs it
    assert send_welcome.options == {"max_attempts": 5}
    assert tasks.get("email.welcome") is send_welcome and len(tasks) == 1


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "missing a required argument"),
        ((1, "en", 3), {}, "too many positional arguments"),
        ((1,), {"colour": "red"}, "unexpected keyword argument"),
        (({1, 2},), {}, "not JSON-serialisable"),
        ((float("nan"),), {}, "not JSON-serialisable"),
    ],
)
def test_bad_arguments_raise_invalid_job(args: Any, kwargs: Any, message: str) -> None:
    tasks = Tasks()

    @tasks.task("t")
    def f(user_id: Any, lang: str = "en") -> None: ...

    with pytest.raises(InvalidJob, match=message):
        f.job(*args, **kwargs)


def test_a_keyword_only_parameter_is_never_filled_by_position() -> None:
    tasks = Tasks()

    @tasks.task("t")
    def f(user_id: int, *, lang: str = "en") -> None: ...

    with pytest.raises(InvalidJob, match="too many positional arguments"):
        f.job(1, "fr")  # type: ignore[call-arg]  # f(1, "fr") is a TypeError too
    assert f.job(1, lang="fr").payload == {"user_id": 1, "lang": "fr"}


def test_default_topic_context_parameter_and_kwargs() -> None:
    tasks = Tasks()

    @tasks.task()
    def with_ctx(ctx: Context, image_id: str, **extra: Any) -> str:
        return f"{image_id}:{ctx.claim.id if ctx._claim else '-'}:{sorted(extra)}"

    assert with_ctx.topic == f"{__name__}.test_default_topic_context_parameter_and_kwargs.<locals>.with_ctx"
    assert with_ctx.takes_context
    assert with_ctx.job("img", size=3).payload == {"image_id": "img", "size": 3}
    assert with_ctx("img") == "img:-:[]"  # a plain call makes a Context
    handler = with_ctx.handler()
    ctx = Context()
    claim = claim_of({"image_id": "x", "w": 1})
    ctx.attach(claim)
    assert handler(ctx, claim) == f"x:{claim.id}:['w']"


def test_string_annotations_are_recognised() -> None:
    ns: dict[str, Any] = {}
    exec(
        "from __future__ import annotations\nfrom brooq_py.queue import Context\n"
        "def f(ctx: Context, a: int) -> None: ...\ndef g(a: int) -> None: ...",
        ns,
    )
    assert _takes_context(ns["f"]) and not _takes_context(ns["g"])


def test_positional_only_and_var_positional_are_refused() -> None:
    tasks = Tasks()
    with pytest.raises(TypeError, match="by name"):

        @tasks.task("p")
        def p(a: int, /) -> None: ...

    with pytest.raises(TypeError, match="by name"):

        @tasks.task("v")
        def v(*a: int) -> None: ...


def test_options_are_checked_at_once_and_topics_once() -> None:
    tasks = Tasks()
    with pytest.raises(TypeError, match="unknown task option"):
        tasks.task("x", retries=3)
    with pytest.raises(ConfigError):
        tasks.task("x", max_attempts=0)

    @tasks.task("dup")
    def a() -> None: ...

    with pytest.raises(ValueError, match="already registered"):

        @tasks.task("dup")
        def b() -> None: ...


def test_using_sets_job_fields_and_delay() -> None:
    tasks = Tasks()

    @tasks.task("u")
    def f(n: int) -> None: ...

    before = datetime.now(UTC)
    parent = "01a23450-46be-7c0c-8353-2f71c0f60754"
    job = f.using(
        idempotency_key="k", delay=30, priority=5, unique_key="uk", after=[parent], meta={"a": "b"}
    ).job(1)
    assert (job.idempotency_key, job.priority, job.unique_key) == ("k", 5, "uk")
    assert [str(p) for p in job.after] == [parent]
    assert job.meta == {"a": "b"}
    assert job.available_at is not None and job.available_at >= before + timedelta(seconds=30)
    assert f.using(delay=timedelta(minutes=1)).job(1).available_at is not None
    assert f.job(1).priority == 0  # using() returned a copy
    with pytest.raises(InvalidJob):
        f.using(delay="soon").job(1)  # type: ignore[arg-type]


def test_using_takes_every_job_field_but_topic_and_payload() -> None:
    """API.md: `.using(...)` sets every Job field; a field Job gains is one using() must take."""
    tasks = Tasks()

    @tasks.task("u")
    def f(n: int) -> None: ...

    named = {fl.name for fl in dataclasses.fields(Job)} - {"topic", "payload"}
    taken = set(inspect.signature(f.using).parameters) - {"delay"}
    assert taken == named
    job = f.using(tenant="acme", sequence="order-7").job(1)
    assert (job.tenant, job.sequence) == ("acme", "order-7")
    assert f.job(1).tenant is None and f.job(1).sequence is None
    with pytest.raises(InvalidJob, match="tenant"):
        f.using(tenant="").job(1)


@pytest.mark.parametrize(
    "delay", [float("inf"), float("nan"), 1e20, 1e13], ids=["inf", "nan", "huge", "past-9999"]
)
def test_using_an_impossible_delay_is_invalid_job(delay: float) -> None:
    """Not OverflowError nor a bare ValueError: the error every other bad job field raises."""
    tasks = Tasks()

    @tasks.task("u")
    def f(n: int) -> None: ...

    with pytest.raises(InvalidJob, match="delay"):
        f.using(delay=delay).job(1)


def test_using_takes_a_delay_or_an_available_at_and_the_later_call_wins() -> None:
    tasks = Tasks()

    @tasks.task("u")
    def f(n: int) -> None: ...

    at = datetime(2030, 1, 1, tzinfo=UTC)
    with pytest.raises(InvalidJob, match="not both"):
        f.using(delay=5, available_at=at)
    assert f.using(delay=5).using(available_at=at).job(1).available_at == at
    later = f.using(available_at=at).using(delay=1).job(1).available_at
    assert later is not None and later < at


class FakeStore:
    def __init__(self) -> None:
        self.jobs: list[tuple[Any, Job]] = []

    def enqueue(self, job: Job) -> EnqueueResult:
        self.jobs.append((None, job))
        return EnqueueResult("id", True)

    def enqueue_tx(self, tx: Any, job: Job) -> EnqueueResult:
        self.jobs.append((tx, job))
        return EnqueueResult("id", True)


class FakeAsyncStore:
    def __init__(self) -> None:
        self.jobs: list[tuple[Any, Job]] = []

    async def enqueue(self, job: Job) -> EnqueueResult:
        self.jobs.append((None, job))
        return EnqueueResult("aid", True)

    async def enqueue_tx(self, tx: Any, job: Job) -> EnqueueResult:
        self.jobs.append((tx, job))
        return EnqueueResult("aid", True)


def test_bound_shortcuts_sync_async_and_unbound() -> None:
    store = FakeStore()
    tasks = Tasks(store)

    @tasks.task("s")
    def f(n: int) -> None: ...

    assert f.enqueue(1) == ("id", True)
    f.enqueue_tx("TX", n=2)
    assert [(tx, j.payload) for tx, j in store.jobs] == [(None, {"n": 1}), ("TX", {"n": 2})]
    with pytest.raises(BrooqError, match="sync Store"):
        asyncio.run(f.aenqueue(3))

    astore = FakeAsyncStore()
    atasks = Tasks(astore)

    @atasks.task("a")
    def g(n: int) -> None: ...

    assert asyncio.run(g.aenqueue(1)) == ("aid", True)
    asyncio.run(g.aenqueue_tx("ATX", 2))
    assert [(tx, j.payload) for tx, j in astore.jobs] == [(None, {"n": 1}), ("ATX", {"n": 2})]
    with pytest.raises(BrooqError, match="AsyncStore"):
        g.enqueue(1)

    unbound = Tasks()

    @unbound.task("x")
    def h() -> None: ...

    with pytest.raises(BrooqError, match="bound to no store"):
        h.enqueue()


def test_async_task_handler_awaits_and_returns() -> None:
    tasks = Tasks()

    @tasks.task("async")
    async def f(ctx: Context, n: int) -> int:
        await asyncio.sleep(0)
        return n * 2

    assert f.is_async
    handler = f.handler()
    assert asyncio.run(handler(Context(), claim_of({"n": 4}))) == 8
    with pytest.raises(InvalidJob, match="JSON object"):
        asyncio.run(handler(Context(), claim_of([1])))


def test_context_claim_outside_an_attempt_raises() -> None:
    with pytest.raises(BrooqError, match="no attempt"):
        Context().claim  # noqa: B018


MYPY_SAMPLE = """
from brooq_py import Context, Tasks

tasks = Tasks()

@tasks.task("email.welcome")
def send_welcome(user_id: int, lang: str = "en") -> dict[str, int]:
    return {"user": user_id}

@tasks.task()
async def resize(ctx: Context, image_id: str) -> None: ...

send_welcome.job(42, lang="fr")
resize.job("img")
result: dict[str, int] = send_welcome(1)
send_welcome.job("forty-two")          # line 16: wrong argument type
resize.job(3)                          # line 17: wrong argument type
send_welcome.using(priority=1).job(1, colour="red")  # line 18: unexpected keyword
"""


def test_mypy_strict_checks_job_calls_against_the_function(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(textwrap.dedent(MYPY_SAMPLE).lstrip("\n"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "c"),
            str(sample),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
    lines = sorted({int(line.split(":")[1]) for line in errors})
    assert lines == [15, 16, 17], proc.stdout
    assert 'incompatible type "str"; expected "int"' in proc.stdout
    assert 'Unexpected keyword argument "colour"' in proc.stdout


def test_register_without_a_batch_registrar_registers_plain_tasks_and_refuses_a_batch_task() -> None:
    """``Tasks.register`` called outside an engine (only ``register_kind`` given): plain tasks register,
    a batch task is refused by name with a ConfigError, not a TypeError about a missing argument."""

    tasks = Tasks()

    @tasks.task("plain")
    def plain(n: int) -> int:
        return n

    registered: list[str] = []
    tasks.register(lambda topic, handler, options: registered.append(topic), KindOptions())
    assert registered == ["plain"]

    @tasks.batch_task("bulk", batch_size=10)
    def bulk(items: list[int]) -> list[int]:
        return items

    with pytest.raises(ConfigError, match=r"'bulk': a batch task needs Engine\.register_tasks"):
        tasks.register(lambda topic, handler, options: None, KindOptions())
