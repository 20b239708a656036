"""W10: the hot statements on a 10,000,000-row job table (9.9 M terminal, 100 k active) vs a fresh one.

Both tables hold the same 100 k active (pending) rows; the big one also 9.9 M terminal rows
(done, dead, canceled) written by generate_series. Claim (one job), settle (one outcome) and
heartbeat (100 leases) run interleaved on both, so a load that comes and goes weighs on both.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql
from util import fresh_schema, job_table, pct, store_on
from workloads import LEASE

from brooq_py.queue import State
from brooq_py.queue.port import EngineProof, HeldLease, Outcome

TOPIC = "w10"


def _fill(dsn: str, schema: str, terminal: int, active: int) -> None:
    table = job_table(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if terminal:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (topic, payload, state, attempts, available_at, updated_at)"
                    " SELECT 't' || (i %% 20), '{{\"n\": 1}}',"
                    " (ARRAY['done', 'done', 'done', 'dead', 'canceled'])[1 + i %% 5], 1,"
                    " now() - interval '2 days', now() - interval '1 day' + i * interval '1 millisecond'"
                    " FROM generate_series(1, %s) AS i"
                ).format(table),
                (terminal,),
            )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (topic, payload, state, available_at)"
                " SELECT %s, '{{\"n\": 1}}', 'pending', now() - interval '1 minute' + i * interval '1 microsecond'"
                " FROM generate_series(1, %s) AS i"
            ).format(table),
            (TOPIC, active),
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))


def _ms(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t0)


def interleaved(
    stores: dict[str, Any], n: int, worker: str, topic: str = TOPIC
) -> dict[str, dict[str, float]]:
    """Claim one job, settle it and renew 100 leases, *n* times on each store in turn (the order
    swapped every round, so that a load that comes and goes weighs on each); p50 and p99 in ms by
    store. Each store's 100 warm-up claims are held for the renewals, then settled."""
    times: dict[str, dict[str, list[float]]] = {k: {"claim": [], "settle": [], "renew": []} for k in stores}
    held: dict[str, list[HeldLease]] = {}
    for label, store in stores.items():
        claimed = store.worker.claim([topic], 100, worker, LEASE)
        held[label] = [HeldLease(c.id, c.claim_token) for c in claimed]
    labels = list(stores)
    for i in range(n):
        for label in labels if i % 2 == 0 else labels[::-1]:
            store = stores[label]
            got: list[Any] = []
            times[label]["claim"].append(
                _ms(lambda s=store, g=got: g.extend(s.worker.claim([topic], 1, worker, LEASE)))
            )
            outcome = [Outcome(c.id, c.claim_token, State.DONE) for c in got]
            times[label]["settle"].append(_ms(lambda s=store, o=outcome: s.worker.settle_many(o)))
            times[label]["renew"].append(
                _ms(
                    lambda s=store, h=held[label]: s.worker.beat(
                        EngineProof("bench", "bench", 1, LEASE, LEASE / 3), h
                    )
                )
            )
    for label, store in stores.items():
        store.worker.settle_many([Outcome(h.id, h.claim_token, State.DONE) for h in held[label]])
    out: dict[str, dict[str, float]] = {}
    for label in stores:
        out[label] = {f"{what}_p50_ms": pct(v, 50) for what, v in times[label].items()}
        out[label].update({f"{what}_p99_ms": pct(v, 99) for what, v in times[label].items()})
    return out


def w10_big_table(dsn: str, terminal: int, active: int, n: int = 300) -> dict[str, Any]:
    out: dict[str, Any] = {"terminal": terminal, "active": active, "ops": n}
    worker = "bench:w10"
    with (
        fresh_schema(dsn, "w10f") as fresh_s,
        fresh_schema(dsn, "w10b") as big_s,
        store_on(dsn, fresh_s, max_size=2) as fresh,
        store_on(dsn, big_s, max_size=2) as big,
    ):
        t0 = time.perf_counter()
        _fill(dsn, fresh_s, 0, active)
        _fill(dsn, big_s, terminal, active)
        out["fill_s"] = round(time.perf_counter() - t0, 1)
        out.update(interleaved({"fresh": fresh, "big": big}, n, worker))
    out["ratios_p50"] = {
        what: out["big"][f"{what}_p50_ms"] / out["fresh"][f"{what}_p50_ms"]
        for what in ("claim", "settle", "renew")
    }
    return out
