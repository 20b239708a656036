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
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import getpass
import glob
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO
from urllib.parse import quote

import psycopg
from psycopg import conninfo, sql

from brooq_py.queue.errors import BrooqError
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

LOCAL_HOST = "127.0.0.1"
LOCAL_PORT = 5432
THROWAWAY_DBNAME = "test"
CONNECT_TIMEOUT = 2  # seconds, per probe of the local server
START_TIMEOUT = 30.0  # seconds until a throwaway server must accept connections
STOP_TIMEOUT = 15.0  # seconds a fast shutdown may take before we escalate

_TMP_PREFIX = "brooq_py-pg-"
_PR_SET_PDEATHSIG = 1
_SERVER_SETTINGS = (
    "listen_addresses=127.0.0.1",
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "max_connections=200",
)


class DevDatabaseError(BrooqError, RuntimeError):
    """No development database could be provided."""


class PostgresNotFound(DevDatabaseError):
    """No PostgreSQL server binaries (initdb, postgres) were found."""


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


# --- finding the binaries ------------------------------------------------------------------------


def find_bindir() -> Path:
    """Return a directory holding both ``initdb`` and ``postgres``.

    Look at ``$PG_BINDIR``, ``pg_config --bindir``, ``/usr/lib/postgresql/*/bin``
    (newest version first), then ``PATH``; raise :class:`PostgresNotFound`
    saying how to get them otherwise.
    """
    candidates: list[Path] = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(Path(os.environ["PG_BINDIR"]))
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out:
                candidates.append(Path(out))
    versioned = glob.glob("/usr/lib/postgresql/*/bin")
    candidates.extend(Path(p) for p in sorted(versioned, key=_version_key, reverse=True))
    on_path = shutil.which("postgres")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
        candidates.append(Path(on_path).parent)
    for bindir in candidates:
        if all(os.access(bindir / name, os.X_OK) for name in ("initdb", "postgres")):
            return bindir
    raise PostgresNotFound(
        "no PostgreSQL server binaries (initdb, postgres) found in $PG_BINDIR, `pg_config --bindir`, "
        "/usr/lib/postgresql/*/bin or PATH. Install them (Debian/Ubuntu: `apt-get install postgresql`; "
        "Fedora: `dnf install postgresql-server`; macOS: `brew install postgresql`), point PG_BINDIR at "
        "them, or set DATABASE_URL to a server you already have (e.g. `make db-up` with Docker)."
    )


def _version_key(path: str) -> tuple[int, ...]:
    name = Path(path).parent.name
    return tuple(int(n) for n in re.findall(r"\d+", name)) or (0,)


# --- the throwaway server ------------------------------------------------------------------------


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = Path(base) / "brooq_py"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK | os.X_OK):
            return root
    except OSError:
        pass
    fallback = Path(tempfile.gettempdir()) / f"brooq_py-cache-{os.geteuid()}"
    fallback.mkdir(mode=0o700, exist_ok=True)
    return fallback


def _tmp_base() -> Path:
    """Where throwaway data directories go: $BROOQ_DEVDB_TMPDIR, else /dev/shm when roomy, else TMPDIR.

    The server runs with fsync off anyway, and creating the ~1,300 files of a
    data directory on a disk file system can take a second where tmpfs takes
    a few milliseconds.
    """
    override = os.environ.get("BROOQ_DEVDB_TMPDIR")
    if override:
        return Path(override)
    shm = Path("/dev/shm")
    with contextlib.suppress(OSError):
        stat = os.statvfs(shm)
        if os.access(shm, os.W_OK | os.X_OK) and stat.f_bavail * stat.f_frsize >= 1 << 30:
            return shm
    return Path(tempfile.gettempdir())


def _server_account() -> pwd.struct_passwd | None:
    """The unprivileged account to run the server as when we are root, else None."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise DevDatabaseError("running as root and neither a `postgres` nor a `nobody` user exists")


def _chown_tree(root: Path, account: pwd.struct_passwd | None) -> None:
    if account is None:
        return
    uid, gid = account.pw_uid, account.pw_gid
    os.chown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def _set_pdeathsig(parent_pid: int) -> None:
    """In the child: ask for SIGKILL when the spawning thread exits (runs after the uid change)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale_dirs() -> None:
    """Remove temp dirs of throwaway servers whose owning process is gone (e.g. SIGKILLed)."""
    for path in _tmp_base().glob(_TMP_PREFIX + "*"):
        try:
            owner = int((path / "owner.pid").read_text().strip())
        except (OSError, ValueError):
            continue
        if _pid_alive(owner):
            continue
        postmaster = path / "data" / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            if _pid_alive(int(postmaster.read_text().splitlines()[0])):
                continue
        log.debug("removing stale throwaway dir %s", path)
        shutil.rmtree(path, ignore_errors=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCAL_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


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
        self.account = _server_account()
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
        _sweep_stale_dirs()
        began = time.monotonic()
        template = self._template()
        self._tmpdir = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=_tmp_base()))
        try:
            (self._tmpdir / "owner.pid").write_text(f"{os.getpid()}\n")
            shutil.copytree(template, self.datadir, symlinks=True)
            os.chmod(self.datadir, 0o700)
            _chown_tree(self._tmpdir, self.account)
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

    def _template(self) -> Path:
        """Return the cached initdb directory for these binaries, building it on first use."""
        version = subprocess.run(
            [str(self.bindir / "postgres"), "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        key = re.sub(r"[^A-Za-z0-9.]+", "_", f"{version}-{self.user}").strip("_")
        cache = _cache_root()
        template = cache / f"initdb-{key}"
        if (template / "PG_VERSION").is_file():
            return template
        staging = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX + "initdb-", dir=_tmp_base()))
        try:
            target = staging / "data"
            _chown_tree(staging, self.account)
            cmd = [
                str(self.bindir / "initdb"),
                "-D",
                str(target),
                "-U",
                self.user,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ]
            result = self._run_as_owner(cmd, cwd=staging)
            if result.returncode != 0:
                raise DevDatabaseError(
                    f"initdb failed ({result.returncode}):\n{result.stdout}{result.stderr}"
                )
            # Bake the database into the template: single-user mode needs no port and no wait.
            result = self._run_as_owner(
                [str(self.bindir / "postgres"), "--single", "-D", str(target), "-c", "fsync=off", "postgres"],
                cwd=staging,
                input=f'create database "{self.dbname}";\n',
            )
            if result.returncode != 0:
                raise DevDatabaseError(
                    f"creating the template database failed:\n{result.stdout}{result.stderr}"
                )
            building = Path(tempfile.mkdtemp(prefix=f"initdb-{key}.", dir=cache))
            shutil.copytree(target, building / "data", symlinks=True)
            with contextlib.suppress(OSError):  # another process won the race: use its template
                os.rename(building / "data", template)
            shutil.rmtree(building, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log.info("cached initdb template in %s", template)
        return template

    def _run_as_owner(
        self, cmd: list[str], *, cwd: Path, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a server tool as the data directory's owner, in the C locale, capturing its output."""
        uid, gid, groups = self._popen_ids()
        return subprocess.run(
            cmd,
            input=input,
            capture_output=True,
            text=True,
            env={**os.environ, "LC_ALL": "C", "LANG": "C"},
            cwd=cwd,
            user=uid,
            group=gid,
            extra_groups=groups,
        )

    def _popen_ids(self) -> tuple[int | None, int | None, list[int] | None]:
        """user, group and extra_groups for Popen: the server account when we are root."""
        if self.account is None:
            return None, None, None
        return self.account.pw_uid, self.account.pw_gid, []

    def _spawn_and_wait(self) -> None:
        assert self._tmpdir is not None
        cmd = [str(self.bindir / "postgres"), "-D", str(self.datadir), "-p", str(self.port)]
        cmd += ["-k", str(self._tmpdir)]
        for setting in _SERVER_SETTINGS:
            cmd += ["-c", setting]
        if self._logfile is not None:
            self._logfile.close()
        self._logfile = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the server
        parent = os.getpid()
        uid, gid, groups = self._popen_ids()
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._logfile,
            stderr=subprocess.STDOUT,
            cwd=self._tmpdir,
            env={**os.environ, "LC_ALL": "C", "LANG": "C"},
            preexec_fn=lambda: _set_pdeathsig(parent),
            user=uid,
            group=gid,
            extra_groups=groups,
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
        if proc is not None and proc.poll() is None:
            # SIGINT is a fast shutdown: roll back open transactions, checkpoint, exit.
            for sig, wait in ((signal.SIGINT, STOP_TIMEOUT), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    log.warning("throwaway server pid %d ignored %s", proc.pid, sig.name)
        elif proc is not None:
            proc.wait()
        if self._logfile is not None:
            self._logfile.close()
            self._logfile = None

    def _log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, DevDatabaseError):
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])


# --- command line --------------------------------------------------------------------------------

_USAGE = """\
usage: python -m brooq_py.devdb            show which database the chain picks
       python -m brooq_py.devdb run -- CMD  run CMD with DATABASE_URL set to it
       python -m brooq_py.devdb serve      keep a throwaway server up until Ctrl-C
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=os.environ.get("BROOQ_DEVDB_LOG", "WARNING").upper(), stream=sys.stderr)
    try:
        if not args:
            return _show()
        if args[0] == "run":
            cmd = args[1:]
            if cmd[:1] == ["--"]:
                cmd = cmd[1:]
            if not cmd:
                sys.stderr.write(_USAGE)
                return 2
            return _run(cmd)
        if args[0] == "serve":
            return _serve()
        if args[0] in ("-h", "--help", "help"):
            sys.stdout.write(_USAGE)
            return 0
    except DevDatabaseError as exc:
        print(f"brooq_py.devdb: {exc}", file=sys.stderr)
        return 1
    sys.stderr.write(_USAGE)
    return 2


def _describe(db: DevDatabase) -> str:
    where = {
        "DATABASE_URL": "DATABASE_URL is set",
        "local 5432": f"PostgreSQL on {LOCAL_HOST}:{LOCAL_PORT} answers",
        "throwaway": f"started a throwaway PostgreSQL (pid {db.pid})",
    }.get(db.how, db.how)
    return f"how: {db.how} ({where})\ndsn: {mask_dsn(db.dsn)}"


def _show() -> int:
    with acquire() as db:
        print(_describe(db))
        if db.how == "throwaway":
            print("note: the throwaway server stops now; use `run -- CMD` or `serve` to keep it")
    return 0


def _run(cmd: list[str]) -> int:
    with acquire() as db:
        print(f"brooq_py.devdb: {db.how}: {mask_dsn(db.dsn)}", file=sys.stderr)
        try:
            child = subprocess.Popen(cmd, env={**os.environ, "DATABASE_URL": db.dsn})
        except OSError as exc:
            print(f"brooq_py.devdb: cannot run {cmd[0]!r}: {exc}", file=sys.stderr)
            return 127

        def forward(signum: int, _frame: FrameType | None) -> None:
            child.send_signal(signum)

        previous = signal.signal(signal.SIGTERM, forward)
        try:
            while True:
                try:
                    status = child.wait()
                    break
                except KeyboardInterrupt:  # the child got the SIGINT too; wait for it to finish
                    continue
        finally:
            signal.signal(signal.SIGTERM, previous)
    return status if status >= 0 else 128 - status


def _serve() -> int:
    stop = threading.Event()
    db = start_throwaway()
    try:
        print(_describe(db), flush=True)
        print(f"export DATABASE_URL={db.dsn}\n(Ctrl-C to stop)", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            while not stop.wait(1.0):
                if db.pid is None:
                    print("brooq_py.devdb: the server exited", file=sys.stderr)
                    return 1
    finally:
        db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
