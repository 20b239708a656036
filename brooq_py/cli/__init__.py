"""The ``brooq-py`` command line (also ``python -m brooq_py``).

Exit status: 0 success; 1 a runtime failure (database unreachable, unknown job for ``get`` and
``retry``, a cancel of a job that has ended); 2 bad usage, bad input, ``cancel`` of an id no job
has, or invalid settings (all listed, before anything connects); 130 a second SIGINT during a
graceful stop.
"""

from brooq_py.cli.commands import format_stats
from brooq_py.cli.common import CONNECT_TIMEOUT, PROG, Failure
from brooq_py.cli.entry import LOG_FORMAT, build_parser, main
from brooq_py.cli.worker import demo_handler

__all__ = [
    "CONNECT_TIMEOUT",
    "LOG_FORMAT",
    "PROG",
    "Failure",
    "build_parser",
    "demo_handler",
    "format_stats",
    "main",
]
