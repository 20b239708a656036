"""The throwaway server: a PostgreSQL in a temporary directory, owned by this process."""

from __future__ import annotations

import atexit
import getpass
import logging
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO
from urllib.parse import quote

import psycopg
from psycopg import conninfo, sql

from brooq_py.devdb.files import (
    TMP_PREFIX,
    DevDatabaseError,
    chown_tree,
    find_bindir,
    initdb_template,
    server_account,
    sweep_stale_dirs,
    tmp_base,
)
from brooq_py.devdb.process import LOCAL_HOST, free_port, spawn_postgres, stop_postgres

log = logging.getLogger("brooq_py.devdb")

THROWAWAY_DBNAME = "test"
START_TIMEOUT = 30.0  # seconds until a throwaway server must accept connections


def local_url(user: str, port: int, dbname: str) -> str:
    return f"postgresql://{quote(user, safe='')}@{LOCAL_HOST}:{port}/{quote(dbname, safe='')}"


def current_user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return getpass.getuser()


class ThrowawayServer:
    """A PostgreSQL server in a temporary directory; ``start()`` raises :class:`DevDatabaseError` with
    the server log if it does not answer within ``START_TIMEOUT``; ``close()`` is idempotent and atexit's."""

    def __init__(self, bindir: Path | None = None) -> None:
        self.bindir = bindir or find_bindir()
        self.user = current_user()  # the database superuser, named like the caller
        self.dbname = THROWAWAY_DBNAME
        self.port = 0
        self.account = server_account()
        self._owner_pid = os.getpid()
        self._tmpdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._logfile: IO[bytes] | None = None

    @property
    def dsn(self) -> str:
        return local_url(self.user, self.port, self.dbname)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def datadir(self) -> Path:
        if self._tmpdir is None:
            raise DevDatabaseError("throwaway server not started")
        return self._tmpdir / "data"

    @property
    def log_path(self) -> Path:
        if self._tmpdir is None:
            raise DevDatabaseError("throwaway server not started")
        return self._tmpdir / "server.log"

    def start(self) -> None:
        if self._tmpdir is not None:
            raise DevDatabaseError("throwaway server already started")
        if threading.current_thread() is not threading.main_thread():
            log.warning("starting a throwaway server off the main thread: it dies when this thread exits")
        sweep_stale_dirs()
        began = time.monotonic()
        template = initdb_template(self.bindir, self.user, self.dbname, self.account)
        self._tmpdir = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=tmp_base()))
        try:
            (self._tmpdir / "owner.pid").write_text(f"{os.getpid()}\n")
            shutil.copytree(template, self.datadir, symlinks=True)
            os.chmod(self.datadir, 0o700)
            chown_tree(self._tmpdir, self.account)
            for attempt in range(3):
                self.port = free_port()
                try:
                    self._spawn_and_wait()
                    break
                except DevDatabaseError:
                    if attempt == 2 or "could not bind" not in self._log_tail():
                        raise
                    log.debug("port %d taken meanwhile, trying another", self.port)
            self._create_database()
        except BaseException:
            self._teardown()
            raise
        atexit.register(self.close)
        log.info(
            "throwaway server pid %s up on port %d in %.2fs (%s)",
            self.pid,
            self.port,
            time.monotonic() - began,
            self._tmpdir,
        )

    def restart(self) -> None:
        """Stop with a fast shutdown and start again on the same port and data directory."""
        if self._tmpdir is None:
            raise DevDatabaseError("throwaway server not started")
        self._shutdown()
        self._spawn_and_wait()
        log.info("throwaway server restarted, pid %s on port %d", self.pid, self.port)

    def close(self) -> None:
        """Stop the server and remove its directory; safe to call twice."""
        if os.getpid() != self._owner_pid:  # a forked child must not stop its parent's server
            return
        atexit.unregister(self.close)
        self._teardown()

    stop = close

    def _teardown(self) -> None:
        self._shutdown()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _spawn_and_wait(self) -> None:
        assert self._tmpdir is not None
        if self._logfile is not None:
            self._logfile.close()
        self._logfile = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the server
        self._proc = spawn_postgres(
            self.bindir,
            self.datadir,
            self.port,
            socket_dir=self._tmpdir,
            logfile=self._logfile,
            account=self.account,
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise DevDatabaseError(
                    f"throwaway PostgreSQL exited with status {self._proc.returncode}; "
                    f"server log:\n{self._log_tail()}"
                )
            try:
                with psycopg.connect(self._conninfo("postgres"), connect_timeout=2, autocommit=True) as conn:
                    conn.execute("select 1").fetchone()
                return
            except psycopg.OperationalError as exc:
                last = exc
                time.sleep(0.02)
        self._shutdown()
        raise DevDatabaseError(
            f"throwaway PostgreSQL did not accept connections within {START_TIMEOUT:.0f}s ({last}); "
            f"server log:\n{self._log_tail()}"
        )

    def _create_database(self) -> None:
        with psycopg.connect(self._conninfo("postgres"), autocommit=True) as conn:
            exists = conn.execute("select 1 from pg_database where datname = %s", [self.dbname]).fetchone()
            if exists is None:
                conn.execute(sql.SQL("create database {}").format(sql.Identifier(self.dbname)))

    def _conninfo(self, dbname: str) -> str:
        return conninfo.make_conninfo(host=LOCAL_HOST, port=self.port, user=self.user, dbname=dbname)

    def _shutdown(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_postgres(proc)
        if self._logfile is not None:
            self._logfile.close()
            self._logfile = None

    def _log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, DevDatabaseError):
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])
