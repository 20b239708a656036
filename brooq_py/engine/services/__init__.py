"""The engine's background loops (docs/development.md maps the modules). Imports point down, to
``engine.attempt``, ``brooq_py.queue`` and the engine's shared leaves, never to the engine facade,
the HTTP package or ``brooq_py.postgres``."""
