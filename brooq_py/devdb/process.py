"""The throwaway server's postgres process: spawn it so it dies with us, stop it with escalation.

PR_SET_PDEATHSIG(SIGKILL) leaves no orphan of a killed parent, but fires when the spawning
*thread* exits: spawn from the main thread, or one that lives as long as the server.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pwd
import signal
import socket
import subprocess
from pathlib import Path
from typing import IO

from brooq_py.devdb.files import popen_ids

log = logging.getLogger("brooq_py.devdb")

LOCAL_HOST = "127.0.0.1"
STOP_TIMEOUT = 15.0  # seconds a fast shutdown may take before we escalate

_PR_SET_PDEATHSIG = 1
_SERVER_SETTINGS = (
    "listen_addresses=127.0.0.1",
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "max_connections=200",
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCAL_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def die_with_parent(parent_pid: int) -> None:
    """In a child (preexec_fn): ask for SIGKILL when the spawning thread exits (runs after any uid change)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def spawn_postgres(
    bindir: Path,
    datadir: Path,
    port: int,
    *,
    socket_dir: Path,
    logfile: IO[bytes],
    account: pwd.struct_passwd | None,
) -> subprocess.Popen[bytes]:
    """Start ``postgres`` on *datadir* and *port* as *account*, logging to *logfile*; do not wait for it."""
    cmd = [str(bindir / "postgres"), "-D", str(datadir), "-p", str(port)]
    cmd += ["-k", str(socket_dir)]
    for setting in _SERVER_SETTINGS:
        cmd += ["-c", setting]
    parent = os.getpid()
    uid, gid, groups = popen_ids(account)
    return subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=logfile,
        stderr=subprocess.STDOUT,
        cwd=socket_dir,
        env={**os.environ, "LC_ALL": "C", "LANG": "C"},
        preexec_fn=lambda: die_with_parent(parent),
        user=uid,
        group=gid,
        extra_groups=groups,
    )


def stop_postgres(proc: subprocess.Popen[bytes]) -> None:
    """Stop *proc* with a fast shutdown, escalating to SIGQUIT then SIGKILL; reap it."""
    if proc.poll() is None:
        # SIGINT is a fast shutdown: roll back open transactions, checkpoint, exit.
        for sig, wait in ((signal.SIGINT, STOP_TIMEOUT), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                log.warning("throwaway server pid %d ignored %s", proc.pid, sig.name)
    else:
        proc.wait()
