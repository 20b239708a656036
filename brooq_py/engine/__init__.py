"""The engine: claims, runs and settles jobs through the ``Repo`` port; never imports psycopg or ``brooq_py.postgres``.

Layout, imports pointing down:

- ``engine``: the Engine facade, which wires everything below together;
- ``attempt/``: an attempt's life (intake and each topic's room, runner and
  slots, the Attempt, decide, handover and the supervisor, the in-flight set);
- ``services/``: the background loops on the one Ticker base (dispatcher,
  completer, liveness, cleanup, wake-ups, refresher, scheduler, events);
- shared leaves both import: ``clock``, ``config``, ``metrics``, ``health``,
  ``schema`` (the migration check at start); the ``Repo`` port itself is
  ``brooq_py.queue.port`` (re-exported here as ``brooq_py.engine.Repo``).
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
