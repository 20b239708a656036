"""What ``brooq-py stats`` shows (``collect``: bounded, index-served statements, sql/stats_*.sql),
and the operator's SQL of the README runnable from code (SPEC O3): ``run``, ``text``, ``pasteable``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from brooq_py.postgres.session.statements import load, render

DEFAULT_CAP = 100_000


@dataclass(frozen=True)
class TopicDepth:
    topic: str
    pending: int
    processing: int
    failed: int
    oldest_ready_seconds: float
    scheduled: int = 0
    blocked: int = 0
    parked: int = 0  # SPEC F3: over a parking depth cap, not claimable


@dataclass(frozen=True)
class InFlight:
    id: str
    topic: str
    locked_by: str
    locked_until: datetime
    attempts: int
    expired: bool


@dataclass(frozen=True)
class Holder:
    locked_by: str
    jobs: int
    next_lease_end: datetime


@dataclass(frozen=True)
class DeadJob:
    id: str
    topic: str
    attempts: int
    last_error: str | None
    updated_at: datetime


@dataclass(frozen=True)
class Stats:
    """One ``stats`` report. A count equal to ``cap`` means "at least that many"."""

    schema: str
    cap: int
    topics: list[TopicDepth]
    holders: list[Holder]
    in_flight: list[InFlight]
    dead: list[DeadJob]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "cap": self.cap,
            "topics": [vars(t) for t in self.topics],
            "holders": [{**vars(h), "next_lease_end": h.next_lease_end.isoformat()} for h in self.holders],
            "in_flight": [{**vars(f), "locked_until": f.locked_until.isoformat()} for f in self.in_flight],
            "dead": [{**vars(d), "updated_at": d.updated_at.isoformat()} for d in self.dead],
        }


def collect(
    conn: psycopg.Connection[Any],
    schema: str = "public",
    *,
    dead_limit: int = 10,
    in_flight_limit: int = 50,
    max_topics: int = 1000,
    cap: int = DEFAULT_CAP,
) -> Stats:
    """Read a stats report of *schema* over *conn* in one transaction (psycopg errors as they are)."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(render("stats_topics", schema).composed, {"max_topics": max_topics})
        topic_names = [str(row[0]) for row in cur.fetchall()]
        topics: list[TopicDepth] = []
        if topic_names:
            # The same bounded statement the engine's gauge refresher reads.
            cur.execute(render("gauges_topics", schema).composed, {"topics": topic_names, "cap": cap})
            topics = sorted(
                (
                    TopicDepth(str(t), int(p), int(pr), int(f), float(age), int(s), int(b), int(k))
                    for t, p, s, pr, f, age, b, k in cur.fetchall()
                ),
                key=lambda d: d.topic,
            )
        cur.execute(render("stats_holders", schema).composed, {"limit": in_flight_limit})
        holders = [Holder(str(by), int(n), until) for by, n, until in cur.fetchall()]
        cur.execute(render("stats_in_flight", schema).composed, {"limit": in_flight_limit})
        in_flight = [
            InFlight(str(i), str(t), str(by), until, int(a), bool(exp))
            for i, t, by, until, a, exp in cur.fetchall()
        ]
        cur.execute(render("stats_dead", schema).composed, {"limit": dead_limit})
        dead = [DeadJob(str(i), str(t), int(a), err, at) for i, t, a, err, at in cur.fetchall()]
    return Stats(schema, cap, topics, holders, in_flight, dead)


# --- the operator's SQL of the README -------------------------------------------------------------


OPS = {
    "fate": "ops_fate",
    "in_flight": "ops_in_flight",
    "depth": "ops_depth",
    "oldest_ready": "ops_oldest_ready",
    "dead": "ops_dead",
    "cancel": "ops_cancel",
}
DEMO = {
    "orders_create": "demo_orders_create",
    "order_insert": "demo_order_insert",
    "schema_drop": "demo_schema_drop",
}


def statement(name: str, schema: str) -> sql.Composed:
    """Return the named statement rendered for *schema*."""
    file = OPS.get(name) or DEMO.get(name)
    if file is None:
        raise KeyError(f"no operator query named {name!r}; known: {', '.join([*OPS, *DEMO])}")
    return sql.SQL(load(file)).format(
        job=sql.Identifier(schema, "job"),
        job_in_flight=sql.Identifier(schema, "job_in_flight"),
        orders=sql.Identifier(schema, "orders"),
        schema=sql.Identifier(schema),
    )


def text(name: str) -> str:
    """Return the statement as the README prints it (unqualified table names, no comments)."""
    file = OPS.get(name) or DEMO.get(name) or name
    body = [ln for ln in load(file).splitlines() if not ln.lstrip().startswith("--")]
    text = "\n".join(body).replace("{job_in_flight}", "job_in_flight").replace("{job}", "job")
    return text.replace("{orders}", "orders").strip()


def pasteable(name: str, params: dict[str, str]) -> str:
    """``text(name)`` with each ``%(key)s`` as an SQL string literal, to paste into psql as it stands."""
    body = text(name)
    for key, value in params.items():
        body = body.replace(f"%({key})s", "'" + value.replace("'", "''") + "'")
    return body


def run(
    conn: psycopg.Connection[Any], name: str, schema: str, params: dict[str, Any] | None = None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run the named statement on *conn*; return (column names, rows) - empty for a write."""
    cur = conn.execute(statement(name, schema), params)
    if cur.description is None:
        return [], []
    return [d.name for d in cur.description], cur.fetchall()
