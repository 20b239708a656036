"""The engine's background services, each a loop on its own thread: on the one
``ticker.Ticker`` base ``liveness`` (heartbeat, fence, watchdog), ``cleanup``
(reaper, retention), ``wakeups`` (stager, LISTEN, topic settings), ``refresher``
(the gauges) and ``scheduler`` (periodic jobs), built by ``wiring``; with loops
of their own the ``dispatcher`` (claims), the ``completer`` (outcome writes) and
``events`` (delivered after commit).

Imports point down: services may import ``engine.attempt`` (they hand rows to it
and watch its attempts), ``brooq_py.queue`` and the engine's shared leaves, never
the engine facade, the HTTP package or ``brooq_py.postgres``.
"""
