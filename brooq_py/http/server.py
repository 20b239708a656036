"""The running surface: the stdlib threading WSGI server, or uvicorn when the ``web`` extra is installed.

``serve()`` picks the server: with the extra (starlette, jinja2, uvicorn)
importable it runs one Starlette application that serves the surface's routes
and the dashboard at /ui; without it, the stdlib server serves the same routes
(``api``). Either runs in a daemon thread and is a ``Server``.
"""

from __future__ import annotations

import importlib.util
import logging
import socketserver
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from brooq_py.http.api import DEFAULT_CONCURRENCY, Gate
from brooq_py.http.listen import LISTEN_BACKLOG, family
from brooq_py.http.wsgi import SurfaceApp

if TYPE_CHECKING:
    from brooq_py.engine import Engine

log = logging.getLogger("brooq_py.service")

# A client that stalls mid-request holds a thread at most this long.
REQUEST_TIMEOUT = 10.0
WEB_MODULES = ("starlette", "jinja2", "uvicorn", "multipart")


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT
    server_version = "brooq"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        # Malformed requests land here (400, 414, 431); requests themselves are logged by the app.
        log.debug("http: " + format, *args)


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG
    block_on_close = False
    allow_reuse_address = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind would call socket.getfqdn(), a reverse DNS lookup that may stall.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)
        self.setup_environ()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("http: connection from %s ended with an error", client_address[0], exc_info=True)


class Backend(Protocol):
    """What carries the requests: bound on construction, serving until ``close()``."""

    address: tuple[str, int]

    def close(self) -> None: ...


class WsgiBackend:
    """The stdlib threading WSGI server of the core install, in a daemon thread."""

    def __init__(self, app: SurfaceApp, host: str, port: int) -> None:
        server_class = type("_Server", (_ThreadingServer,), {"address_family": family(host)})
        self._httpd: _ThreadingServer = server_class((host, port), _Handler)
        self._httpd.set_app(app)
        bound = self._httpd.server_address
        self.address = (str(bound[0]), int(bound[1]))
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.25},
            name=f"brooq-http-{self.address[1]}",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def web_installed() -> bool:
    """Return whether the ``web`` extra's packages can be imported."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in WEB_MODULES)
    except (ImportError, ValueError):
        return False


class Server:
    """The running surface. ``port`` is the bound port (useful with ``port=0``); close() is idempotent.

    ``dashboard`` says whether /ui is served (the ``web`` extra's Starlette
    application on uvicorn); ``address`` is the bound (host, port).
    """

    def __init__(
        self,
        engine: Engine,
        host: str = "127.0.0.1",
        port: int = 8090,
        token: str | None = None,
        *,
        dashboard: bool | None = None,
        read_only: bool = False,
        concurrency: int = DEFAULT_CONCURRENCY,
        viewer_token: str | None = None,
    ):
        gate = Gate(concurrency)
        if dashboard is None:
            dashboard = web_installed()
        self.dashboard = dashboard
        self._backend: Backend
        if dashboard:
            try:
                from brooq_py.http.asgi import uvicorn_backend
            except ImportError as exc:
                raise ImportError(
                    "the dashboard needs the web extra: pip install 'brooq-py[web]' (or serve(..., dashboard=False))"
                ) from exc
            self._backend = uvicorn_backend(
                engine, host, port, token, gate=gate, read_only=read_only, viewer_token=viewer_token
            )
        else:
            self._backend = WsgiBackend(SurfaceApp(engine, token, gate, viewer_token), host, port)
        self.host = host
        self.address = self._backend.address
        self.port: int = self.address[1]
        self._closed = False
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        """Stop accepting requests, wait for the serving loop to end, and release the socket."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._backend.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Server(url={self.url!r}, dashboard={self.dashboard}, closed={self._closed})"


def serve(
    engine: Engine,
    host: str = "127.0.0.1",
    port: int = 8090,
    token: str | None = None,
    *,
    dashboard: bool | None = None,
    read_only: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
    viewer_token: str | None = None,
) -> Server:
    """Start the service surface for *engine* in a background thread and return at once.

    Serve ``/healthz`` and ``/metrics`` without auth, and ``/jobs/{id}``,
    ``/jobs/{id}/cancel``, ``/jobs/{id}/retry``, ``/topics`` and
    ``/topics/{topic}/pause|resume`` with ``Authorization: Bearer <token>``
    (off when neither token is set). *viewer_token* reads every page and GET
    endpoint, here and on the dashboard, and gets 403 for every action
    (SPEC K5). *dashboard* None serves the dashboard at /ui when the ``web``
    extra is installed (True requires it, False never); *read_only* makes that
    dashboard read-only for every token. Beyond *concurrency* requests at once
    the answer is 503. Raise ``OSError`` if the address cannot be bound, and
    ``ValueError`` when both tokens are the same.
    """
    return Server(
        engine,
        host,
        port,
        token,
        dashboard=dashboard,
        read_only=read_only,
        concurrency=concurrency,
        viewer_token=viewer_token,
    )
