"""The engine: worker pool, heartbeat, reaper, retention, watchdog and metrics.

It works through the ``Repo`` port and never imports psycopg or ``brooq_py.postgres``.
"""

from brooq_py.engine.clock import Clock, SystemClock
from brooq_py.engine.config import Config
from brooq_py.engine.engine import Engine
from brooq_py.engine.health import Health
from brooq_py.engine.repo import ClaimedJob, Gauges, HeldLease, Listener, Outcome, Repo, TopicCount

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
