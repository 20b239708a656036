"""Find a PostgreSQL to run the demo, the tests and the benchmarks against.

The chain, first match wins:

1. ``DATABASE_URL`` when set and non-empty (``how="DATABASE_URL"``);
2. PostgreSQL on 127.0.0.1:5432 when it answers ``select 1`` as the current
   user in the database ``test``, the user's own database or ``postgres``
   (``how="local 5432"``); refused logins and missing databases fall through;
3. a throwaway server started for this process from the local PostgreSQL
   binaries, stopped by ``close()`` or at interpreter exit (``how="throwaway"``).

The throwaway server runs with fsync off on a free 127.0.0.1 port. Its data
directory is copied from an ``initdb`` template cached under
``$XDG_CACHE_HOME/brooq_py`` (``~/.cache/brooq_py``), so starts after the first
take a fraction of a second. As root it runs as the ``postgres`` system user
(else ``nobody``), since PostgreSQL refuses to run as root.

The server is spawned with PR_SET_PDEATHSIG(SIGKILL), so a parent killed
without cleanup leaves no orphan server. The kernel sends that signal when the
*thread* that spawned the server exits: call :func:`acquire` and
:func:`start_throwaway` from the main thread (or from a thread that lives as
long as the server).

``python -m brooq_py.devdb`` says which database the chain picks;
``python -m brooq_py.devdb run -- CMD ...`` runs CMD with ``DATABASE_URL`` set
to it; ``python -m brooq_py.devdb serve`` keeps a throwaway server up until
interrupted.

Modules: this one holds the chain, :class:`DevDatabase` and the server's
lifecycle; ``devdb_files`` the binaries, the initdb template cache and the
temp dirs; ``devdb_process`` the postgres process (spawn, stop);
``devdb_cli`` the command line.
"""

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import quote

import psycopg
from psycopg import conninfo, sql

from brooq_py.devdb_files import (
    TMP_PREFIX,
    DevDatabaseError,
    PostgresNotFound,
    chown_tree,
    find_bindir,
    initdb_template,
    server_account,
    sweep_stale_dirs,
    tmp_base,
)
from brooq_py.devdb_process import LOCAL_HOST as LOCAL_HOST
from brooq_py.devdb_process import STOP_TIMEOUT as STOP_TIMEOUT
from brooq_py.devdb_process import free_port as _free_port
from brooq_py.devdb_process import spawn_postgres, stop_postgres
from brooq_py.redact import mask_dsn

__all__ = [
    "DevDatabase",
    "DevDatabaseError",
    "PostgresNotFound",
    "ThrowawayServer",
    "acquire",
    "find_bindir",
    "main",
    "mask_dsn",
    "start_throwaway",
]

log = logging.getLogger("brooq_py.devdb")

LOCAL_PORT = 5432
THROWAWAY_DBNAME = "test"
CONNECT_TIMEOUT = 2  # seconds, per probe of the local server
START_TIMEOUT = 30.0  # seconds until a throwaway server must accept connections


@dataclass
class DevDatabase:
    """A database to work against: its DSN and how the chain found it.

    ``server`` is set only for a throwaway server; ``restart()`` and ``stop()``
    need one. ``close()`` is safe to call on every kind and more than once.
    """

    dsn: str
    how: str  # "DATABASE_URL", "local 5432" or "throwaway"
    server: ThrowawayServer | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        """The postmaster pid of a running throwaway server, else None."""
        return self.server.pid if self.server is not None else None

    def restart(self) -> None:
        """Stop the throwaway server with a fast shutdown and start it again on the same port."""
        self._require_server().restart()

    def stop(self) -> None:
        """Stop the throwaway server and remove its data (same as ``close()``)."""
        self._require_server().close()

    def close(self) -> None:
        """Stop the throwaway server if there is one; a no-op for the other kinds."""
        if self.server is not None:
            self.server.close()

    def __enter__(self) -> DevDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_server(self) -> ThrowawayServer:
        if self.server is None:
            raise DevDatabaseError(f"not a throwaway server (how={self.how!r}): refusing to stop or restart")
        return self.server


# --- the chain -----------------------------------------------------------------------------------


def acquire(*, local_port: int = LOCAL_PORT) -> DevDatabase:
    """Return the first usable database of the chain (see the module docstring).

    Raise :class:`PostgresNotFound` when the chain reaches the throwaway server
    and no PostgreSQL binaries are installed, :class:`DevDatabaseError` when
    that server does not start within ``START_TIMEOUT`` seconds.
    """
    # A throwaway's owner killed with SIGKILL could not remove its directory: any next start does.
    sweep_stale_dirs()
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        log.info("using DATABASE_URL: %s", mask_dsn(url))
        return DevDatabase(url, "DATABASE_URL")
    dsn = _probe_local(local_port)
    if dsn is not None:
        log.info("using the local server: %s", dsn)
        return DevDatabase(dsn, "local 5432")
    return start_throwaway()


def _probe_local(port: int) -> str | None:
    user = _current_user()
    for dbname in dict.fromkeys(["test", user, "postgres"]):
        try:
            with psycopg.connect(
                host=LOCAL_HOST,
                port=port,
                user=user,
                dbname=dbname,
                connect_timeout=CONNECT_TIMEOUT,
                autocommit=True,
            ) as conn:
                conn.execute("select 1").fetchone()
        except psycopg.Error as exc:
            log.debug("%s:%d/%s not usable: %s", LOCAL_HOST, port, dbname, str(exc).strip())
            continue
        return _url(user, port, dbname)
    return None


def start_throwaway() -> DevDatabase:
    """Start a new throwaway server whatever the chain would pick, and return it.

    The caller owns the server: ``restart()``, ``stop()``/``close()`` act on it,
    and it is stopped at interpreter exit at the latest.
    """
    server = ThrowawayServer()
    server.start()
    return DevDatabase(server.dsn, "throwaway", server)


# --- DSN helpers ---------------------------------------------------------------------------------


def _url(user: str, port: int, dbname: str) -> str:
    return f"postgresql://{quote(user, safe='')}@{LOCAL_HOST}:{port}/{quote(dbname, safe='')}"


def _current_user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return getpass.getuser()


# --- the throwaway server ------------------------------------------------------------------------


class ThrowawayServer:
    """A PostgreSQL server in a temporary directory, owned by this process.

    ``start()`` copies the cached initdb template, spawns ``postgres`` and waits
    up to ``START_TIMEOUT`` seconds for it to accept connections, raising
    :class:`DevDatabaseError` with the server log otherwise. ``close()`` stops it
    with a fast shutdown and removes the directory; it is idempotent and also
    registered with :mod:`atexit`.
    """

    def __init__(self, bindir: Path | None = None) -> None:
        self.bindir = bindir or find_bindir()
        self.user = _current_user()  # the database superuser, named like the caller
        self.dbname = THROWAWAY_DBNAME
        self.port = 0
        self.account = server_account()
        self._owner_pid = os.getpid()
        self._tmpdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._logfile: IO[bytes] | None = None

    @property
    def dsn(self) -> str:
        return _url(self.user, self.port, self.dbname)

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
                self.port = _free_port()
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

    # -- internals --

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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (see the module docstring); return the exit status."""
    from brooq_py.devdb_cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
