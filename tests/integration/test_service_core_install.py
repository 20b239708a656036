"""The surface on the core install: without the web extra, serve() runs the stdlib server (NOTES)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import http.client, json, sys
    from importlib.abc import MetaPathFinder

    class NoWebExtra(MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("starlette", "jinja2", "uvicorn", "multipart", "python_multipart"):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, NoWebExtra())

    from psycopg_pool import ConnectionPool
    from brooq_py.engine import Engine
    from brooq_py.postgres import Store
    from brooq_py.queue import Job
    from brooq_py.service import serve

    dsn, schema = sys.argv[1], sys.argv[2]
    with ConnectionPool(dsn, min_size=1, max_size=2) as pool:
        store = Store(pool, schema=schema)
        job_id = store.enqueue(Job("core.topic", {"n": 1})).id
        engine = Engine(store)
        with serve(engine, port=0, token="core-token") as srv:
            def call(method, path):
                conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
                conn.request(method, path, headers={"Authorization": "Bearer core-token"})
                resp = conn.getresponse()
                return resp.status, resp.read()
            status, body = call("GET", "/topics")
            topics = [t["topic"] for t in json.loads(body)["topics"]]
            print(json.dumps({
                "dashboard": srv.dashboard,
                "topics": [status, topics],
                "pause": call("POST", "/topics/core.topic/pause")[0],
                "paused": sorted(store.paused()),
                "get": call("GET", "/jobs/" + job_id)[0],
                "ui": call("GET", "/ui/")[0],
                "ui_bare": [call("GET", "/ui")[0], b"web extra" in call("GET", "/ui")[1]],
                "web_loaded": any(m.split(".")[0] in ("starlette", "uvicorn", "jinja2") for m in sys.modules),
            }))
        engine.close()
        store.close()
    """
)


def test_surface_serves_every_endpoint_without_the_web_extra(dsn: str, schema: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, dsn, schema], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {
        "dashboard": False,
        "topics": [200, ["core.topic"]],
        "pause": 200,
        "paused": ["core.topic"],
        "get": 200,
        "ui": 404,
        "ui_bare": [404, True],
        "web_loaded": False,
    }
