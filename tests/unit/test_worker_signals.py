"""The worker command's wait for SIGTERM/SIGINT (brooq_py/cli/worker.py): woken by the signal itself,
whichever thread it lands on, without a poll."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from brooq_py.cli.worker import _Signals


@pytest.fixture
def signals() -> Iterator[_Signals]:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    s = _Signals()
    s.install()
    try:
        yield s
    finally:
        previous = signal.set_wakeup_fd(-1)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        for fd in (s._woken, previous):
            if fd is not None and fd >= 0:
                os.close(fd)


def test_a_sigterm_sent_during_the_wait_ends_it_at_once(signals: _Signals) -> None:
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    started = time.monotonic()
    assert signals.wait(60.0) is True
    assert time.monotonic() - started < 30, "the wait ran on to its timeout"
    assert signals.requested == "SIGTERM"


def test_no_signal_waits_out_the_timeout_and_says_no(signals: _Signals) -> None:
    started = time.monotonic()
    assert signals.wait(0.3) is False
    assert time.monotonic() - started >= 0.25
    assert signals.requested is None


def test_a_signal_before_the_wait_is_seen_by_it(signals: _Signals) -> None:
    os.kill(os.getpid(), signal.SIGINT)
    assert signals.wait(60.0) is True
    assert signals.requested == "SIGINT"
