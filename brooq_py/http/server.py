"""The running surface: ``serve()`` and ``Server``, on uvicorn with the ``web`` extra, else on the stdlib."""

from __future__ import annotations

import asyncio
import hmac  # noqa: F401  (tests spy on hmac.compare_digest through this module)
import importlib.util
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from types import TracebackType
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from brooq_py.http.api import (
    BUSY,
    DEFAULT_CONCURRENCY,
    MAX_BODY,
    Gate,
    Reply,
    Request,
    Surface,
    safe,
    takes_body,
)

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

    from brooq_py.engine import Engine

log = logging.getLogger("brooq_py.service")

# A client that stalls mid-request holds a thread at most this long.
REQUEST_TIMEOUT = 10.0
STARTUP_TIMEOUT = 10.0
WEB_MODULES = ("starlette", "jinja2", "uvicorn", "multipart")

StartResponse = Callable[..., Any]
Environ = dict[str, Any]

# socketserver's backlog of 5 drops a burst's handshakes (200 scrapes), left to wait on SYN retries.
LISTEN_BACKLOG = 1024


def family(host: str) -> socket.AddressFamily:
    """Return the address family to bind *host* with."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return socket.AF_INET6 if ":" in host else socket.AF_INET
    return infos[0][0] if infos else socket.AF_INET


def bound_socket(host: str, port: int, backlog: int = LISTEN_BACKLOG) -> socket.socket:
    """Return a TCP socket listening on (*host*, *port*); raise ``OSError``, the socket closed, if it cannot."""
    return socket.create_server((host, port), family=family(host), backlog=backlog)


def _headers(environ: Environ) -> dict[str, str]:
    headers = {k[5:].replace("_", "-").lower(): str(v) for k, v in environ.items() if k.startswith("HTTP_")}
    if environ.get("CONTENT_LENGTH"):
        headers["content-length"] = str(environ["CONTENT_LENGTH"])
    return headers


class SurfaceApp:
    """The surface as a WSGI callable (the core install's, without Starlette)."""

    def __init__(
        self,
        engine: Engine,
        token: str | None = None,
        gate: Gate | None = None,
        viewer_token: str | None = None,
    ) -> None:
        self.surface = Surface(engine, token, viewer_token=viewer_token)
        self.gate = gate or Gate()

    def __repr__(self) -> str:
        return f"SurfaceApp({self.surface!r})"

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        started = time.monotonic()
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        # PEP 3333 hands the path over as latin-1; the surface reads UTF-8 (topic names).
        path = (
            str(environ.get("PATH_INFO", "")).encode("latin-1", "replace").decode("utf-8", "replace") or "/"
        )
        if self.gate.enter():
            try:
                body = _body(environ) if takes_body(method, path) else b""
                if body is None:
                    reply = Reply.error(400, "the request's body ended before its Content-Length")
                else:
                    reply = self.surface.dispatch(Request(method, path, _headers(environ), body))
                    if not body and reply.status not in (400, 411, 413):
                        _body(environ)  # dropped: unread, it resets the connection before the answer
            finally:
                self.gate.leave()
        else:
            reply = BUSY
        # 413's name since RFC 9110; Python's table has it only from 3.13 on.
        reason = "Content Too Large" if reply.status == 413 else HTTPStatus(reply.status).phrase
        start_response(f"{reply.status} {reason}", reply.all_headers())
        log.debug(
            "%s %s -> %d (%.1f ms)", method, safe(path), reply.status, (time.monotonic() - started) * 1000
        )
        return [b""] if method == "HEAD" else [reply.body]


def _body(environ: Environ) -> bytes | None:
    """A small body (at most ``MAX_BODY`` bytes; a longer one is left unread, for the route to refuse),
    or None when the stream ended before its Content-Length (a client that left: not a request)."""
    raw = str(environ.get("CONTENT_LENGTH") or "0").strip()
    length = int(raw) if raw.isascii() and raw.isdigit() else 0
    stream = environ.get("wsgi.input")
    if 0 < length <= MAX_BODY and stream is not None:
        body = bytes(stream.read(length))
        return body if len(body) == length else None
    return b""


class _EndSeen:
    """The request's stream, noting whether a line read came back empty (the client closed)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.ended = False

    def readline(self, size: int = -1) -> bytes:
        line: bytes = self._raw.readline(size)
        self.ended = self.ended or not line
        return line


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT
    server_version = "brooq"
    sys_version = ""

    def parse_request(self) -> bool:
        # The standard library takes the end of the stream for the blank line that ends the headers:
        # a request cut off by a client that went away would run (a cancel among them). Refused.
        raw = self.rfile
        self.rfile = seen = _EndSeen(raw)  # type: ignore[assignment]
        try:
            parsed = super().parse_request()
        finally:
            self.rfile = raw
        if parsed and seen.ended:
            self.close_connection = True
            return False
        return parsed

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


class ThreadedUvicorn:
    """uvicorn serving *app* in a daemon thread, on a socket bound here (so bind errors raise here)."""

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        self._sock = bound_socket(host, port)
        self._sock.setblocking(False)
        bound = self._sock.getsockname()
        self.address = (str(bound[0]), int(bound[1]))
        import uvicorn

        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_keep_alive=5,
            timeout_graceful_shutdown=2,
            server_header=False,
            date_header=False,
            h11_max_incomplete_event_size=16 * 1024,
        )
        self._server: uvicorn.Server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"brooq-http-{self.address[1]}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            self.close()
            raise OSError(f"the HTTP server did not start on {host}:{port}")

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        except Exception:
            log.exception("the HTTP server stopped with an error")

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
        self._sock.close()


def web_installed() -> bool:
    """Return whether the ``web`` extra's packages can be imported."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in WEB_MODULES)
    except (ImportError, ValueError):
        return False


class Server:
    """Start the service surface for *engine* in a background thread (``serve`` is this class).

    ``/healthz`` and ``/metrics`` need no auth; ``/jobs/{id}``, ``/jobs/{id}/cancel|retry``,
    ``/topics`` and ``/topics/{topic}/pause|resume`` need ``Authorization: Bearer <token>`` and
    are off when neither token is set. *viewer_token* reads every page and GET endpoint, here
    and on the dashboard, and gets 403 for every action. *dashboard* None serves /ui when the
    ``web`` extra is installed (True requires it, False never); *read_only* makes it read-only
    for every token. Beyond *concurrency* requests at once the answer is 503. Raise ``OSError``
    if the address cannot be bound, ``ValueError`` when both tokens are the same.

    ``address`` and ``port`` are the bound ones (useful with ``port=0``), ``dashboard`` whether
    /ui is served; close() is idempotent.
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
        self._backend: WsgiBackend | ThreadedUvicorn
        if dashboard:
            try:
                from brooq_py.http.asgi import surface_app
            except ImportError as exc:
                raise ImportError(
                    "the dashboard needs the web extra: pip install 'brooq-py[web]' (or serve(..., dashboard=False))"
                ) from exc
            app = surface_app(
                engine, token, host=host, gate=gate, read_only=read_only, viewer_token=viewer_token
            )
            self._backend = ThreadedUvicorn(app, host, port)
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


serve = Server
