"""Batch calls (BD1) told once every job's context is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from tests.polling import wait_for


def st(store: Store, job_id: str) -> State:
    row = store.get(job_id)
    assert row is not None
    return row.state


def test_bd1_stop_with_a_sync_batch_call_ignoring_cancel_ends(
    store: Store, engines: Callable[..., Engine]
) -> None:
    release = threading.Event()
    started = threading.Event()

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        started.set()
        release.wait(120)
        return [None] * len(claims)

    e = engines(workers=4, poll_interval=0.05, watchdog_grace=1, lease=3)
    e.register_batch("bs.bstop", handler, KindOptions(batch_size=3))
    ids = [r.id for r in store.enqueue_many([Job("bs.bstop", i) for i in range(3)])]
    e.start()
    wait_for(started.is_set, "the call running", 30)
    t0 = time.monotonic()
    e.stop(timeout=1)
    took = time.monotonic() - t0
    release.set()
    assert took < 20, took
    print("stop took", took, [st(store, i) for i in ids])


def test_bd1_stop_with_an_async_batch_call_ignoring_cancel_ends(
    store: Store, engines: Callable[..., Engine]
) -> None:
    started = threading.Event()

    async def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        started.set()
        end = time.monotonic() + 60
        while time.monotonic() < end:
            with contextlib.suppress(asyncio.CancelledError):  # ignores every cancel
                await asyncio.sleep(0.05)
        return [None] * len(claims)

    e = engines(workers=4, poll_interval=0.05, watchdog_grace=1, lease=3)
    e.register_batch("bs.bastop", handler, KindOptions(batch_size=3))
    ids = [r.id for r in store.enqueue_many([Job("bs.bastop", i) for i in range(3)])]
    e.start()
    wait_for(started.is_set, "the call running", 30)
    t0 = time.monotonic()
    e.stop(timeout=1)
    took = time.monotonic() - t0
    assert took < 20, took
    print("async stop took", took, [st(store, i) for i in ids])


def test_bd1_batch_jobs_timing_out_at_different_deadlines(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """Two claims gathered by batch_wait at different times: the call is told once both timed out
    (after the later deadline); a call that then stops ends both as timed-out failures."""
    told_at: list[float] = []
    started_at: list[float] = []
    sizes: list[int] = []

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        started_at.append(time.monotonic())
        sizes.append(len(claims))
        end = time.monotonic() + 60
        while not ctx.done() and time.monotonic() < end:
            time.sleep(0.02)
        told_at.append(time.monotonic())
        ctx.raise_if_done()
        return [None] * len(claims)

    e = engines(workers=4, poll_interval=0.05, watchdog_grace=2, lease=3)
    e.register_batch(
        "bs.bto", handler, KindOptions(batch_size=2, batch_wait=3, attempt_timeout=2, max_attempts=1)
    )
    e.start()
    a = store.enqueue(Job("bs.bto", "a")).id
    wait_for(lambda: st(store, a) is State.PROCESSING, "a claimed")
    time.sleep(1.0)  # a second claim, later (this is setup, not a verdict)
    b = store.enqueue(Job("bs.bto", "b")).id
    wait_for(lambda: len(told_at) >= 1, "the call told", 60)
    wait_for(
        lambda: st(store, a) not in (State.PROCESSING,) and st(store, b) not in (State.PROCESSING,),
        "ended",
        60,
    )
    print(
        "sizes",
        sizes,
        "told after",
        told_at[0] - started_at[0],
        st(store, a),
        st(store, b),
        store.get(a).last_error,
        store.get(b).last_error,
    )  # type: ignore[union-attr]
    assert st(store, a) is State.DEAD and st(store, b) is State.DEAD


def test_bd1_run_once_batch_with_a_canceled_job(store: Store, engines: Callable[..., Engine]) -> None:
    seen: list[bool] = []

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        store.cancel(claims[0].id)
        time.sleep(0.5)
        seen.append(ctx.done())
        return [c.payload for c in claims]

    e = engines(workers=4)
    e.register_batch("bs.bro", handler, KindOptions(batch_size=2))
    ids = [r.id for r in store.enqueue_many([Job("bs.bro", i) for i in range(2)])]
    assert e.run_once() == 2
    assert seen == [False]
    assert st(store, ids[0]) is State.CANCELED
    assert st(store, ids[1]) is State.DONE
