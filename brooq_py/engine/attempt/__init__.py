"""An attempt's life, walked forward: the dispatcher's claim -> ``intake`` (each
topic's room, a slot) -> ``runner`` (the handler on a thread or the loop) ->
``attempt`` (its ending, answered through ``outcome.decide()``) -> ``handover``
(the completer, or the closing transaction) -> settled; ``inflight`` holds the
attempts under way, ``handover.Supervisor`` reports the verdicts from outside
the handler (timeout, lease lost, hung, the engine's stop).

Imports point down, to ``brooq_py.queue`` and the engine's shared leaves, never
to ``engine.services``: the services call into attempts, not the other way round.
"""
