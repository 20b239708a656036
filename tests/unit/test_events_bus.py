"""The event bus alone: bounded, never blocking, listeners isolated (SPEC N1)."""

from __future__ import annotations

import logging
import threading

from brooq_py.engine.services.events import EventBus
from brooq_py.queue import Event
from tests.polling import wait_for

log = logging.getLogger("test")


def test_without_listeners_nothing_is_queued_or_started() -> None:
    bus = EventBus(log, max_queue=1)
    bus.emit("done", "a", "t", 1)
    bus.emit("done", "b", "t", 1)
    bus.start()
    assert bus._thread is None
    assert bus._queue.qsize() == 0


def test_a_full_queue_drops_and_counts_never_blocks() -> None:
    dropped: list[int] = []
    gate = threading.Event()
    got: list[Event] = []

    def slow(ev: Event) -> None:
        gate.wait(10)
        got.append(ev)

    bus = EventBus(log, max_queue=3, on_dropped=lambda: dropped.append(1))
    bus.add(slow)
    bus.start()
    for i in range(20):  # returns at once though the listener is stuck
        bus.emit("done", str(i), "t", 1)
    assert 16 <= len(dropped) <= 17  # the queue holds 3, the listener took at most one
    gate.set()
    wait_for(lambda: len(got) + len(dropped) == 20, "delivery of what was queued")
    bus.stop()


def test_listener_errors_are_counted_and_the_next_listener_still_runs() -> None:
    errors: list[int] = []
    got: list[str] = []

    def bad(ev: Event) -> None:
        raise KeyboardInterrupt

    bus = EventBus(log, on_listener_error=lambda: errors.append(1))
    bus.add(bad)
    bus.add(lambda ev: got.append(ev.job_id))
    bus.start()
    bus.emit("claimed", "x", "t", 1)
    bus.emit("done", "x", "t", 1)
    bus.stop()
    assert got == ["x", "x"]
    assert len(errors) == 2


def test_stop_delivers_what_is_queued() -> None:
    got: list[str] = []
    bus = EventBus(log)
    bus.add(lambda ev: got.append(ev.kind))
    bus.start()
    for kind in ("claimed", "failed", "claimed", "dead"):
        bus.emit(kind, "j", "t", 1)  # type: ignore[arg-type]
    bus.stop()
    assert got == ["claimed", "failed", "claimed", "dead"]
    bus.stop()  # twice is fine
