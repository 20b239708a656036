"""The worker command as a newcomer meets it: a factory that closes what it opened, and a busy port
refused before the engine starts."""

from __future__ import annotations

import signal
import socket
import textwrap
import urllib.request
from pathlib import Path

import pytest

from tests.integration.test_cli import Worker, cli_env, run_cli

FACTORIES = {
    "generator": """
        def make_engine():
            pool, store, engine = build()
            try:
                yield engine
            finally:
                store.close()
                pool.close()
                print("APP CLOSED", file=sys.stderr, flush=True)
        """,
    "context-manager": """
        @contextlib.contextmanager
        def make_engine():
            pool, store, engine = build()
            with pool:
                yield engine
                store.close()
            print("APP CLOSED", file=sys.stderr, flush=True)
        """,
}

COMMON = """
    import contextlib
    import os
    import sys

    from psycopg_pool import ConnectionPool

    from brooq_py import Config, Engine
    from brooq_py.postgres import Store


    def build():
        pool = ConnectionPool(os.environ["DATABASE_URL"], min_size=1, max_size=4, open=True)
        store = Store(pool, schema=os.environ["APP_SCHEMA"])
        engine = Engine(store, Config(workers=1, poll_interval=0.2))
        engine.register_kind("app.x", lambda ctx, claim: None)
        return pool, store, engine
    """


@pytest.mark.parametrize("form", sorted(FACTORIES))
def test_an_app_factory_closes_what_it_opened_at_shutdown(
    form: str, dsn: str, schema: str, tmp_path: Path
) -> None:
    (tmp_path / "closingapp.py").write_text(textwrap.dedent(COMMON) + textwrap.dedent(FACTORIES[form]))
    env = cli_env(dsn, BROOQ_HTTP_ADDR="127.0.0.1:0", APP_SCHEMA=schema)
    worker = Worker(["worker", "--app", "closingapp:make_engine"], env, tmp_path)
    try:
        worker.url()
        assert "APP CLOSED" not in worker.output
        assert worker.stop(signal.SIGTERM) == 0, worker.output
    finally:
        worker.kill()
    out = worker.output
    assert "APP CLOSED" in out and out.index("stopped") < out.index("APP CLOSED"), out


def test_a_busy_port_is_refused_before_the_engine_starts(dsn: str, schema: str, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = cli_env(dsn, BROOQ_HTTP_ADDR=f"127.0.0.1:{port}")
        result = run_cli("worker", "--demo", "--schema", schema, dsn=dsn, cwd=tmp_path, env=env)
    assert result.returncode == 1, result.stderr
    # The address was set: it is refused, naming the setting that chooses another.
    assert f"BROOQ_HTTP_ADDR=127.0.0.1:{port}: address already in use" in result.stderr
    assert "port 0 for any free one" in result.stderr
    assert "engine: started" not in result.stderr and "Traceback" not in result.stderr


def test_two_workers_on_one_host_without_an_address_both_serve(dsn: str, schema: str, tmp_path: Path) -> None:
    """BROOQ_HTTP_ADDR unset: the second worker finds 127.0.0.1:8090 taken (by the first, or by
    anything else on this host) and listens on a free port, saying so; both surfaces answer."""
    env = cli_env(dsn)
    assert "BROOQ_HTTP_ADDR" not in env
    workers = [Worker(["worker", "--demo", "--schema", schema], env, tmp_path) for _ in range(2)]
    try:
        urls = [w.url() for w in workers]
        assert len(set(urls)) == 2, urls
        moved = [w for w, url in zip(workers, urls, strict=True) if url != "http://127.0.0.1:8090"]
        assert moved, urls  # at most one of them has the default port
        for w in moved:
            assert "127.0.0.1:8090 of the service surface is taken" in w.output, w.output
            assert "set BROOQ_HTTP_ADDR to choose one" in w.output
        for url in urls:
            with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
                assert answer.status == 200 and b"brooq_claimed_total" in answer.read()
        for w in workers:
            assert w.stop(signal.SIGTERM) == 0, w.output
    finally:
        for w in workers:
            w.kill()
