"""Health: what /healthz reports about an engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Health:
    """ok when the database answers, the engine runs and hung handlers do not
    outnumber the workers (SPEC C5)."""

    ok: bool
    database: bool
    running: bool
    hung: int
    workers: int

    @classmethod
    def of(cls, *, database: bool, running: bool, hung: int, workers: int) -> Health:
        return cls(
            ok=database and running and hung <= workers,
            database=database,
            running=running,
            hung=hung,
            workers=workers,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "database": self.database,
            "running": self.running,
            "hung": self.hung,
            "workers": self.workers,
        }
