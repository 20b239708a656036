"""The development-database chain and the throwaway server, with real processes.

Nothing here touches the machine's shared server beyond a ``select 1``: the
servers these tests stop, restart and kill are throwaway servers they started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from brooq_py import devdb
from brooq_py.devdb import DevDatabase, mask_dsn, start_throwaway
from brooq_py.devdb.process import free_port

DEADLINE = 20.0  # seconds; generous, only reached when something is wrong


def _gone(pid: int) -> bool:
    """True when *pid* no longer runs (a zombie waiting for init to reap it counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def _wait_until(cond: object, what: str) -> None:
    assert callable(cond)
    deadline = time.monotonic() + DEADLINE
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def _select_one(dsn: str) -> object:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute("select 1").fetchone()
    return None if row is None else row[0]


def _closed_port() -> int:
    return free_port()


@pytest.fixture
def throwaway() -> Iterator[DevDatabase]:
    db = start_throwaway()
    try:
        yield db
    finally:
        db.close()


def test_throwaway_answers_and_is_gone_after_close() -> None:
    db = start_throwaway()
    try:
        assert db.how == "throwaway"
        assert db.dsn.startswith("postgresql://") and "@127.0.0.1:" in db.dsn
        assert _select_one(db.dsn) == 1
        pid = db.pid
        assert pid is not None and not _gone(pid)
        assert db.server is not None
        tmpdir = db.server.datadir.parent
    finally:
        db.close()
    _wait_until(lambda: _gone(pid), f"server pid {pid} is gone")
    assert db.pid is None
    assert not tmpdir.exists()
    with pytest.raises(psycopg.OperationalError):
        _select_one(db.dsn)
    db.close()  # closing twice is harmless


def test_restart_keeps_data_and_port(throwaway: DevDatabase) -> None:
    with psycopg.connect(throwaway.dsn, autocommit=True) as conn:
        conn.execute("create table kept (v text)")
        conn.execute("insert into kept values ('before restart')")
    dsn, old_pid = throwaway.dsn, throwaway.pid
    assert old_pid is not None

    throwaway.restart()

    assert throwaway.dsn == dsn
    assert throwaway.pid is not None and throwaway.pid != old_pid
    assert _gone(old_pid)
    with psycopg.connect(throwaway.dsn) as conn:
        assert conn.execute("select v from kept").fetchall() == [("before restart",)]


def test_stop_and_restart_refused_for_a_server_we_do_not_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chain never hands out a way to stop a server it did not start."""
    monkeypatch.setenv("DATABASE_URL", "postgresql://someone@db.example.invalid/app")
    db = devdb.acquire()
    with pytest.raises(devdb.DevDatabaseError):
        db.restart()
    with pytest.raises(devdb.DevDatabaseError):
        db.stop()
    db.close()


def test_chain_picks_database_url_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgresql://app:secret@db.example.invalid:6543/app"
    monkeypatch.setenv("DATABASE_URL", url)
    db = devdb.acquire()
    assert (db.how, db.dsn, db.server) == ("DATABASE_URL", url, None)


def test_chain_picks_local_5432_when_it_answers(
    monkeypatch: pytest.MonkeyPatch, throwaway: DevDatabase
) -> None:
    """An empty DATABASE_URL counts as unset, and a server answering on the local port is used
    (a throwaway one stands in for 5432, so the test holds on a machine without one)."""
    monkeypatch.setenv("DATABASE_URL", "")
    assert throwaway.server is not None
    db = devdb.acquire(local_port=throwaway.server.port)
    try:
        assert db.how == "local 5432"
        assert db.server is None
        assert f":{throwaway.server.port}/" in db.dsn
        assert _select_one(db.dsn) == 1
    finally:
        db.close()


def test_chain_probe_falls_back_to_postgres_db_when_test_is_missing(
    monkeypatch: pytest.MonkeyPatch, throwaway: DevDatabase
) -> None:
    """A missing database is "not usable", never a crash: test, then the user's own, then postgres."""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert throwaway.server is not None
    port = throwaway.server.port
    with psycopg.connect(throwaway.dsn.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute("drop database test")

    db = devdb.acquire(local_port=port)

    assert db.how == "local 5432"
    assert db.dsn.endswith(f":{port}/postgres")
    assert _select_one(db.dsn) == 1


def test_chain_treats_refused_login_as_not_usable(
    monkeypatch: pytest.MonkeyPatch, throwaway: DevDatabase
) -> None:
    """A server that refuses our role is skipped and the chain starts a throwaway server instead."""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert throwaway.server is not None
    me = throwaway.server.user
    base = throwaway.dsn.split("@", 1)[1]
    with psycopg.connect(throwaway.dsn, autocommit=True) as conn:
        conn.execute("create role other superuser login")
    with psycopg.connect(f"postgresql://other@{base}", autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("alter role {} rename to ghost").format(psycopg.sql.Identifier(me)))

    db = devdb.acquire(local_port=throwaway.server.port)
    try:
        assert db.how == "throwaway"
        assert db.dsn != throwaway.dsn
        assert _select_one(db.dsn) == 1
    finally:
        db.close()


def test_chain_starts_throwaway_when_nothing_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    db = devdb.acquire(local_port=_closed_port())
    try:
        assert db.how == "throwaway"
        assert _select_one(db.dsn) == 1
    finally:
        db.close()


def test_killed_parent_leaves_no_orphan_server(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import time
        from brooq_py import devdb
        db = devdb.start_throwaway()
        assert db.server is not None
        print(db.pid, db.server.datadir.parent, flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert child.stdout is not None
        line = child.stdout.readline().split()
        assert line, "the child did not report a server pid"
        pid, tmpdir = int(line[0]), Path(line[1])
        assert not _gone(pid)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()

    _wait_until(lambda: _gone(pid), f"orphaned server pid {pid} is gone")
    # A killed parent cannot remove its directory: any next start does (whatever the chain picks),
    # this one's or another process's on this machine (a suite running beside this one) before it.
    devdb.acquire().close()
    assert not tmpdir.exists()


def test_run_propagates_exit_status_and_sets_database_url() -> None:
    url = "postgresql://app@db.example.invalid/app"
    check = f'test "$DATABASE_URL" = "{url}" && exit 7; exit 1'
    result = subprocess.run(
        [sys.executable, "-m", "brooq_py.devdb", "run", "--", "sh", "-c", check],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 7, result.stderr


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("postgresql://app:s3cr%40t@db:5432/app", "postgresql://app:***@db:5432/app"),
        (
            "postgres://app:p@ss:w@rd@h1,h2/app?sslmode=require",
            "postgres://app:***@h1,h2/app?sslmode=require",
        ),
        (
            "postgresql://app@db/app?password=hunter2&sslmode=disable",
            "postgresql://app@db/app?password=***&sslmode=disable",
        ),
        ("postgresql://root@127.0.0.1:5432/test", "postgresql://root@127.0.0.1:5432/test"),
        ("host=db user=app password=hunter2 dbname=app", "host=db user=app password=*** dbname=app"),
        ("host=db password = 'two words \\' quoted' dbname=app", "host=db password = *** dbname=app"),
        ("host=db PASSWORD=x", "host=db PASSWORD=***"),
        ("host=db user=app dbname=app", "host=db user=app dbname=app"),
    ],
)
def test_mask_dsn_hides_passwords(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked
    assert "hunter2" not in mask_dsn(dsn) and "s3cr" not in mask_dsn(dsn)
