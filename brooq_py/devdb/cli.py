"""``python -m brooq_py.devdb``: show the database the chain picks, run a command on it, or serve one."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from brooq_py.devdb.files import DevDatabaseError
from brooq_py.devdb.find import LOCAL_PORT, DevDatabase, acquire, start_throwaway
from brooq_py.devdb.process import LOCAL_HOST, die_with_parent
from brooq_py.redact import mask_dsn

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
        parent = os.getpid()
        try:
            # Killed with SIGKILL, this process cannot stop CMD, so the kernel does (PDEATHSIG, this thread).
            child = subprocess.Popen(
                cmd, env={**os.environ, "DATABASE_URL": db.dsn}, preexec_fn=lambda: die_with_parent(parent)
            )
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
    stop: list[int] = []  # the handler only appends: an Event's lock, held by this thread, would hang it
    db = start_throwaway()
    try:
        print(_describe(db), flush=True)
        print(f"export DATABASE_URL={db.dsn}\n(Ctrl-C to stop)", flush=True)
        signal.signal(signal.SIGTERM, lambda signum, _frame: stop.append(signum))
        with contextlib.suppress(KeyboardInterrupt):
            while not stop:
                time.sleep(1.0)
                if db.pid is None:
                    print("brooq_py.devdb: the server exited", file=sys.stderr)
                    return 1
    finally:
        db.close()
    return 0
