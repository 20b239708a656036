"""Find a PostgreSQL to run the demo, the tests and the benchmarks against.

The chain: ``DATABASE_URL`` when set; else PostgreSQL on 127.0.0.1:5432 when it
answers ``select 1``; else a throwaway local server started for this process.
(The throwaway server is not implemented yet in this first cut.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class DevDatabase:
    dsn: str
    how: str  # "DATABASE_URL", "local 5432" or "throwaway"

    def close(self) -> None:
        pass


def acquire() -> DevDatabase:
    url = os.environ.get("DATABASE_URL")
    if url:
        return DevDatabase(url, "DATABASE_URL")
    return DevDatabase("postgresql://root@127.0.0.1:5432/test", "local 5432")
