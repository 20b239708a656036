"""A throwaway primary and a synchronous streaming standby for the failover tests (SPEC H1).

Both servers run from the local PostgreSQL binaries in one temp directory, on
free 127.0.0.1 ports, as the ``postgres`` account when we are root, and die
with the spawning thread (PR_SET_PDEATHSIG, see brooq_py.devdb.process). The
primary starts from the cached initdb template; the standby is a
``pg_basebackup -R`` of it, and the primary waits for it at every commit
(``synchronous_standby_names='*'``, ``synchronous_commit=on``): a commit that
returned to a client is on the standby too. The machine's shared server is
never touched.

``fail_primary()`` stops the primary with ``pg_ctl stop -m immediate`` (no
shutdown checkpoint, connections cut), ``promote()`` runs ``pg_ctl promote``
on the standby and waits until it accepts writes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import psycopg
from psycopg import conninfo

from brooq_py.devdb.files import (
    TMP_PREFIX,
    PostgresNotFound,
    chown_tree,
    find_bindir,
    initdb_template,
    popen_ids,
    run_as_owner,
    server_account,
    tmp_base,
)
from brooq_py.devdb.process import LOCAL_HOST, die_with_parent, free_port, stop_postgres
from brooq_py.devdb.server import THROWAWAY_DBNAME, current_user

START_TIMEOUT = 30.0

# Durability is not what these servers test (fsync off: nothing here survives an OS crash, and
# none is caused); the commit's wait for the standby is, so synchronous_commit stays on.
_COMMON = (
    "listen_addresses=127.0.0.1",
    "fsync=off",
    "max_connections=100",
    "wal_level=replica",
    "max_wal_senders=5",
    "hot_standby=on",
    "wal_receiver_status_interval=1",
)
_PRIMARY = ("synchronous_standby_names=*", "synchronous_commit=on")


class Server:
    """One postgres process on *datadir* and *port*."""

    def __init__(self, pair: ReplicaPair, name: str, datadir: Path, extra: tuple[str, ...]) -> None:
        self.pair = pair
        self.name = name
        self.datadir = datadir
        self.extra = extra
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def dsn(self) -> str:
        return conninfo.make_conninfo(
            host=LOCAL_HOST, port=self.port, user=self.pair.user, dbname=THROWAWAY_DBNAME
        )

    @property
    def log_path(self) -> Path:
        return self.pair.root / f"{self.name}.log"

    def start(self) -> None:
        cmd = [str(self.pair.bindir / "postgres"), "-D", str(self.datadir), "-p", str(self.port)]
        cmd += ["-k", str(self.pair.root)]
        for setting in _COMMON + self.extra:
            cmd += ["-c", setting]
        parent = os.getpid()
        uid, gid, groups = popen_ids(self.pair.account)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.pair.root,
            env={**os.environ, "LC_ALL": "C", "LANG": "C"},
            preexec_fn=lambda: die_with_parent(parent),
            user=uid,
            group=gid,
            extra_groups=groups,
        )
        self.wait_accepting()

    def wait_accepting(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until the server answers ``select 1`` (a standby in hot standby does)."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("select 1")
                return
            except psycopg.OperationalError as exc:
                last = exc
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} not accepting connections ({last}):\n{self.log_tail()}")

    def in_recovery(self) -> bool:
        with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as conn:
            row = conn.execute("select pg_is_in_recovery()").fetchone()
        return bool(row and row[0])

    def pg_ctl(self, *args: str) -> None:
        cmd = [str(self.pair.bindir / "pg_ctl"), "-D", str(self.datadir), *args]
        result = run_as_owner(cmd, self.pair.account, cwd=self.pair.root)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{result.stdout}{result.stderr}\n{self.log_tail()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_postgres(proc)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"


class ReplicaPair:
    """A primary and its synchronous streaming standby; ``close()`` stops both and removes the files."""

    def __init__(self) -> None:
        self.bindir = find_bindir()
        if not os.access(self.bindir / "pg_basebackup", os.X_OK):
            raise PostgresNotFound(f"no pg_basebackup in {self.bindir}")
        self.account = server_account()
        self.user = current_user()
        self.root = Path(tempfile.mkdtemp(prefix=TMP_PREFIX + "ha-", dir=tmp_base()))
        (self.root / "owner.pid").write_text(f"{os.getpid()}\n")
        self.primary = Server(self, "primary", self.root / "primary", _PRIMARY)
        self.standby = Server(self, "standby", self.root / "standby", ())

    def start(self) -> ReplicaPair:
        try:
            template = initdb_template(self.bindir, self.user, THROWAWAY_DBNAME, self.account)
            shutil.copytree(template, self.primary.datadir, symlinks=True)
            os.chmod(self.primary.datadir, 0o700)
            chown_tree(self.root, self.account)
            self.primary.start()
            self._base_backup()
            self.standby.start()
            self._wait_synchronous()
        except BaseException:
            self.close()
            raise
        return self

    def _base_backup(self) -> None:
        cmd = [
            str(self.bindir / "pg_basebackup"),
            *("-h", LOCAL_HOST, "-p", str(self.primary.port), "-U", self.user),
            *("-D", str(self.standby.datadir), "-R", "-X", "stream", "-c", "fast", "--no-sync"),
        ]
        result = run_as_owner(cmd, self.account, cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed:\n{result.stdout}{result.stderr}")

    def _wait_synchronous(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            with psycopg.connect(self.primary.dsn, autocommit=True) as conn:
                row = conn.execute("select sync_state from pg_stat_replication").fetchone()
            if row is not None and row[0] == "sync":
                return
            time.sleep(0.05)
        raise RuntimeError(f"the standby never became synchronous:\n{self.standby.log_tail()}")

    @property
    def multi_host(self) -> str:
        """The libpq multi-host conninfo producers and engines use: whichever server accepts writes."""
        return (
            f"host={LOCAL_HOST},{LOCAL_HOST} port={self.primary.port},{self.standby.port} "
            f"user={self.user} dbname={THROWAWAY_DBNAME} target_session_attrs=read-write connect_timeout=2"
        )

    def fail_primary(self) -> None:
        """Stop the primary at once, as a crash would: no checkpoint, every connection cut."""
        self.primary.pg_ctl("stop", "-m", "immediate", "-w")
        self.primary.stop()  # reap the process

    def promote(self) -> None:
        """Promote the standby and wait until it accepts writes."""
        self.standby.pg_ctl("promote", "-w", "-t", str(int(START_TIMEOUT)))
        deadline = time.monotonic() + START_TIMEOUT
        while self.standby.in_recovery():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby did not leave recovery:\n{self.standby.log_tail()}")
            time.sleep(0.05)

    def close(self) -> None:
        self.standby.stop()
        self.primary.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ReplicaPair:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
