"""A real PgBouncer in transaction mode in front of the test server (SPEC Z5).

Debian's ``pgbouncer`` (``.ci/run`` installs it when missing), started on a
free port with its files in a temp dir, killed at the end. PgBouncer refuses
to run as root, so under root it runs as the ``postgres`` account.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from brooq_py.devdb.process import die_with_parent, free_port


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )


def _account() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    return None


@contextmanager
def pgbouncer(dsn: str, binary: str, pool_size: int = 20, ignore_options: bool = True) -> Iterator[str]:
    """Yield the DSN of a transaction-mode PgBouncer in front of *dsn*'s server, *pool_size* server
    connections; *ignore_options* False: PgBouncer's own default, which refuses libpq ``options``."""
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "127.0.0.1")
    port = int(params.get("port") or 5432)
    user = str(params.get("user") or pwd.getpwuid(os.getuid()).pw_name)
    listen = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="brooq-pgbouncer-"))
    account = _account()
    try:
        os.chmod(workdir, 0o777)
        (workdir / "userlist.txt").write_text(f'"{user}" ""\n')
        (workdir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {listen}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {workdir / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            "max_client_conn = 500\n"
            f"default_pool_size = {pool_size}\n"
            + ("ignore_startup_parameters = extra_float_digits,options\n" if ignore_options else "")
            + f"logfile = {workdir / 'pgbouncer.log'}\n"
        )
        parent = os.getpid()
        proc = subprocess.Popen(
            [binary, str(workdir / "pgbouncer.ini")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
            user=None if account is None else account.pw_uid,
            group=None if account is None else account.pw_gid,
            extra_groups=None if account is None else [],
            preexec_fn=lambda: die_with_parent(parent),
        )
        try:
            params.update(host="127.0.0.1", port=str(listen))
            bouncer = make_conninfo("", **{k: v for k, v in params.items() if v is not None})
            deadline = time.monotonic() + 30
            while True:
                try:
                    with psycopg.connect(bouncer, prepare_threshold=None, connect_timeout=2) as conn:
                        conn.execute("SELECT 1")
                    break
                except psycopg.OperationalError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log = workdir / "pgbouncer.log"
                        raise RuntimeError(
                            "pgbouncer did not start: " + (log.read_text() if log.exists() else "no log")
                        ) from None
                    time.sleep(0.1)
            yield bouncer
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
