"""The worker command as a newcomer meets it: a factory that closes what it opened, and a busy port
refused before the engine starts."""

from __future__ import annotations

import signal
import socket
import textwrap
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
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "engine: started" not in result.stderr and "Traceback" not in result.stderr
