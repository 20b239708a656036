"""Where the claim's time goes under a held transaction horizon (SPEC B1, measure first).

    .venv/bin/python bench/horizon_claim.py [--steps 10000,50000,100000,200000] [--batch 500] [--tenants]

On a throwaway server of its own (never the shared one): one session holds an xid
(``BEGIN; SELECT txid_current()``, then idle), and jobs of one topic are cycled through the
real statements (enqueue_many, claim, then an outcome batch: done) until each step's count
is reached. At each step, with 100 jobs ready, it runs ``EXPLAIN (ANALYZE, BUFFERS)`` of
the claim's index scan as the claim statement reads it today (from the head of the topic's
range in ``job_claim_idx``) and of the same scan started past the head the claims consumed
(``priority = p AND (available_at, id) > (a, id)`` of the last claimed row): the buffers and
milliseconds say whether the time goes to the dead index entries at the head. A control run
without the held xid (``--no-hold``, autovacuum free to clean) gives the clean baseline.

``--tenants``: the same for a tenant topic (its jobs name 8 tenants, claimed by the fair claim):
the scan of ``job_fair_idx`` in (priority, turn) order from the start of the topic's range, and
started at the turn of the last claimed row (``priority = p AND turn >= t``).

Prints one row per step and writes bench/results/horizon_claim.json.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from brooq_py import devdb
from brooq_py.postgres import Store, migrations
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome

HERE = Path(__file__).resolve().parent

FROM_HEAD = """EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT id FROM job WHERE topic = 't' AND state = 'pending' AND available_at <= now()
ORDER BY priority DESC, available_at, id LIMIT 10 FOR NO KEY UPDATE SKIP LOCKED"""

PAST_HEAD = """EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT id FROM job WHERE topic = 't' AND state = 'pending' AND available_at <= now()
    AND priority = %s AND (available_at, id) > (%s, %s)
ORDER BY priority DESC, available_at, id LIMIT 10 FOR NO KEY UPDATE SKIP LOCKED"""


FAIR_FROM_HEAD = """EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT id FROM job WHERE topic = 't' AND state = 'pending' AND turn IS NOT NULL AND available_at <= now()
ORDER BY priority DESC, turn, id LIMIT 10"""

FAIR_PAST_HEAD = """EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT id FROM job WHERE topic = 't' AND state = 'pending' AND turn IS NOT NULL AND available_at <= now()
    AND priority = %s AND turn >= %s
ORDER BY turn, id LIMIT 10"""


def jobs(n: int, tenants: bool) -> list[Job]:
    return [Job("t", {"i": i}, tenant=f"c{i % 8}" if tenants else None) for i in range(n)]


def explain(conn: psycopg.Connection[Any], query: str, params: Any = None) -> tuple[float, int]:
    """(milliseconds, shared buffers hit+read) of one run of *query*, rolled back."""
    with conn.transaction(force_rollback=True):
        (plan,) = conn.execute(query, params).fetchone()  # type: ignore[misc]
    top = plan[0]
    buffers = top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0)
    return float(top["Execution Time"]), int(buffers)


def cycle(store: Store, pool: ConnectionPool[Any], n: int, batch: int, tenants: bool) -> tuple[Any, ...]:
    """Enqueue, claim and finish *n* jobs; return the last claimed row's claim key (priority and
    available_at and id; of a tenant topic, priority and turn)."""
    last: tuple[Any, ...] = ()
    done = 0
    key = "priority, turn" if tenants else "priority, available_at, id"
    while done < n:
        store.enqueue_many(jobs(batch, tenants))
        if tenants:
            store.worker.topic_settings()
            rows = list(store.worker.claim_limited("t", batch, "bench", timedelta(seconds=600)))
        else:
            rows = store.claim(["t"], batch, "bench", timedelta(seconds=600))
        store.settle_many([Outcome(r.id, r.claim_token, State.DONE) for r in rows])
        done += len(rows)
        if rows:
            with pool.connection() as c:
                last = c.execute(f"SELECT {key} FROM job WHERE id = %s", (rows[-1].id,)).fetchone() or last
    return last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", default="10000,50000,100000,200000")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--no-hold", action="store_true", help="the control: no held xid")
    parser.add_argument("--tenants", action="store_true", help="a tenant topic and its fair claim")
    args = parser.parse_args(argv)
    steps = [int(s) for s in re.split(r"[, ]+", args.steps) if s]
    db = devdb.start_throwaway()
    rows: list[dict[str, Any]] = []
    try:
        migrations.upgrade(db.dsn, schema="public")
        hold = psycopg.connect(db.dsn)
        if not args.no_hold:
            hold.execute("SELECT txid_current()")
        with ConnectionPool(db.dsn, min_size=2, max_size=4, open=True) as pool:
            store = Store(pool)
            cycled = 0
            print(
                f"{'jobs cycled':>12} {'dead tuples':>12} {'from head ms':>13} {'buffers':>8}"
                f" {'past head ms':>13} {'buffers':>8}"
            )
            for step in steps:
                last = cycle(store, pool, step - cycled, args.batch, args.tenants)
                cycled = step
                store.enqueue_many(jobs(100, args.tenants))
                from_head, past_head = (
                    (FAIR_FROM_HEAD, FAIR_PAST_HEAD) if args.tenants else (FROM_HEAD, PAST_HEAD)
                )
                with pool.connection() as conn:
                    conn.execute("SELECT pg_stat_force_next_flush()")
                    time.sleep(0.5)
                    dead = conn.execute(
                        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'job'"
                    ).fetchone()
                    explain(conn, from_head)  # warm
                    head_ms, head_buf = explain(conn, from_head)
                    past_ms, past_buf = explain(conn, past_head, last)
                row = {
                    "cycled": step,
                    "dead": dead[0] if dead else None,
                    "from_head_ms": head_ms,
                    "from_head_buffers": head_buf,
                    "past_head_ms": past_ms,
                    "past_head_buffers": past_buf,
                }
                rows.append(row)
                print(
                    f"{step:>12} {row['dead']:>12} {head_ms:>13.3f} {head_buf:>8} {past_ms:>13.3f} {past_buf:>8}"
                )
            store.close()
        hold.close()
    finally:
        db.close()
    name = "horizon_claim" + ("_tenants" if args.tenants else "") + ("_nohold" if args.no_hold else "")
    out = HERE / "results" / f"{name}.json"
    doc = {"held": not args.no_hold, "tenants": args.tenants, "batch": args.batch, "rows": rows}
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
