"""An attempt's life, from the claimed row to the outcome handed on to be written.

- ``intake``: from a claim to attempts under way (a poisoned row ends dead
  here, a row that must not run is handed back);
- ``attempt``: the Attempt and its state machine (Phase, HandlerState), and Kind
  (a topic's handler and options);
- ``slots``: the worker slots and the threads and event loop handlers run on;
- ``runner``: runs a handler on a slot and settles how it ended;
- ``outcome``: ``decide()``, the outcome an ending earns (retry with ``backoff``,
  dead, done, discarded, handed back);
- ``supervisor``: the endings decided from outside the handler (timeout, lease
  lost, hung, the engine's stop);
- ``inflight``: the attempts under way, by id; ``capacity``: each topic's room
  (SPEC Q3) and the claim that respects it;
- ``sink``: the port the runner hands outcomes to (the completer implements it).

Imports point down: to ``brooq_py.queue`` and the engine's shared leaves
(``engine.repo``, ``engine.clock``, ``engine.metrics``), never to
``engine.services``: the services call into attempts, not the other way round.
The watchdog, though it watches attempts, is a periodic loop on the Ticker
base, so it lives with the services.
"""
