"""What the throwaway server needs on disk (binaries, initdb template cache, temp dirs), and the errors."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from brooq_py.queue.errors import BrooqError

log = logging.getLogger("brooq_py.devdb")

TMP_PREFIX = "brooq_py-pg-"


class DevDatabaseError(BrooqError, RuntimeError):
    """No development database could be provided."""


class PostgresNotFound(DevDatabaseError):
    """No PostgreSQL server binaries (initdb, postgres) were found."""


def find_bindir() -> Path:
    """Return a directory holding ``initdb`` and ``postgres`` (``$PG_BINDIR``, ``pg_config --bindir``,
    ``/usr/lib/postgresql/*/bin``, then ``PATH``); raise :class:`PostgresNotFound` saying how to get them."""
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


def cache_root() -> Path:
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


def tmp_base() -> Path:
    """Where throwaway data directories go: $BROOQ_DEVDB_TMPDIR, else /dev/shm when roomy (a data
    directory's ~1,300 files take a second on disk, milliseconds on tmpfs), else TMPDIR."""
    override = os.environ.get("BROOQ_DEVDB_TMPDIR")
    if override:
        return Path(override)
    shm = Path("/dev/shm")
    with contextlib.suppress(OSError):
        stat = os.statvfs(shm)
        if os.access(shm, os.W_OK | os.X_OK) and stat.f_bavail * stat.f_frsize >= 1 << 30:
            return shm
    return Path(tempfile.gettempdir())


def server_account() -> pwd.struct_passwd | None:
    """The unprivileged account to run the server as when we are root, else None."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise DevDatabaseError("running as root and neither a `postgres` nor a `nobody` user exists")


def chown_tree(root: Path, account: pwd.struct_passwd | None) -> None:
    if account is None:
        return
    uid, gid = account.pw_uid, account.pw_gid
    os.chown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def popen_ids(account: pwd.struct_passwd | None) -> tuple[int | None, int | None, list[int] | None]:
    """user, group and extra_groups for Popen: the server account when we are root."""
    if account is None:
        return None, None, None
    return account.pw_uid, account.pw_gid, []


def pid_alive(pid: int) -> bool:
    """True while *pid* runs; a zombie (dead, not yet reaped by whoever adopted it) is not alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True  # no /proc to ask: take the signal's word
    return "\nState:\tZ" not in status


def sweep_stale_dirs() -> None:
    """Remove temp dirs of throwaway servers whose owning process is gone (e.g. SIGKILLed)."""
    for path in tmp_base().glob(TMP_PREFIX + "*"):
        try:
            owner = int((path / "owner.pid").read_text().strip())
        except (OSError, ValueError):
            continue
        if pid_alive(owner):
            continue
        postmaster = path / "data" / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            if pid_alive(int(postmaster.read_text().splitlines()[0])):
                continue
        log.debug("removing stale throwaway dir %s", path)
        shutil.rmtree(path, ignore_errors=True)


def run_as_owner(
    cmd: list[str], account: pwd.struct_passwd | None, *, cwd: Path, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a server tool as the data directory's owner, in the C locale, capturing its output."""
    uid, gid, groups = popen_ids(account)
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


def initdb_template(bindir: Path, user: str, dbname: str, account: pwd.struct_passwd | None) -> Path:
    """Return the cached initdb directory for these binaries, *dbname* made in it, built on first use."""
    version = subprocess.run(
        [str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    key = re.sub(r"[^A-Za-z0-9.]+", "_", f"{version}-{user}").strip("_")
    cache = cache_root()
    template = cache / f"initdb-{key}"
    if (template / "PG_VERSION").is_file():
        return template
    staging = Path(tempfile.mkdtemp(prefix=TMP_PREFIX + "initdb-", dir=tmp_base()))
    try:
        target = staging / "data"
        chown_tree(staging, account)
        cmd = [
            str(bindir / "initdb"),
            "-D",
            str(target),
            "-U",
            user,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]
        result = run_as_owner(cmd, account, cwd=staging)
        if result.returncode != 0:
            raise DevDatabaseError(f"initdb failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        # Bake the database into the template: single-user mode needs no port and no wait.
        result = run_as_owner(
            [str(bindir / "postgres"), "--single", "-D", str(target), "-c", "fsync=off", "postgres"],
            account,
            cwd=staging,
            input=f'create database "{dbname}";\n',
        )
        if result.returncode != 0:
            raise DevDatabaseError(f"creating the template database failed:\n{result.stdout}{result.stderr}")
        building = Path(tempfile.mkdtemp(prefix=f"initdb-{key}.", dir=cache))
        shutil.copytree(target, building / "data", symlinks=True)
        with contextlib.suppress(OSError):  # another process won the race: use its template
            os.rename(building / "data", template)
        shutil.rmtree(building, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("cached initdb template in %s", template)
    return template
