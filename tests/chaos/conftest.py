"""Fixtures of the fault-injection suite: a schema with the side tables, real worker processes.

Worker processes run ``worker_proc.py`` in a session of their own (``start_new_session``) and
are killed as a group in teardown, whatever the test did.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.chaos import invariants
from tests.conftest import drop_schema, migrate, own_server
from tests.processes import Process

WORKER = Path(__file__).with_name("worker_proc.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("BROOQ_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="long variant: set BROOQ_SLOW=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def dsn() -> str:
    """The chaos group's own throwaway server (tests/conftest.py, OWN_SERVER_GROUPS)."""
    return own_server("chaos")


def make_chaos_schema(dsn: str) -> str:
    name = "chaos_" + uuid.uuid4().hex[:16]
    migrate(dsn, name)
    invariants.install(dsn, name)
    return name


def drop(dsn: str, schema: str) -> None:
    drop_schema(dsn, schema)


@pytest.fixture
def chaos_schema(dsn: str) -> Iterator[str]:
    """A fresh migrated schema with chaos_exec, chaos_audit, chaos_violation and their triggers."""
    name = make_chaos_schema(dsn)
    try:
        yield name
    finally:
        drop(dsn, name)


class Worker(Process):
    """One worker process (its own engine and pool: worker_proc.py)."""

    def __init__(self, settings: dict[str, Any], log_path: Path) -> None:
        super().__init__(WORKER, settings, log_path)
        self.label = settings["label"]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start worker processes; every one still alive is killed (as a group) in teardown."""
    workers: list[Worker] = []
    counter = iter(range(1_000_000))

    def start(dsn: str, schema: str, **settings: Any) -> Worker:
        label = settings.pop("label", None) or f"w{next(counter)}"
        w = Worker({"dsn": dsn, "schema": schema, "label": label, **settings}, tmp_path / f"{label}.log")
        workers.append(w)
        w.wait_ready()
        return w

    try:
        yield start
    finally:
        for w in workers:
            if w.alive:
                w.kill()
            else:
                w._close()


def enqueue_parents(dsn: str, schema: str, payloads: list[dict[str, Any]]) -> set[str]:
    """Enqueue one ``chaos`` job per payload through the Store; return their ids."""
    from psycopg_pool import ConnectionPool

    from brooq_py import Job
    from brooq_py.postgres import Store

    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = Store(pool, schema=schema)
        results = store.enqueue_many([Job("chaos", p) for p in payloads])
        store.close()
    return {r.id for r in results}


def held_by(dsn: str, schema: str, worker_id: str, among: Sequence[str] | None = None) -> int:
    """How many jobs the engine *worker_id* holds (processing under its id), of *among* if given."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {}.job WHERE state = 'processing' AND locked_by = %s"
                " AND (%s::uuid[] IS NULL OR id = ANY(%s::uuid[]))"
            ).format(sql.Identifier(schema)),
            [worker_id, among, among],
        ).fetchone()
    assert row is not None
    return int(row[0])


def kill_mid_job(
    dsn: str,
    schema: str,
    spawn: Callable[..., Worker],
    live: list[tuple[Worker, str]],
    settings: dict[str, Any],
    rng: random.Random,
    *,
    kills: int,
    pause: tuple[float, float],
    wait: float = 30.0,
    hits: int = 0,
    most: int = 0,
) -> int:
    """SIGKILL *kills* worker processes of *live* in turn, each replaced by a new one (*settings*):
    a victim holding a job when one does within *wait* seconds (a worker starting on a busy machine
    takes a while), then a pause. While fewer than *hits* kills hit a worker holding a job, go on
    killing, up to *most* kills in all (a victim seen busy may have finished its jobs before the
    signal). Return how many kills hit a worker holding a job."""
    mid_job = 0
    done = 0
    while done < kills or (mid_job < hits and done < most):
        deadline = time.monotonic() + wait
        busy: list[tuple[Worker, str]] = []
        while not busy and time.monotonic() < deadline:
            busy = [(w, wid) for w, wid in live if held_by(dsn, schema, wid) > 0]
            if not busy:
                time.sleep(0.05)
        victim = rng.choice(busy or live)
        victim[0].kill()
        done += 1
        # looked at once it is dead: its rows stay processing until the reaper (a lease later), where
        # a look before the kill could see a job it then finished before the signal
        mid_job += bool(held_by(dsn, schema, victim[1]))
        live.remove(victim)
        w = spawn(dsn, schema, **settings)
        live.append((w, f"chaos-{w.label}:{w.proc.pid}"))
        time.sleep(rng.uniform(*pause))
    return mid_job


def settled(dsn: str, schema: str, ids: set[str]) -> bool:
    """True when every job of *ids* and every child is terminal."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FILTER (WHERE state IN ('done','dead','canceled') AND id = ANY(%s::uuid[])),"
                " count(*) FILTER (WHERE state NOT IN ('done','dead','canceled')) FROM {}.job"
            ).format(sql.Identifier(schema)),
            [list(ids)],
        ).fetchone()
    assert row is not None
    return bool(row[0] == len(ids) and row[1] == 0)


class CutProxy:
    """A TCP proxy in front of PostgreSQL that can be cut: its connections are closed and new ones
    are closed at once (a server gone), until ``restore()``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.up = True
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            self._drop(a, b)

    def _drop(self, *socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def cut(self) -> None:
        self.up = False
        with self._lock:
            socks, self._socks = self._socks, []
        self._drop(*socks)

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self.server.close()


@pytest.fixture
def proxy(dsn: str) -> Iterator[CutProxy]:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    p = CutProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    yield p
    p.close()
