"""The engine's background services: each a loop on its own thread.

- ``ticker``: Ticker, the one lifecycle base of every periodic service (its
  stop, its backoff after failures, its logging rule);
- on it: ``liveness`` (the heartbeat, the fence, the watchdog), ``cleanup``
  (the reaper, retention), ``wakeups`` (the stager, the LISTEN wake-ups, the
  operator's topic settings), ``refresher`` (the gauges' snapshot),
  ``scheduler`` (periodic jobs);
- ``wiring``: which periodic services an engine runs, built from its config;
- ``dispatcher``: claims rows while slots are free and hands them to the
  attempt's side; ``completer``: batches outcome writes; ``events``: delivers
  events after their commit. Each has its own loop rather than a period.

Imports point down: services may import ``engine.attempt`` (they hand rows to
it and watch its attempts), ``brooq_py.queue`` and the engine's shared leaves,
never the engine facade (``engine.engine``), the HTTP package or
``brooq_py.postgres``.
"""
