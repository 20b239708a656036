"""TEN: what tenants cost and how fair their claims are (SPEC T4, T5).

``schema_cost``: W1 (one autocommit enqueue a job) and W3 (4 workers draining no-op jobs) in a schema
with migration 0019's trigger and indexes and in one without them (dropped; the columns stay, the
code reads them), alternating, several rounds; medians of the per-round ratios (with / without).
Jobs without a tenant fire no trigger and enter none of the new partial indexes: this measures
what they cost anyway (the WHEN clause, the index predicates).

``fair_drain``: the W3 drain with every job naming one of 1,000 tenants, against the same drain
naming none; ``claim_cost``: the p50 of one fair claim of 10 jobs with 10,000 tenants ready (two
jobs each) against one tenant with as many jobs; ``fairness``: T4 with an engine of 4 workers:
tenant A's backlog first, B's jobs enqueued once A runs (how many of A's jobs started after B's
enqueue before B's last), and two tenants backlogged at weights 3:1 (the A:B ratio in every
window of 1,000 starts).
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import psycopg
from cancel import _timed_drain, _timed_enqueues
from psycopg import sql
from util import fresh_schema, job_table, store_on, wait_all_done
from workloads import LEASE, PAYLOAD, TOPIC

from brooq_py.engine import Config, Engine
from brooq_py.queue import Job

_DROPS = (
    "DROP TRIGGER job_tenant_turn ON {job}",
    "DROP INDEX {fair}",
    "DROP INDEX {tenant}",
    "DROP INDEX {front}",
    "DROP INDEX {unnamed}",  # 0021: the jobs without a tenant of a tenant topic
)


def _drop_tenants(dsn: str, schema: str) -> None:
    names = {
        "job": job_table(schema),
        "fair": sql.Identifier(schema, "job_fair_idx"),
        "tenant": sql.Identifier(schema, "job_tenant_idx"),
        "front": sql.Identifier(schema, "job_turn_front_idx"),
        "unnamed": sql.Identifier(schema, "job_unnamed_idx"),
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        for drop in _DROPS:
            conn.execute(sql.SQL(drop).format(**names))


def _w1(dsn: str, n: int, tenants: bool) -> float:
    with fresh_schema(dsn, "ten1") as schema:
        if not tenants:
            _drop_tenants(dsn, schema)
        with store_on(dsn, schema, max_size=2) as store:
            return _timed_enqueues(store, n)


def _w3(dsn: str, n: int, tenants: bool) -> float:
    with fresh_schema(dsn, "ten3") as schema:
        if not tenants:
            _drop_tenants(dsn, schema)
        return _timed_drain(dsn, schema, n)


def schema_cost(dsn: str, n_w1: int, n_w3: int, rounds: int = 3) -> dict[str, Any]:
    """W1 and W3 of jobs without a tenant, with and without the tenants' trigger and indexes (0019, 0021)."""
    out: dict[str, Any] = {"rounds": rounds, "w1_n": n_w1, "w3_n": n_w3}
    for name, run, n in (("w1", _w1, n_w1), ("w3", _w3, n_w3)):
        pairs: list[tuple[float, float]] = []
        for r in range(rounds):
            if r % 2:
                with_t, without = run(dsn, n, True), run(dsn, n, False)
            else:
                without, with_t = run(dsn, n, False), run(dsn, n, True)
            pairs.append((without, with_t))
        out[name] = {
            "before_per_s": [round(a) for a, _ in pairs],
            "after_per_s": [round(b) for _, b in pairs],
            "ratios": [round(b / a, 3) for a, b in pairs],
            "ratio": statistics.median(b / a for a, b in pairs),
        }
    return out


def _seed(store: Any, n: int, tenants: int) -> None:
    for start in range(0, n, 1000):
        size = min(1000, n - start)
        store.enqueue_many(
            [
                Job(TOPIC, PAYLOAD, tenant=None if not tenants else f"t{(start + i) % tenants}")
                for i in range(size)
            ]
        )


def _drain(dsn: str, n: int, tenants: int) -> float:
    with fresh_schema(dsn, "tend") as schema, store_on(dsn, schema, max_size=8) as store:
        _seed(store, n, tenants)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))
            engine = Engine(store, Config(workers=4, lease=LEASE))
            engine.register_kind(TOPIC, lambda ctx, claim: None)
            t0 = time.perf_counter()
            engine.start()
            t_end = wait_all_done(conn, schema, deadline_s=max(120.0, n / 50))
            engine.stop()
            engine.close()
    if t_end is None:
        raise RuntimeError("not drained in time")
    return n / (t_end - t0)


def fair_drain(dsn: str, n: int, rounds: int = 3, tenants: int = 1000) -> dict[str, Any]:
    """The W3 drain spread over *tenants* tenants against the same drain without tenants."""
    pairs = []
    for r in range(rounds):
        if r % 2:
            spread, plain = _drain(dsn, n, tenants), _drain(dsn, n, 0)
        else:
            plain, spread = _drain(dsn, n, 0), _drain(dsn, n, tenants)
        pairs.append((plain, spread))
    return {
        "n": n,
        "tenants": tenants,
        "plain_per_s": [round(a) for a, _ in pairs],
        "tenants_per_s": [round(b) for _, b in pairs],
        "ratio": statistics.median(b / a for a, b in pairs),
    }


def _claims_p50(dsn: str, tenants: int, per_tenant: int, claims: int) -> float:
    with fresh_schema(dsn, "tenc") as schema, store_on(dsn, schema, max_size=2) as store:
        for start in range(0, tenants * per_tenant, 1000):
            size = min(1000, tenants * per_tenant - start)
            store.enqueue_many([Job(TOPIC, PAYLOAD, tenant=f"t{(start + i) % tenants}") for i in range(size)])
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(job_table(schema)))
        repo = store.worker
        repo.topic_settings()  # as an engine: the topic is known to name tenants
        took = []
        for _ in range(claims):
            t0 = time.perf_counter()
            got = repo.claim_limited(TOPIC, 10, "bench", LEASE)
            took.append(time.perf_counter() - t0)
            if len(got) != 10:
                raise RuntimeError(f"a claim took {len(got)} jobs")
        return statistics.median(took) * 1000


def claim_cost(dsn: str, claims: int = 200, tenants: int = 10_000) -> dict[str, Any]:
    """p50 of a fair claim of 10 with *tenants* tenants ready (2 jobs each) against one tenant."""
    one = _claims_p50(dsn, 1, 2 * tenants, claims)
    many = _claims_p50(dsn, tenants, 2, claims)
    return {"claims": claims, "tenants": tenants, "one_ms": one, "many_ms": many, "ratio": many / one}


def _run_recording(store: Any, workers: int, until: Any, during: Any = None) -> list[tuple[str, float]]:
    started: list[tuple[str, float]] = []
    lock = threading.Lock()

    def handler(ctx: Any, claim: Any) -> None:
        with lock:
            started.append((claim.payload["t"], time.perf_counter()))

    engine = Engine(store, Config(workers=workers, lease=LEASE))
    engine.register_kind(TOPIC, handler)
    engine.start()
    try:
        if during is not None:
            during(started, lock)
        deadline = time.perf_counter() + 600
        while not until(started) and time.perf_counter() < deadline:
            time.sleep(0.01)
    finally:
        engine.stop()
        engine.close()
    return started


def _series(started: list[tuple[str, float]], t0: float) -> dict[str, list[list[float]]]:
    """Each tenant's starts since *t0* over time from *t0* (s), one point per 10 ms step at most."""
    out: dict[str, list[list[float]]] = {}
    counts: dict[str, int] = {}
    for tenant, at in sorted(started, key=lambda x: x[1]):
        if at < t0:
            continue  # counted from t0
        counts[tenant] = counts.get(tenant, 0) + 1
        points = out.setdefault(tenant, [])
        x = round(at - t0, 2)
        if points and points[-1][0] == x:
            points[-1][1] = counts[tenant]
        else:
            points.append([x, counts[tenant]])
    return out


def plot_fairness(r: dict[str, Any], path: str) -> str | None:
    """Draw T4's starts per tenant over time (both runs) into *path*; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot", flush=True)
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    titles = {
        "backlog_series": f"B's {r['b']} jobs enqueued behind A's backlog of {r['a']:,}",
        "weighted_series": "A and B backlogged, weights 3:1",
    }
    for ax, (key, title) in zip(axes, titles.items(), strict=True):
        for tenant, points in sorted(r.get(key, {}).items()):
            ax.plot([p[0] for p in points], [p[1] for p in points], label=f"tenant {tenant}")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("seconds" + (" since B's enqueue" if key == "backlog_series" else ""))
        ax.set_ylabel("jobs started")
        ax.legend()
        ax.grid(alpha=0.3)
    if "backlog_series" in r:  # B's jobs against A's over the time B's jobs took
        b_end = r["backlog_series"].get("B", [[0.0, 0]])[-1][0]
        axes[0].set_xlim(0, max(0.05, b_end * 2))
        axes[0].set_ylim(0, max(r["b"] * 2, r["a_started_before_b_done"] * 2))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def fairness(
    dsn: str, a: int = 100_000, b: int = 100, workers: int = 4, weighted: int = 4000
) -> dict[str, Any]:
    """T4: B's jobs behind A's backlog, and two backlogged tenants at weights 3:1."""
    out: dict[str, Any] = {"a": a, "b": b, "workers": workers}
    with fresh_schema(dsn, "tenf") as schema, store_on(dsn, schema, max_size=4) as store:
        for start in range(0, a, 1000):
            store.enqueue_many([Job(TOPIC, {"t": "A"}, tenant="A") for _ in range(min(1000, a - start))])
        marks: dict[str, float] = {}

        def enqueue_b(started: list[tuple[str, float]], lock: threading.Lock) -> None:
            while len(started) < 200:
                time.sleep(0.005)
            marks["b"] = time.perf_counter()
            store.enqueue_many([Job(TOPIC, {"t": "B"}, tenant="B") for _ in range(b)])

        started = _run_recording(
            store, workers, lambda s: sum(1 for t, _ in s if t == "B") >= b, during=enqueue_b
        )
        last_b = max(at for t, at in started if t == "B")
        a_between = sum(1 for t, at in started if t == "A" and marks["b"] <= at <= last_b)
        out["a_started_before_b_done"] = a_between
        out["backlog_series"] = _series(started, marks["b"])
    with fresh_schema(dsn, "tenw") as schema, store_on(dsn, schema, max_size=4) as store:
        store.set_tenant_weight(TOPIC, "A", 3)
        for start in range(0, weighted, 1000):
            k = min(1000, weighted - start)
            store.enqueue_many([Job(TOPIC, {"t": "A"}, tenant="A") for _ in range(k)])
            store.enqueue_many([Job(TOPIC, {"t": "B"}, tenant="B") for _ in range(k)])
        started = _run_recording(store, workers, lambda s: len(s) >= weighted)
        order = [t for t, _ in sorted(started, key=lambda x: x[1])][:weighted]
        ratios = []
        for lo in range(0, len(order) - 999, 100):
            window = order[lo : lo + 1000]
            ratios.append(window.count("A") / max(1, window.count("B")))
        out["weighted_starts"] = len(order)
        out["weighted_series"] = _series(started, min(at for _, at in started))
        out["ratio_min"], out["ratio_max"] = min(ratios), max(ratios)
    return out


def _row(name: str, measured: str, target: str, ratio: float | None, ok: bool | None) -> dict[str, Any]:
    return {
        "workload": name,
        "measured": measured,
        "target": target,
        "ratio": None if ratio is None else round(ratio, 3),
        "verdict": "n/a" if ok is None else ("PASS" if ok else "MISS"),
    }


def ten_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """TEN (SPEC T4, T5): one row per target."""
    rows = []
    cost = r.get("cost", {})
    for name in ("w1", "w3"):
        if name in cost:
            x = cost[name]
            rows.append(
                _row(
                    f"TEN {name.upper()} without tenants, 0019 before/after",
                    f"ratios {x['ratios']}",
                    ">= 0.97 x before",
                    x["ratio"],
                    x["ratio"] >= 0.97,
                )
            )
    if "drain" in r:
        x = r["drain"]
        rows.append(
            _row(
                f"TEN W3 over {x['tenants']:,} tenants",
                f"{statistics.median(x['tenants_per_s']):,.0f}/s (none {statistics.median(x['plain_per_s']):,.0f}/s)",
                ">= 0.8 x without tenants",
                x["ratio"],
                x["ratio"] >= 0.8,
            )
        )
    if "claim" in r:
        x = r["claim"]
        rows.append(
            _row(
                f"TEN claim p50, {x['tenants']:,} tenants ready",
                f"{x['many_ms']:.2f} ms (one tenant {x['one_ms']:.2f} ms)",
                "<= 3 x one tenant",
                x["ratio"],
                x["ratio"] <= 3,
            )
        )
    if "fair" in r:
        x = r["fair"]
        rows.append(
            _row(
                f"TEN T4 B's {x['b']} behind A's {x['a']:,}",
                f"{x['a_started_before_b_done']} of A's started meanwhile",
                "< 300",
                None,
                x["a_started_before_b_done"] < 300,
            )
        )
        rows.append(
            _row(
                "TEN T4 weights 3:1, any 1,000 starts",
                f"{x['ratio_min']:.2f}..{x['ratio_max']:.2f}",
                "3:1 +-10 %",
                None,
                x["ratio_min"] >= 2.7 and x["ratio_max"] <= 3.3,
            )
        )
    return rows
