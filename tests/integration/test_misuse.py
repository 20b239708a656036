"""The public surface used wrongly, or in an unexpected order: each test states what a user gets (a
clear error naming what is wrong, nothing lost, nothing half-applied, no thread left running). The
docstrings say what happened before the fix."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from brooq_py import Context, Tasks
from brooq_py.engine import Config, Engine
from brooq_py.engine.services.ticker import stop_services
from brooq_py.postgres import AsyncStore, Store
from brooq_py.queue import BrooqError, ConfigError, InvalidJob, InvalidUsage, Job, State
from brooq_py.testing import aassert_enqueued, assert_enqueued, drain
from tests.integration.test_cli import cli_env

ENGINE_THREADS = ("brooq-dispatcher", "brooq-heartbeat", "brooq-stager", "brooq-reaper", "brooq-listener")


def cfg(**extra: Any) -> Config:
    return Config(**{"workers": 2, "poll_interval": 0.2, "lease": 3, "reaper_period": 0.5, **extra})


def engine_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name in ENGINE_THREADS and t.is_alive())


def force_down(engine: Engine) -> None:
    """Cleanup only: end what a failed stop left running, so one failing test leaks no thread into
    the next (internals on purpose: the public stop() is what is under test)."""
    if engine._dispatcher is not None:
        engine._dispatcher.stop(timeout=1.0)
    stop_services(engine._services, 2.0)
    if engine._completer is not None:
        engine._completer.stop(1.0)
    engine.runner.threads.stop()
    engine.runner.settlers.stop()
    engine._async.close()
    engine.events.stop(1.0)


@pytest.fixture
def made(store: Store) -> Iterator[list[Engine]]:
    engines: list[Engine] = []
    yield engines
    for e in engines:
        try:
            e.stop(timeout=1)
            e.close()
        finally:
            force_down(e)


def cli_bytes(dsn: str, schema: str, tmp_path: Path, *args: str | bytes) -> tuple[int, str, str]:
    """Run the CLI with argv given as bytes where needed (an undecodable byte on a command line)."""
    argv = [os.fsencode(sys.executable), b"-m", b"brooq_py", *(os.fsencode(a) for a in args)]
    env = cli_env(dsn, BROOQ_SCHEMA=schema)
    p = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, timeout=120, check=False)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def one_line_error(code: int, err: str) -> None:
    """The CLI's promise: 'Errors are one line with an exit status (2 for bad input), never a traceback'."""
    assert "Traceback" not in err, err
    assert code == 2, (code, err)


# --- Engine lifecycle --------------------------------------------------------------------------


def test_stop_with_an_infinite_timeout_stops_every_thread(store: Store, made: list[Engine]) -> None:
    """stop(timeout=math.inf) ("wait as long as it takes") raised OverflowError from threading.join
    after the engine was marked stopped: heartbeat, reaper, stager and listener kept running, and a
    later stop()/close() returned at once without ending them."""
    e = Engine(store, cfg())
    made.append(e)
    e.register_kind("inf", lambda ctx, claim: None)
    e.start()
    try:
        e.stop(timeout=math.inf)
    except (TypeError, ValueError) as exc:  # a clear refusal is fine, if nothing was changed by it
        assert e.running, f"stop() refused {exc!r} yet left the engine half-stopped"
        e.stop(timeout=1)
    e.close()
    time.sleep(0.3)
    assert engine_threads() == [], "threads still running after stop() and close()"


def test_stop_with_a_timeout_that_is_no_number_changes_nothing(store: Store, made: list[Engine]) -> None:
    """stop(timeout="abc") raised ValueError from float() after the engine was marked stopped: the
    dispatcher kept claiming, and even after close() a new job was claimed and run."""
    ran: list[str] = []
    e = Engine(store, cfg())
    made.append(e)
    e.register_kind("str", lambda ctx, claim: ran.append(claim.id))
    e.start()
    with pytest.raises((TypeError, ValueError)):
        e.stop(timeout="abc")  # type: ignore[arg-type]
    e.close()
    job = store.enqueue(Job("str", {})).id
    time.sleep(2)
    assert job not in ran, "a closed engine claimed and ran a job"
    row = store.get(job)
    assert row is not None and row.state is State.PENDING
    assert engine_threads() == []


def test_stop_called_from_an_event_listener_returns_like_from_a_handler(
    store: Store, made: list[Engine]
) -> None:
    """engine.stop() from an on_event listener (say, stop after the first done) raised
    RuntimeError('cannot join current thread') into the listener, logged as a listener error;
    from a handler the same call "starts the stop and returns" (docs/handlers.md)."""
    e = Engine(store, cfg())
    made.append(e)
    e.register_kind("ev", lambda ctx, claim: None)
    raised: list[BaseException] = []
    returned = threading.Event()

    def on(event: Any) -> None:
        if event.kind == "done":
            try:
                e.stop()
            except BaseException as exc:
                raised.append(exc)
            returned.set()

    e.on_event(on)
    e.start()
    store.enqueue(Job("ev", {}))
    assert returned.wait(30)
    assert raised == [], f"stop() from a listener raised {raised[0]!r}"
    deadline = time.monotonic() + 10
    while e.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not e.running


def test_an_engine_on_a_closed_pool_says_so_at_start(dsn: str, schema: str) -> None:
    """A pool never opened is InvalidUsage at start() ('open the pool first'); a pool already closed
    (the `with pool:` block ended) is taken for an outage: start() succeeds, the engine runs and every
    service retries PoolClosed forever with warnings, a pool that never comes back."""
    pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=2, open=True)
    pool.close()
    e = Engine(Store(pool, schema=schema), cfg())
    e.register_kind("t", lambda ctx, claim: None)
    try:
        with pytest.raises(InvalidUsage, match="closed"):
            e.start()
        assert not e.running
    finally:
        e.stop(timeout=1)
        e.close()
        force_down(e)


def test_lifecycle_misorders_are_clear(store: Store, made: list[Engine]) -> None:
    """stop/close before start, twice, start after close, registration after start, a topic twice."""
    e = Engine(store, cfg())
    made.append(e)
    e.stop()
    e.stop(timeout=0)
    e.register_kind("a", lambda ctx, claim: None)
    with pytest.raises(ConfigError, match="already registered"):
        e.register_kind("a", lambda ctx, claim: None)
    with pytest.raises(ConfigError, match="already registered"):
        e.register_batch("a", lambda ctx, claims: [None] * len(claims))
    e.start()
    e.start()  # idempotent
    with pytest.raises(BrooqError, match="before start"):
        e.register_kind("b", lambda ctx, claim: None)
    with pytest.raises(BrooqError, match="before start"):
        e.on_event(lambda ev: None)
    with pytest.raises(BrooqError, match="not started"):
        e.run_once()
    e.stop(timeout=0)
    e.stop(timeout=0)
    e.close()
    e.close()
    with pytest.raises(BrooqError, match="cannot be started again"):
        e.start()
    assert engine_threads() == []


def test_register_tasks_that_clashes_registers_nothing(store: Store) -> None:
    """register_tasks() registered the tasks before the clashing one and then raised ConfigError:
    half-applied, so fixing the clash and calling it again fails on the first task."""
    tasks = Tasks()

    @tasks.task("misuse.first")
    def first(x: int) -> None: ...

    @tasks.task("misuse.clash")
    def clash(x: int) -> None: ...

    e = Engine(store, cfg())
    e.register_kind("misuse.clash", lambda ctx, claim: None)
    with pytest.raises(ConfigError, match="already registered"):
        e.register_tasks(tasks)
    assert e.topics == ("misuse.clash",), f"half-registered: {e.topics}"


def test_register_tasks_with_a_batch_option_on_a_plain_task_registers_nothing(store: Store) -> None:
    """@tasks.task(batch_size=5) is accepted at decoration; register_tasks refuses it then, after
    registering the tasks before it."""
    tasks = Tasks()

    @tasks.task("misuse.ok")
    def ok(x: int) -> None: ...

    @tasks.task("misuse.batchy", batch_size=5)
    def batchy(x: int) -> None: ...

    e = Engine(store, cfg())
    with pytest.raises(ConfigError, match="batch_size"):
        e.register_tasks(tasks)
    assert e.topics == (), f"half-registered: {e.topics}"


# --- typed tasks -------------------------------------------------------------------------------


def test_a_task_with_var_keyword_refuses_its_context_name_at_job(store: Store) -> None:
    """fn(ctx: Context, **kw): .job(ctx=1) was accepted and enqueued {"ctx": 1}, a payload that can
    never bind (fn(ctx, ctx=1)): the job failed with TypeError on every attempt, then dead. Now
    InvalidJob at the call, and such a payload written by other means ends dead at once, unretried."""
    tasks = Tasks()

    @tasks.task("misuse.kw", max_attempts=3)
    def kw(ctx: Context, **rest: Any) -> None: ...

    with pytest.raises(InvalidJob, match="Context"):
        kw.job(ctx=1)  # type: ignore[arg-type]
    assert kw.job(other=1).payload == {"other": 1}  # type: ignore[call-arg]
    job_id = store.enqueue(Job("misuse.kw", {"ctx": 1})).id  # as psql or the CLI would write it
    e = Engine(store, cfg())
    e.register_tasks(tasks)
    drain(e)
    row = store.get(job_id)
    assert row is not None and row.state is State.DEAD
    assert row.attempts == 1 and "Context" in (row.last_error or ""), (row.attempts, row.last_error)


# --- Store and AsyncStore with wrong values ----------------------------------------------------


@pytest.mark.parametrize("name", ["\ud800", "a\udcff"])
def test_signal_name_that_is_no_text_is_refused_like_the_rest(store: Store, name: str) -> None:
    """Store.signal(id, name) with a lone surrogate (undecodable bytes) raised UnicodeEncodeError from
    psycopg's dumper, where NUL and '' are a ValueError naming the argument."""
    job = store.enqueue(Job("sig", {})).id
    with pytest.raises(ValueError) as err:
        store.signal(job, name)
    assert not isinstance(err.value, UnicodeError), f"from psycopg: {err.value!r}"


def test_async_signal_name_that_is_no_text_is_refused(dsn: str, schema: str) -> None:
    async def main() -> BaseException | None:
        from psycopg_pool import AsyncConnectionPool

        async with AsyncConnectionPool(dsn, min_size=1, max_size=2) as apool:
            a = AsyncStore(apool, schema=schema)
            try:
                await a.signal(str(uuid.uuid4()), "\ud800")
            except BaseException as exc:
                return exc
        return None

    exc = asyncio.run(main())
    assert isinstance(exc, ValueError) and not isinstance(exc, UnicodeError), repr(exc)


def test_a_store_on_a_schema_name_that_is_no_text_is_refused_at_once(pool: ConnectionPool[Any]) -> None:
    """Store(pool, schema='') and schema='a\\x00' are ValueError at construction; a lone surrogate was
    accepted, and every later call raised UnicodeEncodeError from psycopg.sql."""
    with pytest.raises(ValueError, match="schema"):
        Store(pool, schema="\ud800")
    # PostgreSQL keeps 63 bytes of a name: two longer ones alike in them would be one schema
    with pytest.raises(ValueError, match="63"):
        Store(pool, schema="s" * 60 + "\u00e9\u00e9")
    assert Store(pool, schema="s" * 63).schema == "s" * 63


def test_operator_methods_refuse_wrong_types_before_writing(store: Store) -> None:
    """bool, float, NaN, huge ints, '', None where an int or text is wanted: a ValueError or
    InvalidJob naming the argument, and nothing written (sync Store; AsyncStore shares the checks)."""
    calls: list[Callable[[Any], object]] = [
        lambda bad: store.set_limit("t", bad),
        lambda bad: store.set_max_depth("t", bad),
        lambda bad: store.set_rate_limit("t", bad),
        lambda bad: store.set_rate_limit("t", 1, burst=bad),
        lambda bad: store.set_tenant_limit("t", bad),
        lambda bad: store.set_tenant_weight("t", "x", bad),
    ]
    for bad in (True, 5.0, math.nan, 2**31, -1, "5"):
        for call in calls:
            with pytest.raises(ValueError):
                call(bad)
    text_calls: list[Callable[[Any], object]] = [
        lambda b: store.pause(b),
        lambda b: store.set_tenant_limit("t", 1, tenant=b),
        lambda b: store.set_tenant_weight("t", b, 2),
        lambda b: store.resume_sequence("t", b),
        lambda b: store.resume_sequence(b, "s"),
    ]
    for bad_text in (True, "", "a\x00", "\ud800", b"t"):
        for call in text_calls:
            with pytest.raises(ValueError) as err:
                call(bad_text)
            assert not isinstance(err.value, UnicodeError)
    with pytest.raises(ValueError, match="park"):
        store.set_max_depth("t", 5, park=1)  # type: ignore[arg-type]
    assert store.topic_settings() == []


# --- the testing kit ---------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_assert_enqueued_given_an_async_store_says_which_helper(schema: str) -> None:
    """assert_enqueued(brooq_async_store, ...) raised TypeError "'coroutine' object is not
    subscriptable" (and a never-awaited warning): the fix, aassert_enqueued, is not named."""
    a = AsyncStore(None, schema=schema)
    with pytest.raises(TypeError, match=r"use aassert_enqueued\(\)"):
        assert_enqueued(a, "t")  # type: ignore[arg-type]


def test_aassert_enqueued_given_a_sync_store_says_which_helper(store: Store) -> None:
    """aassert_enqueued(brooq_store, ...) raised "object list can't be used in 'await' expression"."""
    with pytest.raises(TypeError, match=r"takes an AsyncStore.*use assert_enqueued\(\)"):
        asyncio.run(aassert_enqueued(store, "t"))  # type: ignore[arg-type]


def test_drain_given_a_store_instead_of_an_engine_says_so(store: Store) -> None:
    """drain(store) raised AttributeError "'Store' object has no attribute 'store'"."""
    with pytest.raises(TypeError, match="takes the Engine"):
        drain(store)  # type: ignore[arg-type]


def test_drain_refuses_bad_arguments_with_their_names(store: Store) -> None:
    """drain(retries='wait', timeout=None) raised TypeError "unsupported operand type(s) for +";
    max_runs=-1 said 'ran 0 attempts and jobs are still ready' with no job at all."""
    e = Engine(store, cfg())
    e.register_kind("t", lambda ctx, claim: None)
    with pytest.raises(ValueError, match="retries"):
        drain(e, retries="later")  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="timeout"):
        drain(e, retries="wait", timeout=None)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="max_runs"):
        drain(e, max_runs=-1)


def test_drain_after_stop_and_close_still_runs_in_this_thread(store: Store) -> None:
    """run_once()/drain on an engine already stopped or closed (async handler included) runs the job
    rather than hanging on the stopped event loop."""

    async def h(ctx: Context, claim: Any) -> int:
        return 1

    e = Engine(store, cfg())
    e.register_kind("after", h)
    e.start()
    e.stop(timeout=1)
    job = store.enqueue(Job("after", {})).id
    assert drain(e).done == 1
    e.close()
    job2 = store.enqueue(Job("after", {})).id
    assert drain(e).done == 1
    assert store.get(job).state is State.DONE and store.get(job2).state is State.DONE  # type: ignore[union-attr]


# --- the CLI -----------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", ["NaN", "1e400", '"\\u0000"', '{"a": -Infinity}'])
def test_cli_signal_with_a_payload_json_cannot_store_is_one_line(
    dsn: str, schema: str, tmp_path: Path, payload: str
) -> None:
    """`brooq-py signal ID NAME NaN` printed InvalidJob's whole traceback (exit 1): json.loads takes
    NaN, 1e400 and \\u0000, which the store then refuses; `enqueue` says the same in one line."""
    code, _, err = cli_bytes(dsn, schema, tmp_path, "signal", str(uuid.uuid4()), "n", payload)
    one_line_error(code, err)


def test_cli_signal_with_an_undecodable_name_is_one_line(dsn: str, schema: str, tmp_path: Path) -> None:
    """`brooq-py signal ID $'\\xff'` printed UnicodeEncodeError's traceback from psycopg."""
    code, _, err = cli_bytes(dsn, schema, tmp_path, "signal", str(uuid.uuid4()), b"\xff")
    one_line_error(code, err)


def test_cli_jobs_with_an_undecodable_tenant_is_one_line(dsn: str, schema: str, tmp_path: Path) -> None:
    """`brooq-py jobs --tenant $'\\xff'` printed InvalidJob's traceback (exit 1); tenant-limit and
    tenant-weight say 'invalid tenant ...' with exit 2."""
    code, _, err = cli_bytes(dsn, schema, tmp_path, "jobs", "--tenant", b"\xff")
    one_line_error(code, err)


@pytest.mark.parametrize("command", ["stats", "topics"])
def test_cli_an_undecodable_schema_is_one_line(dsn: str, schema: str, tmp_path: Path, command: str) -> None:
    """`brooq-py stats --schema $'\\xff'` printed UnicodeEncodeError's traceback from psycopg.sql."""
    code, _, err = cli_bytes(dsn, schema, tmp_path, command, "--schema", b"\xff")
    one_line_error(code, err)


@pytest.mark.parametrize(
    ("args", "value"),
    [
        (("enqueue", "t", "{}", "--delay", "-5s"), "-5s"),
        (("tenant-rate", "t", "-5/1s"), "-5/1s"),
    ],
)
def test_cli_a_value_that_starts_with_a_dash_is_named(
    dsn: str, schema: str, tmp_path: Path, args: tuple[str, ...], value: str
) -> None:
    """Like the known `rate t -5/1s`: argparse takes these values for options and says 'the following
    arguments are required: JSON' or 'expected one argument', never naming the value it refused
    (`--delay=-5s` gets the library's own 'must not be negative')."""
    code, _, err = cli_bytes(dsn, schema, tmp_path, *args)
    one_line_error(code, err)
    assert value in err, err


def test_cli_a_json_payload_that_starts_with_a_dash_is_a_payload(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """`enqueue t -1e3` said 'the following arguments are required: JSON': -1e3 is a JSON number."""
    code, _, err = cli_bytes(dsn, schema, tmp_path, "enqueue", "t", "-1e3")
    assert code == 0, err
    with psycopg.connect(dsn) as conn:
        got = conn.execute(f'SELECT payload::text FROM "{schema}".job').fetchall()
    assert got == [("-1000.0",)], got


def test_cli_rate_none_with_a_burst_is_not_silently_ignored(dsn: str, schema: str, tmp_path: Path) -> None:
    """`brooq-py rate t none --burst 5` exits 0 printing burst null: the --burst given is dropped
    without a word, where a negative or zero one is refused."""
    code, _, err = cli_bytes(dsn, schema, tmp_path, "rate", "t", "none", "--burst", "5")
    assert code == 2 and "burst" in err, (code, err)


def test_cli_operator_values_out_of_range_are_one_line(dsn: str, schema: str, tmp_path: Path) -> None:
    """Negative, zero, float and empty values of limit/depth/weight/burst/--limit and empty tenants:
    exit 2 with the library's own message, nothing written."""
    for args in (
        ("limit", "t", "-5"),
        ("depth", "t", "-1"),
        ("limit", "t", "1e3"),
        ("tenant-weight", "t", "x", "0"),
        ("tenant-weight", "t", "x", "-1"),
        ("tenant-limit", "t", "1", "--tenant", ""),
        ("rate", "t", "5/0s"),
        ("rate", "t", "5", "--burst", "-1"),
        ("jobs", "--limit", "-1"),
        ("retry", "--topic", "t", "--state", "dead", "--limit", "0"),
        ("sequence-resume", "t", ""),
        ("enqueue", "t", "{}", "--priority", "99999999999"),
    ):
        code, _, err = cli_bytes(dsn, schema, tmp_path, *args)
        assert code == 2 and "Traceback" not in err and err.startswith("brooq-py: "), (args, code, err)
    with ConnectionPool(dsn, min_size=1, max_size=1) as p:
        assert Store(p, schema=schema).topic_settings() == []


def test_stop_from_a_listener_during_the_events_drain_does_not_hold_up_the_stop(store: Store) -> None:
    """engine.stop() from a listener "only starts the stop", also for a listener called while the stop
    drains the events queued when it began: its stop() waited for the stop in progress, which joined
    the events thread, both until the join's timeout (40 s here), then "a listener still runs ... left
    behind". Here a listener stops the engine on its first event and again on a later one."""
    e = Engine(store, Config(workers=2, poll_interval=0.2, lease=30, reaper_period=0.5))
    e.register_kind("rv.ev", lambda ctx, claim: time.sleep(0.1))
    calls: list[tuple[str, float]] = []
    first_done = threading.Event()
    t0: list[float] = []

    def on(event: Any) -> None:
        if not first_done.is_set():
            first_done.set()
            t0.append(time.monotonic())
            e.stop(timeout=8)  # from the events thread: deferred
            time.sleep(2.5)  # the stop reaches events.stop() while more events wait in the queue
            return
        start = time.monotonic()
        e.stop(timeout=8)
        calls.append((event.kind, time.monotonic() - start))

    e.on_event(on)
    for _ in range(2):
        store.enqueue(Job("rv.ev", {}))
    try:
        e.start()
        assert first_done.wait(30)
        time.sleep(0.5)
        e.stop()  # from this thread: returns once the stop in progress is over
        took = time.monotonic() - t0[0]
        slow = [(kind, round(s, 1)) for kind, s in calls if s > 2.0]
        assert took < 8.0 and not slow, (f"the stop took {took:.1f}s", slow)
    finally:
        e.close()
