"""``devdb run -- CMD`` killed with SIGKILL leaves nothing behind: CMD dies with it (PDEATHSIG).
(The throwaway directory of a killed owner is removed by the next start: test_devdb.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.integration.test_devdb import _gone, _wait_until


def test_killed_devdb_run_takes_its_command_along() -> None:
    child_script = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
    run = subprocess.Popen(
        [sys.executable, "-m", "brooq_py.devdb", "run", "--", sys.executable, "-c", child_script],
        env={**os.environ, "DATABASE_URL": "postgresql://app@db.example.invalid/app"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert run.stdout is not None
        line = run.stdout.readline().strip()
        assert line, "the command did not start"
        cmd_pid = int(line)
        assert not _gone(cmd_pid)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
        if run.stdout is not None:
            run.stdout.close()
    _wait_until(lambda: _gone(cmd_pid), f"the orphaned command pid {cmd_pid} is gone")
