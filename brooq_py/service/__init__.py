"""The service surface: /healthz, /metrics and the token-guarded /jobs and /topics endpoints (SPEC O1, O2, Z2).

The routes, the token check and the operator's actions live in ``api``,
``auth`` and ``actions``, shared by both servers that may carry them: the
stdlib WSGI server of the core install, and, when the ``web`` extra is
installed, one Starlette application on uvicorn that also serves the
dashboard at /ui.
"""

from brooq_py.service.api import MAX_BODY, Gate, Reply, Request, Surface
from brooq_py.service.app import SurfaceApp
from brooq_py.service.server import Server, serve

__all__ = ["MAX_BODY", "Gate", "Reply", "Request", "Server", "Surface", "SurfaceApp", "serve"]
