"""Find a PostgreSQL for the demo, the tests and the benchmarks: tooling, not part of the queue.

``acquire()`` takes the first that answers: ``DATABASE_URL`` (``how="DATABASE_URL"``), then
PostgreSQL on 127.0.0.1:5432 as the current user in the database ``test``, the user's own or
``postgres`` (``how="local 5432"``), else a throwaway server from the local binaries
(``how="throwaway"``), stopped by ``close()`` or at exit. The throwaway runs with fsync off,
copied from an initdb template cached under ``$XDG_CACHE_HOME/brooq_py``, and as ``postgres``
(else ``nobody``) when we are root, which PostgreSQL refuses. It dies with the thread that
started it: call :func:`acquire` and :func:`start_throwaway` from the main thread.

``python -m brooq_py.devdb [run -- CMD | serve]`` says which database the chain picks, runs CMD
with ``DATABASE_URL`` set to it, or keeps a throwaway server up. Imports point down the list
``cli``, ``find``, ``server``, ``process``, ``files``.
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
