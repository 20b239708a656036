"""Find a PostgreSQL to run the demo, the tests and the benchmarks against.

``acquire()`` walks the chain, first match wins:

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
(else ``nobody``), since PostgreSQL refuses to run as root. It dies with the
thread that started it (``process``): call :func:`acquire` and
:func:`start_throwaway` from the main thread.

``python -m brooq_py.devdb`` says which database the chain picks;
``python -m brooq_py.devdb run -- CMD ...`` runs CMD with ``DATABASE_URL`` set
to it; ``python -m brooq_py.devdb serve`` keeps a throwaway server up until
interrupted.

Modules, imports pointing down the list: ``cli`` the command line; ``find`` the
chain and :class:`DevDatabase`; ``server`` the throwaway server's lifecycle;
``process`` the postgres process (spawn, stop); ``files`` the binaries, the
initdb template cache and the temp dirs. Only the demo, the testing kit, the
tests and the benchmarks import this package: it is tooling, not part of the queue.
"""

from brooq_py.devdb.cli import main
from brooq_py.devdb.files import DevDatabaseError, PostgresNotFound, find_bindir
from brooq_py.devdb.find import LOCAL_PORT, DevDatabase, acquire, start_throwaway
from brooq_py.devdb.process import LOCAL_HOST, STOP_TIMEOUT
from brooq_py.devdb.server import ThrowawayServer
from brooq_py.redact import mask_dsn

__all__ = [
    "LOCAL_HOST",
    "LOCAL_PORT",
    "STOP_TIMEOUT",
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
