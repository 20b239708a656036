"""The service surface: /healthz, /metrics and the token-guarded /jobs and /topics endpoints (SPEC O1, O2, Z2).

The public names of the worker's surface; the code lives in ``brooq_py.http``
(routes in ``http.api``, token in ``http.auth``, actions in ``http.actions``,
the servers in ``http.server`` and ``http.asgi``).
"""

from brooq_py.http.api import MAX_BODY, Gate, Reply, Request, Surface
from brooq_py.http.server import Server, SurfaceApp, serve

__all__ = ["MAX_BODY", "Gate", "Reply", "Request", "Server", "Surface", "SurfaceApp", "serve"]
