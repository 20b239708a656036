"""The ``worker`` command: run an Engine and the service surface until SIGTERM or SIGINT (SPEC C11'')."""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import inspect
import json
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from brooq_py.cli.common import Failure, check_migrated, database_url, log, open_pool
from brooq_py.queue import BrooqError, parse_go_duration
from brooq_py.settings import Settings, merge_env, parse_dotenv

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from brooq_py.engine import Engine
    from brooq_py.http.server import Server
    from brooq_py.postgres import Store
    from brooq_py.queue import Claim, Context


def demo_handler(ctx: Context, claim: Claim) -> None:
    """The built-in `demo` topic: log the payload and return."""
    text = json.dumps(claim.payload, ensure_ascii=False)
    if len(text) > 200:
        text = text[:197] + "..."
    logging.getLogger("brooq_py.demo").info(
        "demo job %s attempt %d payload %s", claim.id, claim.attempt, text
    )


def _load_app(spec: str) -> tuple[Engine, Callable[[], None] | None]:
    """Return the app's Engine and what closes what its factory opened (None: nothing).

    *attr* is an Engine, or a zero-argument factory returning one, a generator yielding one or a
    context manager entering one; the generator's rest or the manager's exit runs at shutdown.
    """
    from brooq_py.engine import Engine

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise Failure(f"--app {spec!r}: expected module:attr, e.g. myapp.jobs:engine", status=2)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing is not None and module_name.startswith(missing):
            raise Failure(f"--app {spec!r}: no module named {missing!r}", status=2) from None
        log.exception("importing %s failed", module_name)
        raise Failure(f"--app {spec!r}: importing {module_name} failed") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise Failure(f"--app {spec!r}: {module_name} has no attribute {attr!r}", status=2) from None
    if not isinstance(obj, Engine) and callable(obj):
        obj = obj()
    closer: Callable[[], None] | None = None
    if inspect.isgenerator(obj):
        obj, closer = _from_generator(spec, obj)
    elif not isinstance(obj, Engine) and hasattr(obj, "__enter__") and hasattr(obj, "__exit__"):
        manager = obj
        obj = manager.__enter__()
        closer = lambda: manager.__exit__(None, None, None)  # noqa: E731
    if not isinstance(obj, Engine):
        if closer is not None:
            closer()
        raise Failure(
            f"--app {spec!r}: expected an Engine, or a factory (a callable, generator or context manager) "
            f"giving one, got {type(obj).__name__}"
        )
    return obj, closer


def _from_generator(spec: str, gen: Generator[Any, Any, Any]) -> tuple[Any, Callable[[], None]]:
    """The Engine a generator factory yields, and how to run the rest of it at shutdown."""
    try:
        engine = next(gen)
    except StopIteration:
        raise Failure(f"--app {spec!r}: the factory yielded nothing") from None

    def close() -> None:
        try:
            next(gen)
        except StopIteration:
            return
        gen.close()
        log.warning("--app %s: the factory yielded more than once; closed it after the first", spec)

    return engine, close


def _apply_dotenv_to_environ(path: Path = Path(".env")) -> None:
    """Make ./.env visible to an --app module's own os.environ reads; the environment still wins."""
    if not path.is_file():
        return
    values, _ = parse_dotenv(path.read_text(encoding="utf-8"), source=str(path))
    for key, value in merge_env(os.environ, values).items():
        if not os.environ.get(key):
            os.environ[key] = value


class StrayTopics:
    """Tell once per topic, every gauges period, of pending jobs no handler here runs (*warn*: logged);
    the line says what this worker runs, since another may serve them."""

    def __init__(self, engine: Engine, warn: Callable[[str], object] | None = None) -> None:
        self.engine = engine
        self.warn: Callable[[str], object] = warn or log.warning
        self.every = engine.config.td("gauges_period").total_seconds()
        self.seen: set[str] = set()
        self.due = 0.0

    def check(self) -> None:
        now = time.monotonic()
        if now < self.due:
            return
        self.due = now + self.every
        find = getattr(self.engine.store, "pending_topics_besides", None)
        if find is None:
            return
        try:
            topics = find(self.engine.topics)
        except Exception as exc:
            log.debug("looking for pending topics without a handler failed: %s", exc)
            return
        for topic in topics:
            if topic not in self.seen:
                self.seen.add(topic)
                self.warn(
                    f"jobs of topic {topic!r} are pending and this worker has no handler for it "
                    f"(it runs: {', '.join(self.engine.topics) or 'nothing'}); "
                    "they wait for a worker that registers it"
                )


class _Interrupted(BaseException):
    """SIGTERM or SIGINT before the engine started: what the main thread was doing (an --app
    factory, a pool opening) is abandoned, as Python's own SIGINT would."""


class _Signals:
    """SIGTERM/SIGINT ask for a stop; a second SIGINT during the stop exits at once. Before the
    engine started, the first one interrupts the main thread (``_Interrupted``): an --app factory
    waiting for a dependency does not hold a SIGTERM up. After it, the handler only sets a flag: one
    that took a lock (an Event's, logging's) could wait for ever on a lock the main thread held when
    the signal came (seen: a process that ignored SIGTERM until killed). The wait is woken by the
    interpreter itself, which writes a byte to a pipe as a signal comes (``signal.set_wakeup_fd``),
    whichever thread it lands on; ``close`` puts back what was there before."""

    def __init__(self) -> None:
        self.requested: str | None = None  # the signal's name, once one came
        self._armed = True  # the engine has not started: a signal interrupts
        self._woken: int | None = None  # the pipe's end the interpreter's byte arrives at
        self._wake = -1
        self._before: tuple[int, dict[signal.Signals, Any]] | None = None  # the wakeup fd, handlers replaced

    def install(self) -> None:
        """Hear SIGTERM/SIGINT (in the main thread alone; elsewhere, as when the command runs in a
        thread of a test, no signal comes and the wait only times out)."""
        self._woken, self._wake = os.pipe()
        for fd in (self._woken, self._wake):
            os.set_blocking(fd, False)
        if threading.current_thread() is threading.main_thread():
            handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
            self._before = (signal.set_wakeup_fd(self._wake, warn_on_full_buffer=False), handlers)
            signal.signal(signal.SIGTERM, self._handle)
            signal.signal(signal.SIGINT, self._handle)

    def started(self) -> None:
        """The engine starts: a signal from now on asks for a graceful stop."""
        self._armed = False

    def close(self) -> None:
        """Put back the wakeup fd and the handlers ``install`` replaced, and close the pipe."""
        if self._before is not None:
            fd, handlers = self._before
            signal.set_wakeup_fd(fd)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            self._before = None
        if self._woken is not None:
            os.close(self._woken)
            os.close(self._wake)
            self._woken = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is None:
            self.requested = signal.Signals(signum).name
            if self._armed:
                raise _Interrupted(self.requested)
        elif signum == signal.SIGINT:
            os.write(2, b"second SIGINT: exiting now, without waiting for running handlers\n")
            os._exit(130)

    def wait(self, timeout: float) -> bool:
        """Whether a stop was asked for within *timeout* seconds (no lock a handler could meet)."""
        assert self._woken is not None, "install() first"
        if self.requested is None and select.select([self._woken], [], [], timeout)[0]:
            with contextlib.suppress(BlockingIOError):
                os.read(self._woken, 64)  # the handler has run by now: it runs between bytecodes
        if self.requested is not None:
            log.info("%s received: stopping gracefully (a second SIGINT exits at once)", self.requested)
        return self.requested is not None


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    stop_timeout: float | None = None
    if args.stop_timeout is not None:
        try:
            stop_timeout = parse_go_duration(args.stop_timeout).total_seconds()
        except ValueError as exc:
            raise Failure(f"--stop-timeout: {exc}", status=2) from None
        if stop_timeout < 0:
            raise Failure("--stop-timeout must not be negative", status=2)

    signals = _Signals()
    signals.install()
    try:
        return _work(args, settings, signals, stop_timeout)
    except _Interrupted as stop:  # before the engine started: nothing of its work to wait for
        log.info("%s received before the engine started: exiting", stop)
        return 0
    finally:
        signals.close()


def _work(args: argparse.Namespace, settings: Settings, signals: _Signals, stop_timeout: float | None) -> int:
    """The worker command once its signals are heard: the app or the demo, the surface, the engine
    until a stop is asked for."""
    from brooq_py.http.server import serve

    pool: ConnectionPool | None = None
    store: Store | None = None
    close_app: Callable[[], None] | None = None
    if args.demo:
        from brooq_py.engine import Engine
        from brooq_py.postgres import Store

        check_migrated(settings)
        pool = open_pool(settings, max_size=settings.config.workers + 2)
        store = Store(pool, schema=settings.schema, conninfo=database_url(settings))
        engine = Engine(store, settings.config)
        engine.register_kind("demo", demo_handler)
    else:
        _apply_dotenv_to_environ()
        engine, close_app = _load_app(args.app)
        app_schema = getattr(engine.repo, "schema", None)
        if args.schema and app_schema is not None and args.schema != app_schema:
            if close_app is not None:
                close_app()
            raise Failure(
                f"--schema {args.schema} does not match the app's Store (schema {app_schema!r}): "
                f"drop --schema or give the app's Store schema={args.schema!r}",
                status=2,
            )

    server = None
    try:
        # The port first: a busy one is refused before the engine claims anything (/healthz is 503 till then).
        server = _listen(engine, settings, serve)
        signals.started()  # from here a signal asks for a graceful stop, which the loop below waits for
        try:
            engine.start()
        except BrooqError as exc:  # e.g. the schema is not migrated: one line naming the fix
            raise Failure(str(exc)) from None
        log.info(
            "worker running: topics %s, %d workers; service surface listening on %s (/jobs %s)",
            ", ".join(engine.topics) or "(none)",
            engine.config.workers,
            server.url,
            _jobs_access(settings),
        )
        strays = StrayTopics(engine)
        checking: threading.Thread | None = None
        while True:
            # On a thread of its own: a database that stops answering never holds up a SIGTERM.
            if checking is None or not checking.is_alive():
                checking = threading.Thread(target=strays.check, name="brooq-strays", daemon=True)
                checking.start()
            if signals.wait(min(1.0, strays.every)):
                break
        log.info("stopping: no new claims; waiting for running handlers")
        engine.stop(stop_timeout)
        log.info("stopped")
        return 0
    finally:
        with contextlib.suppress(Exception):
            engine.close()
        if server is not None:
            server.close()
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
        if pool is not None:
            pool.close(timeout=0.5)  # its connecting threads are daemons: a silent server holds up no exit
        if close_app is not None:
            try:
                close_app()
            except Exception:
                log.exception("closing the --app factory's resources failed")


def _listen(engine: Engine, settings: Settings, serve: Callable[..., Server]) -> Server:
    """Start the surface on BROOQ_HTTP_ADDR, or any free port if it is unset and its default taken,
    so a second worker on one host runs beside the first."""

    def start(port: int) -> Server:
        return serve(
            engine, settings.http_host, port, settings.http_token, viewer_token=settings.http_viewer_token
        )

    addr = f"{settings.http_host}:{settings.http_port}"
    if ":" in settings.http_host:
        addr = f"[{settings.http_host}]:{settings.http_port}"
    try:
        return start(settings.http_port)
    except OSError as exc:
        taken = exc.errno == errno.EADDRINUSE
        if taken and not settings.http_addr_set and settings.http_port != 0:
            try:
                server = start(0)
            except OSError as again:
                raise Failure(f"cannot listen on {settings.http_host}:0: {again.strerror}") from None
            log.warning(
                "the default address %s of the service surface is taken (another worker on this host?): "
                "listening on %s instead; set BROOQ_HTTP_ADDR to choose one",
                addr,
                server.url,
            )
            return server
        why = "address already in use" if taken else (exc.strerror or str(exc))
        where = (
            f"BROOQ_HTTP_ADDR={addr}"
            if settings.http_addr_set
            else f"cannot listen on {addr} (the default of BROOQ_HTTP_ADDR)"
        )
        raise Failure(
            f"{where}: {why}; set BROOQ_HTTP_ADDR to another address, or port 0 for any free one"
        ) from None


def _jobs_access(settings: Settings) -> str:
    """How /jobs is open, for the start-up line: which tokens it takes (never the tokens)."""
    if settings.http_token and settings.http_viewer_token:
        return "enabled: operator and viewer tokens"
    if settings.http_token:
        return "enabled"
    return "enabled: viewer token, read only" if settings.http_viewer_token else "disabled: no token"
