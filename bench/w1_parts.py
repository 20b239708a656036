"""Where W1's time goes: the raw INSERT of make bench's W1 beside the enqueue's own statement, with
and without the NOTIFY trigger, on a dedicated connection and on a pool connection, and
Store.enqueue itself. Every path runs N jobs a round, the paths in a shuffled order each round;
each path's ratio is the median over the rounds of (raw INSERT's us/job) / (its us/job).

    .venv/bin/python bench/w1_parts.py [--dsn DSN] [--n 300] [--rounds 20] [--pool 2]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool
from util import fresh_schema, job_table, raw_insert

from brooq_py.postgres import Store
from brooq_py.queue import Job

PAYLOAD = {"n": 1, "s": "x" * 40}


def _statement(store: Store) -> tuple[bytes, dict[str, Any]]:
    """The statement and parameters Store.enqueue sends for a keyless job, as psycopg saw them."""
    seen: list[tuple[Any, Any]] = []
    execute = psycopg.Cursor.execute

    def spy(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        seen.append((query, params))
        return execute(self, query, params, **kw)

    psycopg.Cursor.execute = spy  # type: ignore[method-assign]
    try:
        store.enqueue(Job("t", PAYLOAD))
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    query, params = seen[-1]
    return query, dict(params)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/test")
    ap.add_argument("--n", type=int, default=300, help="jobs per path and round")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--pool", type=int, default=2, help="the pools' size (W1's Store has 2)")
    args = ap.parse_args()
    with (
        fresh_schema(args.dsn, "w1n") as with_trigger,
        fresh_schema(args.dsn, "w1x") as without,
        psycopg.connect(args.dsn, autocommit=True) as conn,
    ):
        conn.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER job_notify").format(job_table(without)))
        raw = raw_insert(conn, with_trigger)
        size = {"min_size": args.pool, "max_size": args.pool, "open": True}
        pool: ConnectionPool[Any] = ConnectionPool(args.dsn, **size)
        bare: ConnectionPool[Any] = ConnectionPool(args.dsn, kwargs={"autocommit": True}, **size)
        stores = Store(pool, schema=with_trigger), Store(pool, schema=without)
        (q1, p1), (q0, p0) = (_statement(s) for s in stores)
        payload = json.dumps(PAYLOAD)

        def on(
            run: Callable[[bytes, dict[str, Any]], object], q: bytes, p: dict[str, Any]
        ) -> Callable[[], None]:
            def one() -> None:
                run(q, {**p, "id": str(uuid.uuid4())})

            return one

        def lent(q: bytes, p: dict[str, Any]) -> None:  # as Store.enqueue lends it
            c = pool.getconn()
            try:
                c.autocommit = True
                c.execute(q, p)
                c.autocommit = False
            finally:
                pool.putconn(c)

        def lent_bare(q: bytes, p: dict[str, Any]) -> None:
            c = bare.getconn()
            try:
                c.execute(q, p)
            finally:
                bare.putconn(c)

        notify_in_statement = (
            b"WITH i AS (" + q0 + b" RETURNING topic) SELECT pg_notify('w1_parts', topic) FROM i"
        )
        paths: dict[str, Callable[[], None]] = {
            "raw INSERT into a LIKE table (W1's baseline)": lambda: (
                conn.execute(raw, (uuid.uuid4(), "t", payload)),
                None,
            )[1],
            "the enqueue's INSERT, trigger off": on(conn.execute, q0, p0),
            "the same with pg_notify in the statement": on(conn.execute, notify_in_statement, p0),
            "the enqueue's INSERT, NOTIFY trigger on": on(conn.execute, q1, p1),
            "the same on a pool connection lent as Store.enqueue does": on(lent, q1, p1),
            "the same on an autocommit pool's connection": on(lent_bare, q1, p1),
            "Store.enqueue, trigger off": lambda: (stores[1].enqueue(Job("t", PAYLOAD)), None)[1],
            "Store.enqueue (W1)": lambda: (stores[0].enqueue(Job("t", PAYLOAD)), None)[1],
        }
        for run in paths.values():
            for _ in range(20):
                run()
        us: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.rounds):
            order = list(paths.items())
            random.shuffle(order)
            for name, run in order:
                t0 = time.perf_counter()
                for _ in range(args.n):
                    run()
                us[name].append((time.perf_counter() - t0) / args.n * 1e6)
        pool.close()
        bare.close()
    base = us["raw INSERT into a LIKE table (W1's baseline)"]
    print(f"| path ({args.n} jobs x {args.rounds} rounds, pools of {args.pool}) | us/job | x raw |")
    print("|---|---|---|")
    for name, times in us.items():
        ratio = statistics.median(b / t for b, t in zip(base, times, strict=True))
        print(f"| {name} | {statistics.median(times):.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
