"""The pressure bench (SPEC B1): a queue under a held transaction horizon, brooq_py beside its peers.

    .venv/bin/python bench/pressure.py [--quick] [--systems brooq_py,pgqueuer,procrastinate]
        [--hold 600] [--clean 120] [--recovery 600] [--rate R] [--workers 4]

For each system in turn, on a throwaway PostgreSQL server of its own (started here from
`pg_config --bindir` with fsync on and the machine's defaults otherwise, its data directory
on disk under --datadir-base (the temp dir), stopped at the end; never the shared server): install the system's schema, measure its clean drain rate (a preload
of --calibrate jobs drained by the consumers), then keep a producer enqueueing at half that rate
(or --rate) while N workers with 1 ms handlers drain, through these phases:

    (calibration, VACUUM, warmup) clean -> hold (one session: BEGIN; SELECT txid_current();
    then idle) -> recovery
    -> clean -> rr (four REPEATABLE READ sessions scanning the job table) -> recovery

The rr sessions each keep one transaction open for --rr-tx seconds, counting the job table's
rows every --rr-pause seconds, then commit and begin again; they start a quarter of --rr-tx
apart, so some snapshot at most --rr-tx old always holds the horizon.

Every 5 s it records the enqueue and completion rates, enqueue-to-handler-start p50/p99 (the
producer stamps time.time() into the payload), the backlog (enqueued minus completed: ready
jobs plus at most N in flight), and each queue table's live and dead tuples and sizes
(pg_stat_user_tables, pg_total_relation_size, pg_indexes_size). It writes a JSON and a PNG
plot (the systems side by side) into bench/results/ and prints a verdict per system and
pressure phase against SPEC B1:

- backlog bounded: its maximum over the last minute of the pressure phase is at most the clean
  phase's maximum plus 5 s of production;
- claim p99 over the last minute of the pressure phase <= 3 x the clean phase's p99;
- recovered: over the last minute of the recovery, p99 <= 1.5 x clean and the queue tables'
  dead tuples <= 2 x their clean level (the clean phase's highest sample).

--quick shortens the phases (warmup 15 s, clean 30 s, hold 60 s, recovery 60 s) for a smoke run: its
recovery is shorter than autovacuum's default naptime, so its recovery verdicts say little.
Peers come from the `bench` extra (pip install -e '.[bench]'); one that cannot run is reported
with the reason and the others go on.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import multiprocessing as mp
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pressure_systems  # noqa: E402
import psycopg  # noqa: E402
from pressure_report import Events, plot, summary_lines, verdicts, windows  # noqa: E402
from pressure_systems import SYSTEMS  # noqa: E402

from brooq_py.devdb import ThrowawayServer  # noqa: E402
from brooq_py.devdb import process as devdb_process  # noqa: E402

SAMPLE_S = 5.0
log = logging.getLogger("bench.pressure")


# --- the server ----------------------------------------------------------------------------------


class DurableServer(ThrowawayServer):
    """devdb's throwaway server, spawned with the machine's defaults (fsync, synchronous_commit
    and full_page_writes on) instead of the test suite's fast, unsafe settings."""

    def _spawn_and_wait(self) -> None:
        fast = devdb_process._SERVER_SETTINGS
        # BENCH_PG_SETTINGS="name=value;name=value": more -c settings, e.g. auto_explain's.
        extra = tuple(s.strip() for s in os.environ.get("BENCH_PG_SETTINGS", "").split(";") if s.strip())
        devdb_process._SERVER_SETTINGS = ("listen_addresses=127.0.0.1", *extra)
        try:
            super()._spawn_and_wait()
        finally:
            devdb_process._SERVER_SETTINGS = fast


def filesystem(path: str) -> str:
    """The type of the file system *path* is on, from /proc/mounts ("?" when unknown)."""
    best, kind = "", "?"
    real = os.path.realpath(path)
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mount = parts[1]
            if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, kind = mount, parts[2]
    return kind


def server_settings(dsn: str) -> dict[str, str]:
    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers")
    names += ("max_connections", "autovacuum", "autovacuum_naptime", "autovacuum_vacuum_scale_factor")
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]


# --- what runs beside the queue ------------------------------------------------------------------


_TABLES = """
SELECT relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid), pg_relation_size(relid),
       pg_indexes_size(relid), autovacuum_count
FROM pg_stat_user_tables ORDER BY relname
"""
_HORIZON = """
SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0)
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
"""


class Sampler:
    """Every SAMPLE_S seconds: the queue tables' pg_stat_user_tables figures and sizes."""

    def __init__(self, dsn: str, ready_sql: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.ready_sql = ready_sql
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def take(self) -> None:
        t = time.time()
        tables = {
            str(name): {
                "live": int(live),
                "dead": int(dead),
                "total_bytes": int(total),
                "heap_bytes": int(heap),
                "index_bytes": int(idx),
                "autovacuums": int(av),
            }
            for name, live, dead, total, heap, idx, av in self.conn.execute(_TABLES).fetchall()
        }
        horizon = float(self.conn.execute(_HORIZON).fetchone()[0])  # type: ignore[index]
        ready = int(self.conn.execute(self.ready_sql).fetchone()[0])  # type: ignore[index]
        self.samples.append({"t": t, "tables": tables, "oldest_xact_s": round(horizon, 1), "ready": ready})

    def _run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            try:
                self.take()
            except psycopg.Error as exc:
                log.warning("sample failed: %s", exc)

    def start(self) -> None:
        self.take()
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.conn.close()


def hold_xid(dsn: str, stop: threading.Event) -> None:
    """An idle-in-transaction session holding an xid until *stop*."""
    with psycopg.connect(dsn) as conn:
        xid = conn.execute("SELECT txid_current()").fetchone()
        print(f"    holding xid {xid[0] if xid else '?'}", flush=True)
        stop.wait()
        conn.rollback()


def rr_scanner(dsn: str, table: str, delay: float, tx_s: float, pause: float, stop: threading.Event) -> None:
    """A REPEATABLE READ session counting *table* every *pause* s, a new transaction every *tx_s* s."""
    if stop.wait(delay):
        return
    with psycopg.connect(dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        while not stop.is_set():
            began = time.monotonic()
            while not stop.is_set() and time.monotonic() - began < tx_s:
                conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                stop.wait(pause)
            conn.commit()


# --- one system ----------------------------------------------------------------------------------


def phase_plan(args: argparse.Namespace) -> list[tuple[str, float]]:
    plan = [("clean", args.clean), ("hold", args.hold), ("recovery", args.recovery)]
    if args.pressure == "both":
        plan += [("clean2", args.clean), ("rr", args.hold), ("recovery2", args.recovery)]
    elif args.pressure == "rr":
        plan = [("clean", args.clean), ("rr", args.hold), ("recovery", args.recovery)]
    return plan


def run_system(name: str, args: argparse.Namespace) -> dict[str, Any]:
    system = SYSTEMS[name]
    res: dict[str, Any] = {"system": name, "load_at_start": os.getloadavg()}
    server = DurableServer()
    server.start()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    stops = {"consume": ctx.Event(), "produce": ctx.Event()}
    procs: dict[str, Any] = {}
    events = Events(out)
    sampler: Sampler | None = None
    try:
        dsn = server.dsn
        res["server"] = server_settings(dsn)
        res["queue_env"] = {k: v for k, v in os.environ.items() if k.startswith("QUEUE_")}
        res["pg_settings_added"] = os.environ.get("BENCH_PG_SETTINGS", "")
        system.install(dsn)
        n_cal = args.calibrate
        system.preload(dsn, n_cal)
        sampler = Sampler(dsn, system.ready_sql())
        sampler.start()
        procs["consume"] = ctx.Process(
            target=pressure_systems.run_role,
            args=(name, "consume", dsn, args.workers, stops["consume"], out),
            daemon=True,
        )
        t_cal = time.time()
        procs["consume"].start()
        deadline = time.monotonic() + args.calibrate_timeout
        while events.total("done") < n_cal and time.monotonic() < deadline:
            if not procs["consume"].is_alive():
                raise RuntimeError(f"the consumers exited: {events.errors() or 'no report'}")
            time.sleep(0.1)
        with events.lock:
            done_rows = [(t, c) for r, t, c, _ in events.rows if r == "done" and c]
        if not done_rows:
            raise RuntimeError(f"no job completed within {args.calibrate_timeout:g} s of calibration")
        cum, t_end = 0, done_rows[-1][0]
        for t, c in done_rows:
            cum += c
            if cum >= n_cal:
                t_end = t
                break
        t_first = done_rows[0][0] - 0.5  # the first report covers up to half a second before it
        drain_rate = min(cum, n_cal) / max(0.5, t_end - t_first)
        rate = args.rate or drain_rate / 2
        res["calibration"] = {
            "preloaded": n_cal,
            "drained": min(cum, n_cal),
            "seconds": round(t_end - t_first, 2),
            "drain_per_s": round(drain_rate, 1),
            "from_consumer_start_s": round(t_end - t_cal, 2),
        }
        res["rate"] = round(rate, 1)
        res["workers"] = args.workers
        print(f"    clean drain {drain_rate:,.0f} jobs/s; producing {rate:,.0f}/s", flush=True)
        # let the preload's tail finish before the producer starts, then vacuum away what the
        # calibration left (its dead index entries would slow the first clean minute's claims)
        while events.total("done") < n_cal and time.monotonic() < deadline + 30:
            time.sleep(0.1)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE)")
        procs["produce"] = ctx.Process(
            target=pressure_systems.run_role,
            args=(name, "produce", dsn, rate, stops["produce"], out),
            daemon=True,
        )
        procs["produce"].start()
        phases: list[dict[str, Any]] = []
        res["phases"] = phases  # filled as they end: a failure keeps the ones that ran
        for phase, length in [("warmup", args.warmup), *phase_plan(args)]:
            t0 = time.time()
            print(f"    {phase} {length:g} s ...", flush=True)
            stop = threading.Event()
            helpers: list[threading.Thread] = []
            if phase == "hold":
                helpers.append(threading.Thread(target=hold_xid, args=(dsn, stop), daemon=True))
            elif phase == "rr":
                for i in range(4):
                    helpers.append(
                        threading.Thread(
                            target=rr_scanner,
                            args=(
                                dsn,
                                system.main_table(),
                                i * args.rr_tx / 4,
                                args.rr_tx,
                                args.rr_pause,
                                stop,
                            ),
                            daemon=True,
                        )
                    )
            for h in helpers:
                h.start()
            end = time.monotonic() + length
            while time.monotonic() < end:
                for role, p in procs.items():
                    if not p.is_alive():
                        raise RuntimeError(f"the {role} process exited: {events.errors() or 'no report'}")
                time.sleep(0.2)
            stop.set()
            for h in helpers:
                h.join()
            phases.append({"name": phase, "t0": t0, "t1": time.time()})
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        print(f"    {name} failed: {res['error']}", flush=True)
    finally:
        for role in ("produce", "consume"):
            stops[role].set()
            p = procs.get(role)
            if p is not None:
                p.join(45)
                if p.is_alive():
                    p.terminate()
                    p.join(5)
        if sampler is not None:
            with contextlib.suppress(psycopg.Error):
                sampler.take()
            sampler.close()
        time.sleep(0.6)
        events.close()
        server.close()
    res["load_at_end"] = os.getloadavg()
    res["child_errors"] = events.errors()
    res["windows"] = windows(events, sampler.samples if sampler else [], res.get("calibration"))
    if len(res.get("phases", [])) == 1 + len(phase_plan(args)):
        res["verdicts"] = verdicts(res, events, sampler.samples if sampler else [])
    return res


# --- main ----------------------------------------------------------------------------------------


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short phases: clean 30, hold 60, recovery 60 s")
    ap.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}"
    )
    ap.add_argument("--hold", type=float, help="seconds of each pressure phase (600; quick 60)")
    ap.add_argument("--clean", type=float, help="seconds of each clean phase (120; quick 30)")
    ap.add_argument("--recovery", type=float, help="seconds of each recovery phase (600; quick 60)")
    ap.add_argument(
        "--warmup", type=float, help="seconds producing before the first clean phase (30; quick 15)"
    )
    ap.add_argument(
        "--rate", type=float, default=0.0, help="jobs/s to produce (default: half the clean drain)"
    )
    ap.add_argument("--workers", type=int, default=4, help="workers per system (4)")
    ap.add_argument("--calibrate", type=int, default=10_000, help="jobs drained to measure the clean rate")
    ap.add_argument("--calibrate-timeout", type=float, default=180.0)
    ap.add_argument(
        "--rr-tx", type=float, help="seconds each REPEATABLE READ transaction lasts (60; quick 20)"
    )
    ap.add_argument("--rr-pause", type=float, default=1.0, help="seconds between an rr session's scans (1)")
    ap.add_argument(
        "--datadir-base",
        default=tempfile.gettempdir(),
        help="where the servers' data directories go: a disk, so that fsync costs what it costs"
        " (default: the temp dir; devdb's own default, /dev/shm, is tmpfs)",
    )
    ap.add_argument(
        "--pressure",
        choices=("both", "hold", "rr"),
        default="both",
        help="which pressure phases to run: the held xid, the REPEATABLE READ scanners, or both (both)",
    )
    ap.add_argument("--out", help="path prefix of the JSON and PNG (bench/results/pressure-<mode>)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    quick = args.quick
    args.hold = args.hold or (60.0 if quick else 600.0)
    args.clean = args.clean or (30.0 if quick else 120.0)
    args.recovery = args.recovery or (60.0 if quick else 600.0)
    args.rr_tx = args.rr_tx or (20.0 if quick else 60.0)
    args.warmup = args.warmup or (15.0 if quick else 30.0)
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown system(s): {', '.join(unknown)}")
    mode = "quick" if quick else "full"
    if (args.hold, args.clean, args.recovery) not in ((60, 30, 60), (600, 120, 600)):
        mode = "custom"
    prefix = Path(args.out) if args.out else HERE / "results" / f"pressure-{mode}"
    if not args.out and len(names) < len(SYSTEMS):
        prefix = prefix.with_name(prefix.name + "-" + "+".join(names))
    prefix.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"pressure bench ({mode}): {', '.join(names)}; clean {args.clean:g} s, hold {args.hold:g} s,"
        f" recovery {args.recovery:g} s; {args.workers} workers, 1 ms handlers; nproc={os.cpu_count()},"
        f" load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    os.environ["BROOQ_DEVDB_TMPDIR"] = args.datadir_base  # read by devdb when a server starts
    fs = filesystem(args.datadir_base)
    print(f"  data directories under {args.datadir_base} ({fs})", flush=True)
    if fs in ("tmpfs", "ramfs"):
        print("  warning: on tmpfs a commit's fsync costs nothing; use --datadir-base on a disk", flush=True)
    signal.signal(signal.SIGTERM, _terminated)  # a kill runs the finally blocks: children and servers stop
    doc: dict[str, Any] = {
        "mode": mode,
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {
            "nproc": os.cpu_count(),
            "python": platform.python_version(),
            "load_at_start": os.getloadavg(),
            "datadir_base": args.datadir_base,
            "datadir_filesystem": fs,
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
        "results": [],
    }
    results: list[dict[str, Any]] = doc["results"]
    json_path, png = prefix.with_suffix(".json"), prefix.with_suffix(".png")
    title = (
        f"pressure bench ({mode}): clean {args.clean:g} s, hold {args.hold:g} s, recovery {args.recovery:g} s"
    )
    drew = False
    for name in names:
        print(f"  {name}", flush=True)
        try:
            results.append(run_system(name, args))
        except Exception as exc:  # the server would not start, say: report it and go on
            results.append({"system": name, "error": f"{type(exc).__name__}: {exc}"})
            print(f"    {name} not run: {results[-1]['error']}", flush=True)
        # written after each system, so a run cut short keeps the systems it finished
        doc["summary"] = summary_lines(results)
        json_path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        drew = plot(results, png, title)
    print()
    print("\n".join(doc["summary"]))
    print(f"wrote {json_path}" + (f" and {png}" if drew else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
