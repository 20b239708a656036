"""The dashboard (extra ``brooq_py[web]``): ``dashboard(store, token=..., read_only=...)`` is an ASGI app.

Mount it in your own Starlette or FastAPI application
(``app.mount("/brooq", dashboard(store, token=...))``), run it alone with
``brooq-py dashboard``, or find it at ``/ui`` on the worker's surface. The
code lives in ``brooq_py.http.dashboard``.
"""

from brooq_py.http.dashboard import dashboard

__all__ = ["dashboard"]
