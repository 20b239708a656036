"""Context (API.md Context, SPEC C3, C4, C11): cancellation with a cause, sync and async waits."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest

from brooq_py.queue import AttemptTimeout, Context, EngineStopping, LeaseLost


def test_api_fresh_context_is_not_done() -> None:
    ctx = Context()
    assert not ctx.done()
    assert ctx.cause is None
    assert ctx.deadline is None
    ctx.raise_if_done()  # returns quietly
    assert ctx.wait(0) is False
    assert ctx.wait(0.01) is False


def test_api_deadline_is_kept() -> None:
    at = datetime(2030, 1, 1, tzinfo=UTC)
    assert Context(deadline=at).deadline == at


def test_c3_cancel_sets_done_cause_and_raise_if_done() -> None:
    ctx = Context()
    cause = LeaseLost("gone")
    assert ctx.cancel(cause) is True
    assert ctx.done()
    assert ctx.cause is cause
    assert ctx.wait(0) is True
    assert ctx.wait() is True
    with pytest.raises(LeaseLost, match="gone"):
        ctx.raise_if_done()


def test_c4_first_cause_wins() -> None:
    ctx = Context()
    first = AttemptTimeout("t")
    assert ctx.cancel(first)
    assert not ctx.cancel(EngineStopping())
    assert not ctx.cancel(LeaseLost())
    assert ctx.cause is first


def test_c4_first_cause_wins_under_a_race() -> None:
    ctx = Context()
    causes = [LeaseLost(str(i)) for i in range(16)]
    start = threading.Barrier(len(causes))
    results: list[bool] = []

    def go(c: BaseException) -> None:
        start.wait()
        results.append(ctx.cancel(c))

    threads = [threading.Thread(target=go, args=(c,)) for c in causes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1
    assert ctx.cause in causes


def test_api_callbacks_run_once_with_the_cause() -> None:
    ctx = Context()
    seen: list[BaseException] = []
    ctx.add_callback(seen.append)
    cause = EngineStopping()
    ctx.cancel(cause)
    ctx.cancel(LeaseLost())
    assert seen == [cause]


def test_api_callback_added_after_cancel_runs_at_once() -> None:
    ctx = Context()
    cause = AttemptTimeout()
    ctx.cancel(cause)
    seen: list[BaseException] = []
    ctx.add_callback(seen.append)
    assert seen == [cause]
    ctx.cancel(LeaseLost())
    assert seen == [cause]


def test_api_removed_callback_does_not_run() -> None:
    ctx = Context()
    seen: list[BaseException] = []
    ctx.add_callback(seen.append)
    ctx.remove_callback(seen.append)
    ctx.remove_callback(seen.append)  # removing twice is harmless
    ctx.cancel(LeaseLost())
    assert seen == []


def test_c3_wait_wakes_when_cancelled_from_another_thread() -> None:
    ctx = Context()
    timer = threading.Timer(0.05, ctx.cancel, args=(LeaseLost(),))
    timer.start()
    try:
        assert ctx.wait(30) is True
    finally:
        timer.cancel()
        timer.join()
    assert isinstance(ctx.cause, LeaseLost)


def test_c2_wait_async_wakes_when_cancelled_from_another_thread() -> None:
    ctx = Context()

    async def main() -> bool:
        task = asyncio.create_task(ctx.wait_async(30))
        await asyncio.sleep(0)  # let the task register its wake-up
        threading.Thread(target=ctx.cancel, args=(EngineStopping(),)).start()
        return await asyncio.wait_for(task, 30)

    assert asyncio.run(main()) is True
    assert isinstance(ctx.cause, EngineStopping)


def test_c2_wait_async_times_out_returning_false() -> None:
    ctx = Context()
    assert asyncio.run(ctx.wait_async(0.01)) is False
    assert not ctx.done()


def test_c2_wait_async_already_cancelled_returns_true() -> None:
    ctx = Context()
    ctx.cancel(LeaseLost())
    assert asyncio.run(ctx.wait_async(0)) is True


def test_c2_wait_async_leaves_no_callback_behind() -> None:
    ctx = Context()
    for _ in range(3):
        assert asyncio.run(ctx.wait_async(0.001)) is False
    assert ctx._callbacks == []


def test_c2_wait_async_cancelled_task_leaves_no_callback_behind() -> None:
    ctx = Context()

    async def main() -> None:
        task = asyncio.create_task(ctx.wait_async(None))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert ctx._callbacks == []


def test_c2_cancel_after_loop_closed_does_not_raise() -> None:
    """A wait_async whose loop is gone must not make the engine's cancel() raise."""
    ctx = Context()
    pending: list[asyncio.Task[bool]] = []

    async def main() -> None:
        pending.append(asyncio.create_task(ctx.wait_async(None)))
        await asyncio.sleep(0)
        # leave the task pending; asyncio.run cancels it on exit

    asyncio.run(main())
    assert pending[0].cancelled()
    assert ctx.cancel(LeaseLost()) is True
