"""The ``brooq-py`` command line (also ``python -m brooq_py``).

Exit status: 0 success; 1 a runtime failure (database unreachable, unknown job for ``get`` and
``retry``, a cancel of a job that has ended); 2 bad usage, bad input, ``cancel`` of an id no job
has, or invalid settings (all listed, before anything connects); 130 a second SIGINT during a
graceful stop.
"""

from brooq_py.cli.entry import main

__all__ = ["main"]
