"""The service surface: /healthz, /metrics and the token-guarded /jobs endpoints (SPEC O1, O2)."""

from brooq_py.service.app import MAX_BODY, SurfaceApp
from brooq_py.service.server import Server, serve

__all__ = ["MAX_BODY", "Server", "SurfaceApp", "serve"]
