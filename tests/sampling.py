"""A database sampler for the tests that claim exactness: one statement a sample, on its own connection."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from psycopg import sql


class Sampler:
    """Runs *query* (one int) with *params* in a loop on its own connection until the ``with`` block ends."""

    def __init__(self, dsn: str, query: sql.Composable, params: tuple[Any, ...]) -> None:
        self.dsn, self.query, self.params = dsn, query, params
        self.samples: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute(self.query, self.params).fetchone()
                assert row is not None
                self.samples.append(int(row[0]))

    def mark(self) -> int:
        """The index from which every sample began after this call (the one in flight is left out)."""
        return len(self.samples) + 1

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def processing(dsn: str, schema: str, topic: str) -> Sampler:
    """A sampler of *topic*'s processing rows."""
    query = sql.SQL("SELECT count(*) FROM {} WHERE topic = %s AND state = 'processing'")
    return Sampler(dsn, query.format(sql.Identifier(schema, "job")), (topic,))


def tenant_peak(dsn: str, schema: str, topic: str) -> Sampler:
    """A sampler of the most processing rows any one tenant of *topic* has."""
    query = sql.SQL(
        "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM {} "
        "WHERE topic = %s AND state = 'processing' GROUP BY tenant) AS t"
    )
    return Sampler(dsn, query.format(sql.Identifier(schema, "job")), (topic,))
