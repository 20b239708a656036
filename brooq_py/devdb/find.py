"""The chain that picks the database (``acquire``) and ``DevDatabase``, what it hands back."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import psycopg

from brooq_py.devdb.files import DevDatabaseError, sweep_stale_dirs
from brooq_py.devdb.process import LOCAL_HOST
from brooq_py.devdb.server import ThrowawayServer, current_user, local_url
from brooq_py.redact import mask_dsn

log = logging.getLogger("brooq_py.devdb")

LOCAL_PORT = 5432
CONNECT_TIMEOUT = 2  # seconds, per probe of the local server


@dataclass
class DevDatabase:
    """A database to work against: its DSN and how the chain found it; ``restart()`` and ``stop()``
    need a throwaway ``server``, ``close()`` is safe on every kind and twice."""

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


def acquire(*, local_port: int = LOCAL_PORT) -> DevDatabase:
    """Return the first usable database of the chain; raise :class:`PostgresNotFound` when it comes
    to a throwaway without binaries, :class:`DevDatabaseError` when that does not start."""
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
    user = current_user()
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
        return local_url(user, port, dbname)
    return None


def start_throwaway() -> DevDatabase:
    """Start a throwaway server, whatever the chain would pick, owned by the caller (and stopped at exit)."""
    server = ThrowawayServer()
    server.start()
    return DevDatabase(server.dsn, "throwaway", server)
