"""An attempt's life, from the claimed row to the outcome handed on to be written.

An attempt walks forward: the dispatcher's claim -> ``intake`` -> a slot ->
``runner`` (executes the handler) -> ``attempt`` (its ending, answered through
``decide()``) -> ``handover`` (the completer, or the closing transaction) ->
settled.

- ``intake``: from a claim to attempts under way (a poisoned row ends dead
  here, a row that must not run is handed back);
- ``attempt``: the Attempt, which owns its moves: told how it ended, it answers
  the outcome to write or None, and its ``Hooks``, what its moves touch
  outside it; ``phases``: its two state machines' tables; ``kind``: a topic's
  handler and options;
- ``slots``: the worker slots and the threads and event loop handlers run on;
- ``runner``: runs a handler on a slot and reports how it ended, nothing more;
- ``outcome``: ``decide()``, the outcome an ending earns (retry with ``backoff``,
  dead, done, discarded, handed back);
- ``handover``: where an answer goes (the completer through the ``sink`` port,
  or a done's closing transaction) and the attempts settled once written;
- ``supervisor``: the verdicts from outside the handler (timeout, lease lost,
  hung, the engine's stop), reported to the attempt like the handler's end;
- ``inflight``: the attempts under way, by claim token; ``capacity``: each
  topic's room (SPEC Q3) and the claim that respects it.

Imports point down: to ``brooq_py.queue`` and the engine's shared leaves
(``queue.port``, ``engine.clock``, ``engine.metrics``), never to
``engine.services``: the services call into attempts, not the other way round.
The watchdog, though it watches attempts, is a periodic loop on the Ticker
base, so it lives with the services.
"""
