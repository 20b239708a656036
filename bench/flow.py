"""UNQ, CAP, RATE: what unique keys, depth caps and rate limits cost (SPEC U1, F1, F2).

``unique_w1``: W1 (Store.enqueue, one job a statement) with a unique key on every job
against the same without, interleaved round by round in one schema (target >= 0.95 x).
``unique_w2``: W2 (enqueue_many x1000) with a unique key and an idempotency key on
every job against the idempotency key alone, interleaved batch by batch.
``capped_w1``: W1 on a depth-capped topic against an uncapped one, interleaved; the
cap is counted in the INSERT (at most ``cap`` entries of two indexes), so its cost
grows with the topic's depth: measured twice, with the topic kept at most
``shallow`` deep (rows deleted between rounds) and with it growing round by round.
``rate_achieved``: a rate-limited topic's achieved claim rate against its limit (two
engines of 8 workers, no-op handlers, a backlog), at 10/s and 1,000/s.
``w3_beside_rated``: the W3 drain (4 workers) without and with a second topic limited
to 10/s over 1,000 ready jobs in the same engine, the two drains of a pair side by
side in two schemas; the median of the pairs' ratios (target >= 0.95 x).
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import psycopg
from psycopg import sql
from util import fresh_schema, job_table, store_on
from workloads import LEASE, PAYLOAD, TOPIC, seed

from brooq_py.engine import Config, Engine
from brooq_py.queue import Job

RATED = "rated"


def unique_w1(dsn: str, n: int, rounds: int = 10) -> dict[str, Any]:
    per_round = max(1, n // rounds)
    plain_s = unique_s = 0.0
    with fresh_schema(dsn, "unq1") as schema, store_on(dsn, schema, max_size=2) as store:
        for i in range(5):
            store.enqueue(Job(TOPIC, PAYLOAD))
            store.enqueue(Job(TOPIC, PAYLOAD, unique_key=f"warm{i}"))
        k = 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(per_round):
                store.enqueue(Job(TOPIC, PAYLOAD))
            t1 = time.perf_counter()
            for _ in range(per_round):
                k += 1
                store.enqueue(Job(TOPIC, PAYLOAD, unique_key=f"u{k}"))
            t2 = time.perf_counter()
            plain_s += t1 - t0
            unique_s += t2 - t1
    total = per_round * rounds
    return {
        "n": total,
        "plain_per_s": total / plain_s,
        "unique_per_s": total / unique_s,
        "ratio": plain_s / unique_s,
    }


def unique_w2(dsn: str, n: int, batch: int = 1000) -> dict[str, Any]:
    keyed_s = unique_s = 0.0
    with fresh_schema(dsn, "unq2") as schema, store_on(dsn, schema, max_size=2) as store:
        store.enqueue_many([Job(TOPIC, PAYLOAD, idempotency_key="warm", unique_key="warm")])
        for start in range(0, n, batch):
            size = min(batch, n - start)
            t0 = time.perf_counter()
            store.enqueue_many([Job(TOPIC, PAYLOAD, idempotency_key=f"k{start + i}") for i in range(size)])
            t1 = time.perf_counter()
            store.enqueue_many(
                [
                    Job(TOPIC, PAYLOAD, idempotency_key=f"uk{start + i}", unique_key=f"u{start + i}")
                    for i in range(size)
                ]
            )
            t2 = time.perf_counter()
            keyed_s += t1 - t0
            unique_s += t2 - t1
    return {"n": n, "keyed_per_s": n / keyed_s, "unique_per_s": n / unique_s, "ratio": keyed_s / unique_s}


def _capped(dsn: str, n: int, rounds: int, shallow: int | None) -> dict[str, Any]:
    per_round = max(1, n // rounds)
    plain_s = capped_s = 0.0
    with fresh_schema(dsn, "cap") as schema, store_on(dsn, schema, max_size=2) as store:
        store.set_max_depth("capped", 10_000_000)
        delete = sql.SQL("DELETE FROM {}").format(job_table(schema))
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(5):
                store.enqueue(Job(TOPIC, PAYLOAD))
                store.enqueue(Job("capped", PAYLOAD))
            for _ in range(rounds):
                if shallow is not None:
                    conn.execute(delete)
                t0 = time.perf_counter()
                for _ in range(per_round):
                    store.enqueue(Job(TOPIC, PAYLOAD))
                t1 = time.perf_counter()
                for _ in range(per_round):
                    store.enqueue(Job("capped", PAYLOAD))
                t2 = time.perf_counter()
                plain_s += t1 - t0
                capped_s += t2 - t1
    total = per_round * rounds
    return {
        "n": total,
        "deepest": per_round if shallow is not None else total,
        "plain_per_s": total / plain_s,
        "capped_per_s": total / capped_s,
        "ratio": plain_s / capped_s,
    }


def capped_w1(dsn: str, n: int) -> dict[str, Any]:
    return {
        "shallow": _capped(dsn, n, max(1, n // 200), shallow=200),
        "growing": _capped(dsn, min(n, 2000), 10, shallow=None),
    }


def _achieved(dsn: str, limit: int, seconds: float) -> dict[str, Any]:
    n = int(limit * seconds * 1.5) + limit + 100
    with fresh_schema(dsn, "rate") as schema, store_on(dsn, schema, max_size=8) as store:
        seed(store, n, topic=RATED)
        store.set_rate_limit(RATED, limit, 1)
        engines = [Engine(store, Config(workers=8, lease=LEASE)) for _ in range(2)]
        for e in engines:
            e.register_kind(RATED, lambda ctx, claim: None)
            e.start()
        time.sleep(seconds)
        for e in engines:
            e.stop()
        q = sql.SQL(
            "SELECT extract(epoch FROM max(updated_at) - min(updated_at))::float8, count(*) FROM {}"
            " WHERE topic = %s AND state = 'done'"
        ).format(job_table(schema))
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(q, (RATED,)).fetchone()
        for e in engines:
            e.close()
    assert row is not None
    # The first `limit` claims are the burst; the rest came at the rate, over the span from the first
    # done to the last (the engines ran a little longer than *seconds*: their starts and stops).
    span, done = float(row[0] or 0.0), int(row[1])
    achieved = (done - limit) / (span if span > 0 else seconds)
    return {
        "limit_per_s": limit,
        "seconds": seconds,
        "done": done,
        "achieved_per_s": achieved,
        "ratio": achieved / limit,
        "span_s": span,
    }


def rate_achieved(dsn: str) -> dict[str, Any]:
    return {"10/s": _achieved(dsn, 10, 5.0), "1000/s": _achieved(dsn, 1000, 5.0)}


ready = threading.Barrier(1)


def _drain(dsn: str, n: int, with_rated: bool) -> float:
    with fresh_schema(dsn, "ratew3") as schema, store_on(dsn, schema, max_size=8) as store:
        seed(store, n)
        engine = Engine(store, Config(workers=4, lease=LEASE))
        engine.register_kind(TOPIC, lambda ctx, claim: None)
        if with_rated:
            seed(store, 1000, topic=RATED)
            store.set_rate_limit(RATED, 10, 1)
            engine.register_kind(RATED, lambda ctx, claim: None)
        count = sql.SQL("SELECT count(*) FROM {} WHERE topic = %s AND state <> 'done'").format(
            job_table(schema)
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))
            ready.wait()
            t0 = time.perf_counter()
            engine.start()
            deadline = t0 + max(120.0, n / 100)
            while time.perf_counter() < deadline:
                row = conn.execute(count, (TOPIC,)).fetchone()
                if row is not None and row[0] == 0:
                    break
                time.sleep(0.02)
            t_end = time.perf_counter()
            engine.stop()
            engine.close()
    return n / (t_end - t0)


def w3_beside_rated(dsn: str, n: int, rounds: int = 5) -> dict[str, Any]:
    global ready
    pairs = []
    for _ in range(rounds):
        ready = threading.Barrier(2)
        out: dict[bool, float] = {}

        def run(flag: bool, out: dict[bool, float] = out) -> None:
            out[flag] = _drain(dsn, n, flag)

        threads = [threading.Thread(target=run, args=(flag,)) for flag in (False, True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pairs.append((out[False], out[True]))
    ratios = [b / a for a, b in pairs]
    return {
        "n": n,
        "plain_per_s": [round(a) for a, _ in pairs],
        "beside_rated_per_s": [round(b) for _, b in pairs],
        "ratio": statistics.median(ratios),
        "ratios": [round(r, 3) for r in ratios],
    }
