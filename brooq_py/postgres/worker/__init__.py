"""The engine's side of the store: ``repo`` (``WorkerRepo``, the ``Repo`` port of
``brooq_py.queue.port``). It imports ``session``, ``flow``, ``enqueue`` and ``listen``.
"""
