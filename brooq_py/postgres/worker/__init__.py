"""The engine's side of the store: claim, settle, liveness, staging, retention, gauges.

``repo`` holds every statement the engine runs through the ``Repo`` port
(``brooq_py.queue.port``). It imports ``session`` only.
"""
