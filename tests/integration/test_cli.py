"""The command line, driven as a subprocess against a real PostgreSQL (API "Service surface and
command line"; SPEC K2, K3, C11)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store, migrations
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from tests.polling import wait_for

PASSWORD = "Sup3r-Secret-Pw"


def cli_env(dsn: str, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("QUEUE_", "BROOQ_")) and k not in ("DATABASE_URL", "CREDENTIALS_DIRECTORY")
    }
    env["DATABASE_URL"] = dsn
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cli(
    *args: str, dsn: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brooq_py", *args],
        env=env if env is not None else cli_env(dsn),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def count_rows(dsn: str, schema: str, state: str | None = None) -> int:
    query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "job"))
    if state is not None:
        query = sql.SQL("{} WHERE state = %s").format(query)
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query, (state,) if state is not None else None).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def fresh_schema(dsn: str) -> Iterator[str]:
    """A schema name with nothing in it yet (migrate creates it); dropped afterwards."""
    name = "cli_" + uuid.uuid4().hex
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


# Seconds a worker subprocess may take to listen: a fresh interpreter imports the package (about a
# second of CPU), connects and starts its engine; a loaded 2-core machine took 10 to 16 s for that,
# and over 30 s beside a busy test run.
WORKER_STARTUP = 90.0


class Worker:
    """A worker subprocess whose stderr is collected line by line."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "brooq_py", *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def url(self) -> str:
        marker = "listening on "
        wait_for(
            lambda: marker in self.output or self.proc.poll() is not None,
            "the worker to listen",
            WORKER_STARTUP,
        )
        for line in self.lines:
            if marker in line:
                return line.split(marker, 1)[1].split()[0]
        raise AssertionError(f"the worker exited early:\n{self.output}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return rc

    def stopped_within(self, timeout: float, sig: int = signal.SIGTERM) -> str | None:
        """Send *sig* and wait up to *timeout* s: None once the process has exited, else what to say."""
        started = time.monotonic()
        self.proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        if self.proc.poll() is not None:
            return None
        return f"still running {time.monotonic() - started:.0f} s after {signal.Signals(sig).name}\n{self.output}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


# --- migrate ---------------------------------------------------------------------------------


def test_migrate_up_down_status_on_a_fresh_schema(dsn: str, fresh_schema: str, tmp_path: Path) -> None:
    """migrate status | up | down [--to REV] on DATABASE_URL, in the --schema given (SPEC S3)."""

    def migrate(*args: str) -> str:
        result = run_cli("migrate", *args, "--schema", fresh_schema, dsn=dsn, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert migrate("status") == "none"
    head = migrate("up")
    assert head != "none"
    assert migrate("status") == head == migrations.current(dsn, schema=fresh_schema)
    below = migrate("down")
    assert below not in ("none", head)
    assert migrations.current(dsn, schema=fresh_schema) == below
    assert migrate("up", "--to", head) == head
    assert migrate("down", "--to", "base") == "none"
    assert migrate("status") == "none"
    # --schema also works before the action.
    early = run_cli("migrate", "--schema", fresh_schema, "up", "--to", "0001", dsn=dsn, cwd=tmp_path)
    assert early.returncode == 0 and early.stdout.strip() == "0001"
    assert migrations.current(dsn, schema=fresh_schema) == "0001"

    bad = run_cli("migrate", "up", "--to", "nope", "--schema", fresh_schema, dsn=dsn, cwd=tmp_path)
    assert bad.returncode == 1 and "migrate up failed" in bad.stderr and "Traceback" not in bad.stderr


def test_schema_defaults_to_brooq_schema(dsn: str, fresh_schema: str, tmp_path: Path) -> None:
    env = cli_env(dsn, BROOQ_SCHEMA=fresh_schema)
    result = run_cli("migrate", "up", dsn=dsn, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert migrations.current(dsn, schema=fresh_schema) == result.stdout.strip()


# --- enqueue / get / cancel ---------------------------------------------------------------------


def test_enqueue_then_get(dsn: str, schema: str, tmp_path: Path, store: Store) -> None:
    first = run_cli(
        "enqueue", "email.send", '{"to": "a@b"}', "--key", "k-1", "--priority", "5", "--delay", "1h",
        "--schema", schema, dsn=dsn, cwd=tmp_path,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    job_id = first.stdout.strip()
    uuid.UUID(job_id)
    assert "(existing)" not in first.stderr

    again = run_cli("enqueue", "email.send", "{}", "--key", "k-1", "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.strip() == job_id
    assert "(existing)" in again.stderr

    got = run_cli("get", job_id, "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    row = json.loads(got.stdout)
    assert (
        row["id"] == job_id and row["topic"] == "email.send" and row["state"] == "scheduled"
    )  # S5: due in 1h
    assert row["payload"] == {"to": "a@b"} and row["priority"] == 5 and row["idempotency_key"] == "k-1"
    stored = store.get(job_id)
    assert stored is not None and stored.available_at > stored.created_at + timedelta(minutes=50)

    unknown = run_cli("get", str(uuid.uuid4()), "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert unknown.returncode == 1 and "no job" in unknown.stderr and unknown.stdout == ""
    malformed = run_cli("get", "not-a-uuid", "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert malformed.returncode == 2 and "UUID" in malformed.stderr


def test_get_shows_result_errors_with_tracebacks_and_progress(
    dsn: str, schema: str, tmp_path: Path, store: Store
) -> None:
    from brooq_py.queue.port import EngineProof, HeldLease, Outcome

    job_id = store.enqueue(Job("cli.res")).id
    lease = timedelta(seconds=30)
    (c,) = store.worker.claim(["cli.res"], 1, "w", lease)
    held = [HeldLease(c.id, c.claim_token, 0.5, "half")]
    store.worker.beat(EngineProof("w", "h", 1, lease, lease / 3), held)
    assert store.worker.write_progress(held) == {c.claim_token}  # the heartbeat's, after its beat
    long_tb = "Traceback (most recent call last):\n" + "  frame\n" * 1000 + "ValueError: bad\n"
    store.worker.settle_many(
        [Outcome(c.id, c.claim_token, State.FAILED, last_error="ValueError: bad", traceback=long_tb)]
    )
    assert store.worker.stage(["cli.res"], 10, notify=False).total == 1  # the retry is due at once (delay 0)
    (c2,) = store.worker.claim(["cli.res"], 1, "w", lease)
    store.worker.settle_many([Outcome(c2.id, c2.claim_token, State.DONE, result='{"answer": 42}')])

    got = run_cli("get", job_id, "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    row = json.loads(got.stdout)
    assert row["state"] == "done" and row["result"] == {"answer": 42}
    assert (row["progress"], row["progress_note"]) == (0.5, "half")
    (error,) = row["errors"]
    assert error["attempt"] == 1 and error["error"] == "ValueError: bad"
    assert error["traceback"].startswith("...[") and error["traceback"].endswith("ValueError: bad\n")
    full = json.loads(run_cli("get", job_id, "--full", "--schema", schema, dsn=dsn, cwd=tmp_path).stdout)
    assert full["errors"][0]["traceback"] == long_tb


def test_cancel(dsn: str, schema: str, tmp_path: Path, store: Store) -> None:
    job_id = store.enqueue(Job("cli.idle", {"n": 1})).id
    first = run_cli("cancel", job_id, "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert first.returncode == 0 and json.loads(first.stdout) == {"canceled": True}
    second = run_cli("cancel", job_id, "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert second.returncode == 1 and json.loads(second.stdout) == {"canceled": False}
    assert store.get(job_id).state == State.CANCELED  # type: ignore[union-attr]
    unknown = run_cli("cancel", str(uuid.uuid4()), "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert unknown.returncode == 2 and "no such job" in unknown.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["t", "{not json"], "JSON"),
        (["t", "NaN"], "JSON"),
        (["t", '"a\\u0000b"'], "u0000"),
        (["t", "{}", "--delay", "30"], "--delay"),
        (["t", "{}", "--delay", "-5s"], "--delay"),
        (["t", "{}", "--priority", "99999999999"], "priority"),
        (["", "{}"], "topic"),
    ],
)
def test_bad_enqueue_input_exits_2_and_writes_nothing(
    dsn: str, schema: str, tmp_path: Path, args: list[str], message: str
) -> None:
    result = run_cli("enqueue", *args, "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""
    assert count_rows(dsn, schema) == 0


@pytest.mark.parametrize("command", [["get", str(uuid.uuid4())], ["stats"], ["worker", "--demo"]])
def test_unmigrated_schema_is_one_clear_line(
    dsn: str, fresh_schema: str, tmp_path: Path, command: list[str]
) -> None:
    env = cli_env(dsn, BROOQ_HTTP_ADDR="127.0.0.1:0")
    result = run_cli(*command, "--schema", fresh_schema, dsn=dsn, cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert "migrate up" in result.stderr and "Traceback" not in result.stderr


# --- stats ---------------------------------------------------------------------------------------


def test_stats(dsn: str, schema: str, tmp_path: Path, store: Store) -> None:
    """Depth by topic and state, oldest ready age, in flight with holders, recent dead jobs (SPEC O3)."""
    for i in range(3):
        store.enqueue(Job("stats.a", {"i": i}))
    store.enqueue(Job("stats.b", None))
    held = store.enqueue(Job("stats.held", None)).id
    claimed = store.worker.claim(["stats.held"], 1, "holder-x:1:abc", timedelta(minutes=5))
    assert [c.id for c in claimed] == [held]

    def boom(ctx: Context, claim: Claim) -> None:
        raise RuntimeError("it broke")

    engine = Engine(store, Config(workers=1))
    engine.register_kind("stats.dead", boom, KindOptions(max_attempts=1))
    dead_id = store.enqueue(Job("stats.dead", None)).id
    assert engine.run_once() == 1
    engine.close()
    assert store.get(dead_id).state == State.DEAD  # type: ignore[union-attr]

    result = run_cli("stats", "--json", "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    topics = {t["topic"]: t for t in report["topics"]}
    assert set(topics) == {"stats.a", "stats.b", "stats.held"}
    assert (topics["stats.a"]["pending"], topics["stats.a"]["processing"]) == (3, 0)
    assert topics["stats.a"]["oldest_ready_seconds"] >= 0
    assert topics["stats.held"]["processing"] == 1
    assert [h["locked_by"] for h in report["holders"]] == ["holder-x:1:abc"]
    assert [f["id"] for f in report["in_flight"]] == [held]
    assert [d["id"] for d in report["dead"]] == [dead_id]
    assert "it broke" in report["dead"][0]["last_error"]

    text = run_cli("stats", "--schema", schema, dsn=dsn, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    for needle in ("stats.a", "stats.held", "holder-x:1:abc", held, dead_id, "oldest ready"):
        assert needle in text.stdout


# --- settings and connection errors --------------------------------------------------------------------


class CountingListener:
    """A TCP port that counts the connections made to it (to prove nothing connected)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.mark.parametrize(
    "command", [["stats"], ["enqueue", "demo", "{}"], ["worker", "--demo"], ["migrate", "up"]]
)
def test_invalid_settings_are_all_listed_before_connecting(tmp_path: Path, command: list[str]) -> None:
    """SPEC K2: every problem at once, exit 2, and not a single connection attempted."""
    listener = CountingListener()
    try:
        dsn = f"postgresql://root:{PASSWORD}@127.0.0.1:{listener.port}/test"
        env = cli_env(dsn, QUEUE_WORKERS="two", QUEUE_LEASE="120", BROOQ_HTTP_ADDR="8090")
        result = run_cli(*command, dsn=dsn, cwd=tmp_path, env=env)
        assert result.returncode == 2
        for name in ("QUEUE_WORKERS", "QUEUE_LEASE", "BROOQ_HTTP_ADDR"):
            assert name in result.stderr
        assert "Traceback" not in result.stderr and PASSWORD not in result.stderr
        assert listener.accepted == 0
    finally:
        listener.close()


def test_dotenv_in_the_working_directory_is_read(dsn: str, schema: str, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(f"# settings\nDATABASE_URL={dsn}\nBROOQ_SCHEMA='{schema}'\n")
    env = cli_env(dsn)
    del env["DATABASE_URL"]
    result = run_cli("enqueue", "dotenv.topic", "{}", dsn=dsn, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert count_rows(dsn, schema) == 1


@pytest.mark.parametrize(
    "command", [["get", str(uuid.uuid4())], ["migrate", "status"], ["stats"], ["worker", "--demo"]]
)
def test_unreachable_database_is_one_line_with_the_password_masked(
    tmp_path: Path, command: list[str]
) -> None:
    """SPEC K3: a failing connection names the DSN masked; the password appears nowhere."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dsn = f"postgresql://root:{PASSWORD}@127.0.0.1:{port}/test"
    result = run_cli(*command, dsn=dsn, cwd=tmp_path, env=cli_env(dsn, BROOQ_HTTP_ADDR="127.0.0.1:0"))
    assert result.returncode == 1
    assert PASSWORD not in result.stderr and PASSWORD not in result.stdout
    assert "cannot connect" in result.stderr and "root:***@127.0.0.1" in result.stderr
    assert "Traceback" not in result.stderr


# --- worker ---------------------------------------------------------------------------------------------


def test_worker_demo_processes_a_job_and_stops_on_sigterm(dsn: str, schema: str, tmp_path: Path) -> None:
    """worker --demo runs the demo topic with the surface; SIGTERM stops it with exit 0, nothing left
    in processing (SPEC C11)."""
    token = "cli-token-" + uuid.uuid4().hex
    env = cli_env(dsn, BROOQ_HTTP_ADDR="127.0.0.1:0", BROOQ_HTTP_TOKEN=token, QUEUE_POLL_INTERVAL="200ms")
    worker = Worker(["worker", "--demo", "--schema", schema], env, tmp_path)
    try:
        url = worker.url()
        enq = run_cli(
            "enqueue", "demo", '{"msg": "hello from the test"}', "--schema", schema, dsn=dsn, cwd=tmp_path
        )
        assert enq.returncode == 0, enq.stderr
        job_id = enq.stdout.strip()

        def job_state() -> Any:
            request = urllib.request.Request(
                f"{url}/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(request, timeout=10) as resp:
                return json.loads(resp.read())["state"]

        wait_for(lambda: job_state() == "done", "the demo job to be done")
        with urllib.request.urlopen(f"{url}/healthz", timeout=10) as resp:
            assert resp.status == 200 and json.loads(resp.read())["running"] is True
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            assert b'brooq_settle_total{outcome="done",topic="demo"}' in resp.read()

        assert worker.stop(signal.SIGTERM) == 0, worker.output
    finally:
        worker.kill()
    assert count_rows(dsn, schema, "processing") == 0
    assert count_rows(dsn, schema, "done") == 1
    assert "hello from the test" in worker.output  # the demo handler logs the payload
    assert token not in worker.output
    assert "Traceback" not in worker.output


def test_worker_app_and_a_second_sigint_exits_at_once(dsn: str, schema: str, tmp_path: Path) -> None:
    """worker --app module:factory; the first SIGINT starts a graceful stop, a second exits at once."""
    (tmp_path / "slowapp.py").write_text(
        textwrap.dedent(
            """
            import os
            import time

            from psycopg_pool import ConnectionPool

            from brooq_py import Config, Engine
            from brooq_py.postgres import Store


            def stubborn(ctx, claim):
                time.sleep(120)  # ignores ctx on purpose


            def make_engine():
                pool = ConnectionPool(os.environ["DATABASE_URL"], min_size=1, max_size=4, open=True)
                store = Store(pool, schema=os.environ["APP_SCHEMA"])
                engine = Engine(store, Config(workers=1, poll_interval=0.2))
                engine.register_kind("slow", stubborn)
                return engine
            """
        )
    )
    env = cli_env(dsn, BROOQ_HTTP_ADDR="127.0.0.1:0", APP_SCHEMA=schema)
    worker = Worker(["worker", "--app", "slowapp:make_engine", "--stop-timeout", "2m"], env, tmp_path)
    try:
        worker.url()
        enq = run_cli("enqueue", "slow", "{}", "--schema", schema, dsn=dsn, cwd=tmp_path)
        assert enq.returncode == 0, enq.stderr
        wait_for(lambda: count_rows(dsn, schema, "processing") == 1, "the slow job to be claimed")
        worker.proc.send_signal(signal.SIGINT)
        wait_for(lambda: "stopping gracefully" in worker.output, "the graceful stop to begin")
        started = time.monotonic()
        rc = worker.stop(signal.SIGINT, timeout=60)
        assert rc == 130, worker.output
        assert time.monotonic() - started < 60
    finally:
        worker.kill()
    assert "second SIGINT" in worker.output


def test_worker_app_errors_are_clear(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "notengine.py").write_text("thing = 42\n")
    env = cli_env(dsn, BROOQ_HTTP_ADDR="127.0.0.1:0")
    for spec, status, needle in (
        ("no_such_module_xyz:app", 2, "no module named"),
        ("notengine:missing", 2, "no attribute"),
        ("notengine:thing", 1, "expected an Engine"),
        ("notengine", 2, "module:attr"),
    ):
        result = run_cli("worker", "--app", spec, dsn=dsn, cwd=tmp_path, env=env)
        assert result.returncode == status, (spec, result.stderr)
        assert needle in result.stderr and "Traceback" not in result.stderr


def test_usage_errors_exit_2(dsn: str, tmp_path: Path) -> None:
    assert run_cli(dsn=dsn, cwd=tmp_path).returncode == 2
    assert run_cli("frobnicate", dsn=dsn, cwd=tmp_path).returncode == 2
    assert run_cli("worker", dsn=dsn, cwd=tmp_path).returncode == 2
    helped = run_cli("--help", dsn=dsn, cwd=tmp_path)
    assert helped.returncode == 0 and "worker" in helped.stdout and "migrate" in helped.stdout
