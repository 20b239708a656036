"""The engine's side of the store (the ``Repo`` port); it imports ``session``, ``flow``, ``enqueue``
and ``listen``."""
