"""PostgreSQL's own ceilings on this machine: raw psycopg inserts and the pgbench claim script."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql

from brooq_py import devdb

HERE = Path(__file__).resolve().parent
PAYLOAD = json.dumps({"n": 1, "what": "bench"})


def raw_table(conn: psycopg.Connection[Any], schema: str) -> sql.Composed:
    table = sql.Identifier(schema, "raw_job")
    conn.execute(
        sql.SQL("CREATE TABLE IF NOT EXISTS {} (id uuid PRIMARY KEY, payload jsonb NOT NULL)").format(table)
    )
    conn.commit()
    return sql.SQL("INSERT INTO {} (id, payload) VALUES (%s, %s::jsonb)").format(table)


def raw_insert_commit(dsn: str, schema: str, n: int) -> dict[str, float]:
    """One connection, INSERT one jsonb row + COMMIT, *n* times."""
    with psycopg.connect(dsn) as conn:
        insert = raw_table(conn, schema)
        t0 = time.perf_counter()
        for _ in range(n):
            conn.execute(insert, (uuid.uuid4(), PAYLOAD))
            conn.commit()
        dt = time.perf_counter() - t0
    return {"n": n, "seconds": dt, "per_s": n / dt}


def raw_executemany(dsn: str, schema: str, n: int, batch: int = 1000) -> dict[str, float]:
    """One connection, executemany of *batch* rows per transaction."""
    with psycopg.connect(dsn) as conn:
        insert = raw_table(conn, schema)
        t0 = time.perf_counter()
        with conn.cursor() as cur:
            for start in range(0, n, batch):
                cur.executemany(insert, [(uuid.uuid4(), PAYLOAD) for _ in range(min(batch, n - start))])
                conn.commit()
        dt = time.perf_counter() - t0
    return {"n": n, "seconds": dt, "per_s": n / dt}


def find_pgbench() -> str | None:
    """pgbench beside the server binaries devdb would use, else on PATH."""
    try:
        candidate = devdb.find_bindir() / "pgbench"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    except devdb.DevDatabaseError:
        pass
    return shutil.which("pgbench")


def pgbench_ceiling(
    dsn: str, schema: str, seconds: int, rows: int = 100_000, clients: int = 4, threads: int = 2
) -> dict[str, Any]:
    """The one-commit-per-job ceiling: pgbench_claim.sql on a *rows*-row table, partial index on ready rows."""
    exe = find_pgbench()
    if exe is None:
        return {"error": "pgbench not found"}
    table = sql.Identifier(schema, "pgbench_claim")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'pending',"
                " payload jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(table)
        )
        conn.execute(
            sql.SQL("INSERT INTO {} (payload) SELECT %s::jsonb FROM generate_series(1, %s)").format(table),
            (PAYLOAD, rows),
        )
        conn.execute(sql.SQL("CREATE INDEX ON {} (id) WHERE state = 'pending'").format(table))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
    params = conninfo.conninfo_to_dict(dsn)
    env = dict(os.environ)
    for key, var in (
        ("host", "PGHOST"),
        ("port", "PGPORT"),
        ("user", "PGUSER"),
        ("dbname", "PGDATABASE"),
        ("password", "PGPASSWORD"),
    ):
        if params.get(key):
            env[var] = str(params[key])
    env["PGOPTIONS"] = f"-c search_path={schema}"
    cmd = [
        exe,
        "-n",
        "-c",
        str(clients),
        "-j",
        str(threads),
        "-T",
        str(seconds),
        "-f",
        str(HERE / "pgbench_claim.sql"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=seconds + 60)
    if proc.returncode != 0:
        return {"error": f"pgbench exited {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", proc.stdout)
    if m is None:
        m = re.search(r"tps = ([0-9.]+)", proc.stdout)
    lat = re.search(r"latency average = ([0-9.]+) ms", proc.stdout)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE state = 'done'").format(table)).fetchone()
    done = int(row[0]) if row else 0
    return {
        "per_s": float(m.group(1)) if m else float("nan"),
        "latency_avg_ms": float(lat.group(1)) if lat else None,
        "seconds": seconds,
        "clients": clients,
        "threads": threads,
        "rows": rows,
        "jobs_done": done,
        "command": " ".join(cmd[1:]),
    }
