"""Bounded waits on the Store's own connections (heartbeat, LISTEN), derived from the lease (SPEC L3).

Server side: ``lock_timeout`` and ``statement_timeout`` end a statement that
waits or runs too long. Network: TCP keepalives and ``tcp_user_timeout`` notice
a half-open socket, on both ends: the server's keepalives end the session of a
client whose host vanished.
Client side: ``deadline()`` shuts the socket down when a statement has not
answered in time, which ends a wait that nothing on the wire ever will (a path
that goes silent behind a proxy that still ACKs).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg

DEFAULT_LEASE = timedelta(seconds=30)


def own_connection_kwargs(lease: timedelta) -> dict[str, Any]:
    """libpq settings for a connection that must notice trouble within *lease*/3."""
    third = max(lease.total_seconds() / 3, 1.0)
    ms = int(third * 1000)
    return {
        "connect_timeout": max(2, int(third)),
        "keepalives": 1,
        "keepalives_idle": max(1, int(third / 2)),
        "keepalives_interval": max(1, int(third / 6)),
        "keepalives_count": 3,
        "tcp_user_timeout": ms,
        "options": f"-c statement_timeout={ms} -c lock_timeout={max(ms // 2, 100)} "
        f"-c idle_in_transaction_session_timeout={ms * 3} -c tcp_keepalives_idle={max(1, int(third / 2))} "
        f"-c tcp_keepalives_interval={max(1, int(third / 6))} -c tcp_keepalives_count=3",
    }


def merged(kwargs: dict[str, Any], lease: timedelta) -> dict[str, Any]:
    """*kwargs* with the bounds added; the caller's own ``options`` come first, ours win."""
    out = {**kwargs, **own_connection_kwargs(lease)}
    if kwargs.get("options"):
        out["options"] = f"{kwargs['options']} {out['options']}"
    return out


def statement_budget(lease: timedelta) -> float:
    """How long a statement on an own connection may take before its socket is shut down."""
    return max(lease.total_seconds() / 3, 1.0) + 1.0


@contextlib.contextmanager
def deadline(conn: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
    """Shut *conn*'s socket down if the block has not ended after *seconds*.

    The waiting call then fails at once with a connection error (the caller
    closes the connection and reopens it next time), instead of blocking on a
    socket nobody answers.
    """
    done = threading.Event()

    def expire() -> None:
        if done.is_set():
            return
        with contextlib.suppress(Exception):
            fd = conn.pgconn.socket
            sock = socket.socket(fileno=fd)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.detach()  # the fd stays libpq's

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        done.set()
        timer.cancel()
