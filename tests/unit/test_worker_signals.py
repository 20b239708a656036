"""The worker command's wait for SIGTERM/SIGINT (brooq_py/cli/worker.py): woken by the signal itself,
whichever thread it lands on, without a poll; before the engine started, a signal interrupts."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from brooq_py.cli.worker import _Interrupted, _Signals


@pytest.fixture
def signals() -> Iterator[_Signals]:
    """Installed, the engine started (a signal asks for a graceful stop), closed after."""
    s = _Signals()
    s.install()
    s.started()
    try:
        yield s
    finally:
        s.close()


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


def test_close_puts_back_the_wakeup_fd_and_the_handlers_and_closes_the_pipe() -> None:
    def before(signum: int, frame: object) -> None:
        pass

    previous = {s: signal.signal(s, before) for s in (signal.SIGTERM, signal.SIGINT)}
    r, w = os.pipe()
    os.set_blocking(w, False)
    old = signal.set_wakeup_fd(w)
    try:
        s = _Signals()
        s.install()
        pipe = (s._woken, s._wake)
        s.close()
        assert signal.set_wakeup_fd(w) == w, "the wakeup fd before install() is back"
        assert signal.getsignal(signal.SIGTERM) is before and signal.getsignal(signal.SIGINT) is before
        for fd in pipe:
            with pytest.raises(OSError):
                os.fstat(fd)  # type: ignore[arg-type]
    finally:
        signal.set_wakeup_fd(old)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(r)
        os.close(w)


def test_a_signal_before_the_engine_started_interrupts_the_main_thread() -> None:
    s = _Signals()
    s.install()
    try:
        with pytest.raises(_Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # what the main thread was doing (an --app factory): interrupted
        assert s.requested == "SIGTERM"
    finally:
        s.close()


def test_installed_off_the_main_thread_the_wait_times_out_and_close_leaves_no_pipe() -> None:
    """The command run in a thread (no signal comes there): the wait only times out."""
    seen: list[object] = []

    def run() -> None:
        s = _Signals()
        s.install()
        started = time.monotonic()
        seen.extend([s.wait(0.3), time.monotonic() - started >= 0.25, signal.getsignal(signal.SIGTERM)])
        s.close()
        seen.append(s._woken)

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert seen == [False, True, before, None]
