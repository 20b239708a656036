"""brooq_py benchmarks: the hot path against PostgreSQL's own ceilings on this machine.

    .venv/bin/python bench/run.py [--quick | --full] [--only W3,W4] [--out PATH]

Runs the PostgreSQL ceilings (raw psycopg INSERT+COMMIT, executemany, the pgbench
one-commit-per-job claim script) and the workloads W1-W7 (W1a, W2a: W1 and W2 through
AsyncStore) plus W0 (row versions per job in W1 and W3, heartbeat writes to a long
job's row), the memory drain and CXL (the cancel trigger's cost on W1 and W3,
cancel-to-ctx latency), DS (durable steps: a 3-step drain against a plain one, the
durable statements per job, signal-to-resume latency),
each in a fresh schema of the database brooq_py.devdb.acquire() finds, prints a
table with PASS/MISS against each target and writes the figures to
bench/results/latest.json. Ratios are taken within this run on this server only.

Not run here: the pressure bench (SPEC B1, a held transaction horizon, brooq_py beside
pgqueuer and procrastinate on throwaway servers of its own), bench/pressure.py, or
`make bench-pressure` (about 2.5 hours; ARGS=--quick for a 20-minute smoke run).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import async_producer  # noqa: E402
import baselines  # noqa: E402
import batches  # noqa: E402
import big_table  # noqa: E402
import cancel  # noqa: E402
import durable  # noqa: E402
import flow  # noqa: E402
import history  # noqa: E402
import limits  # noqa: E402
import psycopg  # noqa: E402
import results_cost  # noqa: E402
import scale  # noqa: E402
import scrape  # noqa: E402
import sequences  # noqa: E402
import tenants  # noqa: E402
import w7  # noqa: E402
import w8  # noqa: E402
import web  # noqa: E402
import workflows  # noqa: E402
import workloads  # noqa: E402
from util import fresh_schema  # noqa: E402

from brooq_py import devdb  # noqa: E402

WORKLOADS = (
    "W1",
    "W2",
    "W1a",
    "W2a",
    "W3",
    "W0",
    "W3b",
    "W4",
    "W5",
    "W5b",
    "W6",
    "W7",
    "W8",
    "W9",
    "RET",
    "MEM",
    "DASH",
    "SCRAPE",
    "Q3",
    "UNQ",
    "CAP",
    "RATE",
    "RES",
    "W10",
    "W10H",
    "CXL",
    "WF",
    "DS",
    "SQ",
    "TEN",
    "BATCH",
)
# Run only by --full or when named in --only: the 10,000,000-row table takes minutes to build.
FULL_ONLY = frozenset({"W10", "W10H"})

_DEFAULT: dict[str, Any] = dict(
    raw=20_000,
    many=20_000,
    w1=20_000,
    w2=20_000,
    w3=20_000,
    w4=200,
    w5_others=100_000,
    w5_claims=200,
    w6_ticks=30,
    w7=20_000,
    mem=40_000,
    pgbench_s=10,
    w5b_scheduled=1_000_000,
    w5b_failed=100_000,
    w8=12_000,
    w9=1000,
    ret_expired=1_000_000,
    dash=1_000_000,
    w10_terminal=9_900_000,
    w10_active=100_000,
    cxl_w1=5_000,
    cxl_w3=10_000,
    cxl_latency=200,
    wf_parents=10_000,
    ds_signals=200,
    ten_tenants=10_000,
    ten_a=100_000,
)

SIZES: dict[str, dict[str, Any]] = {
    "quick": dict(
        raw=1000,
        many=2000,
        w1=1000,
        w2=2000,
        w3=2000,
        w4=20,
        w5_others=10_000,
        w5_claims=50,
        w6_ticks=10,
        w7=1000,
        mem=3000,
        pgbench_s=3,
        w5b_scheduled=50_000,
        w5b_failed=5000,
        w8=2000,
        w9=200,
        ret_expired=50_000,
        dash=50_000,
        w10_terminal=200_000,
        w10_active=10_000,
        cxl_w1=500,
        cxl_w3=1000,
        cxl_latency=20,
        wf_parents=1000,
        ds_signals=30,
        ten_tenants=2000,
        ten_a=10_000,
    ),
    "default": _DEFAULT,
    # the long variants: a 200k-job memory drain, a bigger W7, longer ceilings
    "full": {**_DEFAULT, "w7": 40_000, "mem": 200_000, "pgbench_s": 20},
}


def machine(db: devdb.DevDatabase) -> dict[str, Any]:
    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("server_version", "fsync", "synchronous_commit", "shared_buffers", "max_connections")
        }
        version = conn.execute("SELECT version()").fetchone()[0]  # type: ignore[index]
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "postgresql": version,
        "pg_settings": settings,
        "db_how": db.how,
        "db_dsn": devdb.mask_dsn(db.dsn),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def flow_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """UNQ, CAP, RATE (SPEC U1, F1, F2): one row per target."""
    rows: list[dict[str, Any]] = []

    def add(name: str, measured: str, target: str, ratio: float | None, ok: bool | None) -> None:
        rows.append(
            {
                "workload": name,
                "measured": measured,
                "target": target,
                "ratio": None if ratio is None else round(ratio, 3),
                "verdict": verdict(ok),
            }
        )

    u = r.get("UNQ", {})
    if "w1" in u:
        x = u["w1"]
        add(
            "UNQ W1 with unique keys",
            f"{x['unique_per_s']:,.0f}/s (without {x['plain_per_s']:,.0f}/s)",
            ">= 0.95 x without",
            x["ratio"],
            x["ratio"] >= 0.95,
        )
    if "w2" in u:
        x = u["w2"]
        add(
            "UNQ W2 with unique keys",
            f"{x['unique_per_s']:,.0f}/s (keys only {x['keyed_per_s']:,.0f}/s)",
            "(vs W2's keys only)",
            x["ratio"],
            None,
        )
    for name, x in r.get("CAP", {}).items():
        if "ratio" in x:
            add(
                f"CAP W1 capped, {name} (to {x['deepest']:,})",
                f"{x['capped_per_s']:,.0f}/s (uncapped {x['plain_per_s']:,.0f}/s)",
                ">= 0.9 x uncapped",
                x["ratio"],
                x["ratio"] >= 0.9,
            )
    rate = r.get("RATE", {})
    for name, x in rate.get("achieved", {}).items():
        add(
            f"RATE achieved at {name}",
            f"{x['achieved_per_s']:,.1f}/s",
            "<= limit, near it (+1 %: done times)",
            x["ratio"],
            0.8 <= x["ratio"] <= 1.01,
        )
    if "w3" in rate:
        x = rate["w3"]
        add(
            "RATE W3 beside a 10/s topic",
            f"ratios {x['ratios']}",
            ">= 0.95 x alone",
            x["ratio"],
            x["ratio"] >= 0.95,
        )
    return rows


def evaluate(r: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target: workload, measured, target, ratio, verdict."""
    rows: list[dict[str, Any]] = []
    base = r.get("baselines", {})
    raw = base.get("raw_insert_commit", {}).get("per_s")
    ceilings = base.get("pgbench_runs", [])

    def add(name: str, measured: str, target: str, ratio: float | None, ok: bool | None) -> None:
        rows.append(
            {
                "workload": name,
                "measured": measured,
                "target": target,
                "ratio": None if ratio is None or math.isnan(ratio) else round(ratio, 3),
                "verdict": verdict(ok),
            }
        )

    if raw:
        add("raw autocommit INSERT", f"{raw:,.0f}/s", "(W1's baseline)", None, None)
    if "raw_executemany" in base:
        add(
            "raw executemany", f"{base['raw_executemany']['per_s']:,.0f} rows/s", "(bar 37-45k/s)", None, None
        )
    for c in ceilings:
        measured = f"{c['per_s']:,.0f} jobs/s" if "per_s" in c else c.get("error", "?")
        add(f"pgbench ceiling (before {c['before']})", measured, "(bar 1,900-2,800/s)", None, None)
    if "W1" in r:
        v, ratio = r["W1"]["per_s"], r["W1"]["ratio"]
        add(
            "W1 enqueue one/tx",
            f"{v:,.0f}/s (raw {r['W1']['raw_per_s']:,.0f}/s)",
            ">= 0.95 x autocommit INSERT",
            ratio,
            ratio >= 0.95,
        )
    if "W2" in r:
        v, ratio = r["W2"]["per_s"], r["W2"]["ratio"]
        add(
            "W2 enqueue_many x1000, keys",
            f"{v:,.0f}/s (COPY {r['W2']['copy_per_s']:,.0f}/s)",
            ">= 0.5 x COPY",
            ratio,
            ratio >= 0.5,
        )
    if "W1a" in r:  # AsyncStore beside the sync Store, interleaved in one run
        v, ratio = r["W1a"]["per_s"], r["W1a"]["ratio"]
        add("W1a async enqueue one/tx", f"{v:,.0f}/s", "(vs sync Store, same run)", ratio, None)
    if "W2a" in r:
        v = r["W2a"]["per_s"]
        add("W2a async enqueue_many x1000", f"{v:,.0f}/s", ">= 40,000/s", None, v >= 40_000)
    for key, need in (("W3", 1.0), ("W3b", 2.5)):
        if key in r:
            w = r[key]
            if "per_s" not in w:
                add(
                    f"{key} drain workers={w['workers']}",
                    w.get("error", "?"),
                    f">= {need} x ceiling",
                    None,
                    False,
                )
            elif w.get("ceiling_per_s"):
                ratio = w["per_s"] / w["ceiling_per_s"]
                add(
                    f"{key} drain workers={w['workers']}",
                    f"{w['per_s']:,.0f} jobs/s",
                    f">= {need:g} x ceiling",
                    ratio,
                    ratio >= need,
                )
    rows.extend(w0_rows(r))
    if "W4" in r:
        w = r["W4"]
        p50, p99 = w["from_call_p50_ms"], w["from_call_p99_ms"]
        ok = p50 <= 2 and p99 <= 8 and w["started"] == w["n"]
        add(
            "W4 enqueue call->start",
            f"p50 {p50:.2f} / p99 {p99:.2f} ms (from commit {w['p50_ms']:.2f} / {w['p99_ms']:.2f})",
            "p50<=2, p99<=8 ms",
            None,
            ok,
        )
    if "W5" in r:
        w = r["W5"]
        worst = max(w["ratio_found_p50"], w["ratio_empty_p50"])
        add(
            "W5 claim, 100k others",
            f"found {w['backlog']['found_p50_ms']:.2f} / empty {w['backlog']['empty_p50_ms']:.2f} ms p50",
            "<= 2 x empty table",
            worst,
            worst <= 2.0,
        )
    if "W5b" in r:
        w = r["W5b"]
        worst = max(w["ratio_found_p50"], w["ratio_empty_p50"])
        add(
            f"W5b claim, {w['scheduled']:,} scheduled + {w['failed']:,} failed same topic",
            f"found {w['waiting']['found_p50_ms']:.2f} (empty table {w['empty']['found_p50_ms']:.2f}) ms p50",
            "<= 2 x empty table",
            worst,
            worst <= 2.0,
        )
    if "W8" in r:
        w = r["W8"]
        ok = w["ratio"] >= 0.8 and w["threads_max"] <= 64
        add(
            f"W8 {w['n']:,} async jobs, sleep 100 ms, workers={w['workers']}",
            f"{w['per_s']:,.0f}/s, {w['threads_max']} threads",
            ">= 0.8 x 5,000/s, <= 64 threads",
            w["ratio"],
            ok,
        )
        if w.get("rss_drift_pct") is not None:
            add(
                "memory across W8",
                f"RSS {w['rss_warm_mb']:.0f} -> max {w['rss_max_mb']:.0f} MiB ({w['rss_drift_pct']:.1f} %)",
                "flat +-10 %",
                None,
                w["rss_drift_pct"] <= 10,
            )
    if "W9" in r:
        w = r["W9"]
        ok = w["p50_ms"] <= 50 and w["p99_ms"] <= 250 and w["started"] == w["n"]
        add(
            f"W9 {w['n']:,} scheduled 5-15 s ahead",
            f"late p50 {w['p50_ms']:.1f} / p99 {w['p99_ms']:.1f} ms",
            "p50<=50, p99<=250 ms",
            None,
            ok,
        )
    if "RET" in r:
        w = r["RET"]
        ok = w["rows_per_min_during_w3"] >= 50_000 and w["w3_ratio"] >= 0.8
        add(
            f"retention {w['expired']:,} expired during W3",
            f"{w['rows_per_min_during_w3']:,.0f} rows/min; W3 {w['w3_with_per_s']:,.0f} vs "
            f"{w['w3_without_per_s']:,.0f} jobs/s",
            ">= 50,000/min, W3 >= 0.8 x",
            w["w3_ratio"],
            ok,
        )
    if "W6" in r:
        w = r["W6"]
        ok = w["statements_per_tick"] == 1 and w["p99_ms"] <= 20 and w["renewed_min"] == w["in_flight"]
        add(
            "W6 renew 1,000 leases",
            f"{w['statements_per_tick']:g} stmt, p50 {w['p50_ms']:.1f} / p99 {w['p99_ms']:.1f} ms",
            "1 stmt, <= 20 ms",
            None,
            ok,
        )
    if "W7" in r:
        runs = r["W7"]["runs"]
        ceiling = r["W7"].get("ceiling_per_s")
        twice = sum(x["jobs_run_twice"] for x in runs)
        missing = any(x["distinct_jobs"] != x["n"] or x["runs"] != x["n"] for x in runs)
        grows = True
        for prev, cur in itertools.pairwise(runs):
            if "per_s" not in prev or "per_s" not in cur:
                grows = False
                continue
            saturated = bool(ceiling) and prev["per_s"] >= 0.8 * ceiling
            if cur["per_s"] < 1.05 * prev["per_s"] and not saturated:
                grows = False
        figures = " / ".join(f"{x['processes']}p {x.get('per_s', float('nan')):,.0f}" for x in runs)
        ratio = runs[-1].get("per_s", float("nan")) / ceiling if ceiling else None
        add(
            "W7 processes",
            f"{figures} jobs/s; twice={twice}",
            "grows to PG ceiling; none twice",
            ratio,
            grows and twice == 0 and not missing,
        )
    if "MEM" in r:
        m = r["MEM"]
        if m.get("rss_drift_pct") is None:
            add("memory drain", m.get("error", "no samples"), "RSS +-10 %", None, None)
        else:
            add(
                f"memory drain {m['n']:,}",
                f"RSS {m['rss_warm_mb']:.0f} -> max {m['rss_max_mb']:.0f} MiB ({m['rss_drift_pct']:.1f} %)",
                "flat +-10 %",
                None,
                m["rss_drift_pct"] <= 10,
            )
    if "W10" in r:
        w = r["W10"]
        ratios = w["ratios_p50"]
        worst = max(ratios.values())
        add(
            f"W10 {w['terminal'] + w['active']:,}-row table ({w['terminal']:,} terminal)",
            " / ".join(
                f"{k} {w['big'][k + '_p50_ms']:.2f} (fresh {w['fresh'][k + '_p50_ms']:.2f})" for k in ratios
            )
            + " ms p50",
            "<= 2 x fresh table",
            worst,
            worst <= 2.0,
        )
    if "W10H" in r:
        w = r["W10H"]
        ratios = w["ratios_p50"]
        worst = max(ratios.values())
        add(
            f"W10H beside {w['terminal']:,} ended jobs in {w['history_tables']} days of history",
            " / ".join(
                f"{k} {w['hist'][k + '_p50_ms']:.2f} (none {w['fresh'][k + '_p50_ms']:.2f})" for k in ratios
            )
            + " ms p50",
            "<= 1.1 x no history",
            worst,
            worst <= 1.1,
        )
        add(
            "W10H drain beside the history",
            f"{w['drain_per_s']['hist']:,.0f} jobs/s (none {w['drain_per_s']['fresh']:,.0f})",
            ">= 0.9 x no history",
            w["drain_ratio"],
            w["drain_ratio"] >= 0.9,
        )
        if "workflow_ratio" in w:
            add(
                "W10H workflow drain (parent, child after it) beside the history",
                f"{w['workflow_per_s']['hist']:,.0f} jobs/s (none {w['workflow_per_s']['fresh']:,.0f})",
                ">= 0.9 x no history",
                w["workflow_ratio"],
                w["workflow_ratio"] >= 0.9,
            )
        d = w["drop"]
        jobs = sum(n for _, n in d["days"])
        add(
            f"W10H retention drops a day of {jobs:,} jobs",
            f"{d['seconds']:.2f} s, {d['job_rows_deleted']} row versions deleted in job",
            "seconds, none per job",
            None,
            d["seconds"] < 10 and d["job_rows_deleted"] == 0,
        )
        m = w["move"]
        add(
            f"W10H mover, {m['rows']:,} ended jobs to their day",
            f"{m['per_s']:,} rows/s",
            "(off the hot path)",
            None,
            None,
        )
    if "DASH" in r:
        m = r["DASH"]["overview_read"]
        add(
            f"DASH topic overview read, {r['DASH']['n']:,} jobs",
            f"p50 {m['p50_ms']:.1f} / p99 {m['p99_ms']:.1f} ms",
            "(cached 2 s, or 5x the read)",
            None,
            None,
        )
        for page, m in r["DASH"]["pages"].items():
            cached = page == "topics (cached)"
            # A payload search reads a window of 1,000 jobs and probes each payload (no GIN index).
            bound = 50 if cached else 300 if "payload search" in page else 100
            add(
                f"DASH {page}, {r['DASH']['n']:,} jobs",
                f"p50 {m['p50_ms']:.1f} / p99 {m['p99_ms']:.1f} ms",
                f"p99 <= {bound} ms",
                None,
                m["p99_ms"] <= bound,
            )
    if "SCRAPE" in r:
        w = r["SCRAPE"]
        d = w["per_request_reads"]
        add(
            f"SCRAPE {w['requests']} concurrent /metrics",
            f"{w['statements_during_burst']} stmt (refresh: {w['refresh_statements']} per period, "
            f"{w['refresh_ms']:.1f} ms), p50 {w['p50_ms']:.1f} / p99 {w['p99_ms']:.1f} ms; "
            f"read per request: {d['statements']} stmt, p99 {d['p99_ms']:.0f} ms",
            "<= 1 refresh",
            None,
            w["ok"] == w["requests"] and w["statements_during_burst"] <= w["refresh_statements"],
        )
    if "Q3" in r:
        rows.extend(q3_rows(r["Q3"]))
    if "CXL" in r:
        rows.extend(cxl_rows(r["CXL"]))
    rows.extend(flow_rows(r))
    if "WF" in r and "error" not in r["WF"]:
        rows.extend(workflows.wf_rows(r["WF"]))
    if "SQ" in r and "error" not in r["SQ"]:
        rows.extend(sequences.sq_rows(r["SQ"]))
    if "BATCH" in r:
        rows.extend(batches.batch_rows(r["BATCH"]))
    if "RES" in r:
        rows.extend(results_cost.rows(r["RES"]))
    if "DS" in r:
        rows.extend(durable.ds_rows(r["DS"]))
    if "TEN" in r and "error" not in r["TEN"]:
        rows.extend(tenants.ten_rows(r["TEN"]))
    return rows


def w0_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """W0: row versions written to the job table per job in W1 and W3 (pg_stat_user_tables), and
    the writes to a long job's row while its handler runs with nothing to report."""
    rows: list[dict[str, Any]] = []
    for key, what, bound in (("W1", "W1 enqueue one/tx", 1), ("W3", "W3 drain workers=4", 3)):
        v = r.get(key, {}).get("row_versions")
        if not v or v.get("per_job") is None:
            continue
        over = v["versions"] - bound * v["jobs"]
        rows.append(
            {
                "workload": f"W0 row versions per job, {what}",
                "measured": f"{v['per_job']:.4f}: {v['ins']:,} ins + {v['upd']:,} upd ({v['hot_upd']:,} HOT)"
                f" + {v['del']:,} del for {v['jobs']:,} jobs" + (f", {over:,} over" if over > 0 else ""),
                "target": f"<= {bound}" + (" (enqueue, claim, done)" if bound == 3 else " (the enqueue)"),
                "ratio": None,
                "verdict": verdict(over <= 0),
            }
        )
    hb = r.get("W0")
    if hb and "writes_while_running" in hb:
        rows.append(
            {
                "workload": f"W0 heartbeat writes to a {hb['handler_s']:g} s job's row, lease {hb['lease_s']:g} s",
                "measured": f"{hb['writes_while_running']} while running; {hb['row_versions']['versions']} "
                f"versions in its life ({hb['updates_in_life']} upd)",
                "target": "0 while running",
                "ratio": None,
                "verdict": verdict(hb["writes_while_running"] == 0),
            }
        )
    return rows


def cxl_rows(c: dict[str, Any]) -> list[dict[str, Any]]:
    """The cancel trigger's cost on W1 and W3 (with / without, same run) and cancel-to-ctx latency."""
    rows = []
    for key, label in (("w1", "W1 enqueue one/tx"), ("w3", "W3 drain workers=4")):
        w = c["cost"][key]
        rows.append(
            {
                "workload": f"CXL {label} with the cancel trigger",
                "measured": f"{statistics.median(w['with_per_s']):,.0f} vs "
                f"{statistics.median(w['without_per_s']):,.0f}/s without",
                "target": ">= 0.97 x without",
                "ratio": round(w["ratio"], 3),
                "verdict": "PASS" if w["ratio"] >= 0.97 else "MISS",
            }
        )
    lat = c["latency"]
    ok = lat["p99_ms"] <= 1000 and lat["all_by_operator"]
    rows.append(
        {
            "workload": f"CXL cancel -> ctx, lease {lat['lease_s']:g} s, {lat['n']} cancels",
            "measured": f"p50 {lat['p50_ms']:.1f} / p99 {lat['p99_ms']:.1f} ms (max {lat['max_ms']:.1f})",
            "target": "p99 <= 1 s, JobCanceledByOperator",
            "ratio": None,
            "verdict": "PASS" if ok else "MISS",
        }
    )
    return rows


def q3_rows(q: dict[str, Any]) -> list[dict[str, Any]]:
    """W3 with a limited topic in the engine vs without (within 5 %), and the limited topic's rate."""
    w3, rate = q["w3"], q["rate"]
    rows = [
        {
            "workload": "Q3 W3 with a limited topic",
            "measured": f"{w3['with_limited_median']:,.0f} vs {w3['plain_median']:,.0f} jobs/s",
            "target": ">= 0.95 x W3 without",
            "ratio": round(w3["ratio"], 3),
            "verdict": "PASS" if w3["ratio"] >= 0.95 else "MISS",
        }
    ]
    for name, x in rate.items():
        ok = "per_s" in x and x["peak"] <= x["limit"]
        measured = f"{x['per_s']:,.0f} jobs/s, peak {x['peak']}" if "per_s" in x else x.get("error", "?")
        target = f"peak <= {x['limit']}" + (
            f", ideal {x['ideal_per_s']:,.0f}/s" if "ideal_per_s" in x else ""
        )
        rows.append(
            {
                "workload": f"Q3 limit {x['limit']}, {name}",
                "measured": measured,
                "target": target,
                "ratio": round(x["per_s"] / x["ideal_per_s"], 3)
                if "ideal_per_s" in x and "per_s" in x
                else None,
                "verdict": "PASS" if ok else "MISS",
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    heads = ("workload", "measured", "target", "ratio", "verdict")
    cells = [[str(row[h]) if row[h] is not None else "" for h in heads] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    line = "  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True))
    print(line)
    print("-" * len(line))
    for c in cells:
        print("  ".join(x.ljust(w) for x, w in zip(c, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a CI-sized smoke run of every workload")
    size.add_argument(
        "--full",
        action="store_true",
        help="the long variants (200k-job memory drain, W10); the held-horizon bench is"
        " separate: make bench-pressure (bench/pressure.py)",
    )
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(WORKLOADS)}")
    ap.add_argument("--out", default=str(HERE / "results" / "latest.json"), help="where to write the JSON")
    ap.add_argument("--no-write", action="store_true", help="print only, write no JSON")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    mode = "quick" if args.quick else "full" if args.full else "default"
    sz = SIZES[mode]
    only = {w.strip().upper() for w in args.only.split(",") if w.strip()}
    known = {w.upper() for w in WORKLOADS}
    if only - known:
        ap.error(f"unknown workload(s): {', '.join(sorted(only - known))}")
    selected = [
        w for w in WORKLOADS if (w.upper() in only if only else (w not in FULL_ONLY or mode == "full"))
    ]

    db = devdb.acquire()
    try:
        info = machine(db)
        print(
            f"brooq_py bench ({mode}): {info['db_how']} {info['db_dsn']}; nproc={info['nproc']}, "
            f"{info['memory_gib']} GiB, PostgreSQL {info['pg_settings']['server_version']} "
            f"(fsync={info['pg_settings']['fsync']}, synchronous_commit="
            f"{info['pg_settings']['synchronous_commit']})",
            flush=True,
        )
        results: dict[str, Any] = {"mode": mode, "machine": info, "sizes": sz, "baselines": {}}
        t_all = time.perf_counter()

        def step(name: str, fn: Any, *a: Any) -> Any:
            print(f"  {name} ...", end="", flush=True)
            t0 = time.perf_counter()
            out = fn(*a)
            print(f" {time.perf_counter() - t0:.1f}s", flush=True)
            return out

        # W1 runs the raw INSERT+COMMIT baseline itself, interleaved with its rounds; the pgbench
        # ceiling runs right before each drain it is compared with (W3, W3b, W7).
        if "W2" in selected:
            with fresh_schema(db.dsn, "raw") as schema:
                results["baselines"]["raw_executemany"] = step(
                    "raw executemany", baselines.raw_executemany, db.dsn, schema, sz["many"]
                )
        ceilings: list[dict[str, Any]] = []
        results["baselines"]["pgbench_runs"] = ceilings

        runs = {
            "W1": lambda: workloads.w1_enqueue_one(db.dsn, sz["w1"]),
            "W2": lambda: workloads.w2_enqueue_many(db.dsn, sz["w2"]),
            "W1a": lambda: async_producer.w1a_enqueue_one(db.dsn, sz["w1"]),
            "W2a": lambda: async_producer.w2a_enqueue_many(db.dsn, sz["w2"]),
            "W3": lambda: workloads.drain(db.dsn, sz["w3"], 4, "w3", versions=True),
            "W0": lambda: workloads.heartbeat_writes(db.dsn),
            "W3b": lambda: workloads.drain(db.dsn, sz["w3"], 32, "w3b"),
            "W4": lambda: workloads.w4_latency(db.dsn, sz["w4"]),
            "W5": lambda: workloads.w5_claim_backlog(db.dsn, sz["w5_others"], sz["w5_claims"]),
            "W6": lambda: workloads.w6_heartbeat(db.dsn, 1000, sz["w6_ticks"]),
            "W7": lambda: w7.w7(db.dsn, sz["w7"]),
            "W8": lambda: w8.w8_async_io(db.dsn, sz["w8"]),
            "MEM": lambda: workloads.memory_drain(db.dsn, sz["mem"]),
            "W5b": lambda: scale.w5b_claim_beside_waiting(
                db.dsn, sz["w5b_scheduled"], sz["w5b_failed"], sz["w5_claims"]
            ),
            "W9": lambda: scale.w9_scheduled_lateness(db.dsn, sz["w9"]),
            "RET": lambda: scale.retention_pace(db.dsn, sz["ret_expired"], sz["w3"]),
            "DASH": lambda: web.dashboard_latency(db.dsn, sz["dash"]),
            "SCRAPE": lambda: scrape.scrape_cost(db.dsn),
            "Q3": lambda: {
                "w3": limits.w3_with_limited(db.dsn, sz["w3"] // 2),
                "rate": limits.limited_rate(db.dsn, sz["w3"] // 4),
            },
            "UNQ": lambda: {
                "w1": flow.unique_w1(db.dsn, sz["w1"]),
                "w2": flow.unique_w2(db.dsn, sz["w2"]),
            },
            "CAP": lambda: flow.capped_w1(db.dsn, sz["w1"]),
            "RATE": lambda: {
                "achieved": flow.rate_achieved(db.dsn),
                "w3": flow.w3_beside_rated(db.dsn, sz["w3"] // 2),
            },
            "RES": lambda: results_cost.res(db.dsn, sz),
            "W10": lambda: big_table.w10_big_table(db.dsn, sz["w10_terminal"], sz["w10_active"]),
            "W10H": lambda: history.w10_history(db.dsn, sz["w10_terminal"], sz["w10_active"]),
            "CXL": lambda: {
                "cost": cancel.trigger_cost(db.dsn, sz["cxl_w1"], sz["cxl_w3"]),
                "latency": cancel.cancel_latency(db.dsn, sz["cxl_latency"]),
            },
            "WF": lambda: workflows.wf(db.dsn, sz["w3"], sz["wf_parents"]),
            "DS": lambda: durable.ds(db.dsn, sz),
            "SQ": lambda: sequences.sq(db.dsn, sz["w1"], sz["w3"]),
            "TEN": lambda: {
                "cost": tenants.schema_cost(db.dsn, sz["cxl_w1"], sz["cxl_w3"]),
                "drain": tenants.fair_drain(db.dsn, sz["w3"] // 2),
                "claim": tenants.claim_cost(db.dsn, tenants=sz["ten_tenants"]),
                "fair": tenants.fairness(db.dsn, a=sz["ten_a"]),
            },
            "BATCH": lambda: batches.batch(db.dsn, sz["w3"]),
        }
        for name in selected:
            ceiling = None
            if name in ("W3", "W3b", "W7"):
                with fresh_schema(db.dsn, "pgb") as schema:
                    ceiling = step(
                        f"pgbench claim ceiling (before {name})",
                        baselines.pgbench_ceiling,
                        db.dsn,
                        schema,
                        sz["pgbench_s"],
                    )
                ceiling["before"] = name
                ceilings.append(ceiling)
            try:
                results[name] = step(name, runs[name])
                if ceiling is not None:
                    results[name]["ceiling_per_s"] = ceiling.get("per_s")
                if name == "W1":
                    results["baselines"]["raw_insert_commit"] = {
                        "n": results[name]["n"],
                        "seconds": results[name]["raw_seconds"],
                        "per_s": results[name]["raw_per_s"],
                        "interleaved_with": "W1",
                        "what": "one autocommit INSERT per job",
                    }
                if name == "W2":
                    results["baselines"]["copy_like_job"] = {
                        "n": results[name]["n"],
                        "seconds": results[name]["copy_seconds"],
                        "per_s": results[name]["copy_per_s"],
                        "interleaved_with": "W2",
                    }
            except Exception as exc:  # one broken workload must not hide the others' figures
                print(f" failed: {type(exc).__name__}: {exc}", flush=True)
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results["total_seconds"] = round(time.perf_counter() - t_all, 1)
        rows = evaluate(
            {
                k: v
                for k, v in results.items()
                if not (isinstance(v, dict) and "error" in v and k in WORKLOADS)
            }
        )
        for name in selected:
            if isinstance(results.get(name), dict) and "error" in results[name]:
                rows.append(
                    {
                        "workload": name,
                        "measured": results[name]["error"],
                        "target": "",
                        "ratio": None,
                        "verdict": "MISS",
                    }
                )
        results["table"] = rows
        print()
        print_table(rows)
        print(f"\ntotal {results['total_seconds']}s")
        if not args.no_write:
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=2, default=str) + "\n")
            print(f"wrote {out}")
            fair = results.get("TEN", {}).get("fair") if isinstance(results.get("TEN"), dict) else None
            if fair and (drawn := tenants.plot_fairness(fair, str(out.parent / "tenants-fairness.png"))):
                print(f"wrote {drawn}")
    finally:
        db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
