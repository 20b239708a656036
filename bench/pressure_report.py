"""What bench/pressure.py makes of a run: the children's reports, the 5 s windows, the verdicts
against SPEC B1, the plot and the summary lines."""

from __future__ import annotations

import itertools
import math
import queue
import threading
from pathlib import Path
from typing import Any

from pressure_systems import SYSTEMS
from util import pct


class Events:
    """The children's reports, drained from their queue by a thread: (role, time, count, lat)."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.rows: list[tuple[str, float, int, list[Any]]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while not self.stop.is_set():
            try:
                row = self.out.get(timeout=0.2)
            except queue.Empty:
                continue
            with self.lock:
                self.rows.append(row)
            if row[0] == "error":
                print(f"    child failed: {row[3][0]}", flush=True)

    def total(self, role: str, until: float = math.inf) -> int:
        with self.lock:
            return sum(c for r, t, c, _ in self.rows if r == role and t <= until)

    def between(self, role: str, t0: float, t1: float) -> tuple[int, list[float]]:
        count, lat = 0, []
        with self.lock:
            for r, t, c, ls in self.rows:
                if r == role and t0 < t <= t1:
                    count += c
                    lat.extend(ls)
        return count, lat

    def errors(self) -> list[str]:
        with self.lock:
            return [ls[0] for r, _, _, ls in self.rows if r == "error"]

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def windows(
    events: Events, samples: list[dict[str, Any]], cal: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """One row per sample: the rates, latencies and backlog of the window that ends at it."""
    preload = cal["preloaded"] if cal else 0
    rows = []
    for prev, cur in itertools.pairwise(samples):
        t0, t1 = prev["t"], cur["t"]
        enq, _ = events.between("enq", t0, t1)
        done, lat = events.between("done", t0, t1)
        tables = cur["tables"]
        rows.append(
            {
                "t": round(t1, 3),
                "enq_per_s": round(enq / (t1 - t0), 1),
                "done_per_s": round(done / (t1 - t0), 1),
                "started": len(lat),
                "p50_ms": round(pct(lat, 50), 2) if lat else None,
                "p99_ms": round(pct(lat, 99), 2) if lat else None,
                "backlog": cur["ready"],
                "unfinished": preload + events.total("enq", t1) - events.total("done", t1),
                "dead": sum(x["dead"] for x in tables.values()),
                "live": sum(x["live"] for x in tables.values()),
                "total_bytes": sum(x["total_bytes"] for x in tables.values()),
                "oldest_xact_s": cur["oldest_xact_s"],
                "tables": tables,
            }
        )
    return rows


# --- verdicts (SPEC B1) --------------------------------------------------------------------------


def _last(t0: float, t1: float, seconds: float = 60.0) -> tuple[float, float]:
    return max(t0, t1 - seconds), t1


def verdicts(res: dict[str, Any], events: Events, samples: list[dict[str, Any]]) -> dict[str, Any]:
    ph = {p["name"]: p for p in res["phases"]}
    rows = res["windows"]
    rate = res["rate"]
    out: dict[str, Any] = {}
    main = SYSTEMS[res["system"]].main_table().split(".")[-1].strip('"')

    def in_range(t0: float, t1: float) -> list[dict[str, Any]]:
        return [w for w in rows if t0 < w["t"] <= t1]

    triples = (("clean", "hold", "recovery"), ("clean2", "rr", "recovery2"), ("clean", "rr", "recovery"))
    for clean_name, phase, rec_name in triples:
        if phase in out or not {clean_name, phase, rec_name} <= ph.keys():
            continue  # a run of one pressure phase (--pressure hold or rr); rr of a run of both: its own
        clean, p, rec = ph[clean_name], ph[phase], ph[rec_name]
        c_ws = in_range(clean["t0"], clean["t1"])
        _, c_lat = events.between("done", clean["t0"], clean["t1"])
        clean_p99 = pct(c_lat, 99)
        clean_backlog = max((w["backlog"] for w in c_ws), default=0)
        clean_dead = max((w["dead"] for w in c_ws), default=0)
        a, b = _last(p["t0"], p["t1"])
        _, p_lat = events.between("done", a, b)
        hold_p99 = pct(p_lat, 99)
        hold_backlog = max((w["backlog"] for w in in_range(a, b)), default=0)
        a, b = _last(rec["t0"], rec["t1"])
        _, r_lat = events.between("done", a, b)
        rec_p99 = pct(r_lat, 99)
        rec_ws = in_range(a, b)
        rec_dead = rec_ws[-1]["dead"] if rec_ws else None
        sizes = [w for w in rows if clean["t0"] < w["t"] <= rec["t1"]]
        before = c_ws[-1] if c_ws else None
        after = sizes[-1] if sizes else None

        def size_of(w: dict[str, Any] | None, table: str | None = None) -> int | None:
            if w is None:
                return None
            if table is None:
                return int(w["total_bytes"])
            return int(w["tables"].get(table, {}).get("total_bytes", 0))

        peak = max((w for w in sizes if p["t0"] < w["t"]), key=lambda w: w["total_bytes"], default=None)
        bounded = hold_backlog <= clean_backlog + 5 * rate
        latency_ok = bool(p_lat) and hold_p99 <= 3 * clean_p99
        recovered = (
            bool(r_lat)
            and rec_p99 <= 1.5 * clean_p99
            and rec_dead is not None
            and rec_dead <= 2 * max(clean_dead, 1)
        )
        out[phase] = {
            "clean_p99_ms": round(clean_p99, 2),
            "clean_backlog_max": clean_backlog,
            "clean_dead_max": clean_dead,
            "last_minute_p99_ms": round(hold_p99, 2),
            "last_minute_p99_x_clean": round(hold_p99 / clean_p99, 2) if clean_p99 else None,
            "last_minute_backlog_max": hold_backlog,
            "peak_backlog": max((w["backlog"] for w in in_range(p["t0"], p["t1"])), default=0),
            "recovery_last_minute_p99_ms": round(rec_p99, 2),
            "recovery_p99_x_clean": round(rec_p99 / clean_p99, 2) if clean_p99 else None,
            "recovery_end_dead": rec_dead,
            "recovery_dead_x_clean": round(rec_dead / max(clean_dead, 1), 2)
            if rec_dead is not None
            else None,
            "peak_dead": max((w["dead"] for w in sizes), default=0),
            "bytes_before": size_of(before),
            "bytes_peak": size_of(peak),
            "bytes_after": size_of(after),
            "main_table": main,
            "main_bytes_before": size_of(before, main),
            "main_bytes_peak": max((size_of(w, main) or 0 for w in sizes), default=None),
            "main_bytes_after": size_of(after, main),
            "backlog_bounded": bounded,
            "p99_within_3x": latency_ok,
            "recovered": recovered,
            "verdict": "PASS" if bounded and latency_ok and recovered else "MISS",
        }
    return out


# --- the plot ------------------------------------------------------------------------------------

_SHADE = {"hold": "#f4b6b6", "rr": "#f8d49a"}


def plot(results: list[dict[str, Any]], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot", flush=True)
        return False
    runs = [r for r in results if r.get("windows")]
    if not runs:
        return False
    panels = ("rates (jobs/s)", "enqueue -> start (ms)", "backlog (jobs)", "dead tuples", "queue tables (MB)")
    fig, axes = plt.subplots(
        len(panels), len(runs), figsize=(5.2 * len(runs), 13), squeeze=False, sharex="col"
    )
    for col, r in enumerate(runs):
        ws = r["windows"]
        start = next((p["t0"] for p in r.get("phases", []) if p["name"] == "clean"), ws[0]["t"])
        x = [(w["t"] - start) / 60 for w in ws]
        ax = axes[:, col]
        ax[0].plot(x, [w["enq_per_s"] for w in ws], label="enqueued", lw=1)
        ax[0].plot(x, [w["done_per_s"] for w in ws], label="completed", lw=1)
        ax[1].plot(x, [w["p50_ms"] or math.nan for w in ws], label="p50", lw=1)
        ax[1].plot(x, [w["p99_ms"] or math.nan for w in ws], label="p99", lw=1)
        ax[1].set_yscale("log")
        ax[2].plot(x, [w["backlog"] for w in ws], lw=1, color="C2")
        ax[3].plot(x, [w["dead"] for w in ws], lw=1, color="C3")
        ax[4].plot(x, [w["total_bytes"] / 2**20 for w in ws], lw=1, label="all queue tables")
        main = SYSTEMS[r["system"]].main_table().split(".")[-1].strip('"')
        ax[4].plot(x, [w["tables"].get(main, {}).get("total_bytes", 0) / 2**20 for w in ws], lw=1, label=main)
        head = r["system"]
        if "rate" in r:
            head += f" — {r['rate']:,.0f}/s, {r['workers']} workers"
        for name, v in (r.get("verdicts") or {}).items():
            head += f"\n{name}: {v['verdict']} (p99 x{v['last_minute_p99_x_clean']}, recovery x{v['recovery_p99_x_clean']})"
        if r.get("error"):
            head += f"\n{r['error'][:60]}"
        ax[0].set_title(head, fontsize=9)
        for i, a in enumerate(ax):
            for p in r.get("phases", []):
                if p["name"] in _SHADE:
                    a.axvspan(
                        (p["t0"] - start) / 60,
                        (p["t1"] - start) / 60,
                        color=_SHADE[p["name"]],
                        alpha=0.5,
                        lw=0,
                    )
            if col == 0:
                a.set_ylabel(panels[i])
            a.grid(alpha=0.3)
        for i in (0, 1, 4):
            ax[i].legend(fontsize=7, loc="upper left")
        ax[-1].set_xlabel("minutes (red: held xid, orange: REPEATABLE READ scans)")
    # one scale per row so the systems compare at a glance
    for row in axes:
        lo = min(a.get_ylim()[0] for a in row)
        hi = max(a.get_ylim()[1] for a in row)
        for a in row:
            a.set_ylim(lo, hi)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)
    return True


def summary_lines(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in results:
        if "verdicts" not in r:
            lines.append(f"{r['system']}: not run ({r.get('error', '?')})")
            continue
        lines.append(
            f"{r['system']}: clean drain {r['calibration']['drain_per_s']:,.0f}/s, producing {r['rate']:,.0f}/s"
            + (f" (stopped early: {r['error']})" if r.get("error") else "")
        )
        for phase, v in r["verdicts"].items():
            mb = 2**20
            lines.append(
                f"  {phase:5s} {v['verdict']}: backlog {'bounded' if v['backlog_bounded'] else 'GREW'}"
                f" (last minute max {v['last_minute_backlog_max']:,}, clean {v['clean_backlog_max']:,});"
                f" p99 {v['last_minute_p99_ms']:.1f} ms = {v['last_minute_p99_x_clean']} x clean"
                f" {v['clean_p99_ms']:.1f} (<= 3);"
                f" recovery p99 {v['recovery_p99_x_clean']} x (<= 1.5), dead {v['recovery_end_dead']:,}"
                f" = {v['recovery_dead_x_clean']} x clean {v['clean_dead_max']:,} (<= 2);"
                f" tables {v['bytes_before'] / mb:.1f} -> peak {(v['bytes_peak'] or 0) / mb:.1f}"
                f" -> {(v['bytes_after'] or 0) / mb:.1f} MB"
            )
    return lines
