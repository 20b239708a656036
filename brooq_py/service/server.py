"""A small threading WSGI server for the service surface, run in a daemon thread."""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from brooq_py.service.app import SurfaceApp

if TYPE_CHECKING:
    from brooq_py.engine import Engine

log = logging.getLogger("brooq_py.service")

# A client that stalls mid-request holds a thread at most this long.
REQUEST_TIMEOUT = 10.0


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT
    server_version = "brooq"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        # Malformed requests land here (400, 414, 431); requests themselves are logged by the app.
        log.debug("http: " + format, *args)


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
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


def _family(host: str) -> socket.AddressFamily:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return socket.AF_INET6 if ":" in host else socket.AF_INET
    return infos[0][0] if infos else socket.AF_INET


class Server:
    """The running surface. ``port`` is the bound port (useful with ``port=0``); close() is idempotent."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 8090, token: str | None = None):
        server_class = type("_Server", (_ThreadingServer,), {"address_family": _family(host)})
        self._httpd: _ThreadingServer = server_class((host, port), _Handler)
        self._httpd.set_app(SurfaceApp(engine, token))
        self.host = host
        self.port: int = self._httpd.server_port
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.25},
            name=f"brooq-http-{self.port}",
            daemon=True,
        )
        self._thread.start()

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
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Server(url={self.url!r}, closed={self._closed})"


def serve(engine: Engine, host: str = "127.0.0.1", port: int = 8090, token: str | None = None) -> Server:
    """Start the service surface for *engine* in a background thread and return at once.

    Serve ``/healthz`` and ``/metrics`` without auth and ``/jobs/{id}`` and
    ``/jobs/{id}/cancel`` with ``Authorization: Bearer <token>`` (off when
    *token* is None). Raise ``OSError`` if the address cannot be bound.
    """
    return Server(engine, host, port, token)
