"""``devdb run -- CMD`` killed with SIGKILL leaves nothing behind: CMD dies with it (PDEATHSIG), and
the throwaway directory of a killed owner is removed by the next start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from brooq_py import devdb
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


def test_next_start_removes_the_directory_of_a_killed_owner(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import time
        from brooq_py import devdb
        db = devdb.start_throwaway()
        assert db.server is not None
        print(db.pid, db.server.datadir.parent, flush=True)
        time.sleep(600)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline().split()
        assert line, "the owner did not report its server"
        pid, tmpdir = int(line[0]), Path(line[1])
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    _wait_until(lambda: _gone(pid), f"server pid {pid} is gone")
    assert tmpdir.exists()  # nobody could remove it yet
    devdb.acquire().close()  # any next start (here: whatever the chain picks)
    assert not tmpdir.exists()
