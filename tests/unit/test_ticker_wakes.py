"""The Ticker's consumed wake-ups (commit b308206) where they meet a running tick."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from brooq_py.engine.services.liveness import Heartbeat
from brooq_py.engine.services.ticker import Ticker, stop_services
from brooq_py.engine.services.wakeups import Stager
from brooq_py.queue.port import Staged
from tests.polling import wait_for

LOG = logging.getLogger("test.ticker")
POLL = 30.0  # a lost wake-up would show as a wait of the whole poll interval


class Table:
    """Scheduled rows by due time (monotonic); a statement sees what was committed when it began."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.due: dict[str, float] = {}
        self.promoted: dict[str, float] = {}
        self.during_stage: list[str] = []  # rows to insert while the next stage statement runs

    def insert(self, name: str, due_in: float) -> None:
        with self.lock:
            self.due[name] = time.monotonic() + due_in

    def stage(self, topics: Sequence[str], batch: int) -> Staged:
        with self.lock:
            now = time.monotonic()
            ready = [n for n, d in self.due.items() if d <= now][:batch]
            for n in ready:
                del self.due[n]
                self.promoted[n] = now
            later = [d - now for d in self.due.values()]
        # the statement's snapshot is taken: a row committed now is not in its answer
        while self.during_stage:
            name = self.during_stage.pop()
            self.insert(name, 0.2)
            stager.wake()  # the enqueue's wake-up, while the tick runs
        return Staged({"t": len(ready)} if ready else {}, min(later) if later else None)

    def next_due(self, topics: Sequence[str]) -> float | None:
        with self.lock:
            now = time.monotonic()
            return min((d - now for d in self.due.values()), default=None)


stager: Stager


def make_stager(table: Table) -> Stager:
    global stager
    stager = Stager(POLL, ["t"], table.stage, table.next_due, lambda: None, LOG)
    return stager


def test_s7_a_job_scheduled_while_the_stagers_statement_runs_is_promoted_at_its_time() -> None:
    table = Table()
    s = make_stager(table)
    s.start()
    try:
        wait_for(lambda: s._due_at is None and s.running, "the first tick")
        time.sleep(0.1)
        table.insert("a", 0.0)
        table.during_stage.append("b")  # inserted (and woken) while the tick of "a" runs
        s.wake()
        wait_for(lambda: "a" in table.promoted, "a promoted", 5)
        wait_for(lambda: "b" in table.promoted, "b promoted at its time, not a poll later", 5)
    finally:
        s.stop()
    assert not s.running


def test_s7_a_wake_up_landing_inside_take_wake_is_not_lost_for_a_job_due_soon() -> None:
    """The wake() lands between take_wake's read of the flag and its clear (the narrowest window), on
    a tick that began on its timeout (nothing woke it): the row was committed before the wake-up, so
    the tick's own statements must see it and the stager must wake at its time."""
    import sys

    table = Table()
    s = make_stager(table)
    real_clear = s._poke.clear
    armed = threading.Event()
    fired = threading.Event()

    def clear() -> None:
        if armed.is_set() and sys._getframe(1).f_code.co_name == "take_wake":
            armed.clear()
            table.insert("c", 0.3)
            s._poke.set()
            fired.set()
        real_clear()

    s._poke.clear = clear  # type: ignore[method-assign]
    table.insert("first", 0.5)  # the tick after it comes on the stager's own timeout
    s.start()
    try:
        time.sleep(0.1)
        armed.set()
        wait_for(lambda: "first" in table.promoted, "first promoted", 5)
        assert fired.wait(5)
        wait_for(lambda: "c" in table.promoted, "c promoted near its time, not a poll later", 5)
    finally:
        s.stop()


def test_l7_halt_during_a_tick_that_takes_the_wake_stops_the_loop_at_once() -> None:
    """halt() while the stager's tick runs; the tick's take_wake() consumes halt()'s wake-up."""
    entered = threading.Event()
    go = threading.Event()

    def stage(topics: Sequence[str], batch: int) -> Staged:
        entered.set()
        go.wait(5)
        return Staged({}, None)

    s = Stager(POLL, ["t"], stage, lambda t: None, lambda: None, LOG)
    s.start()
    entered.wait(5)
    s.halt()
    s.take_wake()  # as a tick would, after the halt
    go.set()
    t0 = time.monotonic()
    s.stop(10)
    assert time.monotonic() - t0 < 2
    assert not s.running


def test_l7_services_idle_after_a_burst_of_wake_ups_no_spin() -> None:
    ticks = {"n": 0}

    class Counting(Ticker):
        name = "counting"

        def tick(self) -> None:
            ticks["n"] += 1

    t = Counting(3600, LOG)
    t.start()
    wait_for(lambda: ticks["n"] == 1)
    for _ in range(1000):
        t.wake()
    wait_for(lambda: ticks["n"] >= 2)
    n = ticks["n"]
    time.sleep(0.5)
    assert ticks["n"] <= n + 1
    assert ticks["n"] <= 3
    stop_services([t], 5)
    assert not t.running


def test_heartbeat_has_no_wait_of_its_own_any_more() -> None:
    assert Heartbeat._wait is Ticker._wait
