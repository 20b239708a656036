"""The engine's background services: each a loop on its own thread.

- ``ticker``: Ticker, the one lifecycle base of every periodic service (its
  stop, its backoff after failures, its logging rule);
- on it: ``heartbeat`` (renews held leases), ``watchdog`` (attempt timeouts,
  hung handlers), ``reaper`` (expired leases back to pending), ``retention``
  (deletes old terminal rows), ``stager`` (scheduled rows due), ``listener``
  (LISTEN/NOTIFY wake-ups), ``refresher`` (the gauges' snapshot),
  ``scheduler`` (periodic jobs), ``topic_watch`` (operator settings);
- ``wakeups``: wires the listener and the stager to the dispatcher;
  ``wiring``: which periodic services an engine runs, built from its config;
- ``dispatcher``: claims rows while slots are free and hands them to the
  attempt's side; ``completer``: batches outcome writes. Both have their own
  loop (a wake-driven claim loop, a linger-driven writer) rather than a period.

Imports point down: services may import ``engine.attempt`` (they hand rows to
it and watch its attempts), ``brooq_py.queue`` and the engine's shared leaves
(``queue.port``, ``engine.clock``, ``engine.config``), never the engine facade
(``engine.engine``), the HTTP package or ``brooq_py.postgres``.
"""
