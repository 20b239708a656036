"""Run by .ci/wheel-check with the fresh virtualenv's Python, from a temporary directory: what a user
of the built wheel runs, against DATABASE_URL, on a schema of its own (dropped at the end).

1. the installed package is the wheel's (site-packages), not a checkout;
2. ``brooq-py migrate up`` on a fresh schema;
3. ``brooq-py enqueue demo ...`` and ``brooq-py worker --demo`` (surface on a free port) runs it;
4. the worker's surface serves ``/ui/`` and the dashboard's static files (200).
Exits non-zero with a message on any failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

import brooq_py

DEADLINE = 120.0


def fail(message: str) -> None:
    sys.exit(f"wheel_check: error: {message}")


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("brooq-py", path=str(Path(sys.executable).parent))
    if exe is None:
        fail("the brooq-py console script is not installed beside this Python")
    done = subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=DEADLINE)
    if done.returncode != 0:
        fail(f"brooq-py {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.status, answer.read()


def main() -> None:
    where = Path(brooq_py.__file__).resolve()
    if "site-packages" not in where.parts:
        fail(f"brooq_py was imported from {where}, not from the installed wheel")
    if Path("pyproject.toml").exists():
        fail("run from a directory without a checkout")
    print(f"brooq_py from {where.parent}")

    dsn = os.environ["DATABASE_URL"]
    schema = f"wheel_check_{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROOQ_", "QUEUE_"))}
    env.update(BROOQ_SCHEMA=schema, BROOQ_HTTP_ADDR="127.0.0.1:0", QUEUE_POLL_INTERVAL="200ms")
    worker: subprocess.Popen[str] | None = None
    try:
        revision = cli("migrate", "up", env=env).stdout.strip()
        print(f"migrate up: schema {schema} at {revision}")
        job_id = cli("enqueue", "demo", json.dumps({"msg": "from the wheel"}), env=env).stdout.strip()
        print(f"enqueued demo job {job_id}")

        log = Path("worker.log")
        with log.open("w") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "brooq_py", "worker", "--demo"], env=env, stderr=out, text=True
            )
        url = None
        state = None
        started = time.monotonic()
        while time.monotonic() - started < DEADLINE:
            if worker.poll() is not None:
                fail(f"the worker exited {worker.returncode}:\n{log.read_text()}")
            found = re.search(r"listening on (http://\S+)", log.read_text())
            url = found.group(1) if found else None
            state = json.loads(cli("get", job_id, env=env).stdout)["state"]
            if url and state == "done":
                break
            time.sleep(0.5)
        else:
            fail(f"the demo job is {state} and the surface at {url} after {DEADLINE:g}s:\n{log.read_text()}")
        print(f"demo job done; surface at {url}")

        for path in ("/ui/", "/ui/static/app.css", "/ui/static/app.js", "/healthz"):
            status, body = get(f"{url}{path}")
            if status != 200 or not body:
                fail(f"GET {path}: {status}, {len(body)} bytes")
            print(f"GET {path}: {status}, {len(body)} bytes")
        worker.send_signal(signal.SIGTERM)
        if worker.wait(timeout=DEADLINE) != 0:
            fail(f"the worker exited {worker.returncode} after SIGTERM:\n{log.read_text()}")
        worker = None
    finally:
        if worker is not None:
            worker.kill()
            worker.wait(timeout=30)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    print("wheel_check: ok")


if __name__ == "__main__":
    main()
