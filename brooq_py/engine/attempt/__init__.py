"""An attempt's life, walked forward (docs/development.md maps the modules). Imports point down, to
``brooq_py.queue`` and the engine's shared leaves, never to ``engine.services``: the services call
into attempts, not the other way round."""
