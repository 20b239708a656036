"""The engine: claims, runs and settles jobs through the ``Repo`` port (``brooq_py.queue.port``,
re-exported here); it never imports psycopg or ``brooq_py.postgres``. Imports point down: the facade
wires ``attempt/`` and ``services/``, which share the leaves ``clock``, ``config``, ``metrics``,
``health``, ``schema`` and ``producing``.
"""

from brooq_py.engine.clock import Clock, SystemClock
from brooq_py.engine.config import Config
from brooq_py.engine.engine import Engine
from brooq_py.engine.health import Health
from brooq_py.queue.port import ClaimedJob, Gauges, HeldLease, Listener, Outcome, Repo, TopicCount

__all__ = [
    "ClaimedJob",
    "Clock",
    "Config",
    "Engine",
    "Gauges",
    "Health",
    "HeldLease",
    "Listener",
    "Outcome",
    "Repo",
    "SystemClock",
    "TopicCount",
]
