"""Real engine processes for the tests of stalled engines (tests/integration/engine_proc.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

PROC = Path(__file__).with_name("engine_proc.py")
ROOT = Path(__file__).resolve().parents[2]


def rows(dsn: str, schema: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rendered = sql.SQL(query).format(  # type: ignore[arg-type]
            job=sql.Identifier(schema, "job"), schedule_tick=sql.Identifier(schema, "schedule_tick")
        )
        cur = conn.execute(rendered, params or None)
        return cur.fetchall() if cur.description is not None else []


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


class Proc:
    def __init__(self, settings: dict[str, Any], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, str(PROC), json.dumps(settings)],
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=str(ROOT),
        )

    def ready(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert line.startswith("ready "), self.tail()
        return line.split()[1]

    def cont(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.cont()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
        self._log.close()

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-60:])
