"""An attempt's life, from the claimed row to the outcome handed on to be written.

An attempt walks forward: the dispatcher's claim -> ``intake`` -> a slot ->
``runner`` (executes the handler) -> ``attempt`` (its ending, answered through
``outcome.decide()``) -> ``handover`` (the completer, or the closing
transaction) -> settled.

- ``intake``: the claim within each topic's room (``Capacity``), and from it
  attempts under way (a poisoned row ends dead here, a row that must not run
  is handed back);
- ``runner``: the worker slots, the threads and the event loop handlers run
  on; runs a handler and reports how it ended, nothing more;
- ``attempt``: the Attempt, which owns its moves (told how it ended, it answers
  the outcome to write or None), its ``Hooks`` (what its moves touch outside
  it) and ``Kind`` (a topic's handler and options);
- ``outcome``: the attempt's state tables and ``decide()``, the outcome an
  ending earns (retry with backoff, dead, done, discarded, handed back);
- ``handover``: where an answer goes (the completer through the
  ``OutcomeSink`` port, or a done's closing transaction), the attempts settled
  once written, and the ``Supervisor``'s verdicts from outside the handler
  (timeout, lease lost, hung, the engine's stop);
- ``inflight``: the attempts under way, by claim token.

Imports point down, to ``brooq_py.queue`` and the engine's shared leaves, never
to ``engine.services``: the services call into attempts, not the other way round.
"""
