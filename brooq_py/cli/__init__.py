"""The ``brooq-py`` command line (also ``python -m brooq_py``).

Exit status: 0 success; 1 a runtime failure (database unreachable, unknown
job for ``get`` and ``retry``, a cancel of a job that has ended); 2 bad usage,
bad input, ``cancel`` of an id no job has ("no such job"), or invalid settings
(listed all at once, before anything connects); 130 a second SIGINT during a
graceful stop.

Modules: ``entry`` (the parser and :func:`main`), ``worker`` (the worker
command and its signal handling), ``commands`` (the one-shot commands),
``operator`` (the operator's commands), ``dashboard`` (the dashboard alone) and
``common`` (:class:`Failure` and the database helpers they share).
"""

from brooq_py.cli.entry import main

__all__ = ["main"]
