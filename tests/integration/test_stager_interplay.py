"""The stager learns every due time it could miss: poll-only enqueues, failed attempts, a reconnect (SPEC S7).

Every engine here polls once an hour, so a job that runs at all within the
generous deadline ran because the stager was told of its time, not because a
poll found it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, MustDelay, State
from tests.integration import test_scheduled
from tests.integration.test_scheduled import later
from tests.polling import wait_for

db = test_scheduled.db  # the raw autocommit connection fixture on the test schema

HOUR = 3600


@pytest.fixture
def engines(store: Store) -> Iterator[Callable[..., Engine]]:
    made: list[Engine] = []

    def make(**cfg: Any) -> Engine:
        e = Engine(store, Config(**{"workers": 2, "poll_interval": HOUR, "lease": 10, **cfg}))
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def idle(e: Engine) -> None:
    """Let the stager run its first tick (it then sleeps for the poll interval)."""
    time.sleep(0.5)


@pytest.mark.parametrize("ahead", [0.0, 0.3, 1.0])
def test_s7_poll_only_an_engines_own_scheduled_enqueue_wakes_its_stager(
    engines: Callable[..., Engine], ahead: float
) -> None:
    """notify=False: no NOTIFY reaches the stager, so the engine's own enqueue must tell it.

    ``ahead`` 0 is a job due "now" by Python's clock: a database clock behind
    Python's makes it scheduled all the same.
    """
    ran = threading.Event()
    e = engines(notify=False)
    e.register_kind("a", lambda ctx, claim: ran.set())
    e.start()
    idle(e)
    e.enqueue(Job("a", 1, available_at=later(ahead)))
    assert ran.wait(30)


@pytest.mark.parametrize("notify", [True, False])
def test_s7_a_failed_attempts_retry_is_staged_at_its_time(
    engines: Callable[..., Engine], notify: bool
) -> None:
    """A failed attempt's retry time is written by the engine itself: its stager learns it at once."""
    runs: list[int] = []
    again = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        runs.append(claim.attempt)
        if claim.attempt == 1:
            raise MustDelay(0.5)
        again.set()

    e = engines(notify=notify)
    e.register_kind("a", handler)
    e.start()
    idle(e)
    e.enqueue(Job("a", 1))
    assert again.wait(30), runs
    assert runs == [1, 2]


def test_s7_a_scheduled_enqueue_while_the_listener_reconnects_is_not_lost(
    store: Store, engines: Callable[..., Engine], db: psycopg.Connection[Any]
) -> None:
    """The stager's NOTIFY is missed while LISTEN is down: the reconnect makes the stager look again."""
    subs: list[Any] = []
    calls: list[int] = []
    gate = threading.Event()
    listen = store.worker.listen

    def gated_listen(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            gate.wait(30)
        sub = listen(*args, **kwargs)
        subs.append(sub)
        return sub

    store.worker.listen = gated_listen  # type: ignore[method-assign]
    ran = threading.Event()
    e = engines()
    e.register_kind("a", lambda ctx, claim: ran.set())
    e.start()
    wait_for(lambda: subs, "the first LISTEN")
    idle(e)
    db.execute("SELECT pg_terminate_backend(%s)", (subs[0]._conn.info.backend_pid,))
    wait_for(lambda: len(calls) > 1, "the listener to reconnect")
    job = store.enqueue(Job("a", 1, available_at=later(0.5))).id
    gate.set()
    assert ran.wait(30)
    row = store.get(job)
    assert row is not None and row.state in (State.PROCESSING, State.DONE)
