"""``brooq-py dashboard``: the dashboard alone, on uvicorn, until SIGINT or SIGTERM (extra ``web``)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
from collections.abc import Iterator

from brooq_py.cli.common import Failure, check_migrated, open_store
from brooq_py.settings import Settings, parse_http_addr

log = logging.getLogger("brooq_py.cli")

DEFAULT_ADDR = "127.0.0.1:8091"


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    dash = sub.add_parser(
        "dashboard", parents=[common], help="serve the web dashboard (needs the web extra: brooq-py[web])"
    )
    dash.add_argument(
        "--addr",
        metavar="HOST:PORT",
        default=DEFAULT_ADDR,
        help=f"where to listen (default {DEFAULT_ADDR}); without BROOQ_HTTP_TOKEN only a loopback address",
    )
    dash.add_argument("--read-only", action="store_true", help="hide and refuse every action")


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # Ours stop it and exit 0, as the worker does; uvicorn's would re-raise the signal at the end.
            yield

    return Server


def cmd_dashboard(args: argparse.Namespace, settings: Settings) -> int:
    try:
        import uvicorn

        from brooq_py.http.auth import is_loopback
        from brooq_py.http.dashboard import dashboard
        from brooq_py.http.server import bound_socket
    except ImportError:
        raise Failure("the dashboard needs the web extra: pip install 'brooq-py[web]'", status=2) from None
    try:
        host, port = parse_http_addr(args.addr)
    except ValueError as exc:
        raise Failure(str(exc).replace("BROOQ_HTTP_ADDR=", "--addr "), status=2) from None
    token, viewer_token = settings.http_token, settings.http_viewer_token
    if not token and not viewer_token and not is_loopback(host):
        raise Failure(
            f"refusing to serve the dashboard on {host} without a token: set BROOQ_HTTP_TOKEN "
            "(or BROOQ_HTTP_TOKEN_FILE), or listen on a loopback address",
            status=2,
        )
    check_migrated(settings)
    try:
        sock = bound_socket(host, port, backlog=128)
    except OSError as exc:
        raise Failure(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    with contextlib.closing(sock), open_store(settings, max_size=4) as store:
        app = dashboard(store, token=token, read_only=args.read_only, viewer_token=viewer_token)
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
        log.info(
            "dashboard listening on http://%s:%d/ (schema %s, %s%s)",
            shown,
            bound[1],
            settings.schema,
            "token required" if token or viewer_token else "no token: loopback only",
            ", read-only" if args.read_only else "",
        )
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=5,
        )
        server = _server_class()(config)

        def stop(signum: int, _frame: object) -> None:
            if server.should_exit:  # a second signal: stop waiting for open connections
                server.force_exit = True
            server.should_exit = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        server.run(sockets=[sock])
        log.info("dashboard stopped")
        return 0
