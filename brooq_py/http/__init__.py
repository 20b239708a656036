"""HTTP: the worker's surface (/healthz, /metrics, /jobs, /topics) and the dashboard (/ui), one package.

Core install (standard library only, no Starlette):

- ``api``: the surface's routes (``Surface``), the request and reply types and
  the concurrency gate (``Gate``, ``Gated`` around an ASGI app); ``auth``: the
  token guard; ``actions``: the operator's actions both faces share;
- ``server``: ``serve()`` and ``Server``, which run the routes as a WSGI app
  on the stdlib server or, with the ``web`` extra, ``asgi``'s app on uvicorn.

The ``web`` extra (Starlette, Jinja2, uvicorn):

- ``dashboard``: ``dashboard(store, ...)``, the dashboard's Starlette app
  (``templates/``, ``static/``); ``render``: what its pages show;
- ``asgi``: the surface as one Starlette app, with the dashboard at /ui.

Imports point down that list: ``server`` imports ``asgi`` and uvicorn lazily
(only when the extra is present) and ``asgi`` imports ``dashboard`` and
``api``, never ``server``. Nothing here imports the engine at run time (only for types); the
public names live on in ``brooq_py.service`` and ``brooq_py.web``.
"""
