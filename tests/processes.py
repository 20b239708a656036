"""Real processes for the tests: a script run with its settings as JSON, in a session of its own (so
it is signalled and killed as a group, whatever it started), its stderr in a log file. The script
prints ``ready <id>`` once started and stops on SIGTERM (tests/chaos/worker_proc.py,
tests/integration/engine_proc.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


class Process:
    def __init__(self, script: Path, settings: dict[str, Any], log_path: Path) -> None:
        self.settings = settings
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in kill()/stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(script), json.dumps(settings)],
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            cwd=str(REPO_ROOT),
        )

    def wait_ready(self) -> str:
        """The id the process printed once started (an AssertionError with its log if it did not)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("ready "):
            raise AssertionError(f"{self.log_path.stem} did not start: {line!r}\n{self.log_tail()}")
        return line.split()[1]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def cont(self) -> None:
        """SIGCONT the group (after a SIGSTOP)."""
        self.signal_group(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the whole process group (no cleanup of any kind in the process)."""
        if self.proc.poll() is None:
            self.signal_group(signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGCONT, SIGTERM (a graceful stop); SIGKILL the group if it does not exit in time, after
        SIGUSR1 (a script that registers faulthandler for it logs every thread's stack)."""
        if self.proc.poll() is None:
            self.cont()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGUSR1)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(2)
                self.kill()
        self._close()
        return self.proc.returncode

    def _close(self) -> None:
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
        self._log.close()

    def log_tail(self, n: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""
