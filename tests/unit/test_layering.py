"""Imports point one way: postgres -> queue <- engine, attempt <- services, and no circle (proved from the real imports: fresh interpreters, and every import statement of the source)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.unit.import_graph import cycles, graph, modules, within

PROBE = """
import json, sys
before = set(sys.modules)
import {module}
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def loaded_by(module: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True, check=True
    )
    mods: list[str] = json.loads(out.stdout)
    return mods


def top(name: str) -> str:
    return name.split(".")[0]


def test_queue_imports_only_the_standard_library() -> None:
    outside = sorted(
        {top(m) for m in loaded_by("brooq_py.queue")}
        - set(sys.stdlib_module_names)
        - {"brooq_py", "_distutils_hack"}
    )
    assert outside == []
    assert not [
        m for m in loaded_by("brooq_py.queue") if m.startswith(("brooq_py.engine", "brooq_py.postgres"))
    ]


@pytest.mark.parametrize(
    "forbidden", ["psycopg", "psycopg_pool", "sqlalchemy", "alembic", "brooq_py.postgres"]
)
def test_engine_never_imports_the_database_layer(forbidden: str) -> None:
    mods = loaded_by("brooq_py.engine")
    assert "brooq_py.engine" in mods
    assert not [m for m in mods if m == forbidden or m.startswith(forbidden + ".")]


def test_postgres_does_not_import_alembic_or_sqlalchemy() -> None:
    mods = loaded_by("brooq_py.postgres")
    assert "psycopg" in mods  # the probe works
    assert not [m for m in mods if top(m) in ("alembic", "sqlalchemy")]


@pytest.mark.parametrize(
    "forbidden", ["brooq_py.engine", "prometheus_client", "alembic", "sqlalchemy", "django"]
)
def test_a1_a_producer_only_import_stays_light(forbidden: str) -> None:
    """``import brooq_py.postgres`` (Store, AsyncStore, WrapTx, AsyncWrapTx) loads no engine, no
    metrics, no migration tool and no framework: the whole import graph, migrations included."""
    mods = loaded_by("brooq_py.postgres")
    assert "brooq_py.postgres.async_store" in mods  # the probe works
    assert not [m for m in mods if m == forbidden or m.startswith(forbidden + ".")]


def test_the_django_contrib_is_never_imported_by_the_core() -> None:
    for module in ("brooq_py", "brooq_py.postgres", "brooq_py.engine", "brooq_py.cli"):
        # brooq_py.contrib.otel is stdlib-only and imports OpenTelemetry only if the process did
        assert not [m for m in loaded_by(module) if m.startswith(("brooq_py.contrib.django", "django"))]


# --- the directions inside the package, from every import statement in the source (ast) -------------

IMPORTS = graph()
MODULES = modules()


def imported_by(prefix: str) -> set[str]:
    return {i.target for i in IMPORTS if within(i.importer, prefix)}


def test_the_graph_reads_the_real_imports() -> None:
    """The graph holds edges known to exist: a module-level one, a lazy one and a type-only one."""
    edges = {(i.importer, i.target, i.type_only) for i in IMPORTS}
    assert ("brooq_py.engine.services.liveness", "brooq_py.engine.attempt.attempt", False) in edges
    assert ("brooq_py.http.server", "brooq_py.http.asgi", False) in edges  # inside a function
    assert ("brooq_py.http.api", "brooq_py.engine", True) in edges
    assert "brooq_py.engine.attempt.runner" in MODULES and "brooq_py.devdb" in MODULES


def test_queue_imports_the_standard_library_and_itself_only() -> None:
    outside = {t for t in imported_by("brooq_py.queue") if not within(t, "brooq_py.queue")}
    assert sorted(t for t in outside if top(t) not in sys.stdlib_module_names) == []


@pytest.mark.parametrize(
    "forbidden",
    [
        "psycopg",
        "psycopg_pool",
        "sqlalchemy",
        "alembic",
        "brooq_py.postgres",
        "brooq_py.http",
        "brooq_py.cli",
    ],
)
def test_engine_source_never_imports(forbidden: str) -> None:
    assert sorted(t for t in imported_by("brooq_py.engine") if within(t, forbidden)) == []


@pytest.mark.parametrize(
    ("importer", "forbidden"),
    [
        # the services call into attempts (hand rows over, watch them), never the reverse
        ("brooq_py.engine.attempt", "brooq_py.engine.services"),
        # the facade wires both; neither reaches back up to it
        ("brooq_py.engine.attempt", "brooq_py.engine.engine"),
        ("brooq_py.engine.services", "brooq_py.engine.engine"),
        ("brooq_py.engine.services", "brooq_py.http"),
        ("brooq_py.engine.services", "brooq_py.service"),
        ("brooq_py.engine.services", "brooq_py.web"),
        ("brooq_py.queue", "brooq_py.engine"),
        ("brooq_py.postgres", "brooq_py.engine"),
        ("brooq_py.postgres", "brooq_py.http"),
        # the worker's surface and the dashboard live in brooq_py.http; the old names re-export them
        ("brooq_py.http", "brooq_py.service"),
        ("brooq_py.http", "brooq_py.web"),
    ],
)
def test_import_directions(importer: str, forbidden: str) -> None:
    wrong = sorted(
        f"{i.importer} -> {i.target}"
        for i in IMPORTS
        if within(i.importer, importer) and within(i.target, forbidden)
    )
    assert wrong == []


def test_only_the_demo_the_cli_and_the_testing_kit_import_devdb() -> None:
    """devdb is tooling for the demo, the tests (users' too: brooq_py.testing finds a database with
    it) and the benchmarks: the queue never depends on it."""
    allowed = ("brooq_py.devdb", "brooq_py.demo", "brooq_py.cli", "brooq_py.testing")
    wrong = sorted(
        f"{i.importer} -> {i.target}"
        for i in IMPORTS
        if within(i.target, "brooq_py.devdb") and not any(within(i.importer, a) for a in allowed)
    )
    assert wrong == []
    assert "brooq_py.devdb" in {i.target for i in IMPORTS if i.importer == "brooq_py.demo"}


def test_no_import_cycle_inside_the_package() -> None:
    """Imports form no circle: module level, lazy ones inside functions, and type-only ones too
    (a circle of types is a circle of ideas, even when it never runs)."""
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for i in IMPORTS:
        if within(i.target, "brooq_py") and i.target in MODULES:
            edges[i.importer].add(i.target)
    assert cycles(edges) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


LONGEST = 700


def test_every_module_stays_short() -> None:
    """A module past ~700 lines likely holds more than one role: split it by role, not by length."""
    long = sorted(
        f"{name}: {n} lines"
        for name, path in MODULES.items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > LONGEST
    )
    assert long == []
