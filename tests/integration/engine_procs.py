"""Helpers of the tests of stalled engine processes (tests/integration/engine_proc.py, run as
tests/processes.Process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

PROC = Path(__file__).with_name("engine_proc.py")


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
